"""The turn as a graph: which steps wait for which, derived from what they read and write.

Rules, for each step S in the configured ``order``:

* for each turn-state field S reads (other than ``message``, which every turn starts
  with), S waits for the nearest step before it in ``order`` that writes the field;
  if none does, for the steps after it that write it; if no step writes it at all,
  the config is refused;
* S waits for the previous writer of every field it writes (the last write wins in
  ``order``, whatever finishes first);
* ``after = [...]`` adds explicit edges;
* the fields a step's ``when`` routes on count as read: a routing step (e.g. classify,
  which writes ``label``) is on the critical path only of the steps that route on it
  (or read what it writes), and of the steps that wait for those.

``order`` stays the tie-break (steps that become ready together start in that order)
and the display order. A cycle is a config error naming the steps.

*Off the critical path*: a step that the answer step does not wait for (directly or
not), that does not wait for the answer and that cannot end the turn (not a guard, not
fail-closed, holds nothing back). With ``off_path = "after_answer"`` (the default) such
a step also waits for the answer step, so it does not compete with the answer for a
shared model server; with ``"when_ready"`` it starts as soon as its inputs exist.

Steps downstream of the answer step that do not hold the answer back and do not rewrite
it are *post-answer*: their time is not part of the shopper's wait.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from chainrun.errors import ConfigError
from chainrun.steps.base import INITIAL_FIELDS, Step


@dataclass(frozen=True)
class TurnGraph:
    """Dependencies between a chain's steps.

    Attributes:
        order: the steps in configured order (tie-break and display order).
        deps: per step, the steps it waits for.
        answer_step: the step whose output is the answer.
        post_answer: steps that only follow the answer (not part of the wait for it).
        deferred: off-path steps made to wait for the answer (``off_path = "after_answer"``).
    """

    order: tuple[str, ...]
    deps: Mapping[str, frozenset[str]]
    answer_step: str
    post_answer: frozenset[str]
    deferred: frozenset[str] = frozenset()

    def ancestors(self, name: str) -> frozenset[str]:
        """Every step ``name`` waits for (directly or not)."""
        out: set[str] = set()
        frontier = [name]
        while frontier:
            for d in self.deps[frontier.pop()]:
                if d not in out:
                    out.add(d)
                    frontier.append(d)
        return frozenset(out)

    def descendants(self, name: str) -> frozenset[str]:
        """Every step that waits (directly or not) for ``name``."""
        out: set[str] = set()
        frontier = [name]
        while frontier:
            current = frontier.pop()
            for s in self.order:
                if current in self.deps[s] and s not in out:
                    out.add(s)
                    frontier.append(s)
        return frozenset(out)


def _field_edges(name: str, i: int, order: Sequence[str], steps: Mapping[str, Step]) -> set[str]:
    step = steps[name]
    deps: set[str] = set(step.config.after)
    for f in sorted((step.reads | step.routes_on) - INITIAL_FIELDS):
        before = [o for o in order[:i] if f in steps[o].writes]
        later = [o for o in order[i + 1 :] if f in steps[o].writes]
        if before:
            deps.add(before[-1])
        elif later:
            deps.update(later)
        else:
            where = "its prompt" if f in step.reads else "its when"
            raise ConfigError(
                f"steps.{name}: reads {{{f}}}, which no step writes; "
                f"add a step that writes it or remove {{{f}}} from {where}"
            )
    for f in step.writes:
        before = [o for o in order[:i] if f in steps[o].writes]
        if before:
            deps.add(before[-1])
    return deps


def _why(a: str, b: str, steps: Mapping[str, Step]) -> str:
    fields = sorted((steps[a].reads | steps[a].routes_on) & steps[b].writes)
    if fields:
        return f"{a} reads {{{fields[0]}}}, which {b} writes"
    return f"{a} is after {b}"


def build_graph(
    steps: Mapping[str, Step],
    order: Sequence[str],
    answer_step: str,
    off_path: Literal["after_answer", "when_ready"] = "after_answer",
) -> TurnGraph:
    """Derive the turn's graph from the steps' reads/writes and ``after``.

    Args:
        off_path: when steps off the answer's critical path start (module text).

    Raises:
        ConfigError: a step reads a field no step writes, or the steps wait for each
            other in a cycle (one line naming the steps and the fields).
    """
    deps = {name: frozenset(_field_edges(name, i, order, steps)) for i, name in enumerate(order)}
    _check_acyclic(order, deps, steps)
    deferred: frozenset[str] = frozenset()
    if off_path == "after_answer":
        # an off-path step is no ancestor of the answer step, so waiting for it adds no cycle
        graph = TurnGraph(tuple(order), deps, answer_step, frozenset())
        on_path = graph.ancestors(answer_step) | graph.descendants(answer_step) | {answer_step}
        # a step that can end the turn must not end up after the answer, nor wait for
        # a step that does
        enders = {s for s in order if steps[s].may_end_turn}
        keep = enders.union(*(graph.ancestors(s) for s in enders))
        deferred = frozenset(s for s in order if s not in on_path and s not in keep)
        deps = {n: d | {answer_step} if n in deferred else d for n, d in deps.items()}
    graph = TurnGraph(tuple(order), deps, answer_step, frozenset())
    post = frozenset(
        s for s in graph.descendants(answer_step)
        if not steps[s].holds_answer and "answer" not in steps[s].writes
    )  # fmt: skip
    return TurnGraph(tuple(order), deps, answer_step, post, deferred)


def _check_acyclic(
    order: Sequence[str], deps: Mapping[str, frozenset[str]], steps: Mapping[str, Step]
) -> None:
    done: set[str] = set()
    while len(done) < len(order):
        ready = [s for s in order if s not in done and deps[s] <= done]
        if not ready:
            break
        done.update(ready)
    left = [s for s in order if s not in done]
    if not left:
        return
    # walk back along unfinished dependencies until a step repeats: that is the cycle
    path = [left[0]]
    while True:
        nxt = next(d for d in order if d in deps[path[-1]] and d not in done)
        if nxt in path:
            cycle = [*path[path.index(nxt) :], nxt]
            break
        path.append(nxt)
    reasons = "; ".join(_why(a, b, steps) for a, b in itertools.pairwise(cycle))
    raise ConfigError(
        f"steps {', '.join(cycle[:-1])} wait for each other in a cycle ({reasons}); "
        "change a prompt or an `after` so one of them can go first"
    )
