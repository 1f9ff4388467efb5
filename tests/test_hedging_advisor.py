"""The hedge controller: the window under hedging, the advisor online, the back-off.

Every test runs calls through the real engine (:class:`~chainrun.hedging.Hedger`) on a
virtual-time loop against a scripted backend: each attempt sleeps a latency drawn from
a seeded distribution, so thousands of calls of seconds each take a second of wall time
and every number is reproducible.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import pytest
from virtual_time import run_virtual, vloop

from chainrun.hedging import AttemptInfo, HedgeOutcome, HedgePolicy, Hedger
from chainrun.hedging.advisor import advise, candidate_delays, hedge_detail, predict
from chainrun.hedging.window import LatencyWindow, kaplan_meier, km_quantile

Draw = Callable[[random.Random, int], float]  # (rng, call index) -> latency in s


async def drive(
    hedger: Hedger[str], draw: Draw, calls: int, rng: random.Random, *, concurrency: int = 20,
    first: int = 0,
) -> list[HedgeOutcome[str]]:  # fmt: skip
    """Run ``calls`` calls, ``concurrency`` at a time; each attempt sleeps ``draw(rng, i)``
    seconds for call ``i`` (a fresh draw per attempt: copies are independent)."""
    outcomes: list[HedgeOutcome[str]] = [None] * calls  # type: ignore[list-item]
    index = iter(range(calls))

    async def worker() -> None:
        for i in index:

            async def attempt(info: AttemptInfo, i: int = i) -> str:
                await asyncio.sleep(draw(rng, first + i))
                return f"call-{i}"

            outcomes[i] = await hedger.run(attempt)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await hedger.aclose()
    return outcomes


def virtual_clock() -> Callable[[], float]:
    return lambda: vloop().time()


def extra_calls(outcomes: list[HedgeOutcome[str]]) -> float:
    return sum(sum(a.sent for a in o.attempts[1:]) for o in outcomes) / len(outcomes)


# ------------------------------------------------------------------ the window under hedging


def lognormal_with_slow_path(rng: random.Random, _: int) -> float:
    """One call: log-normal body (median 200 ms, sigma 0.8) plus 3% of 3-10 s."""
    if rng.random() < 0.03:
        return rng.uniform(3.0, 10.0)
    return 0.2 * math.exp(0.8 * rng.gauss(0.0, 1.0))


def true_p95_ms() -> float:
    """The p95 of :func:`lognormal_with_slow_path`: 0.97 P(body > t) + 0.03 = 0.05."""
    z = NormalDist().inv_cdf(1 - 0.02 / 0.97)
    return 200 * math.exp(0.8 * z)


def test_window_p95_under_hedging_matches_the_unhedged_p95() -> None:
    """Hedged at its own p95, the window (answers plus the cancelled attempts as censored)
    estimates the p95 of one call: inside the unhedged run's interval and vice versa. The
    winners alone (what the window held before) put it well below that interval."""
    calls = 4000

    async def main() -> tuple[Any, Any, list[float]]:
        plain: Hedger[str] = Hedger(HedgePolicy(window_s=1e6), ["a"], clock=virtual_clock())
        await drive(plain, lognormal_with_slow_path, calls, random.Random(1))
        policy = HedgePolicy(
            delay_percentile=95, max_attempts=3, max_extra_load=1.0, window_s=1e6,
            initial_delay_ms=500, min_win_rate=0,
        )  # fmt: skip
        hedged: Hedger[str] = Hedger(policy, ["a", "b"], clock=virtual_clock())
        outcomes = await drive(hedged, lognormal_with_slow_path, calls, random.Random(2))
        winners = [
            next(a.latency_ms for a in o.attempts if a.number == o.winner) for o in outcomes
        ]
        assert hedged.stats.copy_wins > 100  # the hedge really cut many primaries short
        plain_est, hedged_est = plain.window.estimate(95), hedged.window.estimate(95)
        return plain_est, hedged_est, winners

    plain_est, hedged_est, winners = run_virtual(main)
    assert plain_est.n_censored == 0 and hedged_est.n_censored > 100
    lo, hi = plain_est.ci95
    assert lo is not None and hi is not None
    assert lo <= hedged_est.value_ms <= hi
    h_lo, h_hi = hedged_est.ci95
    assert h_lo is not None and h_hi is not None
    assert h_lo <= true_p95_ms() <= h_hi  # and it covers the distribution's own p95
    winners_only = km_quantile([(w, True) for w in winners], 95)
    assert winners_only is not None and winners_only.value_ms < lo


def test_censored_mass_past_the_longest_observation_sits_there() -> None:
    """Efron's convention: when the slowest attempts were all cut short, a percentile in
    their mass is the longest time observed (a lower bound), flagged ``at_tail``."""
    samples = [(float(ms), True) for ms in range(100, 300, 4)]  # 50 answers
    samples += [(3000.0, False)] * 50  # 50 cut at a 3 s deadline
    est = km_quantile(samples, 90)
    assert est is not None
    assert est.at_tail and est.value_ms == 3000.0
    assert est.tail_share == pytest.approx(0.5)
    s = kaplan_meier(samples)
    assert s(3000.0) == pytest.approx(0.5) and s(3000.1) == 0.0
    assert km_quantile(samples, 40).value_ms == 256.0  # type: ignore[union-attr]


# ------------------------------------------------------------------ the advisor's model


def bimodal_window() -> LatencyWindow:
    """Half the calls answer in 0.1-0.3 s; the other half were cut at the 3 s deadline."""
    window = LatencyWindow(1e6, min_samples=1, refresh_s=0)
    for i in range(200):
        window.record(100 + i)
        window.record_censored(3000)
    return window


def test_predict_follows_the_schedule_of_attempts() -> None:
    s = bimodal_window().survival()
    assert s is not None
    pred = predict(s, 350.0, 3, 3000.0)
    # copy 1 at d: primary out (1/2); copy 2 at 2d: both out (1/4)
    assert pred.extra_calls == pytest.approx(0.5 + 0.25)
    assert pred.fire_rate == pytest.approx(0.5)
    assert pred.in_time == pytest.approx(1 - 0.5**3)


def test_auto_on_a_bimodal_call_copies_just_after_the_fast_path() -> None:
    s = bimodal_window().survival()
    assert s is not None
    assert any(299 < d < 301 for d in candidate_delays(s, 3000.0))  # the cluster's end
    policy = HedgePolicy(
        delay_auto=True, target="in_deadline", deadline_s=3.0, max_attempts=10,
        max_extra_load=1.05,
    )  # fmt: skip
    best, _ = advise(s, policy)
    assert best is not None
    assert 299 <= best.delay_ms < 301 and best.attempts >= 7
    assert best.in_time is not None and best.in_time >= 0.99
    assert best.extra_calls <= 1.05


def bimodal_guard(rng: random.Random, _: int) -> float:
    """The bimodal guard: 0.1-0.3 s half the time, else 3-19 s."""
    return rng.uniform(0.1, 0.3) if rng.random() < 0.5 else rng.uniform(3.0, 19.0)


def test_auto_on_the_bimodal_guard_answers_in_time() -> None:
    """delay = "auto", target in_deadline: after warm-up >= 0.99 answered within 3 s at
    <= 1.05 extra calls per call; the advisor's change is logged with old, new and why."""
    policy = HedgePolicy(
        delay_auto=True, target="in_deadline", deadline_s=3.0, max_attempts=10,
        max_extra_load=1.05, advise_interval_s=10.0,
    )  # fmt: skip

    async def main() -> tuple[Hedger[str], list[HedgeOutcome[str]]]:
        hedger: Hedger[str] = Hedger(policy, ["a", "b"], clock=virtual_clock())
        await drive(hedger, bimodal_guard, 300, random.Random(3), concurrency=50)  # warm-up
        outcomes = await drive(
            hedger, bimodal_guard, 1000, random.Random(4), concurrency=50, first=300
        )
        return hedger, outcomes

    hedger, outcomes = run_virtual(main)
    in_time = sum(o.error is None for o in outcomes) / len(outcomes)
    assert in_time >= 0.99
    assert extra_calls(outcomes) <= 1.05
    advised = [c for c in hedger.controller.history if c.kind == "advised"]
    assert advised and advised[0].old.mode == "warm_up"
    assert advised[-1].new.delay_ms is not None and advised[-1].new.max_attempts >= 7
    assert "in time" in advised[0].why and advised[0].prediction is not None
    # hysteresis: a stable distribution does not make it flap
    assert len(advised) <= 3


# ------------------------------------------------------------------ the back-off


class WorkNoiseLab:
    """A call's latency is work W (its own tokens x 10 ms, the same for every copy of
    the call) plus serving noise N (log-normal, drawn per attempt); ``noise`` can be
    turned up between phases, as an operator would change the lab's scenario."""

    def __init__(self, seed: int) -> None:
        self.work = random.Random(seed)
        self.tokens: dict[int, int] = {}
        self.noise = (0.030, 0.3)  # median s, sigma: little serving noise

    def __call__(self, rng: random.Random, i: int) -> float:
        tokens = self.tokens.setdefault(i, self.work.randint(20, 200))
        median, sigma = self.noise
        return tokens * 0.010 + median * math.exp(sigma * rng.gauss(0.0, 1.0))


def test_a_hedge_that_stops_paying_backs_off_probes_and_resumes() -> None:
    """The work-noise lab at a p95 hedge: copies lose (the slow calls are the long ones),
    so the site backs off at the 30th fire; its extra calls fall to the probe rate; when
    the noise is turned up, probe copies win and it hedges every call again."""
    policy = HedgePolicy(delay_percentile=95, max_attempts=2, max_extra_load=1.0)
    lab = WorkNoiseLab(seed=5)

    async def main() -> tuple[Hedger[str], list[list[HedgeOutcome[str]]]]:
        hedger: Hedger[str] = Hedger(
            policy, ["a", "b"], clock=virtual_clock(), rng=random.Random(6)
        )
        rng = random.Random(7)
        low = await drive(hedger, lab, 3000, rng)
        lab.noise = (0.300, 1.2)  # serving noise turned up
        noisy = await drive(hedger, lab, 3000, rng, first=3000)
        return hedger, [low, noisy]

    hedger, (low, noisy) = run_virtual(main)
    kinds = [c.kind for c in hedger.controller.history]
    assert kinds == ["backed_off", "resumed"]
    # backed off within min_fires (30) fires that sent a copy
    backed = next(i for i, o in enumerate(low) if any(c.kind == "backed_off" for c in o.changes))
    fires = sum(1 for o in low[:backed] if o.fired and any(a.sent for a in o.attempts[1:]))
    assert fires <= policy.min_fires
    assert "won 0 of the last 30 fires" in hedger.controller.history[0].why
    # after the back-off, extra calls fall to the probe rate (1%): Poisson-ish bounds
    after = low[backed:]
    assert 0.004 <= extra_calls(after) <= 0.02
    assert all(o.delay_ms is None or o.probe for o in after)
    # noise turned up: it hedges again, every call armed, extra calls back to ~the p95's 5%
    resumed = next(i for i, o in enumerate(noisy) if any(c.kind == "resumed" for c in o.changes))
    assert resumed < 2000
    again = noisy[resumed:]
    assert all(o.delay_ms is not None for o in again)
    assert extra_calls(again) > 0.03
    assert hedge_detail(noisy[resumed])["hedge_changes"][0]["kind"] == "resumed"


# ------------------------------------------------------------------ the config spelling


def test_delay_auto_in_the_config_reaches_the_engine() -> None:
    from chainrun.config import config_from_dict, policy_from_config
    from chainrun.errors import ConfigError

    cfg = config_from_dict({"steps": {"validate": {"deadline_s": 3.0, "hedge": {
        "delay": "auto", "target": "in_deadline", "max_attempts": 10,
        "max_extra_load": 1.05}}}})  # fmt: skip
    policy = policy_from_config(cfg.steps["validate"])
    assert policy.delay_auto and policy.target == "in_deadline" and policy.deadline_s == 3.0
    assert policy.delay_ms is None and policy.delay_percentile is None
    for hedge, expected in (
        ({"delay": "p95", "target": "p99"}, "target applies to delay = 'auto' only"),
        ({"delay": "auto", "target": "p50"}, "steps.validate.hedge.target"),
        ({"delay": "autoo"}, "or 'auto'"),
    ):
        with pytest.raises(ConfigError) as e:
            config_from_dict({"steps": {"validate": {"hedge": hedge}}}, "c.toml")
        assert expected in str(e.value) and str(e.value).startswith("c.toml: ")


# ------------------------------------------------------------------ in the chain's log


async def test_a_steps_back_off_is_logged_with_the_call_it_applies_to(store: Any) -> None:
    """A step whose copies always lose backs off; the change (time, old, new, why) is in
    the step row of the first turn it applies to, and later turns are not armed."""
    from chainrun.chain import Chain
    from chainrun.config import LLM_CLASSIFY_STEP, config_from_dict
    from chainrun.providers.fake import FakeProvider, FakeReply

    cfg = config_from_dict({
        "providers": {"backup": {"base_url": "http://127.0.0.1:1/v1"}},
        "order": ["classify"], "answer_step": "classify",
        "steps": {"classify": {**LLM_CLASSIFY_STEP, "stream": False, "hedge": {
            "delay_ms": 10, "max_attempts": 2, "targets": ["backup"], "max_extra_load": 1.0,
            "min_fires": 3, "min_win_rate": 0.5, "probe_rate": 0.0}}},
    })  # fmt: skip
    primary = FakeProvider(name="local", script=FakeReply("sizing", ttft_s=0.03))
    backup = FakeProvider(name="backup", script=FakeReply("styling", ttft_s=0.2))
    async with Chain(cfg, store=store, providers={"local": primary, "backup": backup}) as chain:
        for _ in range(5):
            done = await chain.run_turn("hello")
    steps = sorted(store.steps(done.run_id), key=lambda s: s.turn_id)
    assert [s.hedge_fired for s in steps[:3]] == [1, 1, 1]
    assert [s.hedge_won for s in steps[:3]] == [0, 0, 0]
    change = (steps[3].detail or {})["hedge_changes"][0]
    assert change["kind"] == "backed_off"
    assert change["old"]["mode"] == "hedging" and change["new"]["mode"] == "backed_off"
    assert "won 0 of the last 3 fires" in change["why"] and change["at"] > 0
    assert [s.hedge_delay_ms for s in steps[3:]] == [None, None]  # not armed: no probes
    assert all("hedge_changes" not in (s.detail or {}) for s in steps[:3] + steps[4:])
    # hedge-stats shows it: when, from what, to what, why
    from rich.console import Console

    from chainrun.analysis.summary import hedge_stats
    from chainrun.cli.tables import hedge_changes_table

    stats = hedge_stats(store, done.run_id)["steps"]["classify"]
    (shown,) = stats["changes"]
    assert shown["kind"] == "backed_off" and shown["at"].endswith("+00:00")
    assert shown["old"] == "d = 10 ms, 2 attempts"
    assert shown["new"] == "backed off (d = 10 ms, 2 attempts on probe calls only)"
    assert stats["n_probe_calls"] == 0 and stats["n_fired"] == 3
    table = hedge_changes_table(hedge_stats(store, done.run_id))
    assert table is not None
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "backed_off" in text and "won 0 of the last 3" in text
    # the audit's item 4 says what the step did and when
    from chainrun.audit import audit

    item = audit(store).items[3]
    said = " ".join(item.notes)
    assert f"{shown['at']}: backed off (copies won 0 of the last 3 fires" in said
    assert "Now backed off: only probe calls are hedged (0 probe calls so far)." in said
    assert item.figures["steps"]["classify"]["controller"]["changes"][0]["kind"] == "backed_off"
