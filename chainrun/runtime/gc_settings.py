"""Keep the garbage collector off the objects a long-running chainrun process starts with,
and its full passes rare.

CPython's cyclic collector stops the whole process for a full (generation 2) collection,
and such a pass walks every tracked object. A process serving many turns holds the
objects of its start-up for its whole life (imported modules, the config, pydantic
schemas, the catalogue, the providers' clients: about 170,000 with the default chain)
and, with 1,000 turns in flight, each full collection also walks them. Measured on
``benchmarks/scale.py``'s paced 1,000 level (2,000 turns, about 80 s): 18 full
collections, 13.2 s in all, the longest 1.2 s, and the event loop's lag p99 589 ms;
with the start-up objects frozen (the next run, 6 minutes later), 6.3 s in all, the
longest 0.63 s, lag p99 55 ms (benchmarks/README.md, "Scale in one process at 1,000
turns").

:func:`freeze_startup_objects` collects once, then ``gc.freeze()``s what is left: those
objects move to the permanent generation, which later collections ignore (Python
documentation, ``gc.freeze``; the technique Instagram described for their Django
servers). Objects made later are collected as before. ``chainrun serve`` calls it once
its chain is open; a backend that embeds chainrun can call it once it has opened its
chain. The library never calls it by itself: freezing is a whole-process decision.

:func:`rare_full_collections` raises the collector's third threshold from 10 to
:data:`FULL_COLLECTION_EVERY` (100): a full collection then waits for 100 collections
of the middle generation instead of 10 (Python documentation, ``gc.set_threshold``).
The objects a full pass would free are few (a turn's objects are freed by reference
counting when it ends; the full passes of a census at 300 in flight freed about 270
objects each), so garbage waits longer at little cost. Measured on the same level,
frozen start-up objects in both: 18 full collections (longest 456 ms) against 1 (432
ms), the added time per call's p99 364 ms against 61 ms, the loop lag p99 on uvloop
18.4 ms [14.2, 28.5] against 10.8 ms [9.3, 12.0], peak RSS 424 against 477 MB (two
runs, 11 minutes apart). ``chainrun serve`` does both.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect garbage once, then freeze every object still tracked (``gc.freeze()``).

    Returns:
        How many objects are now in the permanent generation (``gc.get_freeze_count()``).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


#: the collector's third threshold :func:`rare_full_collections` sets (Python's is 10)
FULL_COLLECTION_EVERY = 100


def rare_full_collections(every: int = FULL_COLLECTION_EVERY) -> tuple[int, int, int]:
    """Set the collector's third threshold to ``every`` (the first two are kept): a full
    collection at most once per ``every`` collections of the middle generation.

    Returns:
        The thresholds now in force (``gc.get_threshold()``).
    """
    first, second, _ = gc.get_threshold()
    gc.set_threshold(first, second, every)
    return gc.get_threshold()
