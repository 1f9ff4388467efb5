"""Label accuracy and latency of each way chainrun classifies a shopper's message.

Cases: ``evals/regression.jsonl`` (every case carries its expected ``label``). Methods:

* ``model``: the classify step done by the model (:data:`chainrun.config.LLM_CLASSIFY_STEP`):
  the local model continues the few-shot transcript (``Category:``), its answer's first
  label is taken (``parse_label``);
* ``model-enum``: the same prompt, the answer constrained to ``{"label": <one of the
  labels>}`` by a JSON Schema enum (``response_format``; llama-server turns it into a
  grammar: :func:`chainrun.classify.label_schema`);
* ``examples``: nearest labelled examples on MiniLM (``chainrun/data/classify_examples.jsonl``,
  k = 11; no model call);
* ``keywords``: the keyword rules of :mod:`chainrun.classify.keywords`;
* ``combined``: keyword rules when exactly one label's rules fire, else the examples.

For each: accuracy k/n with a 95% Wilson interval, and per-message latency (ms, wall
clock around one classification, the model's call included) p50 and p95 with n and
95% order-statistic intervals. The model methods run on their own llama-server of the
local model (``-np 1``: one message at a time, as the step sees it), started and
stopped by the benchmark; ``--no-model`` skips them.

Run (timing runs hold the shared lock)::

    flock /tmp/chainrun-bench.lock python benchmarks/classify_accuracy.py \\
        [--rounds 3] [--model-rounds 1]

The examples and rules were written by the people who labelled the cases (they were
not fitted to them, but they are not a blind test either): a shop should measure on
its own labelled messages (``--cases``).

``--cv`` estimates instead of that upper bound: stratified k-fold cross-validation
(``--folds``, ``--repeats``) over the pooled labelled set (the shipped examples the
team wrote and the cases), every fold's classifier built from the training folds only:
its examples are the training folds' messages plus the shipped rows of public corpora
(those with a ``source``, never held out; ``--no-public`` leaves them out), and its
keyword rules are the built-in patterns that
match at least one training message of their label with a precision of at least
``--rule-precision`` on the training folds (a pattern justified only by held-out
messages is dropped). Out-of-fold labels give the accuracy per method and per label
(Wilson intervals), and the combined method's accuracy-coverage curve over its
confidence (:attr:`chainrun.classify.Classification.confidence`): the threshold below
which a turn is unsure and gets the material of its runner-up labels too (the classify
step's ``unsure_below``). The rule-writing figure (the rules as written, on the set
they were written from) is printed beside it. No timing, no lock needed::

    python benchmarks/classify_accuracy.py --cv [--folds 5 --repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _common as c

from chainrun.classify import (
    DEFAULT_EXAMPLES,
    DEFAULT_K,
    OUT_OF_SCOPE_BELOW,
    KeywordRules,
    NearestExamples,
    RulesThenExamples,
    label_schema,
    read_examples,
)
from chainrun.classify.base import DEFAULT_LABELS
from chainrun.config import LLM_CLASSIFY_STEP, ProviderConfig
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.factory import open_provider
from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.statistics import intervals as stats
from chainrun.steps.llm import parse_label

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "evals" / "regression.jsonl"

Classify = Callable[[str], Awaitable[str]]


def load_cases(path: Path) -> list[tuple[str, str, str]]:
    """(id, message, expected label) of every labelled case."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            doc = json.loads(line)
            if doc.get("label"):
                out.append((doc["id"], doc["message"], doc["label"]))
    return out


async def model_method(
    base_url: str, *, enum: bool
) -> tuple[Classify, Callable[[], Awaitable[None]]]:
    """The model classify step's request on the server at ``base_url`` (a conversation's
    first turn: ``{history}`` empty)."""
    step = LLM_CLASSIFY_STEP
    provider = await open_provider("local", ProviderConfig(base_url=base_url), quiet=True)
    labels = list(DEFAULT_LABELS)

    async def classify(message: str) -> str:
        request = ChatRequest(
            model="gemma-3-270m",
            messages=[{"role": "user",
                       "content": step["prompt"].format(history="", message=message)}],
            # the grammar llama-server builds from a JSON Schema allows whitespace before
            # the object, and the 270M model writes some: 16 tokens cut every answer
            # ('finish_reason: length', all unparseable); 64 leave room for the label
            max_output_tokens=64 if enum else step["max_output_tokens"],
            temperature=0.0,
            stop=None if enum else step["stop"],
            json_schema=label_schema(labels) if enum else None,
        )
        stream = ChatStream(provider, request)
        try:
            await stream.collect()
        finally:
            await stream.aclose()
        text = stream.timer.text
        if enum:
            try:
                return str(json.loads(text)["label"])
            except (ValueError, KeyError, TypeError):
                return "(unparseable)"
        return parse_label(text, labels)

    return classify, provider.aclose


async def measure(
    name: str, classify: Classify, cases: list[tuple[str, str, str]], rounds: int
) -> dict[str, Any]:
    """Accuracy (first round) and latency (every round) of one method."""
    latencies: list[float] = []
    wrong: list[dict[str, str]] = []
    right = 0
    confusion: dict[str, dict[str, int]] = {}
    for r in range(rounds):
        print(f"{name}: round {r + 1} of {rounds}", file=sys.stderr, flush=True)
        for case_id, message, expected in cases:
            t0 = time.perf_counter()
            got = await classify(message)
            latencies.append((time.perf_counter() - t0) * 1000.0)
            if r == 0:
                right += got == expected
                row = confusion.setdefault(expected, {})
                row[got] = row.get(got, 0) + 1
                if got != expected:
                    wrong.append({"id": case_id, "expected": expected, "got": got})
    n = len(cases)
    lat = sorted(latencies)
    p50, p95 = stats.percentile(lat, 50), stats.percentile(lat, 95)
    result = {
        "method": name,
        "n": n,
        "correct": right,
        "accuracy": round(right / n, 4),
        "accuracy_ci95": c.wilson(right, n),
        "latency_n": len(lat),
        "latency_p50_ms": round(p50, 2),
        "latency_p50_ci95_ms": stats.quantile_ci(lat, 50),
        "latency_p95_ms": round(p95, 2),
        "latency_p95_ci95_ms": stats.quantile_ci(lat, 95),
        "confusion": confusion,
        "wrong": wrong,
    }
    # each method's figures as soon as they are known (a long model run may be cut)
    print("result " + json.dumps(result), file=sys.stderr, flush=True)
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cases = load_cases(Path(args.cases))
    labels = list(DEFAULT_LABELS)
    embedder = MiniLMEmbedder()
    examples = NearestExamples(labels, read_examples(DEFAULT_EXAMPLES, labels), embedder, k=args.k)
    await examples.warm()
    rules = KeywordRules(labels)
    combined = RulesThenExamples(rules, examples)

    async def label_of(method: Any, message: str) -> str:
        return str((await method.classify(message)).label)

    methods: dict[str, Classify] = {
        "keywords": lambda m: label_of(rules, m),
        "examples": lambda m: label_of(examples, m),
        "combined": lambda m: label_of(combined, m),
    }
    results = []
    for name, fn in methods.items():
        await fn("warm-up")
        results.append(await measure(name, fn, cases, args.rounds))
    if not args.no_model:
        from real_model import llama_server

        with llama_server(1) as base_url:
            for name, enum in (("model", False), ("model-enum", True)):
                fn, close = await model_method(base_url, enum=enum)
                try:
                    await fn("warm-up")
                    results.append(await measure(name, fn, cases, args.model_rounds))
                finally:
                    await close()
    return {"methods": results}


# ------------------------------------------------------------------ cross-validation


def public_rows(examples_path: Path = DEFAULT_EXAMPLES) -> set[str]:
    """The messages of the examples file that name a ``source`` (rows of a public corpus's
    training split, not written by the team)."""
    rows = (json.loads(line) for line in examples_path.read_text(encoding="utf-8").splitlines()
            if line.strip())  # fmt: skip
    return {d["message"] for d in rows if d.get("source")}


def pooled_set(cases_path: Path, examples_path: Path = DEFAULT_EXAMPLES) -> list[tuple[str, str]]:
    """(label, message) of the examples the team wrote (no ``source``) and the labelled
    cases, each message once."""
    labels = list(DEFAULT_LABELS)
    public = public_rows(examples_path)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    written = [e for e in read_examples(examples_path, labels) if e[1] not in public]
    for label, message in [*written,
                           *((lab, m) for _, m, lab in load_cases(cases_path))]:  # fmt: skip
        if message not in seen:
            seen.add(message)
            out.append((label, message))
    return out


def stratified_folds(labels: list[str], folds: int, seed: int) -> list[int]:
    """A fold number for each item: items of each label shuffled (``seed``) and dealt
    round-robin, so every fold holds about 1/folds of each label."""
    import random

    rng = random.Random(seed)
    fold = [0] * len(labels)
    start = 0
    for label in sorted(set(labels)):
        idx = [i for i, lab in enumerate(labels) if lab == label]
        rng.shuffle(idx)
        for j, i in enumerate(idx):
            fold[i] = (start + j) % folds
        start += len(idx)
    return fold


def fit_rules(
    train: list[tuple[str, str]], min_precision: float, candidates: dict[str, list[str]]
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """The ``candidates`` patterns (label → patterns) the training messages justify: a
    pattern is kept when it matches at least one training message of its label and at
    least ``min_precision`` of the training messages it matches are of its label.
    Returns (label → patterns, with an empty list for a label that keeps none, and
    counts kept/dropped)."""
    import re

    kept: dict[str, list[str]] = {}
    n_kept = n_dropped = 0
    for label, patterns in candidates.items():
        kept[label] = []
        for pattern in patterns:
            rx = re.compile(pattern, re.I)
            matched = [lab for lab, m in train if rx.search(m)]
            right = sum(lab == label for lab in matched)
            if right >= 1 and right / len(matched) >= min_precision:
                kept[label].append(pattern)
                n_kept += 1
            else:
                n_dropped += 1
    return kept, {"kept": n_kept, "dropped": n_dropped}


async def cross_validate(args: argparse.Namespace) -> dict[str, Any]:
    """Out-of-fold labels of keywords, examples and combined (see the module text)."""
    import numpy as np

    from chainrun.classify import DEFAULT_RULES

    pool = pooled_set(Path(args.cases), Path(args.examples))
    labels = list(DEFAULT_LABELS)
    public = [] if args.no_public else [
        e for e in read_examples(Path(args.examples), labels)
        if e[1] in public_rows(Path(args.examples))]  # fmt: skip
    candidates = DEFAULT_RULES
    if args.rules:
        with open(args.rules, encoding="utf-8") as f:  # noqa: ASYNC230 (a benchmark's input, once)
            candidates = json.load(f)
    embedder = MiniLMEmbedder()
    vectors = np.asarray(await embedder.embed([m for _, m in pool]), dtype=np.float32)
    public_vectors = np.asarray(await embedder.embed([m for _, m in public]), dtype=np.float32)
    truth = [lab for lab, _ in pool]
    per_method: dict[str, list[tuple[str, str, float]]] = {"keywords": [], "examples": [],
                                                           "combined": []}  # fmt: skip
    combined_found: list[tuple[str, Any]] = []
    rule_counts = []
    for repeat in range(args.repeats):
        fold = stratified_folds(truth, args.folds, seed=repeat)
        for f in range(args.folds):
            train = [i for i in range(len(pool)) if fold[i] != f]
            test = [i for i in range(len(pool)) if fold[i] == f]
            rules_fit, counts = fit_rules([pool[i] for i in train], args.rule_precision,
                                          candidates)  # fmt: skip
            rule_counts.append(counts)
            rules = KeywordRules(labels, rules_fit)
            examples = NearestExamples(
                labels, [*(pool[i] for i in train), *public], embedder, k=args.k,
                vectors=np.concatenate([vectors[train], public_vectors.reshape(-1, 384)]),
                out_of_scope_below=args.out_of_scope_below)  # fmt: skip
            combined = RulesThenExamples(rules, examples)
            for i in test:
                message = pool[i][1]
                found_k = rules.classify_now(message)
                found_e = examples.vote(vectors[i])
                per_method["keywords"].append((truth[i], found_k.label,
                                               found_k.confidence or 0.0))  # fmt: skip
                per_method["examples"].append((truth[i], found_e.label,
                                               found_e.confidence or 0.0))  # fmt: skip
                found_c = combined.decide(message, found_e)
                per_method["combined"].append((truth[i], found_c.label,
                                               found_c.confidence or 0.0))  # fmt: skip
                combined_found.append((truth[i], found_c))
    n_pool = len(pool)
    methods = []
    for name, rows in per_method.items():
        first = rows[:n_pool]  # repeat 1: each item once, for the intervals
        right = sum(t == g for t, g, _ in first)
        all_right = sum(t == g for t, g, _ in rows)
        per_label = {}
        for label in labels:
            mine = [(t, g) for t, g, _ in first if t == label]
            k = sum(t == g for t, g in mine)
            per_label[label] = {"correct": k, "n": len(mine),
                                "accuracy": round(k / len(mine), 4) if mine else None,
                                "ci95": c.wilson(k, len(mine))}  # fmt: skip
        methods.append({
            "method": name, "n": n_pool, "correct": right,
            "accuracy": round(right / n_pool, 4), "accuracy_ci95": c.wilson(right, n_pool),
            "accuracy_all_repeats": round(all_right / len(rows), 4),
            "per_label": per_label,
        })  # fmt: skip
    curve = coverage_curve(combined_found)
    # the rule-writing figure: the rules as written, on the set they were written from
    written = KeywordRules(labels, candidates)
    in_sample = sum(written.classify_now(m).label == lab for lab, m in pool)
    return {
        "pool": {"n": n_pool, "by_label": {lab: truth.count(lab) for lab in labels}},
        "folds": args.folds, "repeats": args.repeats, "rule_precision": args.rule_precision,
        "rules_kept_per_fold": rule_counts[: args.folds],
        "methods": methods,
        "coverage_curve": curve,
        "threshold": choose_threshold(curve, args.target_accuracy),
        "target_accuracy": args.target_accuracy,
        "rule_writing": {"method": "keywords as written", "n": n_pool, "correct": in_sample,
                         "accuracy": round(in_sample / n_pool, 4),
                         "ci95": c.wilson(in_sample, n_pool)},
    }  # fmt: skip


def coverage_curve(rows: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Per threshold t (0.30 .. 0.95 by 0.05) over out-of-fold (true label,
    Classification) rows of every repeat: coverage (share of turns with confidence >= t:
    sure, one route), the sure turns' accuracy with its Wilson interval, and
    ``route_right``: the share of all turns whose true label is among the labels whose
    material they get (:meth:`~chainrun.classify.Classification.route_labels`)."""
    out = []
    n = len(rows)
    for step in range(6, 20):
        t = round(step * 0.05, 2)
        sure = [(tr, f.label) for tr, f in rows if (f.confidence or 0.0) >= t]
        k = sum(tr == g for tr, g in sure)
        covered = sum(tr in f.route_labels(t) for tr, f in rows)
        unsure_wrong = sum(tr != f.label for tr, f in rows if (f.confidence or 0.0) < t)
        out.append({"threshold": t, "coverage": round(len(sure) / n, 4), "n_sure": len(sure),
                    "sure_accuracy": round(k / len(sure), 4) if sure else None,
                    "sure_accuracy_ci95": c.wilson(k, len(sure)),
                    "wrong_sure": len(sure) - k, "wrong_unsure": unsure_wrong,
                    "route_right": round(covered / n, 4), "route_right_ci95": c.wilson(covered, n),
                    "n": n})  # fmt: skip
    return out


def choose_threshold(curve: list[dict[str, Any]], target: float) -> float | None:
    """The lowest threshold whose sure turns are right at least ``target`` of the time
    (so the most turns keep one route at that accuracy); None: no threshold reaches it."""
    for point in curve:
        if point["sure_accuracy"] is not None and point["sure_accuracy"] >= target:
            return float(point["threshold"])
    return None


def cv_summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = [f"pooled labelled set: n = {res['pool']['n']} {res['pool']['by_label']}; "
             f"{res['folds']}-fold stratified CV x {res['repeats']} repeats"]  # fmt: skip
    rw = res["rule_writing"]
    lines.append(f"rule-writing figure (rules as written, in-sample): {rw['correct']}/{rw['n']}"
                 f" = {rw['accuracy']:.3f} {rw['ci95']}")
    for m in res["methods"]:
        lines.append(f"{m['method']:<9} {m['correct']}/{m['n']} = {m['accuracy']:.3f} "
                     f"{m['accuracy_ci95']} (all repeats {m['accuracy_all_repeats']:.3f})")
        for lab, v in m["per_label"].items():
            lines.append(f"    {lab:<15} {v['correct']}/{v['n']} {v['ci95']}")
    lines.append("combined: threshold  coverage  sure accuracy [95% CI]  wrong sure/unsure"
                 "  right label in the route [95% CI]")
    for p in res["coverage_curve"]:
        lines.append(f"  {p['threshold']:.2f}  {p['coverage']:.3f} ({p['n_sure']}/{p['n']})  "
                     f"{p['sure_accuracy']}  {p['sure_accuracy_ci95']}  "
                     f"{p['wrong_sure']}/{p['wrong_unsure']}  {p['route_right']} "
                     f"{p['route_right_ci95']}")
    lines.append(f"chosen threshold (lowest with sure accuracy >= {res['target_accuracy']}): "
                 f"{res['threshold']}")
    return "\n".join(lines)


def summary(doc: dict[str, Any]) -> str:
    lines = [f"{'method':<11} {'accuracy [95% CI]':<26} {'n':>3}  "
             f"{'p50 ms [95% CI]':<24} {'p95 ms [95% CI]':<24} n(lat)"]  # fmt: skip
    for m in doc["results"]["methods"]:
        lo, hi = m["accuracy_ci95"]

        def ci(v: Any) -> str:
            return "-" if v is None else f"[{v[0]:.1f}, {v[1]:.1f}]"

        lines.append(
            f"{m['method']:<11} {m['correct']}/{m['n']} = {m['accuracy']:.3f} "
            f"[{lo:.3f}, {hi:.3f}]".ljust(39) + f"{m['n']:>3}  "
            f"{m['latency_p50_ms']:>8.2f} {ci(m['latency_p50_ci95_ms']):<15} "
            f"{m['latency_p95_ms']:>8.2f} {ci(m['latency_p95_ci95_ms']):<15} {m['latency_n']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=str(CASES), help="labelled cases (JSONL)")
    parser.add_argument("--rounds", type=int, default=3, help="passes for the latency figures")
    parser.add_argument("--model-rounds", type=int, default=1,
                        help="passes of the model methods (a model call per message each)")
    parser.add_argument("--k", type=int, default=DEFAULT_K, help="examples: neighbours that vote")
    parser.add_argument("--no-model", action="store_true", help="skip the model methods")
    parser.add_argument("--cv", action="store_true",
                        help="cross-validated estimate instead (see the module text)")
    parser.add_argument("--folds", type=int, default=5, help="--cv: folds")
    parser.add_argument("--examples", default=str(DEFAULT_EXAMPLES),
                        help="--cv: the examples pooled with the cases (JSONL)")
    parser.add_argument("--rules", help="--cv: candidate rules, JSON label -> patterns "
                        "(default: the built-in ones)")
    parser.add_argument("--repeats", type=int, default=3, help="--cv: repeats (seeds 0..)")
    parser.add_argument("--no-public", action="store_true",
                        help="--cv: leave the public corpora's rows out of every fold's "
                             "examples (as before they were shipped)")
    parser.add_argument("--out-of-scope-below", type=float, default=OUT_OF_SCOPE_BELOW,
                        help="--cv: the examples' out-of-scope threshold (0: off)")
    parser.add_argument("--rule-precision", type=float, default=0.5,
                        help="--cv: a rule's least precision on the training folds")
    parser.add_argument("--target-accuracy", type=float, default=0.95,
                        help="--cv: the sure turns' accuracy the threshold must reach")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document("classify_accuracy", argv or [], vars(args))
    if args.cv:
        doc["results"] = asyncio.run(cross_validate(args))
        out = args.out or str(c.RESULTS_DIR / "classify_cv.json")
        c.finish(doc, as_json=args.json, summary=cv_summary, out=out)
        return
    doc["results"] = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
