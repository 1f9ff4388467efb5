"""Keep the garbage collector off the objects a long-running chainrun process starts with.

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
