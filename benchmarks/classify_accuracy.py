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

from chainrun.analysis import stats
from chainrun.classify import (
    DEFAULT_EXAMPLES,
    DEFAULT_K,
    KeywordRules,
    NearestExamples,
    RulesThenExamples,
    label_schema,
    read_examples,
)
from chainrun.config import CLASSIFY_LABELS, LLM_CLASSIFY_STEP, ProviderConfig
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.factory import open_provider
from chainrun.retrieval.embeddings import MiniLMEmbedder
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
    labels = list(CLASSIFY_LABELS)

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
    labels = list(CLASSIFY_LABELS)
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
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    doc = c.new_document("classify_accuracy", argv or [], vars(args))
    doc["results"] = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
