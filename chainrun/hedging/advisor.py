"""Hedging that keeps itself right at run time: the delay advisor and the back-off.

:class:`HedgeController` decides, before each call of a call site, the hedge delay and
the number of attempts in force, and after each call counts whether the hedge paid.

**The advisor online** (``delay = "auto"``): every ``advise_interval_s`` seconds (sooner
only when the window has doubled since the last advice, as it does right after warm-up)
the site re-derives its delay d and attempts k from its own latency window (the
Kaplan-Meier survival S of one call, :mod:`chainrun.hedging.window`), with copies taken
as independent draws of the same call (Dean and Barroso, "The Tail at Scale", CACM
56(2), 2013: copies go to independent replicas). Attempt i (0-based) starts at i·d, so

* extra calls per call = sum over j = 1..k-1 of prod over i < j of S((j - i)·d): copy j
  is sent when every earlier attempt is still out at j·d (gRFC A6's schedule);
* P(no answer by t) = prod over the attempts started before t of S(t - i·d).

The candidate (d, k) pairs are the window's p50..p99.9 (of every call, and of the calls
that answered in sight) and the ends of its clusters
(an answer time followed by a gap of at least twice itself: the fast path of a bimodal
call), with k from 2 to ``max_attempts`` and (k - 1)·d before the deadline. Among those
whose predicted extra calls stay within :data:`LOAD_HEADROOM` of ``max_extra_load`` (so
that the load budget rarely refuses a copy), the objective picks: ``target = "p99"``
the least predicted mean of the slowest 1% of calls (the expected shortfall at 99%,
R. T. Rockafellar and S. Uryasev, "Optimization of conditional value-at-risk", Journal
of Risk 2(3), 2000: never below the p99, and it counts how far the deeper tail reaches,
so a third attempt that rescues the calls whose first two copies both drew a slow path
is worth its small load), ``target = "in_deadline"`` the largest predicted share
answered within the deadline; near-ties (:data:`P99_TIE`, :data:`IN_TIME_TIE`) go to
fewer extra calls. Hysteresis: the
setting in force is kept unless it breaks the load limit by more than
:data:`OVER_LIMIT_BAND` or the best candidate beats it by more than the tie margins and
moves the delay by more than :data:`MIN_DELAY_MOVE` of itself. It is the model of
``chainrun advise`` (which replays the log offline and also models the work W a copy
shares) without W.

**Backing off** when hedging stops paying: a call's time is work W (shared by both
copies) plus serving noise N (per copy); a copy sent at d wins only when N1 - N2 > d
(Dean and Barroso), so once noise is small the hedge fires on long answers and loses.
When the last ``min_fires`` fires that sent a copy won less than ``min_win_rate`` of
the time (the audit's rule for a hedge that does not pay; fires whose call nobody
answered are not counted: no attempt lost to another), the site stops arming its
calls except a random share that keeps about ``probe_rate`` extra calls per call: the
probes. When ``probe_fires`` probe fires in a row window win at least
``resume_win_rate`` of the time (serving noise is back, say after a provider change),
it hedges again. Finagle's ``BackupRequestFilter`` and gRPC's retry throttling (gRFC
A6) stop backups by load; this stops them by their measured win rate.

Every decision is a :class:`HedgeChange` (time, old, new, why): in
:attr:`HedgeController.history` and on the :class:`~chainrun.hedging.HedgeOutcome` of the
first call it applies to, for the caller to log.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from chainrun.hedging.outcome import HedgeChange, HedgeOutcome, HedgeSetting, Mode
from chainrun.hedging.policy import HedgePolicy

if TYPE_CHECKING:  # NumPy (the window's) is not loaded by readers of logged changes
    from chainrun.hedging.window import LatencyWindow, Survival

#: the advisor plans extra calls up to this share of ``max_extra_load`` (the token bucket
#: holds 100 calls' deposits, so bursts above the average are absorbed, and a copy it
#: refuses waits for the next tick rather than being lost)
LOAD_HEADROOM = 1.0
#: the setting in force is moved for load only when its predicted extra calls exceed the
#: limit by more than this factor (the budget refuses the excess meanwhile): estimates of
#: a 0.1 fire rate move by +-0.01 from one window to the next
OVER_LIMIT_BAND = 1.1
#: steps of the integral behind :attr:`Prediction.tail_mean_ms`
TAIL_STEPS = 100
#: candidates whose predicted tail (ms) is within this share of the best count as tied
P99_TIE = 0.1
#: candidates whose predicted share in time is within this of the best count as tied
IN_TIME_TIE = 0.002
#: the advisor moves a delay only by more than this share of the delay in force
MIN_DELAY_MOVE = 0.1
#: percentiles of one call tried as delays (plus the ends of its clusters)
CANDIDATE_PERCENTILES = (50, 60, 70, 75, 80, 85, 88, 90, 92, 94, 95, 96, 97, 98, 99, 99.5, 99.9)


@dataclass(frozen=True)
class CallPlan:
    """The setting for one call: delay (None: not armed), attempts, whether it is a
    probe, and the changes made just before it (to be logged with it)."""

    delay_ms: float | None
    max_attempts: int
    probe: bool
    changes: tuple[HedgeChange, ...]


@dataclass(frozen=True)
class Prediction:
    """The advisor's model of one (delay, attempts): ms and shares (0-1)."""

    delay_ms: float
    attempts: int
    extra_calls: float
    fire_rate: float
    p99_ms: float
    p999_ms: float
    #: the mean latency of the slowest 1% (expected shortfall at 99%), calls capped at
    #: the deadline: what ``target = "p99"`` minimises
    tail_mean_ms: float
    in_time: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "delay_ms": round(self.delay_ms, 1),
            "attempts": self.attempts,
            "extra_calls_per_call": round(self.extra_calls, 4),
            "fire_rate": round(self.fire_rate, 4),
            "p99_ms": round(self.p99_ms, 1) if math.isfinite(self.p99_ms) else None,
            "p999_ms": round(self.p999_ms, 1) if math.isfinite(self.p999_ms) else None,
            "slowest_1pct_mean_ms": round(self.tail_mean_ms, 1),
            "in_time": None if self.in_time is None else round(self.in_time, 4),
        }


def predict(
    survival: Survival, delay_ms: float, attempts: int, deadline_ms: float | None
) -> Prediction:
    """The model of the module text for one (delay, attempts) on ``survival``.

    The mass past the last answer is taken to never answer
    (:meth:`Survival.never_past_tail`): right after a start, or on a call whose slow
    path is only ever cut short, the window cannot say when those calls would answer,
    and assuming "soon" (the window's own convention for a percentile, a lower bound)
    would promise answers in time that no copy delivers. ``p99_ms`` (``p999_ms``) is then
    ``inf`` when more than 1% (0.1%) of calls never answer under the setting.
    """
    s = survival.never_past_tail
    extra, still_out = 0.0, 1.0
    for j in range(1, attempts):
        still_out = math.prod(s((j - i) * delay_ms) for i in range(j))
        extra += still_out
    fire = s(delay_ms) if attempts > 1 else 0.0

    def late(t: float) -> float:
        return math.prod(s(t - i * delay_ms) for i in range(attempts) if i * delay_ms < t)

    last = survival.times[-1] if survival.times else 0.0

    def quantile(share_late: float) -> float:
        # P(late) falls with t: bisect to 0.1 ms for the first t with P(late) <= share
        lo, hi = 0.0, last + 1.0 + (attempts - 1) * delay_ms
        if late(hi) > share_late:  # more calls than that never answer
            return math.inf
        while hi - lo > 0.1:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if late(mid) <= share_late else (mid, hi)
        return hi

    in_time = None if deadline_ms is None else 1.0 - late(deadline_ms)
    p99 = quantile(0.01)
    # the mean of the slowest 1%: p99 + (1 / 0.01) x the integral of P(late) past the p99,
    # a call ending at the deadline (or, without one, at the end of what the window saw)
    end = deadline_ms if deadline_ms is not None else last + (attempts - 1) * delay_ms
    if not math.isfinite(p99) or p99 >= end:
        tail_mean = max(p99, end) if math.isfinite(p99) else end
    else:
        step = (end - p99) / TAIL_STEPS
        area = sum(late(p99 + (i + 0.5) * step) for i in range(TAIL_STEPS)) * step
        tail_mean = p99 + area / 0.01
    return Prediction(
        delay_ms, attempts, extra, fire, p99, quantile(0.001), tail_mean, in_time
    )


def candidate_delays(s: Survival, deadline_ms: float | None) -> list[float]:
    """Delays to try, in ms: the window's p50..p99.9 (of all calls, and of those that
    answered in sight), and, for a clustered distribution,
    just past the end of each cluster (an answer time whose next answer is at least
    twice as late, or the last answer when some calls never answered); all above 0 and
    before the deadline."""
    out: set[float] = set()
    answered = 1.0 - s.tail_share  # the mass that answered within what the window saw
    for p in CANDIDATE_PERCENTILES:
        for share in (p / 100, p / 100 * answered):
            # of all calls, and of the calls that answered: when half the calls never
            # answer in sight (a bimodal call cut at its deadline), the first has no p60
            t = _quantile(s, share)
            if t is not None:
                out.add(t)
    times = s.times
    for a, b in itertools.pairwise(times):
        if a > 0 and b >= 2 * a:
            out.add(a * 1.001)
    if times and s.tail_share > 0:  # the last answer, with calls that never answered after it
        out.add(times[-1] * 1.001)
    limit = math.inf if deadline_ms is None else deadline_ms
    return sorted(d for d in out if 0 < d < limit)


def _quantile(s: Survival, p: float) -> float | None:
    """First answer time with S <= 1 - p (float; the window decides delays exactly)."""
    neg = [-v for v in s.surv]
    i = bisect.bisect_left(neg, -(1 - p) - 1e-12)
    return s.times[i] if i < len(s.times) else None


def advise(
    s: Survival, policy: HedgePolicy, current: tuple[float, int] | None = None
) -> tuple[Prediction | None, Prediction | None]:
    """(best candidate, the current setting's prediction) for ``policy``'s target.

    The best is None when no candidate keeps within the load limit; the second is None
    when ``current`` is None.
    """
    deadline_ms = None if policy.deadline_s is None else policy.deadline_s * 1000
    limit = policy.max_extra_load * LOAD_HEADROOM
    best: Prediction | None = None
    for d in candidate_delays(s, deadline_ms):
        for k in range(2, policy.max_attempts + 1):
            if deadline_ms is not None and (k - 1) * d >= deadline_ms:
                break
            pred = predict(s, d, k, deadline_ms)
            if pred.extra_calls > limit:
                break  # more attempts at this delay only cost more
            if best is None or _better(pred, best, policy.target):
                best = pred
    now = None if current is None else predict(s, current[0], current[1], deadline_ms)
    return best, now


def _cmp_ms(a: float, b: float) -> int:
    """-1 when ``a`` is shorter than ``b`` by more than :data:`P99_TIE` of the shorter,
    1 when longer, 0 for a near-tie (two ``inf`` tie; a finite time beats ``inf``)."""
    if math.isinf(a) or math.isinf(b):
        return 0 if a == b else (-1 if a < b else 1)
    if abs(a - b) <= P99_TIE * min(a, b):
        return 0
    return -1 if a < b else 1


def _cmp_tail(a: Prediction, b: Prediction, target: str) -> int:
    """-1 when ``a`` is clearly better than ``b`` on ``target``, 1 when clearly worse, 0
    for a near-tie: ``in_deadline`` by the share in time; ``p99`` by the mean of the
    slowest 1% (:attr:`Prediction.tail_mean_ms`)."""
    if target == "in_deadline" and a.in_time is not None and b.in_time is not None:
        if abs(a.in_time - b.in_time) <= IN_TIME_TIE:
            return 0
        return -1 if a.in_time > b.in_time else 1
    return _cmp_ms(a.tail_mean_ms, b.tail_mean_ms)


def _better(a: Prediction, b: Prediction, target: str) -> bool:
    """Whether ``a`` beats ``b`` on ``target``, near-ties going to fewer extra calls."""
    c = _cmp_tail(a, b, target)
    return c < 0 if c else a.extra_calls < b.extra_calls


class HedgeController:
    """The per-call hedge setting of one call site, and the decisions that change it.

    Args:
        policy: the site's :class:`HedgePolicy` (its delay, target, back-off settings).
        window: the site's latency window (answers and censored attempts).
        clock: monotonic seconds (the advisor's interval).
        running: how long each attempt of the site still in flight has run, in ms (they
            enter the advisor's survival estimate as censored observations).
        wall_clock: Unix seconds for the time of each :class:`HedgeChange`.
        rng: draws which calls are probes while backed off.

    Raises:
        ValueError: ``target = "in_deadline"`` without a deadline.
    """

    def __init__(
        self,
        policy: HedgePolicy,
        window: LatencyWindow,
        *,
        clock: Callable[[], float] = time.monotonic,
        running: Callable[[], list[float]] = list,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if policy.delay_auto and policy.target == "in_deadline" and policy.deadline_s is None:
            raise ValueError('target = "in_deadline" needs a deadline (the step\'s deadline_s)')
        self.policy = policy
        self.window = window
        self._clock = clock
        self._running = running
        self._wall = wall_clock
        self.rng = rng if rng is not None else random.Random()
        #: every decision so far, oldest first
        self.history: list[HedgeChange] = []
        self._pending: list[HedgeChange] = []
        self._auto: tuple[float, int] | None = None  # the advisor's (delay, attempts)
        self._auto_pred: Prediction | None = None
        self._advised_at = -math.inf
        self._advised_n = 0  # observations (with those in flight) at the last advice
        self.backed_off = False
        self._probe: tuple[float, float] | None = None  # (computed at, share of calls)
        #: wins (True) of the last fires that sent a copy, since the last back-off/resume
        self._fires: deque[bool] = deque(maxlen=policy.min_fires)
        self._probes: deque[bool] = deque(maxlen=policy.probe_fires)

    # ------------------------------------------------------------------ per call

    def plan(self) -> CallPlan:
        """The setting for a call starting now (and any change made for it)."""
        p = self.policy
        if not p.hedges:
            return CallPlan(None, p.max_attempts, False, ())
        delay, attempts = self._base()
        probe = False
        if self.backed_off and delay is not None:
            probe = self.rng.random() < self._probe_share(delay, attempts)
            if not probe:
                delay = None
            else:
                attempts = 2  # one copy per probe: the win rate of a copy is what is measured
        changes = tuple(self._pending)
        self._pending.clear()
        return CallPlan(delay, attempts, probe, changes)

    def observe(self, outcome: HedgeOutcome[Any], *, probe: bool) -> None:
        """Count one finished call: a fire that sent a copy and answered, and whether a
        copy won (the primary answering first is a loss). A call nobody answered says
        nothing of which attempt is faster, and a fire whose copy was never sent nothing
        of the copy: neither counts."""
        p = self.policy
        if outcome.delay_ms is None or not outcome.fired or p.min_win_rate <= 0:
            return
        if outcome.winner is None or not any(a.sent for a in outcome.attempts[1:]):
            return
        won = outcome.won_by_copy
        if not self.backed_off:
            self._fires.append(won)
            if len(self._fires) == p.min_fires and sum(self._fires) < p.min_win_rate * p.min_fires:
                self._back_off()
        elif probe:
            self._probes.append(won)
            wins = sum(self._probes)
            if len(self._probes) == p.probe_fires and wins >= p.resume_win_rate * p.probe_fires:
                self._resume(wins)

    @property
    def setting(self) -> HedgeSetting:
        """The setting in force now (for reports; asks the advisor nothing)."""
        delay, attempts = self._base(advise_now=False)
        mode: Mode = "backed_off" if self.backed_off else self._mode()
        return HedgeSetting(delay, attempts, mode)

    # ------------------------------------------------------------------ the delay

    def _mode(self) -> Mode:
        p = self.policy
        warming = (p.delay_auto and self._auto is None) or (
            p.delay_percentile is not None and self.window.percentile(p.delay_percentile) is None
        )
        return "warm_up" if warming else "hedging"

    def _base(self, *, advise_now: bool = True) -> tuple[float | None, int]:
        """Delay and attempts before the back-off: fixed, percentile or advised."""
        p = self.policy
        if p.delay_ms is not None:
            return p.delay_ms, p.max_attempts
        if p.delay_percentile is not None:
            warm = self.window.percentile(p.delay_percentile)
            return (warm if warm is not None else p.warmup_delay_ms), p.max_attempts
        if p.delay_auto:
            if advise_now:
                self._maybe_advise()
            if self._auto is not None:
                return self._auto
            return p.warmup_delay_ms, p.max_attempts
        return None, p.max_attempts

    def _maybe_advise(self) -> None:
        now = self._clock()
        if now - self._advised_at < self.policy.advise_interval_s:
            # sooner only while the window still grows fast (right after warm-up): once it
            # holds twice the observations of the last advice, its errors are ~0.7x
            if len(self.window) < 2 * self._advised_n:
                return
        s = self.window.survival(self._running())
        if s is None or not s.times:
            return  # warm-up: retried at the next call
        self._advised_at, self._advised_n = now, s.n
        best, current = advise(s, self.policy, self._auto)
        old = self.setting_for(self._auto)
        limit = self.policy.max_extra_load * LOAD_HEADROOM
        if best is None:
            # nothing fits the load limit (a window that still sees mostly calls in flight):
            # keep warming up, or keep the setting unless it is clearly over the limit; then
            # copy at the latest candidate delay, once
            delays = candidate_delays(s, _ms(self.policy.deadline_s))
            if current is None or current.extra_calls <= limit * OVER_LIMIT_BAND or not delays:
                return
            new_auto: tuple[float, int] = (delays[-1], 2)
            pred = predict(s, delays[-1], 2, _ms(self.policy.deadline_s))
            why = (
                f"no delay keeps extra calls under {self.policy.max_extra_load:g} per call "
                f"and the setting in force would cost {current.extra_calls:.3f}; one copy at "
                f"the latest candidate delay ({pred.extra_calls:.3f} extra calls per call); "
                f"window n = {s.n} ({s.n_censored} cut short)"
            )
        else:
            if not self._worth_moving(best, current):
                return
            new_auto, pred = (best.delay_ms, best.attempts), best
            why = self._why(best, current, s)
        self._auto, self._auto_pred = new_auto, pred
        new = self.setting_for(new_auto)
        self._note("advised", old, new, why, pred.as_dict())

    def _worth_moving(self, best: Prediction, current: Prediction | None) -> bool:
        if current is None:
            return True  # the first advice after warm-up
        limit = self.policy.max_extra_load * LOAD_HEADROOM
        if current.extra_calls > limit * OVER_LIMIT_BAND:
            return True
        if abs(best.delay_ms - current.delay_ms) <= MIN_DELAY_MOVE * current.delay_ms and (
            best.attempts == current.attempts
        ):
            return False
        return _clear_gain(best, current, self.policy.target)

    def _why(self, best: Prediction, current: Prediction | None, s: Survival) -> str:
        target = self.policy.target
        goal = (
            f"in time {_pct(best.in_time)}"
            if target == "in_deadline"
            else f"p99 {_ms_text(best.p99_ms)}, p99.9 {_ms_text(best.p999_ms)}"
        )
        basis = f"window n = {s.n} ({s.n_censored} cut short)"
        load = (
            f"{best.extra_calls:.3f} extra calls per call (limit "
            f"{self.policy.max_extra_load:g})"
        )
        if current is None:
            return f"first advice after warm-up: predicted {goal}, {load}; {basis}"
        was = (
            f"in time {_pct(current.in_time)}"
            if target == "in_deadline"
            else f"p99 {_ms_text(current.p99_ms)}, p99.9 {_ms_text(current.p999_ms)}"
        )
        if current.extra_calls > self.policy.max_extra_load * LOAD_HEADROOM * OVER_LIMIT_BAND:
            return (
                f"the setting in force would cost {current.extra_calls:.3f} extra calls per "
                f"call, over the limit; predicted {goal}, {load}; {basis}"
            )
        return f"predicted {goal} against {was} for the setting in force, {load}; {basis}"

    def setting_for(self, auto: tuple[float, int] | None) -> HedgeSetting:
        p = self.policy
        if auto is None:
            return HedgeSetting(p.warmup_delay_ms, p.max_attempts, "warm_up")
        return HedgeSetting(auto[0], auto[1], "backed_off" if self.backed_off else "hedging")

    # ------------------------------------------------------------------ back-off

    def _probe_share(self, delay_ms: float, attempts: int) -> float:
        """The share of calls armed as probes so that probes cost ``probe_rate`` extra
        calls per call: probe_rate / P(a probe fires), P from the window (S(d)),
        re-read at most every ``refresh_s`` seconds (the window's own refresh)."""
        now = self._clock()
        if self._probe is not None and now - self._probe[0] < self.policy.refresh_s:
            return self._probe[1]
        s = self.window.survival(self._running())
        fire = s(delay_ms) if s is not None else None
        if not fire:
            fire = 0.05  # no estimate yet: the p95's fire rate
        share = min(1.0, self.policy.probe_rate / fire)
        self._probe = (now, share)
        return share

    def _back_off(self) -> None:
        p = self.policy
        wins = sum(self._fires)
        old = self.setting
        self.backed_off = True
        self._probes.clear()
        self._probe = None
        new = self.setting
        why = (
            f"copies won {wins} of the last {p.min_fires} fires (under {p.min_win_rate:.0%}): "
            "a copy rarely beats its primary here (when the slow calls are the long "
            "answers, W + N, every copy is as slow); hedging only probe calls, about "
            f"{p.probe_rate:g} extra calls per call"
        )
        self._note("backed_off", old, new, why)

    def _resume(self, wins: int) -> None:
        p = self.policy
        old = self.setting
        self.backed_off = False
        self._fires.clear()
        new = self.setting
        why = (
            f"probe copies won {wins} of the last {p.probe_fires} probe fires (at least "
            f"{p.resume_win_rate:.0%}): serving noise is back; hedging every call again"
        )
        self._note("resumed", old, new, why)

    def _note(
        self, kind: Any, old: HedgeSetting, new: HedgeSetting, why: str,
        prediction: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        change = HedgeChange(self._wall(), old, new, why, kind, prediction)
        self.history.append(change)
        self._pending.append(change)


def _clear_gain(a: Prediction, b: Prediction, target: str) -> bool:
    """``a`` beats ``b`` by more than the tie margins on the target, or ties and costs
    at least 10% fewer extra calls."""
    c = _cmp_tail(a, b, target)
    return c < 0 if c else a.extra_calls < 0.9 * b.extra_calls


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _ms_text(x: float) -> str:
    return f"{x:.0f} ms" if math.isfinite(x) else "never (past what the window has seen)"


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.1%}"


def logged_changes(details: Iterable[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """The controller's changes read back from log rows' ``detail`` (:func:`hedge_detail`),
    oldest first, for reports: ``{at, kind, old, new, why, prediction}`` with ``at`` in
    ISO 8601 UTC and ``old``/``new`` as :meth:`HedgeSetting.describe` phrases."""
    out = []
    for detail in details:
        for c in (detail or {}).get("hedge_changes", []):
            out.append({
                "at": datetime.fromtimestamp(c["at"], UTC).isoformat(timespec="seconds"),
                "kind": c["kind"],
                "old": HedgeSetting(**c["old"]).describe(),
                "new": HedgeSetting(**c["new"]).describe(),
                "why": c["why"],
                "prediction": c.get("prediction"),
            })  # fmt: skip
    return sorted(out, key=lambda c: c["at"])


def hedge_detail(outcome: HedgeOutcome[Any]) -> dict[str, Any]:
    """What a call's log row keeps of its controller: ``{"hedge_changes": [...]}`` (the
    decisions made just before it, :meth:`HedgeChange.as_dict`) and ``{"hedge_probe":
    True}`` for a probe of a backed-off site; empty for most calls."""
    out: dict[str, Any] = {}
    if outcome.changes:
        out["hedge_changes"] = [c.as_dict() for c in outcome.changes]
    if outcome.probe:
        out["hedge_probe"] = True
    return out
