"""Two transforms writing one collection's tables at once converge.

Airflow runs one ``transform`` at a time across a source's runs (``max_active_tis_per_dag``, see
test_dag_shape); these tests take that away and race the Spark job against itself on one lake:
a backfill run's transform (``--rebuild-hours``) beside a live one, a live pull landing meanwhile,
one run reading an older batch log than the other. The run that loses a commit race makes its work
again from a fresh read (``CollectionTransform.converged``). After each race the state equals
MongoDB and the changes table holds every committed raw event exactly once.

All but the last test interleave two runs in this process at a chosen commit (real Spark, real
delta-rs: the second run commits inside the first run's call, just before its commit), so each
race happens every time; the last one (slow) starts spark-submit jobs side by side and lets them
race as they will.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cdc_support import CdcSource, assert_state_equals_collection
from deltalake import DeltaTable

from mongo_cdc import lake
from mongo_cdc.capture.backfill import HOUR, hour_partitions
from mongo_cdc.transform.changes_commit import ChangesRun
from mongo_cdc.transform.collection_run import CollectionRun
from mongo_cdc.transform.driver import CollectionTransform, transform_collections
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.state_commit import StateRun
from mongo_cdc.transform.work import source_work

LOST_RACE = "lost a commit race"


def transform(
    context, source: CdcSource, batches: list | None = None, rebuild_hours: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The job's run of the test's collection (``batches``: the batch log it read, all by default)."""
    lake = source.lake
    run = CollectionRun(
        context,
        lake,
        f"{source.database}.items",
        lake.batches() if batches is None else batches,
        FlatteningOptions(),
        rebuild_hours,
    )
    return CollectionTransform(run).run(None)


def just_before_the_first(monkeypatch, owner: type, method: str, other_writer: Callable[[], object]) -> None:
    """Make ``other_writer`` commit inside the first call of ``owner.method`` (the run under test's
    commit), before it goes on; later calls, the other writer's own included, are left as they are."""
    original = getattr(owner, method)
    pending = [other_writer]

    def interleaved(self, *args: Any, **kwargs: Any) -> Any:
        if pending:
            pending.pop()()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, interleaved)


def assert_every_event_once(source: CdcSource, collection: str = "items") -> None:
    """The changes table has one row per committed raw event (tombstones have none), none twice."""
    events = sorted(
        (row["cluster_time"], row["event_order"], row["op"])
        for row in source.raw_rows(collection)
        if row["op"] is not None
    )
    changes = sorted(
        (row["__cluster_time"], row["__event_order"], row["__op"]) for row in source.change_rows(collection)
    )
    assert changes == events


def assert_converged(source: CdcSource, client, lost_races: list[str]) -> None:
    """After one interleaved race: the state equals MongoDB, every event is in the changes table
    once, and the run under test lost exactly one commit race (and made its work again)."""
    assert_state_equals_collection(source, client, "items")
    assert_every_event_once(source)
    assert len(lost_races) == 1, lost_races


@pytest.fixture
def lost_races() -> Iterator[list[str]]:
    """The job's "lost a commit race" log lines during the test (Airflow's logging config leaves
    pytest's caplog out, so a handler of its own)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if LOST_RACE in record.getMessage():
                lines.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("cdc_transform")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def this_hour_on(began: dt.datetime) -> tuple[str, ...]:
    """The hours a backfill of the test's writes rebuilds (it may straddle an hour's end)."""
    return tuple(hour_partitions(began, dt.datetime.now(dt.timezone.utc)))


def started(source: CdcSource, items, documents: int = 30, transformed_by=None) -> None:
    """``documents`` documents inserted and snapshotted by a DAG run (its transform left out), then
    transformed in this process when given the SparkContext ``transformed_by``."""
    items.insert_many([{"_id": i, "v": 0, "name": f"n{i}"} for i in range(documents)])
    source.run(skip_spark=True)
    if transformed_by is not None:
        transform(transformed_by, source)


def test_a_state_commit_lost_after_the_deletion_markers_commit_deletes_on_the_next_try(
    cdc_source, replica_set, db_name, spark_context, monkeypatch, lost_races
):
    """A backfill's transform (newer batch log) commits its deletion markers, then loses the state
    MERGE to a live run that read the log one batch earlier; its next try applies that batch's
    deletes, whose markers are already there (a marker's own delete still deletes)."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        began = dt.datetime.now(dt.timezone.utc)
        started(source, items, transformed_by=spark_context)
        for i in range(5):
            items.update_one({"_id": i}, {"$set": {"v": 1}})
        items.insert_many([{"_id": i, "v": 1} for i in range(30, 35)])
        source.run(skip_spark=True)
        live_log = source.lake.batches()
        items.delete_many({"_id": {"$in": [10, 11, 30]}})
        items.update_one({"_id": 5}, {"$set": {"v": 2}})
        source.run(skip_spark=True)

        just_before_the_first(
            monkeypatch, StateRun, "merge", lambda: transform(spark_context, source, live_log)
        )
        transform(spark_context, source, rebuild_hours=this_hour_on(began))

        assert_converged(source, client, lost_races)


def test_two_runs_deleting_the_same_documents_record_each_deletion_marker_once(
    cdc_source, replica_set, db_name, spark_context, monkeypatch, lost_races
):
    """Two runs with the same deletes: the second creates the deletion markers' table and commits
    everything inside the first's call, just before the first writes the markers; the first's
    write then fails instead of adding the same markers again, and its next try has nothing to do."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        started(source, items, transformed_by=spark_context)
        items.delete_many({"_id": {"$in": [1, 2, 3]}})
        items.update_one({"_id": 4}, {"$set": {"v": 4}})
        source.run(skip_spark=True)

        just_before_the_first(
            monkeypatch, StateRun, "update_deletion_markers", lambda: transform(spark_context, source)
        )
        transform(spark_context, source)

        markers = DeltaTable(
            lake.deletions_uri(source.location, source.prefix, source.database, "items")
        ).to_pyarrow_table()
        keys = markers.column("__key").to_pylist()
        assert len(keys) == len(set(keys)) == 3, keys  # documents 1, 2 and 3, each once
        assert_converged(source, client, lost_races)


def test_a_new_column_commit_made_from_an_earlier_read_fails_instead_of_doubling_change_rows(
    cdc_source, replica_set, db_name, spark_context, monkeypatch, lost_races
):
    """A run crashed between its state and change commits; two runs pick up. The one with the older
    batch log appends the change rows it missed, inside the other's call; the other's change rows
    need a new column, whose commit, made from its earlier read, must fail: carried past that
    append, it would let the append after it apply the same batch again."""

    def crashing(*_: Any) -> None:
        raise RuntimeError("crashed before the change commit")

    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        started(source, items, transformed_by=spark_context)
        items.update_many({"_id": {"$in": [6, 7, 8]}}, {"$set": {"v": 3}})
        source.run(skip_spark=True)
        older_log = source.lake.batches()
        with monkeypatch.context() as crash:
            crash.setattr(ChangesRun, "finish", crashing)
            with pytest.raises(RuntimeError, match="crashed"):
                transform(spark_context, source, older_log)
        for i in range(5):
            items.update_one({"_id": i}, {"$set": {"v": 1, "colour": f"c{i}"}})  # a new column
        source.run(skip_spark=True)

        just_before_the_first(
            monkeypatch, StateRun, "merge", lambda: transform(spark_context, source, older_log)
        )
        transform(spark_context, source)

        assert_converged(source, client, lost_races)
        assert {row["_id"]: row["colour"] for row in source.change_rows("items") if row["colour"]} == {
            i: f"c{i}" for i in range(5)
        }


def test_a_run_with_an_older_batch_log_than_the_tables_starts_again_from_the_newer_one(
    cdc_source, replica_set, db_name, spark_context, lost_races
):
    """The job reads the batch log once, then transforms collection after collection: a backfill run
    that read it before the last batch committed reaches this collection after a live run applied
    that batch. Rewriting its hour as of its older log would record the older batch as the last one
    applied, and the next run would append the newer batch's change rows a second time."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        began = dt.datetime.now(dt.timezone.utc)
        started(source, items, transformed_by=spark_context)
        items.update_many({"_id": {"$lt": 10}}, {"$inc": {"v": 1}})
        source.run(skip_spark=True)
        backfill_log = source.lake.batches()
        items.insert_many([{"_id": i, "v": 2} for i in range(30, 40)])
        source.run(skip_spark=True)
        transform(spark_context, source)  # the live run: every batch

        the_hour_before = tuple(hour_partitions(began - HOUR, began - HOUR))
        transform(spark_context, source, backfill_log, rebuild_hours=the_hour_before)
        transform(spark_context, source)  # the next live run: nothing new

        assert_converged(source, client, lost_races)
        assert "past this run's batch log" in lost_races[0], lost_races


def test_a_backfill_rebuild_after_a_live_pull_and_transform_landed_keeps_their_change_rows(
    cdc_source, replica_set, db_name, spark_context, monkeypatch, lost_races
):
    """While a backfill run's transform works, a live run pulls a new batch and transforms it; the
    backfill's rewrite of its hours, made from the batches it knew, loses, and its next try rewrites
    them with the new batch's rows too."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        began = dt.datetime.now(dt.timezone.utc)
        started(source, items, transformed_by=spark_context)
        items.update_many({"_id": {"$lt": 10}}, {"$inc": {"v": 1}})
        source.run(skip_spark=True)

        def live_run() -> None:
            items.insert_many([{"_id": i, "v": 9} for i in range(40, 45)])
            items.update_one({"_id": 20}, {"$set": {"v": 9}})
            source.run(skip_spark=True)
            transform(spark_context, source)

        just_before_the_first(monkeypatch, ChangesRun, "rebuild", live_run)
        transform(spark_context, source, rebuild_hours=this_hour_on(began))

        assert_converged(source, client, lost_races)


@pytest.mark.slow
def test_backfill_transforms_racing_live_runs_keep_state_equal_to_mongodb_and_every_event_once(
    cdc_source, replica_set, db_name
):
    """Real concurrency: per hour of a backfill, its run's spark-submit transform starts, a live pull
    lands a batch while it works, and the live run's transform starts beside it. Whichever loses a
    race (timing decides) runs again; every run succeeds and the lake ends exact."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        began = dt.datetime.now(dt.timezone.utc)
        started(source, items, 200)
        source.transform()
        races = 0
        backfill_hours = this_hour_on(began)
        for round_number in range(1, 3):
            items.update_many({"_id": {"$mod": [round_number + 1, 0]}}, {"$inc": {"v": round_number}})
            source.run(skip_spark=True)
            backfill = subprocess.Popen(
                source.transform_command("--rebuild-hours", json.dumps(list(backfill_hours))),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            items.insert_many([{"_id": 1000 * round_number + i, "v": round_number} for i in range(20)])
            items.delete_many({"_id": {"$in": [round_number, 10 + round_number, 1000 + round_number]}})
            source.run(skip_spark=True)
            live = subprocess.Popen(
                source.transform_command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for job in (backfill, live):
                out, err = job.communicate(timeout=600)
                assert job.returncode == 0, out[-3000:] + err[-3000:]
                races += (out + err).count(LOST_RACE)
        print(f"commit races lost and run again: {races}")
        source.transform()  # nothing new: both runs applied every batch between them
        assert_state_equals_collection(source, client, "items")
        assert_every_event_once(source)


def test_a_run_in_the_job_shared_by_small_collections_that_loses_a_commit_race_runs_again_on_its_own(
    cdc_source, replica_set, db_name, spark_context, monkeypatch, lost_races
):
    """A small collection runs in the job shared by small collections (``transform_collections``: one
    task for the whole collection, which writes the small state table again whole); another writer
    commits its state first: the shared run's commit loses, and it runs again with jobs of its own
    from a fresh read, applying every batch once."""
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        started(source, items, transformed_by=spark_context)
        items.update_many({"_id": {"$lt": 10}}, {"$inc": {"v": 1}})
        source.run(skip_spark=True)
        live_log = source.lake.batches()
        items.insert_many([{"_id": i, "v": 2} for i in range(30, 35)])
        items.update_one({"_id": 31}, {"$set": {"v": 3}})  # a document with two events: folded in the task
        source.run(skip_spark=True)
        shared = []  # the runs committed from a shared job's task
        finished_shared = CollectionTransform.finished_shared
        monkeypatch.setattr(
            CollectionTransform,
            "finished_shared",
            lambda self, run, output: shared.append(output) or finished_shared(self, run, output),
        )
        just_before_the_first(
            monkeypatch, StateRun, "merge", lambda: transform(spark_context, source, live_log)
        )
        namespace = f"{db_name}.items"
        batches = source.lake.batches()
        summary = transform_collections(
            spark_context,
            source.lake,
            batches,
            source_work(source.lake, batches, FlatteningOptions()),
            FlatteningOptions(),
            (),
            None,
        )
        assert summary.failed == {} and summary.collections[namespace]["state_rows"] == 35
        assert len(shared) == 1 and shared[0].folded_documents >= 1  # _id 31: inserted, then updated
        assert shared[0].rewritten is not None  # the task wrote the small state table whole
        assert_converged(source, client, lost_races)
