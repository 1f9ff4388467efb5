"""Measure: what ``Store.log_turn`` costs the event loop per turn on a file log.

Before commit abe3a47 ``Store.open`` turned WAL on but left ``synchronous`` at SQLite's
default (FULL), so each turn's transaction waited for an fsync, and ``Chain`` calls
``log_turn`` on the event loop: every in-flight stream and hedge timer waited with it.
abe3a47 sets ``synchronous = NORMAL``. Compares the store as opened now, the old FULL,
and an in-memory log.

Run: ``python benchmarks/repro/log_turn_cost.py``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store


def turn() -> TurnLog:
    return TurnLog(
        TurnRow(input="hi", status="ok"),
        steps=[StepRow(step="guard")],
        calls=[CallRow(step="guard", attempt=1)],
    )


def cost_ms(store: Store, n: int = 200) -> tuple[float, float]:
    run = store.create_run("live", "{}")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        store.log_turn(run, turn())
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[n // 2], times[int(n * 0.9)]


def main() -> None:
    for sync in ("as Store.open", "FULL (old)"):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp) / "log.db")
            if sync == "FULL (old)":
                store.db.execute("PRAGMA synchronous=FULL")
            p50, p90 = cost_ms(store)
            store.close()
        print(f"file log, synchronous={sync:15} log_turn median {p50:5.2f} ms, p90 {p90:5.2f} ms")
    store = Store.open(":memory:")
    p50, p90 = cost_ms(store)
    print(f"in-memory log:                           median {p50:5.2f} ms, p90 {p90:5.2f} ms")


if __name__ == "__main__":
    main()
