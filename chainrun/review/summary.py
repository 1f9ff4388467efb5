"""The paired result of a review: how often B's answer was judged better, worse or the
same as A's, with intervals, a sign test, the tags by run and the reviewers' agreement.

- Shares (B better, A better, same) over the judgements, each with its 95% Wilson
  interval (Wilson, JASA 22, 1927).
- The sign test: among the judgements that preferred one answer, is B preferred more
  often than chance (exact two-sided binomial at 1/2, the same test as the paired
  pass-rate comparison; ties carry no information and are left out).
- Verdict: ``better`` (B preferred, p < 0.05), ``worse`` (A preferred, p < 0.05), else
  ``inconclusive``; with the judgements it would take at the observed split to decide.
- Agreement, for requests judged by two or more reviewers: the share of reviewer pairs
  that gave the same verdict (percent agreement) and, for exactly two reviewers,
  Cohen's kappa (Cohen, "A coefficient of agreement for nominal scales", Educational
  and Psychological Measurement 20(1), 1960): agreement beyond what the two reviewers'
  own verdict shares give by chance.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import combinations
from typing import Any, Literal

from chainrun.log.rows import ReviewJudgementRow
from chainrun.statistics.intervals import sign_test_p, wilson_interval

__all__ = ["TAGS", "judgements_to_decide", "review_summary"]

#: the tags a reviewer can give an answer
TAGS: tuple[str, ...] = ("invented fact", "wrong route", "rude", "unhelpful", "too long")

Verdict = Literal["better", "worse", "same"]


def _verdict(j: ReviewJudgementRow) -> Verdict:
    """B's side of one judgement: ``better`` (B preferred), ``worse`` or ``same``."""
    if j.preferred_run is None:
        return "same"
    return "better" if j.preferred_run == j.run_b else "worse"


def _share(k: int, n: int) -> dict[str, Any]:
    ci = wilson_interval(k, n)
    return {"n": k, "share": round(k / n, 4) if n else None,
            "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None}  # fmt: skip


def judgements_to_decide(better: int, worse: int, limit: int = 10_000) -> int | None:
    """The fewest decisive judgements (same or more) at which the observed split
    ``better : worse`` would reach p < 0.05 in the sign test (None: an even split, or
    beyond ``limit``)."""
    n = better + worse
    if n == 0 or better == worse:
        return None
    share = max(better, worse) / n
    for m in range(max(n, 1), limit + 1):
        if sign_test_p(round(share * m), m) < 0.05:
            return m
    return None


def _kappa(pairs: Sequence[tuple[Verdict, Verdict]]) -> float | None:
    n = len(pairs)
    if n == 0:
        return None
    observed = sum(1 for x, y in pairs if x == y) / n
    first, second = Counter(x for x, _ in pairs), Counter(y for _, y in pairs)
    chance = sum(first[v] * second[v] for v in ("better", "worse", "same")) / (n * n)
    return None if chance == 1 else round((observed - chance) / (1 - chance), 4)


def review_summary(judgements: Sequence[ReviewJudgementRow], n_shared: int) -> dict[str, Any]:
    """The paired result of ``judgements`` (one run pair), over ``n_shared`` requests
    both runs answered. JSON-ready: ``{"n_shared", "n_judgements", "b_better", "b_worse",
    "same", "sign_test", "verdict", "to_decide", "tags", "reviewers", "agreement"}``."""
    verdicts = [_verdict(j) for j in judgements]
    n = len(verdicts)
    count = Counter(verdicts)
    better, worse = count["better"], count["worse"]
    p = sign_test_p(better, better + worse)
    verdict = "inconclusive"
    if better + worse and p < 0.05:
        verdict = "better" if better > worse else "worse"
    tags: dict[str, Counter[str]] = {"a": Counter(), "b": Counter()}
    for j in judgements:
        for side in ("a", "b"):
            tags[side].update(j.tags.get(side, []))
    by_reviewer: dict[str, Counter[str]] = defaultdict(Counter)
    by_request: dict[str, dict[str, Verdict]] = defaultdict(dict)
    for j, v in zip(judgements, verdicts, strict=True):
        by_reviewer[j.reviewer][v] += 1
        by_request[j.request_id][j.reviewer] = v
    pair_verdicts: dict[tuple[str, str], list[tuple[Verdict, Verdict]]] = defaultdict(list)
    for seen in by_request.values():
        for r1, r2 in combinations(sorted(seen), 2):
            pair_verdicts[(r1, r2)].append((seen[r1], seen[r2]))
    all_pairs = [pv for pvs in pair_verdicts.values() for pv in pvs]
    agreement: dict[str, Any] = {
        "reviewer_pairs": len(all_pairs),
        "percent_agreement": (round(sum(1 for x, y in all_pairs if x == y) / len(all_pairs), 4)
                              if all_pairs else None),
        "cohens_kappa": (_kappa(next(iter(pair_verdicts.values())))
                         if len(by_reviewer) == 2 and pair_verdicts else None),
    }  # fmt: skip
    return {
        "n_shared": n_shared,
        "n_judgements": n,
        "b_better": _share(better, n),
        "b_worse": _share(worse, n),
        "same": _share(count["same"], n),
        "sign_test": {"decisive": better + worse, "b_preferred": better, "p_value": round(p, 6)},
        "verdict": verdict,
        "to_decide": None if verdict != "inconclusive" else judgements_to_decide(better, worse),
        "tags": {side: dict(sorted(c.items())) for side, c in tags.items()},
        "reviewers": {r: dict(c) for r, c in sorted(by_reviewer.items())},
        "agreement": agreement,
    }
