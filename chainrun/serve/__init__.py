"""``chainrun serve``: the chain inside a chat backend.

* :mod:`chainrun.serve.app`: the ASGI app (Starlette, served by uvicorn), its shared
  state (one chain for every chat) and the bearer-token check;
* :mod:`chainrun.serve.turns`: one turn as wire events, and the summary read back from
  the log;
* :mod:`chainrun.serve.chat`: ``POST /chat`` as Server-Sent Events;
* :mod:`chainrun.serve.openai_face`: ``/v1/chat/completions`` and ``/v1/models``;
* :mod:`chainrun.serve.errors`: the one error shape of every route;
* :mod:`chainrun.serve.disconnect`: cancel a non-streamed turn whose client went away;
* :mod:`chainrun.serve.server`: run it under uvicorn (loopback unless a token is set);
* ``static/``: the chat page with its live step waterfall.
"""

from chainrun.serve.app import DEFAULT_MAX_BODY_BYTES, ServeState, create_app
from chainrun.serve.openai_face import DEFAULT_MODEL_ID
from chainrun.serve.server import TOKEN_ENV, serve
from chainrun.serve.turns import TurnObserver, TurnRunner, WireEvent, turn_summary

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MODEL_ID",
    "TOKEN_ENV",
    "ServeState",
    "TurnObserver",
    "TurnRunner",
    "WireEvent",
    "create_app",
    "serve",
    "turn_summary",
]
