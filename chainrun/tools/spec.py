"""A tool's configuration (``[tools.NAME]`` in chainrun.toml): what the model is told and
what runs when it asks.

::

    [tools.add_to_cart]
    description = "Add a product to the shopper's cart"
    function = "shop_tools:add_to_cart"   # a Python callable, sync or async
    # url = "http://127.0.0.1:9000/cart"  # or a JSON POST instead of function
    side_effects = true
    timeout_s = 5

    [tools.add_to_cart.parameters]
    type = "object"
    required = ["sku", "qty"]
    properties = { sku = { type = "string" }, qty = { type = "integer" } }

``parameters`` is a JSON Schema (Draft 2020-12, https://json-schema.org/draft/2020-12)
of the arguments object; it is sent to the model as the function's ``parameters``
(OpenAI API reference, "Function calling") and the model's arguments are validated
against it before the tool runs. The tool's name is the table's name: 1 to 64 letters,
digits, ``_`` or ``-`` (the function-name rule of the OpenAI API).

Validation here is the config's shape only; whether ``function`` imports is checked when
the chain is built (:func:`chainrun.tools.build_tools`), before any call.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chainrun.answer_json import check_schema
from chainrun.providers.config import http_url

__all__ = ["RESERVED_ARGUMENTS", "TOOL_NAME_RE", "ToolConfig", "check_tool_name", "question_fields"]

#: a tool's name as the OpenAI API accepts a function name
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: keyword names chainrun passes to a callable besides the model's arguments; a tool's
#: ``parameters`` must not use them
RESERVED_ARGUMENTS = frozenset({"idempotency_key", "context"})

_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_tool_name(name: str) -> None:
    """Check a tool's name (the ``NAME`` of ``[tools.NAME]``).

    Raises:
        ValueError: not 1 to 64 letters, digits, ``_`` or ``-``.
    """
    if not TOOL_NAME_RE.match(name):
        raise ValueError(
            f"tool name {name!r}: expected 1 to 64 letters, digits, '_' or '-' (the "
            "function-name rule of the OpenAI API)"
        )


class ToolConfig(BaseModel):
    """One ``[tools.NAME]`` table.

    Attributes:
        description: what the tool does, as the model is told.
        parameters: the JSON Schema of its arguments (an object schema).
        function: ``"module:callable"`` (a dotted attribute path after the colon
            allowed), sync or async; exactly one of ``function`` and ``url``.
        url: an ``http://`` or ``https://`` URL answering a JSON POST (see
            :class:`~chainrun.tools.tool.HttpTool` for the body).
        side_effects: the tool changes something (places an order, fills a cart): it
            starts only once the turn is clear to act and is never run again by chainrun.
            A read-only tool (false) is safe to run again.
        timeout_s: how long one run may take, in s; past it the model is told it timed
            out (a sync callable's thread cannot be stopped: it runs on, unseen, until
            the callable returns, holding one of the tool's ``threads``).
        threads: a sync callable's own worker threads (default 4): how many of its calls
            may run at once, timed-out ones still running included. A call while all are
            busy is refused at once (status ``error``, ``ToolBusy``; nothing ran), so a
            tool whose service hangs takes its own threads only, never those every other
            turn needs. Async callables and URL tools use none.
        replay: what a replay or an eval does when the model asks for a tool with side
            effects: ``"stub"`` (the default: the tool is not carried out; the model is
            told ``replay_result``, the call row says ``stubbed``) or ``"run"`` (carried
            out as in live traffic) or ``"record"`` (not carried out; the model is told
            the result the live turn the replay line came from logged for the same call,
            found by the line's ``id`` as that turn's request id and the call's step,
            round and position; the call row says ``recorded``, with ``error_type``
            ``not_recorded`` when the log has none). ``chainrun replay --act`` /
            ``eval --act`` run every tool. A read-only tool runs in replays as live.
        replay_result: what a stubbed call tells the model (JSON; default
            ``{"stubbed": true}``).
        confirm: the shopper must say yes first: when the model asks for the tool, its
            arguments are checked and recorded as a pending action, and the turn's
            answer is :attr:`confirm_question` (see :mod:`chainrun.tools.confirm`); the
            conversation's next turn decides. Implies nothing about ``side_effects``.
        confirm_question: the question, a Python format string over the validated
            arguments (``"Add {qty} x {sku} to your cart?"``); a field may only name a
            parameter. Default: the description and every argument, ``"Add a product to
            the cart: sku = JKT-12, qty = 2?"``.
        confirm_turns: how many later turns of the conversation may decide (default 3:
            an unclear reply is asked again, and that counts); past them it expires.
        confirm_minutes: how long the action may wait for the shopper, in minutes
            (default 15); past it it expires.
        product_arguments: the parameters whose value names a product of the chain's
            catalogue by its id (a SKU: a string, or an array of strings). A call whose
            such argument is no product of the catalogue is not run, not stubbed and
            not asked about (no pending action): status ``invalid_arguments``, and the
            model is told which product the catalogue does not hold. The chain loads
            the catalogue (the sample one when its database has none) whenever a tool
            names such arguments.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: what the tool does, as the model is told
    description: str = Field(min_length=1)
    #: the JSON Schema (Draft 2020-12) of the arguments object; the model's arguments
    #: are validated against it before the tool runs
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    #: a Python callable, "module:callable", sync or async (or set url)
    function: str | None = None
    #: an http(s) URL answering a JSON POST per call (or set function)
    url: str | None = None
    #: the tool changes something: it starts only once the turn is clear to act and is
    #: never run again by chainrun (false: read-only, safe to run again)
    side_effects: bool = False
    #: how long one run may take, in s
    timeout_s: float = Field(default=10.0, gt=0)
    #: a sync callable's own worker threads: its calls running at once, at most
    threads: int = Field(default=4, ge=1, le=256)
    #: a replay or an eval: "stub" a side-effecting tool (not carried out) or "run" it
    replay: Literal["stub", "run", "record"] = "stub"
    #: what a stubbed call tells the model (JSON)
    replay_result: Any = Field(default_factory=lambda: {"stubbed": True})
    #: the shopper must say yes before the tool runs (a pending action)
    confirm: bool = False
    #: the question asked, a format string over the arguments (None: the default wording)
    confirm_question: str | None = None
    #: later turns of the conversation that may decide, at most
    confirm_turns: int = Field(default=3, ge=1, le=100)
    #: minutes the action may wait for the shopper
    confirm_minutes: float = Field(default=15.0, gt=0, le=60 * 24 * 30)
    #: parameters whose value is a product id (SKU) of the catalogue, checked before the
    #: tool runs or its question is asked
    product_arguments: list[str] = Field(default_factory=list)

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_schema(v)  # Draft 2020-12 metaschema: a bad schema is a config error
        if v.get("type") != "object":
            raise ValueError(
                "expected an object schema (type = \"object\"): a tool's arguments are a "
                f"JSON object, got type {v.get('type')!r}"
            )
        props = v.get("properties")
        reserved = sorted(RESERVED_ARGUMENTS & set(props or {}))
        if reserved:
            raise ValueError(
                f"properties.{reserved[0]}: reserved (chainrun passes "
                f"{', '.join(sorted(RESERVED_ARGUMENTS))} to the callable itself)"
            )
        return v

    @field_validator("function")
    @classmethod
    def _function(cls, v: str | None) -> str | None:
        if v is not None and not _FUNCTION_RE.match(v):
            raise ValueError(
                f"expected \"module:callable\" (e.g. \"shop_tools:add_to_cart\"), got {v!r}"
            )
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return http_url(v)

    @model_validator(mode="after")
    def _one_target(self) -> ToolConfig:
        if (self.function is None) == (self.url is None):
            raise ValueError("set exactly one of function (\"module:callable\") or url")
        props = self.parameters.get("properties") or {}
        for name in self.product_arguments:
            spec = props.get(name)
            if not isinstance(spec, dict) or spec.get("type") not in ("string", "array"):
                raise ValueError(
                    f"product_arguments: {name!r} is no string or array parameter of the "
                    f"tool (parameters: {', '.join(sorted(props)) or 'none'})"
                )
        if self.confirm_question is not None:
            names = set(props)
            for field in question_fields(self.confirm_question):
                if field not in names:
                    known = ", ".join(sorted(names)) or "none"
                    raise ValueError(
                        f"confirm_question: {{{field}}} is no parameter of the tool "
                        f"(parameters: {known})"
                    )
        return self


def question_fields(template: str) -> list[str]:
    """The field names a ``confirm_question`` format string uses.

    Raises:
        ValueError: not a format string (an unmatched brace), or a field that is not a
            plain name (``{0}``, ``{sku.upper}``, ``{}``).
    """
    import string

    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"confirm_question: {e} (write {{{{ and }}}} for a brace)") from None
    fields = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"confirm_question: {{{name}}}: expected an argument's name")
        fields.append(name)
    return fields
