"""The eight checks of the slow-chain checklist, each judged from the run log.

Each ``check_*`` takes a :class:`~chainrun.audit.scope.Scope` and returns an
:class:`~chainrun.audit.report.Item` with a verdict (``pass | warn | fail |
not_enough_data``), evidence in plain words, the figures behind it (every statistic
with its n) and, where data is missing, what is missing and the command that would
produce it. Nothing passes by default. Percentiles and their intervals are the
order-statistic ones of :mod:`chainrun.statistics.intervals`; times are in ms. Every latency figure
follows the one rule of every summary (:func:`chainrun.analysis.summary.completed_turns`): it is
over the steps and calls of completed turns only (``Sample.done_*``), with the
cancelled, refused and errored turns counted beside it; the logging checks (item 1)
read every row.
"""

from __future__ import annotations

from collections.abc import Callable

from chainrun.audit.items.common import needed_n
from chainrun.audit.items.every_step_timed import check_timed
from chainrun.audit.items.grounding import check_grounding
from chainrun.audit.items.hedge_delay import check_hedge_delay
from chainrun.audit.items.latency_vs_tokens import check_latency_tokens
from chainrun.audit.items.live_vs_replay import check_live_vs_replay
from chainrun.audit.items.reasoning_effort import check_reasoning
from chainrun.audit.items.retrieval import check_retrieval
from chainrun.audit.items.win_rate import check_win_rate
from chainrun.audit.report import Item
from chainrun.audit.scope import Scope

CHECKS: tuple[Callable[[Scope], Item], ...] = (
    check_timed,
    check_reasoning,
    check_hedge_delay,
    check_win_rate,
    check_latency_tokens,
    check_retrieval,
    check_live_vs_replay,
    check_grounding,
)

__all__ = ["CHECKS", "needed_n"]
