"""A pull's micro-batches landed one at a time on a thread of their own (``LandingThread``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mongo_cdc.capture.offsets import Offset


class LandingThread:
    """Micro-batches landed one at a time on a thread of their own: a batch's files, Delta commits
    and offset are written while the pull reads and builds the next one, instead of one after the
    other.

    At most one batch is in flight. ``settle`` waits for it and hands its committed offset to
    ``landed`` on the caller's thread; a landing's error is raised there, in the pull, so nothing
    after a failed batch lands. Leaving the ``with`` settles.
    """

    def __init__(self, landed: Callable[[Offset], None]) -> None:
        self._landed = landed
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="land")
        self._in_flight: Future[Offset] | None = None

    def start(self, land: Callable[[], Offset]) -> None:
        self.settle()
        self._in_flight = self._thread.submit(land)

    def settle(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self._landed(in_flight.result())

    def __enter__(self) -> LandingThread:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.settle()
        finally:
            self._thread.shutdown(wait=True)
