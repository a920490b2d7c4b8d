"""``make bench``'s state-at-scale section (issue 51): what a run costs as the state table grows.

Two sources of small documents, ``--state`` (1 M) and ``--scaled-state`` (4 M), each loaded,
snapshotted and built, then given the same runs in turn:

1. ``--scaled-state`` / 100 changes (1% of the larger state) spread over the whole key range
   (``transform.spread_changes``: updates, deletes and inserts);
2. ``--changes`` changes among the most recent documents (``transform.apply_changes``).

Each run prints its wall time, CPU time (spark-submit's process tree), the bytes of the state
table's data files it removed (rewritten) and added, and the Python driver's peak RSS; the larger
state's figures are given as ratios to the smaller one's. Budgets (issue 51): the spread run on the
larger state at most ``SPREAD_GROWTH_MAX`` times the smaller one's (the budget without deletion
vectors: this lake does not write them yet, so the 1.3x budget with them is not measured); the
recent changes flat (``RECENT_GROWTH_MAX``); the driver's peak flat (``DRIVER_GROWTH_MAX``).

The smaller state's spread changes are also transformed on a Spark standalone cluster, by one
executor and by two (``cluster_executors``: copies of its lake taken before the run above): each
run's wall time, its Spark jobs' and its state MERGE job's, the executors that ran its tasks and the
MERGE's, and the two executors' wall time as a ratio to one's (budget: at most 1.0x,
``cluster_executors.TWO_VS_ONE_MAX``).

On a bigger machine, the same section at 20 M documents:
``make bench BENCH_ARGS="--only state-scale --scaled-state 20000000"`` (about 3.4 GB of documents in
mongod, and the lake on the bench's scratch directory, ``$TMPDIR``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable
from pymongo import MongoClient

from mongo_cdc import extjson
from mongo_cdc_dev.bench.cluster_executors import (
    ClusterRun,
    cluster_rows,
    cluster_runs,
    copied_lakes,
    skipped_row,
)
from mongo_cdc_dev.bench.data import load, small_documents
from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.bench.transform import (
    Source,
    TransformRun,
    apply_changes,
    check_run,
    quiet_oplog_warnings,
    spread_changes,
    step,
)

if TYPE_CHECKING:
    from mongo_cdc_dev.bench.context import Bench

SPREAD_SHARE = 100  # the spread run changes 1 in SPREAD_SHARE documents of the larger state
SPREAD_GROWTH_MAX = 4.0
RECENT_GROWTH_MAX = 1.2
DRIVER_GROWTH_MAX = 1.1
MB = 1e6
SECTION = "state at scale"


@dataclass(frozen=True)
class ScaledRun:
    """One transform run on one state, with the data files it replaced in the state table."""

    run: TransformRun
    removed_bytes: int  # the state's data files the run removed: what it read and rewrote
    added_bytes: int


def data_file_sizes(uri: str) -> dict[str, int]:
    """The live data files of a Delta table and their sizes in bytes."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
    return dict(zip(actions["path"], actions["size_bytes"], strict=True))


def measured_run(source: Source, events: int) -> ScaledRun:
    """Transform ``source``'s landed changes, checked, with the state files it removed and added."""
    before = data_file_sizes(source.state_uri)
    run = source.transform()
    check_run(run, source, events)
    after = data_file_sizes(source.state_uri)
    removed = sum(size for path, size in before.items() if path not in after)
    added = sum(size for path, size in after.items() if path not in before)
    print(f"  state files: {removed / MB:,.1f} MB removed, {added / MB:,.1f} MB added", flush=True)
    return ScaledRun(run, removed, added)


def built_source(name: str, client: MongoClient, bench: Bench, documents: int) -> Source:
    """A source of ``documents`` small documents, snapshotted and built."""
    source = Source(name, client, bench.rs.name, bench.lake("state-scale"), documents)
    with step(f"loading {documents:,} documents into {source.namespace}"):
        load(source.collection, documents, small_documents)
    with step(f"snapshot of {source.namespace}"):
        source.snapshot()
    with step(f"first build of {source.namespace}"):
        check_run(source.transform(), source, documents)
    return source


def state_scale(bench: Bench) -> list[Row]:
    """The section's runs on both states; its rows."""
    args = bench.args
    sizes = (args.state, args.scaled_state)
    spread = args.scaled_state // SPREAD_SHARE
    runs: dict[str, dict[int, ScaledRun]] = {"spread": {}, "recent": {}}
    on_cluster: list[ClusterRun] = []
    client = bench.rs.client(datetime_conversion=extjson.DECODE_OPTIONS.datetime_conversion)
    with client, quiet_oplog_warnings():
        for size in sizes:
            source = built_source(f"scale{size}", client, bench, size)
            rows = source.pull(spread_changes(source.collection, spread, size + 1, seed=5))
            # the smaller state's landed changes, once more for each run on the cluster
            lakes = copied_lakes(bench, source) if size == args.state and not args.no_cluster else {}
            with step(f"{spread:,} changes spread over {source.namespace}"):
                runs["spread"][size] = measured_run(source, rows)
            if lakes:
                on_cluster = cluster_runs(bench, source, rows, lakes)
            first_new = size + 1 + spread
            rows = source.pull(apply_changes(source.collection, args.changes, first_new, seed=6))
            with step(f"{args.changes:,} recent changes on {source.namespace}"):
                runs["recent"][size] = measured_run(source, rows)
            source.collection.drop()  # its lake stays: the next load has the memory
    what = f"{spread:,} spread changes, {args.state:,} docs"
    cluster = cluster_rows(SECTION, what, on_cluster) if on_cluster else [skipped_row(SECTION, what)]
    return scale_rows(sizes, spread, args.changes, runs) + cluster


def scale_rows(
    sizes: tuple[int, int], spread: int, changes: int, runs: dict[str, dict[int, ScaledRun]]
) -> list[Row]:
    """Spread changes are over the whole key range, recent ones among the newest documents."""
    small, large = sizes
    section = SECTION
    rows = []
    for kind, count, max_ratio in (
        ("spread", spread, SPREAD_GROWTH_MAX),
        ("recent", changes, RECENT_GROWTH_MAX),
    ):
        what = f"{count:,} {kind} changes"
        base, scaled = runs[kind][small], runs[kind][large]
        for size, measured in ((small, base), (large, scaled)):
            name = f"{what}, {size:,} docs"
            rows += [
                Row(section, f"{name}: wall", measured.run.seconds, "s"),
                Row(section, f"{name}: CPU", measured.run.cpu_seconds, "s"),
                Row(section, f"{name}: state files rewritten", measured.removed_bytes / MB, "MB"),
                Row(section, f"{name}: Python driver peak", measured.run.driver_mib, "MiB"),
            ]
        rows += [
            Row(section, f"{what}: wall, {large:,} vs {small:,} docs", None, "",
                scaled.run.seconds / base.run.seconds, f"{small:,} docs", max_ratio=max_ratio),
            Row(section, f"{what}: state files rewritten, {large:,} vs {small:,} docs", None, "",
                scaled.removed_bytes / base.removed_bytes if base.removed_bytes else None, f"{small:,} docs"),
            Row(section, f"{what}: Python driver peak, {large:,} vs {small:,} docs", None, "",
                scaled.run.driver_mib / base.run.driver_mib, f"{small:,} docs", max_ratio=DRIVER_GROWTH_MAX),
        ]  # fmt: skip
    return rows
