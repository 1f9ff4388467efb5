"""Does the classify label change what retrieve finds? (issue 15: ``use_label`` default)

For every message of a replay set and every label the default classify step can give,
run the default retrieval stage with the label and without it, and compare the product
ids. Prints a JSON document; exit 0.

    python benchmarks/retrieval_label_effect.py [--replay replays/commerce-12.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import sqlite_utils

from chainrun.classify.base import DEFAULT_LABELS
from chainrun.replay.run import load_requests
from chainrun.retrieval import RetrievalSettings, build_retriever
from chainrun.retrieval.catalog import ensure_sample_catalog


async def run(replay: str) -> dict[str, Any]:
    db = sqlite_utils.Database(memory=True)
    ensure_sample_catalog(db)
    retriever = build_retriever(RetrievalSettings(), db)
    await retriever.warm()
    changed: list[dict[str, Any]] = []
    n = 0
    try:
        for req in load_requests(replay):
            base = [r["id"] for r in (await retriever.retrieve(req.message)).as_json()["results"]]
            for label in DEFAULT_LABELS:
                found = await retriever.retrieve(req.message, label=label)
                ids = [r["id"] for r in found.as_json()["results"]]
                n += 1
                if ids != base:
                    changed.append({"id": req.id, "label": label, "without": base, "with": ids})
    finally:
        await retriever.aclose()
    return {"replay": replay, "labels": list(DEFAULT_LABELS), "pairs": n,
            "changed": len(changed), "examples": changed[:5]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", default="replays/commerce-12.jsonl")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.replay)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
