"""The policy step (``kind = "policy"``): the shop's policy text for the turn's label.

It reads the classify ``label`` and writes ``policy``: the section of the shop's policy
file (:mod:`chainrun.shop_policy`) for that label (for an unsure turn, the sections of
each of its ``labels`` that has one, the label's first), as the answer's prompt shows it
(``{policy}``; ``""`` for a label with no section). With ``lines`` set, a section keeps
its title and only its ``lines`` lines nearest the shopper's message (MiniLM's cosine,
else shared words: :func:`chainrun.steps.facts.line_scores`), in the section's order:
every line the prompt holds is a prompt token the model server computes before the
answer's first token (about 2.5 ms each for the embedded model on 2 cores), and a
conversation's prompt cache holds none of a section the conversation had not reached.
No model call and no search: a lookup of microseconds, or one MiniLM forward of the
message that the classify step has already made (its vector is kept). In the default
chain it is the route of order-status, returns, sizing and other questions
(``when = { label = [...] }``), which the answer step then answers from this text
without a product search.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Literal

from pydantic import Field

from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.shop_policy import PolicySection, load_policy, policy_text
from chainrun.steps.base import (
    BuildContext,
    StateField,
    Step,
    StepContext,
    StepItem,
    StepResult,
    TurnState,
    register_step_kind,
)
from chainrun.steps.config import StepConfig, route_problem
from chainrun.steps.facts import line_scores, policy_lines

__all__ = ["PolicyConfig", "PolicyStep"]


class PolicyConfig(StepConfig):
    """A ``policy`` step (``[steps.NAME]`` with ``kind = "policy"``)."""

    kind: Literal["policy"] = "policy"
    #: the shop's policy file: TOML with a table per label, each a title and a text
    #: (None: the sample shop's, chainrun/data/shop_policy.toml)
    file: str | None = Field(default=None, min_length=1)
    #: of each section, the lines the turn keeps: the ones nearest the shopper's message,
    #: in the section's order (unset: the whole section)
    lines: int | None = Field(default=None, ge=1)


def policy_again(text: str, seen: str) -> str:
    """The policy text for a prompt whose history (``seen``) already shows it: its
    sections the history holds word for word are named by their first line (the
    section's title) instead of repeated."""
    parts = [p for p in text.split("\n\n") if p.strip()]
    out = [p.split("\n", 1)[0] + " (as above)" if p in seen and "\n" in p else p for p in parts]
    return "".join(p + "\n\n" for p in out)


@register_step_kind
class PolicyStep(Step):
    """The policy section of the turn's label (see the module text)."""

    kind = "policy"
    config_model = PolicyConfig
    config: PolicyConfig
    state_fields = (
        StateField("policy", "the shop's policy text for the turn's label", empty="",
                   again=policy_again),
    )

    def __init__(self, name: str, config: PolicyConfig) -> None:
        super().__init__(name, config)
        #: the policy file's sections by label, read once when the chain is built
        self.sections: dict[str, PolicySection] = load_policy(config.file)
        self._embedder = MiniLMEmbedder() if config.lines is not None else None

    def beside(self, steps: Mapping[str, Step]) -> str | None:
        """``file: ...`` when the policy file does not fit the chain's classify labels:
        a table that names no label (no turn would ever read it), or a label this step's
        ``when`` routes here without a table (its turns would get no policy text, and
        the model would answer them from nothing). None without a classify step that
        lists its labels."""
        labels = [str(lab) for s in steps.values() if s.kind == "classify"
                  for lab in (getattr(s.config, "labels", None) or [])]  # fmt: skip
        if not labels:
            return None
        where = self.config.file or "chainrun/data/shop_policy.toml"
        for table in self.sections:
            if table not in labels:
                return (f"file: {where}: [{table}] names no classify label; expected a "
                        f"table per label, one of {', '.join(labels)}")  # fmt: skip
        routed = (self.config.when or {}).get("label")
        for label in routed if isinstance(routed, list) else []:
            if label in labels and label not in self.sections:
                return (f"file: {where}: no [{label}] table, and this step's `when` routes "
                        f"{label!r} turns here: add the table, or take the label out of "
                        "`when`")  # fmt: skip
        return None

    async def open(self, ctx: BuildContext) -> None:
        """Embed the sections' lines now (one MiniLM batch, kept as the turns'
        messages are: :meth:`MiniLMEmbedder.embed_kept`), not in the first turn of each
        section (about 200 ms before its answer on 2 cores); without MiniLM, nothing."""
        if self._embedder is not None and self._embedder.available():
            await self._embedder.embed_kept(
                [line for section in self.sections.values() for line in section.lines])

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"label"})

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({"policy"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        label = state.label
        several = state.get("labels")
        labels: list[str] = (
            [str(v) for v in several]
            if isinstance(several, (list, tuple)) and several
            else ([label] if label else [])
        )
        # an unsure turn: the sections of each of its labels that has one and that this
        # step's route takes, the label's first
        found = [
            lab
            for lab in dict.fromkeys(labels)
            if lab in self.sections
            and (lab == label or route_problem(self.config.when, {"label": lab}) is None)
        ]
        message = str(state.get("message") or "")
        text = "".join([await self._section(lab, message) for lab in found])
        ctx.row.output = (found[0] if len(found) == 1 else ",".join(found)) if found else None
        section = self.sections.get(label or "")
        ctx.row.detail = {"label": label, "section": section.title if section else None}
        if self.config.lines is not None:
            ctx.row.detail["lines"] = len(policy_lines(text))
        if len(labels) > 1:
            ctx.row.detail["labels"] = labels
            ctx.row.detail["sections"] = [self.sections[lab].title for lab in found]
        ctx.row.duration_ms = ctx.elapsed_ms()
        yield StepResult(updates={"policy": text})

    async def _section(self, label: str, message: str) -> str:
        """``label``'s section as the turn keeps it (the module text): whole, or its
        title and its ``lines`` lines nearest ``message``."""
        limit = self.config.lines
        lines = self.sections[label].lines
        if limit is None or len(lines) <= limit:
            return policy_text(self.sections, label)
        scores, _ = await line_scores(message, lines, self._embedder)
        nearest = sorted(range(len(lines)), key=lambda i: -scores[i])[:limit]
        return policy_text(self.sections, label, keep=nearest)
