"""The LLM step: one model call per turn, hedged by the step's policy, streamed or not.

The call itself (attempts raced by the hedging engine, their ``calls`` rows, shadow
losers, tool rounds) is the step's :class:`~chainrun.steps.model_call.HedgedCall`; this
kind makes the turn's answer, label or verdict of it.

What the step writes follows from its config (:class:`LLMConfig`): the chain's
``answer_step`` writes ``answer``; a step with ``labels`` writes ``label`` (the first
label its answer names, "other" when none); any other LLM step is a check whose answer
becomes the turn's verdict for it (parsed JSON when it expects JSON, else
``{"text": ...}``). It reads the turn-state fields its templates name.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from chainrun.answer_json import answer_problem, parse_json_object
from chainrun.checks.config import GroundingConfig, LoopConfig, OutputCheckConfig
from chainrun.checks.holdback import HoldBack, OutputBlocked
from chainrun.checks.sentences import SentenceLimit
from chainrun.checks.stream import (
    CheckList,
    CheckMaker,
    apply_redactions,
    registered_check,
    registered_checks,
)
from chainrun.checks.verdict import MissingReason
from chainrun.errors import ConfigError, InvalidAnswer, ProviderTimeout
from chainrun.events import ProductsShown, TokenDelta
from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.retrieval.products import PRODUCTS_FIELD
from chainrun.steps.base import (
    ANSWER,
    LABEL,
    BuildContext,
    Step,
    StepContext,
    StepItem,
    StepNeeds,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.config import StepConfig
from chainrun.steps.facts import FactsConfig, after, closing, render_facts, with_lead
from chainrun.steps.grounding import AnswerGrounding, open_grounding
from chainrun.steps.model_call import AnswerCheck, AnswerStarted, CallResult, HedgedCall
from chainrun.steps.model_config import ModelStepConfig, template_fields
from chainrun.steps.tool_use import ToolRounds
from chainrun.tools import Tool

if TYPE_CHECKING:
    from chainrun.providers.base import ChatStream

#: The verdict a validating step (``on_reject`` refuse or replace) must give when its
#: config names no ``json_schema``: ``{"ok": bool, "reason": str}``.
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["ok", "reason"],
}

#: the answer's built-in checks, in their default order (the answer step's ``checks``)
ANSWER_CHECKS = ("output_check", "grounding", "loop", "sentences")


def _output_maker(oc: OutputCheckConfig) -> CheckMaker:
    """A maker of the output check ``oc`` (it reads no turn values)."""
    return lambda values: oc.make()


def missing_reason(error: BaseException) -> MissingReason:
    """Why a checking step has no verdict: ``timeout`` (its deadline or a stream timer),
    ``unparseable`` (it answered, but not a verdict of the required form), ``error``."""
    if isinstance(error, TimeoutError | ProviderTimeout):
        return "timeout"
    return "unparseable" if isinstance(error, InvalidAnswer) else "error"


def parse_label(text: str | None, labels: Sequence[str]) -> str:
    """The first of ``labels`` named in ``text`` (case, spaces and dashes ignored), or
    "other" when none is."""
    low = (text or "").lower().replace("-", "_").replace(" ", "_")
    found = [(low.find(lab), lab) for lab in labels if lab in low]
    return min(found)[1] if found else "other"


class LLMConfig(ModelStepConfig):
    """An ``llm`` step (``[steps.NAME]``, the default kind): a model call whose answer
    is the turn's answer (the ``answer_step``), its ``label`` (with ``labels``) or a
    verdict (any other step)."""

    answers: ClassVar[bool] = True

    kind: Literal["llm"] = "llm"
    #: an LLM step with labels writes the turn's ``label``: the first of these its
    #: answer names ("other" when none)
    labels: list[str] | None = None
    #: a checking step's rejection (its JSON verdict has ``"ok": false``): ``flag`` only
    #: records it; ``refuse`` answers ``reject_text`` (default: the chain's refusal);
    #: ``replace`` answers ``reject_text`` (required) instead. With refuse or replace
    #: a streamed answer is held back from the user until this step's verdict.
    on_reject: Literal["flag", "refuse", "replace"] = "flag"
    #: what the shopper is told when this step rejects the answer (see ``on_reject``)
    reject_text: str | None = None
    #: the answer step only: its checks, in the order they run on the answer (streamed
    #: or not; chainrun.checks.stream): ``output_check``, ``grounding``, ``loop`` (each
    #: with its table's settings) or the name of a registered check
    #: (chainrun.checks.stream.register_check); None: those of the three whose tables
    #: are set and enabled, in that order
    checks: list[str] | None = None
    #: the answer step only: pattern checks on its answer, in held-back windows
    output_check: OutputCheckConfig | None = None
    #: the answer step only: its product, price, stock and policy claims against the
    #: turn's own sources (chainrun.checks.grounding); None: off
    grounding: GroundingConfig | None = None
    #: the answer step only: a repeating answer stopped on the stream, its model call
    #: cancelled (chainrun.checks.loops); on by default
    loop: LoopConfig = Field(default_factory=LoopConfig)
    #: the tools (names of ``[tools.NAME]`` tables) the step's model may call; the step
    #: runs rounds of model call, tool calls and results until the model answers in text
    tools: list[str] = Field(default_factory=list)
    #: which of ``tools`` the step offers, by the turn's classify label; a label not
    #: named, or no label (classify failed), offers only the read-only ones (neither
    #: ``side_effects`` nor ``confirm``); the step then waits for ``label``
    tools_by_label: dict[str, list[str]] = Field(default_factory=dict)
    #: rounds of tool calls at most; a model that still asks for tools after them fails
    #: the step (``tool_rounds_exceeded``) under its ``on_failure``
    max_tool_rounds: int = Field(default=4, ge=1, le=32)
    #: a turn-state field the step writes with its tools' results (JSON by tool name:
    #: the last result of each), for the steps after it; None: none
    tool_results_field: str | None = None
    #: the answer step only: facts chainrun renders from the turn's data after the
    #: model's text (the products the answer is about, or the policy lines that answer
    #: the question; chainrun.steps.facts); None: the model writes the whole answer
    facts: FactsConfig | None = None

    @model_validator(mode="after")
    def _tools_by_label_are_tools(self) -> LLMConfig:
        for label, names in self.tools_by_label.items():
            extra = [n for n in names if n not in self.tools]
            if extra:
                close = difflib.get_close_matches(extra[0], self.tools, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"tools_by_label.{label}: {extra[0]!r} is not one of the step's tools "
                    f"{self.tools}{hint}"
                )
        if self.tool_results_field is not None and not self.tools:
            raise ValueError("tool_results_field: the step has no tools")
        return self

    @model_validator(mode="after")
    def _checks_are_checks(self) -> LLMConfig:
        if self.checks is None:
            return self
        known = [*ANSWER_CHECKS, *registered_checks()]
        for i, name in enumerate(self.checks):
            if name not in known:
                raise ValueError(f"checks[{i}]: {name!r} is no check; expected one of "
                                 f"{', '.join(known)}")  # fmt: skip
            if name in self.checks[:i]:
                raise ValueError(f"checks[{i}]: {name!r} is listed twice")
        off = [n for n in ("grounding", "loop") if n in self.checks
               and (cfg := getattr(self, n)) is not None and not cfg.enabled]  # fmt: skip
        if off:
            raise ValueError(f"checks: {off[0]!r} is listed but {off[0]}.enabled = false")
        return self

    def check_names(self) -> list[str]:
        """The answer's checks in order: ``checks``, or the built-ins whose tables are
        set and enabled (``output_check``, ``grounding``, ``loop``; ``sentences`` with
        ``facts.sentences``)."""
        if self.checks is not None:
            return list(self.checks)
        on = {"output_check": self.output_check is not None,
              "grounding": self.grounding is not None and self.grounding.enabled,
              "loop": self.loop.enabled,
              "sentences": self.facts is not None and self.facts.enabled
                           and self.facts.sentences is not None}  # fmt: skip
        return [name for name in ANSWER_CHECKS if on[name]]

    def tool_refs(self) -> list[str]:
        """The step's ``tools``."""
        return list(self.tools)

    def added_fields(self) -> list[str]:
        """``tool_results_field``, when set."""
        return [self.tool_results_field] if self.tool_results_field else []

    @model_validator(mode="after")
    def _replace_needs_text(self) -> LLMConfig:
        if self.on_reject == "replace" and not self.reject_text:
            raise ValueError(
                "reject_text: on_reject = 'replace' needs the safe answer to show instead"
            )
        return self

    def chain_problem(self, name: str, answer_step: str) -> str | None:
        """``output_check`` and ``checks`` are only for the answer step; ``facts`` only
        for the answer step."""
        if self.output_check is not None and name != answer_step:
            return (
                "output_check: only the answer step's answer is checked this way "
                f"(answer_step is {answer_step!r})"
            )
        if self.checks and name != answer_step:
            return f"checks: only the answer step's answer is checked (answer_step is " \
                   f"{answer_step!r})"
        if self.facts is not None and name != answer_step:
            return f"facts: only the answer step renders facts (answer_step is {answer_step!r})"
        return None


def _sentence_limit_maker(limit: int) -> CheckMaker:
    """The ``sentences`` check's maker: a fresh :class:`SentenceLimit` per answer."""

    def make(values: Mapping[str, Any]) -> SentenceLimit:
        return SentenceLimit(limit)

    return make


@register_step_kind
class LLMStep(Step):
    """A model call (``kind = "llm"``), hedged per ``[steps.NAME.hedge]``: the step's
    :class:`~chainrun.steps.model_call.HedgedCall` (``self.call``) with what the kind
    makes of its answer (the answer, a label or a verdict; the output check; tools)."""

    kind = "llm"
    config_model: ClassVar[type[StepConfig]] = LLMConfig
    config: LLMConfig
    state_fields = (ANSWER, LABEL)

    def __init__(self, name: str, config: LLMConfig) -> None:
        super().__init__(name, config)
        #: the step's tools (its config's ``tools``), by name, once opened
        self.tools: dict[str, Tool] = {}
        self.is_answer = False
        # a verdict that can refuse or replace the answer must be seen before the answer
        self.holds_answer = config.on_reject != "flag"
        #: the verdict's JSON Schema, checked with jsonschema: the configured one, or
        #: {"ok": bool, "reason": str} for a validating step (refuse or replace)
        self.answer_schema = config.json_schema or (
            VERDICT_SCHEMA if config.on_reject != "flag" else None
        )
        #: the answer's grounding check (built by open() for the answer step)
        self.grounding: AnswerGrounding | None = None
        #: the answer's checks, in order: (name, maker of a fresh check for one answer
        #: from the turn-state values); built by open() for the answer step
        self.check_makers: list[tuple[str, CheckMaker]] = []
        #: the facts the answer renders from data (None: none, the model writes it all)
        self.facts = config.facts if config.facts is not None and config.facts.enabled else None
        #: MiniLM for the policy lines the answer quotes (``facts``; None: shared words)
        self._embedder = MiniLMEmbedder() if self.facts is not None else None
        #: the step's hedged model call
        self.call = HedgedCall(
            name, config, answer_problem=self._answer_problem if self.wants_json else None
        )

    @property
    def reads(self) -> frozenset[str]:
        fields = template_fields(*self.config.templates().values())
        if self.config.tools_by_label:
            fields |= {"label"}  # the label picks the tools the step offers
        return fields

    @property
    def writes(self) -> frozenset[str]:
        cfg = self.config
        extra = {cfg.tool_results_field} if cfg.tool_results_field else set()
        if self.is_answer:
            return frozenset({"answer", *extra})
        if cfg.labels:
            return frozenset({"label", *extra})
        return frozenset(extra)

    def needs(self) -> StepNeeds:
        """What its model call needs (:meth:`HedgedCall.needs`)."""
        return self.call.needs()

    @property
    def wants_json(self) -> bool:
        return self.config.expect_json or self.answer_schema is not None

    def bind(self, answer_step: str) -> None:
        """Tell the step whether it is the chain's answer step (before the graph is built)."""
        self.is_answer = self.name == answer_step

    async def open(self, ctx: BuildContext) -> None:
        await self.call.open(ctx)
        self.tools = {name: ctx.tools[name] for name in self.config.tools}
        if self.is_answer:
            self.check_makers = await self._open_checks(ctx)

    async def _open_checks(self, ctx: BuildContext) -> list[tuple[str, CheckMaker]]:
        """The answer's checks (:meth:`LLMConfig.check_names`) with their makers: the
        built-ins from their tables (the grounding check reads the catalogue and the
        policy now), the others from the registry."""
        cfg = self.config
        makers: list[tuple[str, CheckMaker]] = []
        for name in cfg.check_names():
            if name == "output_check":
                oc = cfg.output_check or OutputCheckConfig()
                makers.append((name, _output_maker(oc)))
            elif name == "grounding":
                self.grounding = await open_grounding(cfg.grounding or GroundingConfig(), ctx)
                makers.append((name, self.grounding.stream_check))
            elif name == "loop":
                makers.append((name, lambda values: cfg.loop.make()))
            elif name == "sentences":
                limit = (cfg.facts.sentences if cfg.facts else None) or 1
                makers.append((name, _sentence_limit_maker(limit)))
            else:
                make = registered_check(name)
                if make is None:  # registered when the config was read, since removed
                    raise ConfigError(f"steps.{self.name}.checks: no check {name!r} is "
                                      "registered")  # fmt: skip
                makers.append((name, make))
        return makers

    def check_list(self, values: Mapping[str, Any]) -> CheckList:
        """Fresh checks for one answer of a turn whose state holds ``values`` (the
        turn-state fields by name, ``message`` among them)."""
        return CheckList([(name, make(values)) for name, make in self.check_makers])

    async def aclose(self) -> None:
        await self.call.aclose()

    def offered_tools(self, state: TurnState) -> list[str]:
        """The tools the step offers for ``state`` (names, in ``tools`` order).

        Without ``tools_by_label``, all of ``tools``. With it, ``tools_by_label[label]``
        when the turn's label is named there; else the route is unknown (classify failed
        and left no label, or its label is one the table does not name) and the step
        fails safe: only the tools that act on nothing (``side_effects = false`` and
        ``confirm = false``), so a turn nobody routed cannot fill a cart or place an
        order."""
        by_label = self.config.tools_by_label
        if not by_label:
            return list(self.config.tools)
        if state.label is not None and state.label in by_label:
            return list(by_label[state.label])
        return [n for n in self.config.tools
                if not (self.tools[n].config.side_effects or self.tools[n].config.confirm)]

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        cfg = self.config
        tools = None
        if self.tools:
            tools = ToolRounds(
                self.name, self.tools, self.offered_tools(state),
                max_rounds=cfg.max_tool_rounds, turn_tools=ctx.tools,
                state=state.prompt_vars(), t0=ctx.started,
            )  # fmt: skip
        checks = None
        made: list[CheckList] = []  # this turn's checks, one list per streamed round
        if cfg.stream and self.check_makers:
            checks = AnswerCheck(
                # the checks read the turn's state (and the tool results so far)
                make=lambda results: self._holdback(state, results if tools else None, made),
                record=lambda ctx_, engine, winner, blocked: self._record_checks(
                    ctx_, made[-1], engine, winner, blocked),
            )  # fmt: skip
        shown = checks is not None or tools is not None
        request = self.call.request(state, cache_owner=self.is_answer)
        lead_text = await self._lead_text(state) if self.is_answer else ""
        if lead_text:  # written at the end of the prompt for the model to continue
            request.messages[-1]["content"] += lead_text
        lead_text = lead_text.lstrip()  # the answer starts with the lead's first word
        lead = lead_text  # until the model's first text joins it
        unsent = lead_text  # until it reached the shopper
        call: CallResult | None = None
        items = self.call.run(ctx, request, checks=checks, tools=tools,
                              announce_start=bool(lead))
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, CallResult):
                    call = item
                    continue
                if isinstance(item, AnswerStarted):
                    # the model is answering: the lead (chainrun's words from the turn's
                    # data, no claim to check) goes out now, not with its first sentence
                    if unsent:
                        yield TokenDelta(step=self.name, text=unsent)
                        unsent = ""
                    continue
                if lead and isinstance(item, TokenDelta) and item.step == self.name:
                    replacements = made[-1].replacement_texts() if made else ()
                    text = with_lead(lead, item.text, replacements)
                    if text != after(lead, item.text):  # a check's words, not the model's
                        lead_text = lead.rstrip() + closing(lead)
                    if not unsent:  # the lead was shown: what follows it
                        text = text[len(lead):]
                    item, lead, unsent = TokenDelta(step=self.name, text=text), "", ""
                yield item
        assert call is not None
        result = await self._result(ctx, call, shown=shown, state=state, made=made)
        if self.is_answer and self.facts is not None:
            async for fact in self._with_facts(result, state, ctx, self.facts,
                                               lead_text, unsent):
                yield fact
        else:
            yield result

    async def _lead_text(self, state: TurnState) -> str:
        """The lead the answer starts with (" " and ``facts.lead``'s words, filled from
        the turn: :meth:`FactsConfig.render_lead`), or ""."""
        facts = self.facts
        if (facts is None or not facts.lead or self.tools
                or self.call.history_layout == "messages"):
            return ""
        shown = state.get(PRODUCTS_FIELD)
        lead = await facts.render_lead(
            message=str(state.get("message") or ""),
            shown=tuple(shown) if isinstance(shown, tuple | list) else (),
            policy=str(state.get("policy") or ""), embedder=self._embedder,
        )  # fmt: skip
        return " " + lead if lead else ""

    async def _with_facts(
        self, result: StepResult, state: TurnState, ctx: StepContext, facts: FactsConfig,
        lead: str, unsent_lead: str,
    ) -> AsyncGenerator[StepItem, None]:
        """``result`` with the lead before the model's answer and the facts rendered
        after it (:func:`~chainrun.steps.facts.render_facts`): the ``products`` event,
        the facts' text as the answer's last piece, the answer and the step's
        ``detail["facts"]`` (``text``, product ``ids``, ``quoted`` lines) with them.
        ``lead``: the answer's lead (:meth:`_lead_text`); ``unsent_lead``: the lead when
        no token of the answer carried it (the answer came whole: it is its start). A
        result with no answer (an error, a refusal) passes unchanged."""
        answer = result.updates.get("answer") if result.error is None else None
        if not isinstance(answer, str) or result.refuse:
            yield result
            return
        if lead and not answer.startswith(lead):
            answer = after(lead, answer)
            if unsent_lead:
                yield TokenDelta(step=self.name, text=unsent_lead)
        shown = state.get(PRODUCTS_FIELD)
        rendered = await render_facts(
            facts, prose=answer, message=str(state.get("message") or ""),
            shown=tuple(shown) if isinstance(shown, tuple | list) else (),
            policy=str(state.get("policy") or ""), embedder=self._embedder,
        )  # fmt: skip
        if rendered.text:
            if rendered.products:
                yield ProductsShown(self.name, tuple(p.as_json() for p in rendered.products))
            piece = (closing(answer) + "\n\n" if answer.strip() else "") + rendered.text
            yield TokenDelta(step=self.name, text=piece)
            answer += piece
        if rendered.text or lead:
            ctx.row.detail = {**(ctx.row.detail or {}), "facts": {
                "text": rendered.text, "ids": [p.id for p in rendered.products],
                "quoted": len(rendered.quoted), "lead": lead.strip()}}  # fmt: skip
        result.updates["answer"] = answer
        yield result

    def _holdback(
        self, state: TurnState, results: Mapping[str, Any] | None, made: list[CheckList]
    ) -> HoldBack:
        """A hold-back engine running the answer's checks on a round's stream (they read
        the turn's state, with ``results``, the tool results so far, as
        ``tool_results``); the checks are appended to ``made``."""
        values = {"message": state.message, **state.values}
        if results is not None:
            values["tool_results"] = json.dumps(results)
        checks = self.check_list(values)
        made.append(checks)
        return HoldBack(checks, checks.window_tokens)

    async def _check_whole(
        self, ctx: StepContext, state: TurnState, text: str
    ) -> tuple[StepResult | None, str]:
        """The answer's checks on a whole (unstreamed) answer ``text``, fed once as the
        end of the answer: their verdicts in the row's ``detail``; (a refusal or the
        blocking check's text, else None; the answer as the checks left it)."""
        checks = self.check_list({"message": state.message, **state.values})
        verdict = await checks(text, final=True)
        docs = checks.finish(checks.figures(None))
        ctx.row.detail = {**(ctx.row.detail or {}), **docs,
                          "checks": [n for n, _ in checks.checks]}  # fmt: skip
        if not verdict.ok:
            refusal_text, replaced = checks.on_block()
            return StepResult(verdict=docs, refuse=True, refusal_text=refusal_text,
                              replaced=replaced), text  # fmt: skip
        return None, apply_redactions(text, verdict.redactions)

    def _record_checks(
        self, ctx: StepContext, checks: CheckList, engine: HoldBack, winner: ChatStream | None,
        blocked: OutputBlocked | None,
    ) -> None:  # fmt: skip
        """Each check's verdict (:meth:`~chainrun.checks.stream.StreamCheck.finish`) in
        the step's ``detail`` under its name, with ``checks``, the names in order; the
        stream's generation speed from the winner's chunk gaps."""
        gaps = winner.timer.token_chunk_gaps_ms if winner is not None else []
        tokens_per_s = 1000.0 * len(gaps) / sum(gaps) if gaps and sum(gaps) > 0 else None
        figures = checks.figures(
            engine.stats, blocked_tokens=blocked.released_tokens if blocked else None,
            tokens_per_s=tokens_per_s,
        )  # fmt: skip
        ctx.row.detail = {**(ctx.row.detail or {}), **checks.finish(figures),
                          "checks": [n for n, _ in checks.checks]}  # fmt: skip

    def _answer_problem(self, text: str | None) -> str | None:
        """Why ``text`` is not an acceptable answer of a JSON step (None: it is): not a
        JSON object, breaks :attr:`answer_schema` (jsonschema, Draft 2020-12), or, for a
        validating step, has no boolean ``ok`` to act on."""
        problem = answer_problem(text, self.answer_schema)
        if problem is None and self.config.on_reject != "flag":
            parsed = parse_json_object(text) or {}
            if not isinstance(parsed.get("ok"), bool):
                problem = "the verdict has no boolean 'ok' to act on"
        return problem

    async def _result(
        self, ctx: StepContext, call: CallResult, *, shown: bool, state: TurnState | None = None,
        made: list[CheckList] | None = None,
    ) -> StepResult:
        """The step's result from its call's; ``shown``: the answer is the text that
        reached the shopper (through the output check, or over rounds of tools). An
        answer that was not streamed is grounded here, whole (``state``: the turn's
        sources). An answer that was not streamed goes through the answer's checks here,
        whole (``state``: the turn's)."""
        cfg = self.config
        whole: str | None = None  # an unstreamed answer, as its checks left it
        if (self.is_answer and not cfg.stream and self.check_makers
                and state is not None and call.text is not None and call.error is None):
            refusal, whole = await self._check_whole(ctx, state, call.text)
            if refusal is not None:
                return refusal
        detail = ctx.row.detail or {}
        checked = {k: detail[k] for k, _ in self.check_makers if k in detail}
        blocked = call.blocked
        if blocked is not None:
            refusal_text, replaced = made[-1].on_block() if made else (None, False)
            return StepResult(verdict=checked, refuse=True, refusal_text=refusal_text,
                              replaced=replaced)  # fmt: skip
        error, text = call.error, call.text
        if error is not None or text is None:
            if not self.is_answer and not cfg.labels and self.wants_json and error is not None:
                # a missing verdict, with its reason (never silently ok): the step's
                # on_failure decides whether the turn goes on
                missing = {"ok": None, "missing": missing_reason(error), "problem": str(error)}
                return StepResult(error=error, verdict=missing)
            return StepResult(error=error)
        if self.is_answer:
            answer = "".join(call.shown) if shown and cfg.stream else (
                whole if whole is not None else text)
            result = StepResult(updates={"answer": answer})
            redacted = (checked.get("output_check") or {}).get("redactions")
            if redacted or any(k != "output_check" for k in checked):
                result.verdict = checked  # with the checks' redactions
        elif cfg.labels:
            result = StepResult(updates={"label": parse_label(text, cfg.labels)})
        else:
            parsed = parse_json_object(text) if self.wants_json else None
            verdict = parsed if parsed is not None else {"text": text}
            if parsed is not None and parsed.get("ok") is False and cfg.on_reject != "flag":
                # refuse: the configured text or the chain's refusal; replace: the safe answer
                return StepResult(verdict=verdict, refuse=True, refusal_text=cfg.reject_text,
                                  replaced=cfg.on_reject == "replace")  # fmt: skip
            result = StepResult(verdict=verdict)
        if cfg.tool_results_field:
            result.updates[cfg.tool_results_field] = json.dumps(call.tool_results,
                                                                ensure_ascii=False)
        return result


__all__ = ["ANSWER_CHECKS", "LLMConfig", "LLMStep", "parse_label", "template_fields"]
