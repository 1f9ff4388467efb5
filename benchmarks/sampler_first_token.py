"""What llama.cpp's samplers cost at the answer's first token, on the embedded model.

The answer step sends llama-server sampler fields (``[steps.compose] sampling``). Each
arm below sends the same streamed request (the longest answer prompt of the main job,
``replays/commerce-12.jsonl``, as the default chain writes it; ``max_tokens`` 4,
temperature 0.2) to the same slot of this install's embedded model server (Gemma 3
270M on llama-server, started if it is not running), so after the first request the
prompt is cached and the time to the first content token is the sampler's setup and
one decoded token, not the prompt's computation. Arms, in turn, ``--rounds`` times:

- ``none``: no sampler field;
- ``repeat``: the repetition penalty (``repeat_penalty`` 1.15 over the last 64 tokens);
- ``dry``: the DRY sampler (multiplier 0.8, base 1.75, allowed length 2: the values its
  author suggests, p-e-w, text-generation-webui pull request 5677);
- ``dry_last_64``: DRY looking back 64 tokens only (``dry_penalty_last_n``);
- ``repeat_and_dry``: both, the default chain's setting before this measurement.

Per arm: n, the median time to the first content token (ms, the first round left out:
it computes the prompt) with its distribution-free 95% interval, and the median's
difference from ``none``.

Run (a timing run: alone, under the lock)::

    flock /tmp/chainrun-timing.lock python benchmarks/sampler_first_token.py \\
        [--rounds 12] [--out benchmarks/results/sampler_first_token.json]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from _common import machine_info

from chainrun.runtime import local_model
from chainrun.statistics.intervals import percentile, quantile_ci

#: the answer prompt the arms send: the main job's longest (sizing-1's, 553 prompt
#: tokens), as the default chain wrote it
SYSTEM = (
    "A chat between a shopper and the friendly stylist of an online fashion shop. The "
    "stylist answers in one short sentence in the shopper's own words; the shop lists "
    "the products under it."
)
PROMPT = (
    "Shop policy, Sizes and fit:\n"
    'Fits: "slim" runs close to the body (size up if between sizes), "regular" is true '
    'to size, "relaxed" and "oversized" are roomy (size down for a closer fit).\n'
    "Every product page has a size chart in cm; our sizes run XS-XXL (EU 32-50 for "
    "women, 44-58 for men).\n"
    "Shoes are in EU sizes 35-47; UK to EU: add 33 for UK 2-5 (UK 4 = EU 37), add 34 "
    "from UK 6 (UK 8 = EU 42); wide feet: our running shoes and trainers fit true to "
    "size, boots run slightly narrow.\n\n"
    "Catalogue matches:\n(none)\n\n"
    "Shopper: I'm usually a medium in tops but your slim-fit shirts look tight. Should I "
    "size up?\nStylist: Here is what our policy says about fits"
)
ARMS: dict[str, dict[str, Any]] = {
    "none": {},
    "repeat": {"repeat_penalty": 1.15, "repeat_last_n": 64},
    "dry": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2},
    "dry_last_64": {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
                    "dry_penalty_last_n": 64},
    "repeat_and_dry": {"repeat_penalty": 1.15, "repeat_last_n": 64, "dry_multiplier": 0.8,
                       "dry_base": 1.75, "dry_allowed_length": 2},
}  # fmt: skip


def first_token_ms(base_url: str, fields: dict[str, Any]) -> float:
    """One streamed request's time to its first content token (ms).

    Raises:
        RuntimeError: the stream ended without content.
    """
    body = {
        "model": "gemma-3-270m", "stream": True, "max_tokens": 4, "temperature": 0.2,
        "id_slot": 0, "cache_prompt": True, **fields,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": PROMPT}],
    }  # fmt: skip
    t0 = time.perf_counter()
    took: float | None = None
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if took is None and line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"] if '"choices"' in line else {}
                if delta.get("content"):
                    took = (time.perf_counter() - t0) * 1000.0
    if took is None:
        raise RuntimeError("the stream ended without content")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args()
    server = local_model.up(quiet=True)
    started, date = machine_info(), datetime.now(UTC).isoformat(timespec="seconds")
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        for arm, fields in ARMS.items():
            times[arm].append(first_token_ms(server.base_url, fields))
    base = percentile(times["none"][1:], 50)
    results = {}
    for arm, values in times.items():
        kept = values[1:]
        p50 = percentile(kept, 50)
        results[arm] = {"n": len(kept), "p50_ms": round(p50, 1),
                        "p50_ci_ms": quantile_ci(kept, 50),
                        "p50_minus_none_ms": round(p50 - base, 1)}  # fmt: skip
        print(f"{arm:>15}: n={len(kept)} p50 {p50:6.1f} ms "
              f"(vs none {p50 - base:+6.1f}) ci {results[arm]['p50_ci_ms']}")  # fmt: skip
    doc = {"benchmark": "sampler_first_token", "date": date, "machine_start": started,
           "machine_end": machine_info(), "server": server.base_url,
           "rounds": args.rounds, "results": results}  # fmt: skip
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
