"""``make bench``'s "many collections" section: a run's cost grows with the data, not with the collections.

Two sources in the bench's replica set, each landing in a lake of its own: ``--collections``
collections of ``--collection-docs`` small documents each, and one collection of as many documents
in all. Each goes through the DAG's tasks' work, the two sources' runs in turn:

1. first run: the snapshot (``run_snapshot``), the transform's first build;
2. one change in every collection (the single collection: as many changes), pulled
   (``pull_changes``) and transformed;
3. an idle run: a pull that finds nothing, and no transform (no collection has work).

Each run asks what ``plan_transform`` asks (``work.plan_work``: does any collection have work?)
and, when one has, runs the transform as the DAG's ``transform`` task does: ``spark-submit`` of
``spark_apps/cdc_transform.py`` (``bench.transform.run_transform``), Spark's start included, as in
every DAG run that transforms. Then it reads what ``summary`` reads: each collection's backlog, the
applied mark, and the tables of those transformed whose version and rows (its asset events carry
them) the mark does not have. Budgets
(issue 28): the many collections' first run and change run at most FIRST_RUN_MAX and CHANGE_RUN_MAX
times the single collection's, the idle run at most IDLE_RUN_MAX times. The per-collection overhead
row is the difference of the two runs over the collections: Spark's start, the same in both, is not
in it. A single run of a source varies by a fifth on this machine (10.1-14.0 s for the single
collection's first run): the pair of sources runs ``--collection-repeats`` times over fresh ones,
each ratio of two neighbouring runs, and each row is the median. Every run is checked: nothing
failed, every collection's state holds its documents, the events applied are the changes made.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from mongo_cdc import extjson
from mongo_cdc.capture.offsets import OffsetKeeper
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, row_count
from mongo_cdc.transform.applied_mark import read_mark
from mongo_cdc.transform.backlog import collections_behind, source_backlogs
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.work import plan_work
from mongo_cdc_dev.bench.data import small_documents
from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.bench.transform import run_transform
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

if TYPE_CHECKING:
    from mongo_cdc_dev.bench.context import Bench

# budgets (issue 28): the many collections' run against the single collection's
FIRST_RUN_MAX = 2.0
CHANGE_RUN_MAX = 2.0
IDLE_RUN_MAX = 1.2
RUNS = ("first run", "one change in every collection", "idle run")
RUN_ID = "bench"  # the DAG passes its run's id, which the summary looks for in the applied mark


@dataclass
class Source:
    """A captured database of ``collections`` collections holding ``documents`` documents each."""

    name: str
    client: MongoClient
    rs: str
    lake_root: str
    collections: int
    documents: int
    config: SourceConfig = field(init=False)
    keeper: OffsetKeeper = field(init=False)
    lake: SourceLake = field(init=False)

    def __post_init__(self) -> None:
        self.config = database_source(self.name, self.lake_root, f"^{self.name}$")
        self.keeper = memory_keeper(self.config, self.rs)
        self.lake = SourceLake(LakeLocation(self.lake_root), self.config.topic_prefix)

    @property
    def names(self) -> list[str]:
        return [f"c{index:05d}" for index in range(self.collections)]

    def load(self) -> None:
        database = self.client[self.name]
        for index, name in enumerate(self.names):
            database[name].insert_many(small_documents(index * self.documents, self.documents))

    def change(self, changes: int) -> None:
        """``changes`` inserts spread over the collections: one each when there are as many."""
        database = self.client[self.name]
        for index in range(changes):
            name = self.names[index % self.collections]
            database[name].insert_one(small_documents(10**9 + index, 1)[0])

    def capture(self, first: bool) -> None:
        capture = ReplicaSetCapture(self.client, self.config, self.keeper)
        run_snapshot(capture) if first else pull_changes(capture)

    def transform(self) -> dict[str, Any]:
        """The run's transform, as the DAG runs it: none when no collection has work
        (``plan_transform``), else the Spark job; then the backlog ``summary`` reads. Each collection's
        figures (the job's summary)."""
        collections: dict[str, Any] = {}
        if plan_work(self.lake, self.lake.batches(), FlatteningOptions()).first is not None:
            summary = run_transform(self.lake_root, self.config.topic_prefix, False, RUN_ID).summary
            if summary["failed"]:
                raise AssertionError(f"{self.name}: the transform failed for {sorted(summary['failed'])}")
            collections = summary["collections"]
        # summary's reads: every collection's backlog, the tables of those transformed whose figures
        # (asset events) the applied mark does not have
        mark = read_mark(self.lake)
        figures = {} if mark is None else mark.figures(RUN_ID)
        unknown = [namespace for namespace in collections if len(figures.get(namespace, {})) < 2]
        for table in self.lake.tables(unknown, ("state", "changes")).values():
            row_count(table)
        behind = collections_behind(source_backlogs(self.lake, self.lake.batches()))
        if behind:
            raise AssertionError(f"{self.name}: collections left behind: {behind}")
        return collections

    def check(self, collections: dict[str, Any], events: int) -> None:
        """Every collection's state holds its documents; ``events`` were applied in all (a run
        without events transforms no collection)."""
        if not events:
            if collections:
                raise AssertionError(f"{self.name}: an idle run transformed {sorted(collections)}")
            return
        applied = sum(summary["new_events"] for summary in collections.values())
        if applied != events:
            raise AssertionError(f"{self.name}: the transform applied {applied} events, not {events}")
        for name in self.names:
            expected = self.client[self.name][name].estimated_document_count()
            landed = collections[f"{self.name}.{name}"]["state_rows"]
            if landed != expected:
                raise AssertionError(f"{self.name}.{name}: the state holds {landed} rows, not {expected}")

    def run(self, run: str, changes: int) -> float:
        """Seconds of ``run``, one of RUNS in their order (``changes``: the inserts of the second),
        checked."""
        events = {RUNS[0]: self.collections * self.documents, RUNS[1]: changes, RUNS[2]: 0}[run]
        if run == RUNS[1]:
            self.change(events)
        with _timed(f"{self.name}: {run}") as took:
            self.capture(first=run == RUNS[0])
            collections = self.transform()
        self.check(collections, events)
        return took()


@contextmanager
def _timed(name: str) -> Iterator[Callable[[], float]]:
    started = time.perf_counter()
    ended: list[float] = []
    yield lambda: ended[0] - started
    ended.append(time.perf_counter())
    print(f"many collections: {name}: {ended[0] - started:.1f}s", flush=True)


def many_collections(bench: Bench) -> list[Row]:
    """The module docstring's runs, ``--collection-repeats`` times over fresh sources: each run of the
    two sources back to back, the single collection first in every other pair (this machine's speed
    drifts by a fifth within minutes: the same job took 29 and 45 CPU-s in one section run); each row
    the median of its figures, each ratio the median of the pairs' ratios. The section's rows."""
    count, documents = bench.args.collections, bench.args.collection_docs
    client = bench.rs.client(datetime_conversion=extjson.DECODE_OPTIONS.datetime_conversion)
    # the bench's mongod has a small oplog: its headroom warnings say nothing here
    oplog_log = logging.getLogger("mongo_cdc.capture.oplog_window")
    level = oplog_log.level
    oplog_log.setLevel(logging.ERROR)
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    try:
        for repeat in range(bench.args.collection_repeats):
            many, one = (
                Source(f"{name}{repeat}", client, bench.rs.name, bench.lake(f"{name}{repeat}"), *shape)
                for name, shape in (("many", (count, documents)), ("one", (1, count * documents)))
            )
            for source in (many, one):
                source.load()
            order = (one, many) if repeat % 2 == 0 else (many, one)
            seconds: dict[str, dict[str, float]] = {one.name: {}, many.name: {}}
            for run in RUNS:  # the two sources' runs back to back, so that each ratio is of neighbours
                for source in order:
                    seconds[source.name][run] = source.run(run, count)
            pairs.append((seconds[one.name], seconds[many.name]))
    finally:
        client.close()
        oplog_log.setLevel(level)
    section = f"{count:,} collections x {documents:,} docs"
    if len(pairs) > 1:
        section += f", median of {len(pairs)}"
    against = f"1 x {count * documents:,} docs"
    rows = []
    for run, budget in zip(RUNS, (FIRST_RUN_MAX, CHANGE_RUN_MAX, IDLE_RUN_MAX), strict=True):
        single = statistics.median(one_runs[run] for one_runs, _ in pairs)
        several = statistics.median(many_runs[run] for _, many_runs in pairs)
        ratio = statistics.median(many_runs[run] / one_runs[run] for one_runs, many_runs in pairs)
        rows.append(Row(section, f"{run}, 1 collection", single, "s"))
        path = f"{run}, {count:,} collections"
        rows.append(Row(section, path, several, "s", ratio, against, max_ratio=budget))
        overhead = statistics.median(
            (many_runs[run] - one_runs[run]) / max(count - 1, 1) for one_runs, many_runs in pairs
        )
        rows.append(Row(section, f"{run}, overhead per collection", overhead * 1000, "ms"))
    return rows
