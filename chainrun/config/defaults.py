"""The built-in default chain: what a ``chainrun.toml`` is merged onto, key by key.

Six steps, routed on the classify label:

- classify (``kind = "classify"``, method ``combined``: keyword rules, else the nearest
  labelled examples; no model call) writes the message's category, a
  :data:`~chainrun.classify.base.DEFAULT_LABELS` label; a follow-up that names no subject
  of its own keeps the label of the turn it follows;
- retrieve (catalogue search; a follow-up searches the subject of the turn it follows)
  runs unless the label is one of :data:`POLICY_LABELS`;
- policy (the shop's policy text for the label) runs only for those labels;
- compose (the streamed answer, from the conversation's history, the policy text and
  the products);
- validate (a JSON verdict on the answer) and critique (one sentence of feedback).

The label decides the route at the cost of a few keyword rules (an embedding of the
message when the rules do not decide), so routing puts no model call before the
answer. ``chainrun config show`` prints the chain, merged with a config file, as TOML.
:data:`LLM_CLASSIFY_STEP` is the classify step done by the model instead.
"""

from __future__ import annotations

from typing import Any

from chainrun.classify.base import DEFAULT_LABELS

STEP_NAMES_DEFAULT = ("classify", "retrieve", "policy", "compose", "validate", "critique")
#: the default classify step's labels (a shop's message categories)
#: the labels the default chain answers from the shop's policy text without a product
#: search (every other label, and a turn whose classify failed, searches the catalogue):
#: the labels of the replay and eval sets' order, delivery, return and fit questions
POLICY_LABELS = ("order_status", "returns", "sizing")


# The model prompts are transcripts for the model to continue: the embedded local
# model is the pre-trained Gemma 3 270M, which continues text well and follows
# instructions badly. A chat-tuned model (e.g. OpenAI's) reads them just as well.
_CLASSIFY_PROMPT = (
    "Messages sent to an online fashion shop, each with its category "
    "(sizing, product_search, order_status, returns, styling or other).\n\n"
    'Message: "Does this dress run small?"\nCategory: sizing\n\n'
    'Message: "Where is my parcel?"\nCategory: order_status\n\n'
    '{history}Message: "{message}"\nCategory:'
)
_COMPOSE_SYSTEM = (
    "A chat between a shopper and the friendly stylist of an online fashion shop. "
    "The stylist answers in one short sentence in the shopper's own words; the shop "
    "lists the products under it."
)
# {history} first: the earlier turns are the start of the prompt that the next turn of
# the conversation repeats, so a server's prompt cache can reuse them (llama-server
# keeps each slot's last prompt); it renders "" on a conversation's first turn
# {policy} is "" on the search route, the policy section and a blank line on the policy
# route (where {products} is "(none)": retrieve did not run)
_COMPOSE_PROMPT = (
    "{history}{policy}Catalogue matches:\n{products}\n\nShopper: {message}\nStylist:"
)
#: Where the compose step's answer ends: its first sentence, its line, a colon or an
#: aside in brackets. The default prompt is a transcript of "Shopper:" and "Stylist:"
#: lines, and a pre-trained model continues a transcript past its own turn: the
#: embedded 270M model went on with invented "Customer:" and "Stylist:" lines and
#: copied catalogue lines after its own; a second sentence, a colon (an invented
#: quotation of the policy followed) or a bracket ("(red and yellow)", a web address)
#: was where it began to repeat itself or to invent a fact. Its answer is one clause;
#: the facts come from data (``facts``). A stop sequence is not part of the text, so
#: the answer step closes the sentence (chainrun.steps.facts). Four sequences, the most
#: the OpenAI Chat Completions API takes ("up to four stop sequences": help.openai.com,
#: "How do I use stop sequences in the OpenAI API?"), so the default chain stays valid
#: on such a provider.
COMPOSE_STOP = ("\n", ". ", ":", " (")
#: llama.cpp's sampler settings for the embedded model's answer: a repetition penalty
#: over the last 64 tokens, against the loops a 270M model falls into at low temperature
#: ("I'm a shop assistant. I'm a shop assistant. ..."). The DRY sampler is not sent: the
#: answer is one clause now (the stop sequences above, the ``sentences`` check, the loop
#: check), and on llama-server it added about 45 ms to every answer's first token with
#: Gemma 3's vocabulary (benchmarks/README.md, "DRY's cost at the first token")
COMPOSE_SAMPLING = {"repeat_penalty": 1.15, "repeat_last_n": 64}
_VALIDATE_PROMPT = (
    "Shopper: {message}\nStylist:{answer}\n\n"
    "Review: is the stylist's reply polite, on topic and free of invented facts? "
    "Review as JSON:"
)
_CRITIQUE_PROMPT = (
    "Shopper: {message}\nStylist:{answer}\n\n"
    "One sentence on how the stylist's reply could be more helpful:"
)
_VALIDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        # short enough that the JSON closes inside the validate step's max_output_tokens
        # (a 270M model may spend one token per character: measured on the replay set)
        "reason": {"type": "string", "maxLength": 40},
    },
    "required": ["ok", "reason"],
}

#: The built-in default chain as a plain dict (what a chainrun.toml is merged onto).
DEFAULT_CHAIN: dict[str, Any] = {
    "order": list(STEP_NAMES_DEFAULT),
    "providers": {"local": {}},
    "steps": {
        "classify": {
            "kind": "classify",
            "method": "combined",
            "labels": list(DEFAULT_LABELS),
            "follow_ups": True,
            "deadline_s": 5.0,
            "on_failure": "open",
        },
        "retrieve": {
            "kind": "retrieve",
            "deadline_s": 5.0,
            "when": {"label": {"not": list(POLICY_LABELS)}},
        },
        # "other" too: the policy's general section (care, customer service, what the
        # assistant does) answers what is neither a product nor an order; its products
        # are still searched (retrieve runs on every label but the policy ones)
        # of a section, the two lines nearest the message (the two the answer's facts
        # quote at most): a shorter prompt, an earlier first token
        "policy": {"kind": "policy", "when": {"label": [*POLICY_LABELS, "other"]},
                   "lines": 2},
        "compose": {
            "system": _COMPOSE_SYSTEM,
            "prompt": _COMPOSE_PROMPT,
            "stop": list(COMPOSE_STOP),
            "max_output_tokens": 32,
            "temperature": 0.2,
            "sampling": dict(COMPOSE_SAMPLING),
            # the products and the policy lines come from data, after the model's line
            # (chainrun.steps.facts)
            "facts": {
                "products": 3, "policy_lines": 2,
                # the model's part is one sentence: the stop sequences end it at ". ",
                # the sentences check at "! " and "? " too (chainrun.checks.sentences)
                "sentences": 1,
                "lead": {"products": "Here are our {subject}",
                         "policy": "Here is what our policy says about {topic}"},
            },
            "stream": True,
            "deadline_s": 60.0,
            "on_failure": "closed",
            # the answer's product ids, titles, prices, stock, colours and policy figures
            # against the turn's products, tool results and policy
            # (chainrun.checks.grounding)
            "grounding": {"action": "correct"},
        },
        "validate": {
            "prompt": _VALIDATE_PROMPT,
            "json_schema": _VALIDATE_SCHEMA,
            "max_output_tokens": 96,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
        "critique": {
            "prompt": _CRITIQUE_PROMPT,
            "stop": ["\n"],
            "max_output_tokens": 40,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
    },
}


#: The classify step done by the model (an ``llm`` step, as ``[steps.classify]`` with
#: ``kind = "llm"`` and these keys): the local model continues a few-shot transcript and
#: its first label is taken. Not in the default chain (a model call before the answer,
#: and fewer labels right than the ``combined`` method on the regression eval set:
#: benchmarks/README.md, "Label accuracy of each way to classify"); kept for
#: comparisons (``benchmarks/classify_accuracy.py``, ``benchmarks/conversation_routes.py``).
LLM_CLASSIFY_STEP: dict[str, Any] = {
    "kind": "llm",
    "prompt": _CLASSIFY_PROMPT,
    "labels": list(DEFAULT_LABELS),
    "stop": ["\n"],
    "max_output_tokens": 8,
    "temperature": 0.0,
    "deadline_s": 30.0,
    "on_failure": "open",
}

__all__ = [
    "COMPOSE_STOP",
    "DEFAULT_CHAIN",
    "LLM_CLASSIFY_STEP",
    "POLICY_LABELS",
    "STEP_NAMES_DEFAULT",
]
