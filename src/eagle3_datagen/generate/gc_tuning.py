"""The garbage collector's pace in a process that runs batches.

Why: every response allocates a few dozen container objects (the decoded body, the request's
aiohttp and asyncio objects, the record), and CPython's default young-generation threshold
(700 allocations) then starts a collection every few requests, each one traversing the token-id
lists still alive. Measured on the pipeline path of benchmark (a) (3,000 prompts, 2 shared
cores): 380 collections taking ~14% of the event loop thread's CPU at the default, 6-10 at
20,000. Almost nothing a run allocates is cyclic (reference counting frees it), so collecting
less often only delays the few cycles there are; the old generations keep their thresholds.

And a full collection traverses every object alive, the imports and the tokenizer among them:
70-90 ms of the event loop's thread each with transformers loaded (measured on 2 shared cores;
``tests/integration/test_event_loop.py`` failed on it). What is alive when a partition starts
lives as long as the process, so it is frozen (``gc.freeze``): later collections only traverse
what the run allocated since.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def collect_less_often() -> None:
    """Raise the young generation's threshold to :data:`YOUNG_THRESHOLD` (never lower it: a
    process that set a higher one keeps it)."""
    young, middle, old = gc.get_threshold()
    if young and young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def tune_for_batches() -> None:
    """What a process that runs batches sets, once its tokenizer is loaded: the young
    threshold, and every object alive now moved into the permanent generation, which no
    collection traverses (reference counting still frees what becomes garbage; a cycle among
    them would stay: nothing loaded before a run makes them)."""
    collect_less_often()
    gc.freeze()
