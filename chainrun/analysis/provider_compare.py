"""``chainrun compare A B --by provider``: is B slower because of the work or the serving?

A step's latency on a streamed call is roughly TTFT + (generated tokens − 1) × time per
output token. Of these, the **generated tokens** are *work*: the request (prompt, cap,
model) decides them, and another provider or route carries the same work (W cancels out
between two copies: Dean and Barroso, "The Tail at Scale", 2013).
**TTFT** and **time per output token** are *serving*:
queueing, load and the hardware behind the endpoint, which another route can fix.

For every LLM step, on the call whose answer the step used (hedging losers excluded),
each side gets, with n and distribution-free 95% intervals
(:func:`chainrun.statistics.intervals.summarize`):

- ``ttft_ms``: time to the first content or reasoning token;
- ``tpot_ms`` (time per output token): ``(duration − TTFT) / (output_tokens − 1)``, the
  definition of vLLM's and LLMPerf's benchmarks; a call with fewer than 2 output tokens
  or unknown tokens has none (counted as unknown, never 0);
- ``output_tokens``: generated tokens, reasoning included, as the provider reported them;

and B − A of each one's p50 and p90 with intervals
(:func:`chainrun.statistics.intervals.quantile_diff`).
A component **rose** when the p50's or the p90's interval lies entirely above 0 (more
TTFT noise shows in the p90 first), **fell** when one lies entirely below 0 and none
above, and is **similar** otherwise (``too_few`` when n bounds neither).

Verdict per step (``verdict.cause``): ``serving`` when TTFT or time per token rose at
similar token counts, ``work`` when tokens rose at similar TTFT and time per token.
When both rose, :func:`contributions` splits the p50 duration change into ms from TTFT,
from the per-token pace and from the extra tokens, and the cause is the side that
accounts for at least twice the other (else ``both``): a verbose answer on a busier
machine is still work. ``unexplained``: slower with no component beyond its interval.
``verdict.duration`` says whether the call itself got slower (p50 or p90, as
``compare``); the cause is given even when it did not, so a serving regression hidden
by shorter answers is not missed.

Rows are read by name through :func:`_col`, so this works on dict rows and typed rows.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from chainrun.analysis.compare import Side, select
from chainrun.errors import ChainrunError
from chainrun.log.rows import winning_calls
from chainrun.log.store import Store
from chainrun.statistics.intervals import latency_verdict, quantile_diff, summarize

Cause = Literal["work", "serving", "both", "unexplained"]

#: (key, label, unit) of the three components, work last
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("ttft_ms", "TTFT", "ms"),
    ("tpot_ms", "time per output token", "ms"),
    ("output_tokens", "generated tokens", "tokens"),
)
_SERVING = ("ttft_ms", "tpot_ms")
_WORK = "output_tokens"


def _col(row: Any, key: str) -> Any:
    """A column of a log row, whether the row is a dict or a typed row."""
    return row.get(key) if isinstance(row, Mapping) else getattr(row, key, None)


def tpot_ms(call: Any) -> float | None:
    """Time per output token of one call, in ms: ``(duration − TTFT) / (output_tokens − 1)``.

    None when the duration, TTFT or token count is unknown or the call made < 2 tokens.
    """
    duration, ttft, tokens = (_col(call, k) for k in ("duration_ms", "ttft_ms", "output_tokens"))
    if duration is None or ttft is None or tokens is None or tokens < 2:
        return None
    return max(0.0, float(duration) - float(ttft)) / (int(tokens) - 1)


def _step_calls(side: Side) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for (_, step), call in winning_calls(side.calls).items():
        if _col(call, "error_type") is None:
            out.setdefault(step, []).append(call)
    return out


def _values(calls: Sequence[Any]) -> tuple[dict[str, list[float]], dict[str, int]]:
    values: dict[str, list[float]] = {k: [] for k, _, _ in COMPONENTS}
    unknown = {k: 0 for k, _, _ in COMPONENTS}
    for c in calls:
        raw = {
            "ttft_ms": _col(c, "ttft_ms"),
            "tpot_ms": tpot_ms(c),
            "output_tokens": _col(c, "output_tokens"),
        }
        for k, v in raw.items():
            if v is None:
                unknown[k] += 1
            else:
                values[k].append(float(v))
    return values, unknown


def _who(calls: Sequence[Any]) -> dict[str, list[str]]:
    def distinct(key: str) -> list[str]:
        return sorted({str(v) for c in calls if (v := _col(c, key)) is not None})

    return {
        "provider": distinct("provider"),
        "server_address": distinct("server_address"),
        "model": distinct("model"),
    }


def _change(a: Sequence[float], b: Sequence[float], confidence: float) -> dict[str, Any]:
    diffs = [quantile_diff(a, b, p, confidence) for p in (50, 90)]
    out: dict[str, Any] = {}
    for d in diffs:
        out[f"p{int(d.p)}_diff"] = round(d.estimate, 3) if d.estimate is not None else None
        out[f"p{int(d.p)}_diff_ci"] = [round(d.ci[0], 3), round(d.ci[1], 3)] if d.ci else None
    if not a or not b:
        out["status"] = "unknown"
    elif all(d.ci is None for d in diffs):
        out["status"] = "too_few"
    else:
        out["status"] = {"worse": "up", "better": "down"}.get(latency_verdict(diffs), "similar")
    return out


def _p50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def hidden_reasoning(calls: Sequence[Any]) -> float | None:
    """p50 of the reasoning tokens of calls that streamed no reasoning text (None: unknown).

    Reasoning the model does not stream (no summary asked) happens before the first
    visible token, so it sits inside TTFT; :func:`contributions` moves its time from
    TTFT (serving) to tokens (work).
    """
    values = [
        float(r)
        for c in calls
        if (r := _col(c, "reasoning_tokens")) is not None and not _col(c, "reasoning")
    ]
    return _p50(values) if values else None


def contributions(
    va: Mapping[str, Sequence[float]],
    vb: Mapping[str, Sequence[float]],
    hidden: tuple[float | None, float | None] = (None, None),
) -> dict[str, float | None]:
    """How many ms of the p50 duration change each component accounts for (B − A).

    With duration ≈ TTFT + (tokens − 1) × TPOT, at the medians: ``ttft`` = ΔTTFT,
    ``per_token`` = (tokens_B − 1) × ΔTPOT (serving pace), ``tokens`` = Δtokens × TPOT_A
    (work). Hidden reasoning tokens (``hidden``: each side's p50 from
    :func:`hidden_reasoning`) are generated before the first visible token: their
    change × TPOT_A is taken out of ``ttft`` (it is work, already in ``tokens``).
    An approximation (the median of a sum is not the sum of medians), shown next to the
    measured duration change; None where a median is unknown.
    """
    m = {side: {k: _p50(v[k]) for k, _, _ in COMPONENTS} for side, v in (("a", va), ("b", vb))}
    a, b = m["a"], m["b"]
    out: dict[str, float | None] = {"ttft": None, "per_token": None, "tokens": None}
    if a["ttft_ms"] is not None and b["ttft_ms"] is not None:
        out["ttft"] = round(b["ttft_ms"] - a["ttft_ms"], 3)
    tok_a, tok_b, tp_a, tp_b = a["output_tokens"], b["output_tokens"], a["tpot_ms"], b["tpot_ms"]
    if tok_b is not None and tp_a is not None and tp_b is not None:
        out["per_token"] = round(max(0.0, tok_b - 1) * (tp_b - tp_a), 3)
    if tok_a is not None and tok_b is not None and tp_a is not None:
        out["tokens"] = round((tok_b - tok_a) * tp_a, 3)
    if out["ttft"] is not None and tp_a is not None and any(h is not None for h in hidden):
        reasoning_ms = ((hidden[1] or 0.0) - (hidden[0] or 0.0)) * tp_a
        out["ttft"] = round(out["ttft"] - reasoning_ms, 3)
    return out


def _verdict(
    slower: str, changes: Mapping[str, Mapping[str, Any]], parts: Mapping[str, float | None]
) -> dict[str, Any]:
    serving_up = [k for k in _SERVING if changes[k]["status"] == "up"]
    work_up = changes[_WORK]["status"] == "up"
    part_of = {"ttft_ms": "ttft", "tpot_ms": "per_token"}
    serving_ms = sum(max(0.0, parts[part_of[k]] or 0.0) for k in serving_up)
    work_ms = max(0.0, parts["tokens"] or 0.0) if work_up else 0.0
    cause: Cause | None
    if serving_up and work_up:
        # one side explains the change when it accounts for at least twice the other
        # (chainrun's rule: a dominant cause, not a statistical test)
        if work_ms >= 2 * serving_ms:
            cause = "work"
        elif serving_ms >= 2 * work_ms:
            cause = "serving"
        else:
            cause = "both"
    elif serving_up:
        cause = "serving"
    elif work_up:
        cause = "work"
    else:
        cause = "unexplained" if slower == "worse" else None
    labels = {k: lbl for k, lbl, _ in COMPONENTS}
    rose = " and ".join(labels[k] for k in serving_up)
    text = {
        "serving": f"{rose} rose ({serving_ms:+.0f} ms at p50) at similar token counts: "
        "serving, which another provider or route can fix",
        "work": f"it generated more tokens ({work_ms:+.0f} ms at p50): work, which another "
        "provider will not fix (cap or shorten the answer)",
        "both": f"it generated more tokens ({work_ms:+.0f} ms, work) and {rose} rose "
        f"({serving_ms:+.0f} ms, serving)",
        "unexplained": "slower, but no component rose beyond its interval",
        None: "no component rose beyond its interval",
    }[cause]
    if cause == "work" and serving_up:
        text += f"; {rose} also rose ({serving_ms:+.0f} ms)"
    if cause == "serving" and work_up:
        text += f"; tokens also rose ({work_ms:+.0f} ms)"
    head = {"worse": "B slower", "better": "B faster", "inconclusive": "no clear change"}[slower]
    return {"duration": slower, "cause": cause, "explanation": f"{head}: {text}"}


def _without_providers(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The config with every provider reference removed (what must match)."""
    out = {k: v for k, v in snapshot.items() if k != "providers"}
    steps = {}
    for name, step in (snapshot.get("steps") or {}).items():
        step = {k: v for k, v in step.items() if k != "provider"}
        if isinstance(step.get("hedge"), Mapping):
            step["hedge"] = {k: v for k, v in step["hedge"].items() if k != "targets"}
        steps[name] = step
    out["steps"] = steps
    return out


def _providers_used(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """Per step, the provider configs it calls (by value, so a renamed provider matches)."""
    providers = snapshot.get("providers") or {}
    used = {}
    for name, step in (snapshot.get("steps") or {}).items():
        targets = [step.get("provider")]
        if isinstance(step.get("hedge"), Mapping):
            targets += list(step["hedge"].get("targets") or [])
        used[name] = [providers.get(t) for t in targets]
    return used


def differ_only_in_provider(store: Store, a: str, b: str) -> bool:
    """True when A and B are runs whose configs are the same but for where steps are served
    (a step's provider, its hedge targets, or a provider's own settings).

    ``chainrun compare A B`` then adds the ``--by provider`` comparison by itself.
    Live windows and unknown runs give False.
    """
    if not (a.strip().isdigit() and b.strip().isdigit()):
        return False
    try:
        snaps = [json.loads(_col(store.get_run(int(x)), "config")) for x in (a, b)]
    except (ChainrunError, KeyError, TypeError, ValueError):
        return False
    if _without_providers(snaps[0]) != _without_providers(snaps[1]):
        return False
    return _providers_used(snaps[0]) != _providers_used(snaps[1])


def compare_providers(store: Store, a: str, b: str, confidence: float = 0.95) -> dict[str, Any]:
    """Per LLM step, B against A split into TTFT, time per output token and tokens.

    Args:
        store: the run log.
        a, b: run ids (as strings) or ``live`` / ``live:FROM..TO``, as for
            :func:`chainrun.analysis.compare.compare`.
        confidence: level of every interval.

    Returns (JSON-ready; ``*_ci`` lists are ``[lo, hi]`` or None where n cannot bound
    them)::

        {"a": SIDE, "b": SIDE, "confidence": 0.95, "by": "provider",
         "steps": {"<step>": {
            "a": {"provider": [...], "server_address": [...], "model": [...],
                  "n_calls": N, "unknown": {"tpot_ms": k, ...},
                  "ttft_ms": SUMMARY, "tpot_ms": SUMMARY, "output_tokens": SUMMARY},
            "b": {...},
            "duration": {"a": SUMMARY, "b": SUMMARY},
            "changes": {"ttft_ms": CHANGE, "tpot_ms": CHANGE, "output_tokens": CHANGE},
            "contributions_ms": {"ttft", "per_token", "tokens"},   (see contributions())
            "verdict": {"duration": "worse"|"better"|"inconclusive",
                        "cause": "work"|"serving"|"both"|"unexplained"|None,
                        "explanation": "..."}}}}

        CHANGE = {"p50_diff", "p50_diff_ci", "p90_diff", "p90_diff_ci",
                  "status": "up"|"down"|"similar"|"too_few"|"unknown"}

    Raises:
        UserInputError: an unknown run id or a malformed selector.
    """
    sa, sb = select(store, a), select(store, b)
    calls_a, calls_b = _step_calls(sa), _step_calls(sb)
    steps: dict[str, Any] = {}
    for step in dict.fromkeys([*calls_a, *calls_b]):
        ca, cb = calls_a.get(step, []), calls_b.get(step, [])
        va, ua = _values(ca)
        vb, ub = _values(cb)
        sides = {}
        for name, calls, vals, unknown in (("a", ca, va, ua), ("b", cb, vb, ub)):
            sides[name] = {
                **_who(calls),
                "n_calls": len(calls),
                "unknown": unknown,
                **{k: summarize(vals[k], confidence, unit) for k, _, unit in COMPONENTS},
            }
        dur_a = [float(d) for c in ca if (d := _col(c, "duration_ms")) is not None]
        dur_b = [float(d) for c in cb if (d := _col(c, "duration_ms")) is not None]
        slower = latency_verdict([quantile_diff(dur_a, dur_b, p, confidence) for p in (50, 90)])
        changes = {k: _change(va[k], vb[k], confidence) for k, _, _ in COMPONENTS}
        parts = contributions(va, vb, (hidden_reasoning(ca), hidden_reasoning(cb)))
        steps[step] = {
            **sides,
            "duration": {"a": summarize(dur_a, confidence), "b": summarize(dur_b, confidence)},
            "changes": changes,
            "contributions_ms": parts,
            "verdict": _verdict(slower, changes, parts),
        }
    return {
        "a": sa.describe(),
        "b": sb.describe(),
        "confidence": confidence,
        "by": "provider",
        "steps": steps,
    }
