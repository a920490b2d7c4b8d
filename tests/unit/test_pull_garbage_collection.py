"""A pull runs the cyclic garbage collector once per ``COLLECT_EVERY_BATCHES`` landed batches, with the
automatic one off while it reads, and gives the process its collector back after
(``garbage_collection.CyclicCollection``)."""

from __future__ import annotations

import gc
import weakref

from mongo_cdc.capture.garbage_collection import COLLECT_EVERY_BATCHES, CyclicCollection


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage_cycle() -> weakref.ref:
    """A reference cycle nothing else refers to: only the cyclic collector frees it."""
    return weakref.ref(_Cycle())


def test_cycles_wait_for_the_batches_between_collections_then_are_collected() -> None:
    assert gc.isenabled()
    with CyclicCollection() as collector:
        assert not gc.isenabled()
        cycle = _garbage_cycle()
        for _ in range(COLLECT_EVERY_BATCHES - 1):
            collector.landed()
        assert cycle() is not None, "a collection ran before COLLECT_EVERY_BATCHES batches landed"
        collector.landed()
        assert cycle() is None, "no collection after COLLECT_EVERY_BATCHES batches landed"
        assert collector.since_collection == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_count_carries_over_the_streams_a_pull_reopens() -> None:
    collector = CyclicCollection()
    with collector:
        for _ in range(COLLECT_EVERY_BATCHES - 1):
            collector.landed()
    with collector:
        cycle = _garbage_cycle()
        collector.landed()
        assert cycle() is None


def test_a_process_without_the_automatic_collector_keeps_it_off() -> None:
    gc.disable()
    try:
        with CyclicCollection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
