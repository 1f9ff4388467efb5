"""A time-windowed latency window: the source of a percentile hedge delay.

Modelled on Finagle's ``BackupRequestFilter``: latencies go into a histogram over a
sliding window made of a few time buckets (3 buckets of 10 s there), the percentile
is recomputed at most every few seconds (3 s there), it never goes below a floor
(1 ms there), and there is no percentile at all until the window holds enough data
(no backups during warm-up). Dean and Barroso ("The Tail at Scale", CACM 56(2), 2013)
suggest the p95 as the hedge delay, which limits the extra load to about 5%.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


class LatencyWindow:
    """Latency samples (ms) of the last ``window_s`` seconds, kept in ``buckets`` time buckets.

    A sample lives in the bucket of the time it was recorded; a bucket is dropped as a
    whole once it is ``buckets`` bucket-lengths old, so the window covers between
    ``window_s * (buckets - 1) / buckets`` and ``window_s`` seconds of history (Finagle's
    scheme: cheap expiry, no per-sample timestamps).

    Args:
        window_s: length of the window in seconds (Finagle: 30 s).
        buckets: number of buckets the window is split into (Finagle: 3).
        min_samples: fewer samples than this in the window means warm-up:
            :meth:`percentile` returns None.
        refresh_s: a percentile is recomputed at most this often, in seconds (Finagle: 3 s);
            in between the cached value is returned.
        floor_ms: lower bound of any percentile returned, in ms (Finagle: 1 ms).
        clock: monotonic time in seconds; injectable for tests.

    Raises:
        ValueError: a non-positive window, bucket count or refresh interval, or a negative
            ``min_samples`` or ``floor_ms``.
    """

    def __init__(
        self,
        window_s: float = 30.0,
        *,
        buckets: int = 3,
        min_samples: int = 20,
        refresh_s: float = 3.0,
        floor_ms: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or buckets < 1 or refresh_s < 0 or min_samples < 0 or floor_ms < 0:
            raise ValueError(
                "LatencyWindow needs window_s > 0, buckets >= 1, refresh_s >= 0, "
                f"min_samples >= 0, floor_ms >= 0; got {window_s=}, {buckets=}, "
                f"{refresh_s=}, {min_samples=}, {floor_ms=}"
            )
        self.window_s = window_s
        self.buckets = buckets
        self.min_samples = min_samples
        self.refresh_s = refresh_s
        self.floor_ms = floor_ms
        self._clock = clock
        self._bucket_s = window_s / buckets
        # (bucket index, samples in ms), oldest first
        self._buckets: deque[tuple[int, list[float]]] = deque()
        # percentile -> (computed at, in clock seconds; value in ms)
        self._cache: dict[float, tuple[float, float]] = {}

    def record(self, latency_ms: float) -> None:
        """Add one latency sample, in ms (negative values are clamped to 0)."""
        index = self._expire()
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, []))
        self._buckets[-1][1].append(max(0.0, latency_ms))

    def __len__(self) -> int:
        """Number of samples currently in the window."""
        self._expire()
        return sum(len(samples) for _, samples in self._buckets)

    def percentile(self, p: float) -> float | None:
        """The ``p``-th percentile (0 < p <= 100) of the window in ms, or None during warm-up.

        Nearest-rank definition: the ``ceil(p / 100 * n)``-th smallest of the ``n`` samples,
        so with 20 samples the p95 is the second-slowest. The result is at least
        ``floor_ms``, cached for ``refresh_s`` seconds, and None whenever the window holds
        fewer than ``min_samples`` samples (checked on every call, not cached).

        Raises:
            ValueError: ``p`` outside (0, 100].
        """
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {p}")
        count = len(self)
        if count == 0 or count < self.min_samples:
            return None
        now = self._clock()
        cached = self._cache.get(p)
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1]
        samples = sorted(s for _, bucket in self._buckets for s in bucket)
        rank = max(1, math.ceil(p / 100 * len(samples)))
        value = max(self.floor_ms, samples[rank - 1])
        self._cache[p] = (now, value)
        return value

    def _expire(self) -> int:
        """Drop buckets that left the window; return the current bucket index."""
        index = math.floor(self._clock() / self._bucket_s)
        while self._buckets and self._buckets[0][0] <= index - self.buckets:
            self._buckets.popleft()
        return index
