"""A message too long for the model's context: the provider's HTTP 400 saying so is a
``context_length`` error (not ``http_400``, nor a configuration mistake), and the
shopper is told to send a shorter message instead of "try again in a moment", which
could never work."""

from __future__ import annotations

from conftest import failing_compose_on

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import PromptTooLong, RequestRejected
from chainrun.providers.openai_client import status_error
from chainrun.scheduler import TOO_LONG_REFUSAL
from chainrun.serve.faces import failure


def test_a_400_saying_the_prompt_exceeds_the_context_is_prompt_too_long() -> None:
    # the embedded model's llama-server, for a 7,996-character message (as logged)
    llama = {"code": 400, "message": "request (4376 tokens) exceeds the available context "
             "size (4096 tokens), try increasing it"}  # fmt: skip
    err = status_error("local", 400, "Error code: 400", llama, {})
    assert isinstance(err, PromptTooLong) and err.error_type == "context_length"
    # OpenAI's names the messages parameter: still not a configuration mistake
    openai_body = {"message": "This model's maximum context length is 128000 tokens.",
                   "param": "messages", "code": "context_length_exceeded"}  # fmt: skip
    err = status_error("openai", 400, "Error code: 400", openai_body, {})
    assert isinstance(err, PromptTooLong) and not isinstance(err, RequestRejected)
    # another 400 naming a parameter is the configuration's, as before
    other = {"message": "Unsupported value: 'temperature'", "param": "temperature"}
    assert isinstance(status_error("openai", 400, "Error code: 400", other, {}),
                      RequestRejected)  # fmt: skip


async def test_the_shopper_is_told_to_send_a_shorter_message(store) -> None:
    message = "a very long message " * 10
    fake = failing_compose_on(message.strip(), PromptTooLong("local: HTTP 400: the request "
                                                             "exceeds the available context"))
    chain = Chain(config_from_dict({}), store=store, providers={"local": fake})
    async with chain:
        done = await chain.run_turn(message.strip())
    assert done.status == "refused" and done.error_type == "context_length"
    assert done.output == TOO_LONG_REFUSAL
    # the OpenAI face answers such a turn 400, as OpenAI answers context_length_exceeded
    assert failure({"status": "refused", "error_type": "context_length"})[0] == 400
