"""The config model every step kind extends, and routing on the turn state (``when``).

``[steps.NAME]`` of chainrun.toml is validated by the model of the step's ``kind``
(:class:`StepConfig` or a subclass a kind brings: ``LLMConfig`` in :mod:`.llm`,
``RetrieveConfig`` in :mod:`.retrieve`, ...). The models form a union discriminated on
``kind`` (:mod:`chainrun.config.chain`); a key the kind's model does not take is one
config error naming the key, the step and the kind.

A kind's own model extends :class:`StepConfig` and narrows ``kind`` to its name::

    class OrderLookupConfig(StepConfig):
        kind: Literal["order_lookup"] = "order_lookup"
        #: the shop's order API
        api_url: str

Routing: ``when = { label = ["product_search", "styling"] }`` runs the step only when
the turn-state field ``label`` is one of those values; ``when = { label = { not =
["returns"] } }`` runs it unless it is. Several fields: every one must match. A field
nothing has set (the step that writes it failed open, or was itself skipped) matches no
list, so a ``not`` list lets the step run. A step that does not run is logged
``skipped`` with the reason (:func:`route_problem`).

A turn may carry more than one label: a classifier that is not sure writes ``labels``
beside ``label`` (the label and its runners-up: :mod:`chainrun.steps.classify`). Then
``when = { label = [...] }`` runs the step when any of them is in the list, and ``{ not
= [...] }`` skips it only when every one is, so an unsure turn gets the material of
each route its labels point to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

#: One field's condition in ``when``: the values it runs on, or ``{not = [...]}``.
RouteValues = Annotated[list[str], Field(min_length=1)]
RouteMatch = RouteValues | dict[Literal["not"], RouteValues]


class Strict(BaseModel):
    """A config table: unknown keys are errors, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StepConfig(Strict):
    """One step of the chain (``[steps.NAME]``): the keys every kind takes.

    A kind registered with :func:`chainrun.steps.register_step_kind` is validated by its
    ``config_model`` (this class when it brings none). ``on_failure`` says what a missing
    answer (error, timeout, truncation) means: ``"open"`` continue unchecked,
    ``"closed"`` refuse the turn. When a step starts follows from what it reads (see
    :mod:`chainrun.graph`); ``after`` adds explicit edges, ``when`` routes.
    """

    #: whether a step of this kind can be the chain's ``answer_step`` (its output is
    #: streamed to the shopper); a kind that answers overrides it
    answers: ClassVar[bool] = False

    #: the step's kind: ``llm`` (the default), ``retrieve``, ``guard`` or a kind
    #: registered with ``chainrun.steps.register_step_kind``
    kind: str = Field(default="llm", min_length=1)
    #: what a missing answer means: ``open`` continue unchecked (the answer step: the
    #: turn ends ``error``), ``closed`` refuse the turn
    on_failure: Literal["open", "closed"] = "open"
    #: steps that must end before this one starts, besides what it reads
    after: list[str] = Field(default_factory=list)
    #: run only when turn-state fields match, e.g. ``{ label = ["product_search"] }`` or
    #: ``{ label = { not = ["returns"] } }``; otherwise the step is logged ``skipped``
    when: dict[str, RouteMatch] | None = None

    def provider_refs(self) -> dict[str, list[str]]:
        """The provider names this step's keys refer to, by key (``{"provider": [...],
        "hedge.targets": [...]}``); each must be a ``[providers.NAME]``. None here."""
        return {}

    def provider_names(self) -> list[str]:
        """The providers this step calls: its own first, then hedge targets (each once)."""
        return list(dict.fromkeys(n for names in self.provider_refs().values() for n in names))

    def chain_problem(self, name: str, answer_step: str) -> str | None:
        """What is wrong with this step in its chain, as ``KEY: reason`` (None: nothing);
        ``name``: the step's name, ``answer_step``: the chain's answer step."""
        return None

    def templates(self) -> dict[str, str]:
        """The step's prompt templates by key (``{"prompt": ..., "system": ...}``), whose
        ``{placeholders}`` are turn-state fields; none here."""
        return {}

    def added_fields(self) -> list[str]:
        """Turn-state fields this step's settings add (e.g. a field a key names), beside
        those its kind declares; none here."""
        return []

    def tool_refs(self) -> list[str]:
        """The tools (``[tools.NAME]`` names) this step's settings name; none here."""
        return []

    def route_fields(self) -> frozenset[str]:
        """The turn-state fields ``when`` routes on (the step waits for their writers)."""
        return frozenset(self.when or {})


def route_problem(when: Mapping[str, Any] | None, values: Mapping[str, Any]) -> str | None:
    """Why a step with this ``when`` does not run on a turn with these field values, in
    one line (None: it runs). ``values``: the turn-state fields set so far, by name."""
    for name, match in (when or {}).items():
        value = values.get(name)
        shown = "unset" if value is None else f"{value!r}"
        several = values.get("labels") if name == "label" else None
        candidates = (
            list(several) if isinstance(several, (list, tuple)) and several else [value]
        )
        if len(candidates) > 1:
            shown = f"{value!r} (unsure: {', '.join(map(str, candidates))})"
        if isinstance(match, dict):
            if all(v in match["not"] for v in candidates):
                return f"when: {name} is {shown}, one of {', '.join(match['not'])}"
        elif not any(v in match for v in candidates):
            return f"when: {name} is {shown}, not one of {', '.join(match)}"
    return None


__all__ = ["RouteMatch", "StepConfig", "Strict", "route_problem"]
