"""The cyclic garbage collector during a pull: run once per ``COLLECT_EVERY_BATCHES`` landed
micro-batches, not every few hundred allocations (``CyclicCollection``)."""

from __future__ import annotations

import gc

# Micro-batches landed between two runs of the cyclic garbage collector during a pull.
COLLECT_EVERY_BATCHES = 16


class CyclicCollection:
    """The cyclic garbage collector run once per ``COLLECT_EVERY_BATCHES`` landed micro-batches
    (``landed``), instead of every few hundred allocations, while a pull reads.

    A batch's rows are acyclic and live until the batch lands, so each automatic collection scanned
    them again and again (a quarter of a pull's CPU per event); the objects made before the pull
    (modules, the task's) are frozen out of it too. A collection costs about what is alive then,
    the batches in flight (~40 ms for 16,384 small events), and finds the few objects the stream's
    reads leave in cycles (about ten a batch): one per batch was still a sixth of a pull's CPU. Per
    ``COLLECT_EVERY_BATCHES`` it is about 1 %, whatever ``max.batch.size`` (a collection's cost
    grows with the batch), and what waits for it is a few hundred small objects.
    """

    def __init__(self) -> None:
        self.since_collection = 0
        self._was_enabled = False

    def __enter__(self) -> CyclicCollection:
        gc.freeze()
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()
        gc.unfreeze()

    def landed(self) -> None:
        """One more micro-batch landed: collect when ``COLLECT_EVERY_BATCHES`` have since the last time."""
        self.since_collection += 1
        if self.since_collection >= COLLECT_EVERY_BATCHES:
            gc.collect()
            self.since_collection = 0
