"""The built-in default chain: what a ``chainrun.toml`` is merged onto, key by key.

Five steps: classify (the message's category, a :data:`CLASSIFY_LABELS` label), retrieve
(catalogue search), compose (the streamed answer), validate (a JSON verdict on the
answer) and critique (one sentence of feedback). ``chainrun config show`` prints it,
merged with a config file, as TOML.
"""

from __future__ import annotations

from typing import Any

from chainrun.classify.base import DEFAULT_LABELS

STEP_NAMES_DEFAULT = ("classify", "retrieve", "compose", "validate", "critique")
#: the default classify step's labels (a shop's message categories)
CLASSIFY_LABELS = DEFAULT_LABELS


# The default prompts are transcripts for the model to continue: the embedded local
# model is the pre-trained Gemma 3 270M, which continues text well and follows
# instructions badly. A chat-tuned model (e.g. OpenAI's) reads them just as well.
_CLASSIFY_PROMPT = (
    "Messages sent to an online fashion shop, each with its category "
    "(sizing, product_search, order_status, returns, styling or other).\n\n"
    'Message: "Does this dress run small?"\nCategory: sizing\n\n'
    'Message: "Where is my parcel?"\nCategory: order_status\n\n'
    'Message: "{message}"\nCategory:'
)
_COMPOSE_SYSTEM = (
    "A chat between a shopper and the friendly stylist of an online fashion shop. "
    "The stylist answers in two or three sentences, recommends only products from the "
    "catalogue matches, and never invents order details."
)
_COMPOSE_PROMPT = "Catalogue matches:\n{products}\n\nShopper: {message}\nStylist:"
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
            "prompt": _CLASSIFY_PROMPT,
            "labels": list(CLASSIFY_LABELS),
            "stop": ["\n"],
            "max_output_tokens": 8,
            "temperature": 0.0,
            "deadline_s": 30.0,
            "on_failure": "open",
        },
        "retrieve": {"kind": "retrieve", "deadline_s": 5.0},
        "compose": {
            "system": _COMPOSE_SYSTEM,
            "prompt": _COMPOSE_PROMPT,
            "stop": ["\nShopper:", "\n\n"],
            "max_output_tokens": 120,
            "temperature": 0.7,
            "stream": True,
            "deadline_s": 60.0,
            "on_failure": "closed",
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


__all__ = ["CLASSIFY_LABELS", "DEFAULT_CHAIN", "STEP_NAMES_DEFAULT"]
