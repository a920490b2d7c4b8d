"""The cyclic garbage collector during a pull: run once per ``COLLECT_EVERY_EVENTS`` landed events,
not every few hundred allocations (``CyclicCollection``)."""

from __future__ import annotations

import gc

# Events landed between two runs of the cyclic garbage collector during a pull (``CyclicCollection``).
COLLECT_EVERY_EVENTS = 1 << 18


class CyclicCollection:
    """The cyclic garbage collector run once per ``COLLECT_EVERY_EVENTS`` events landed
    (``landed``), instead of every few hundred allocations, while a pull reads.

    A batch's rows are acyclic and live until the batch lands, so each automatic collection scanned
    them again and again (a quarter of a pull's CPU per event); the objects made before the pull
    (modules, the task's) are frozen out of it too. A collection costs about what is alive then
    (the batches in flight, ~40 ms for 16,384 small events) and finds a few objects per batch (the
    stream's reads leave about ten), so one per batch was still a sixth of the CPU; one per
    ``COLLECT_EVERY_EVENTS`` is under 1 %, and what waits for it is a few hundred objects.
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

    def landed(self, events: int) -> None:
        """``events`` more landed: collect when ``COLLECT_EVERY_EVENTS`` have since the last time."""
        self.since_collection += events
        if self.since_collection >= COLLECT_EVERY_EVENTS:
            gc.collect()
            self.since_collection = 0
