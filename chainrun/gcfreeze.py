"""Keep the garbage collector off the objects a long-running chainrun process starts with.

CPython's cyclic collector stops the whole process for a full (generation 2) collection,
and such a pass walks every tracked object. A process serving many turns holds the
objects of its start-up for its whole life (imported modules, the config, pydantic
schemas, the catalogue, the providers' clients: about 170,000 with the default chain)
and, with 1,000 turns in flight, each full collection also walks them: measured on
``benchmarks/scale.py``'s paced 1,000 level, full collections of 0.6-1.2 s, 13 s of
15 over 80 s of level, and the event loop's lag p99 at 589 ms; with the start-up
objects frozen, 6.3 s and a lag p99 of 55 ms (benchmarks/README.md, "Scale in one
process").

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
