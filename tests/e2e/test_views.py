"""Views captured in batches, and discovery naming what a source leaves out (Airflow dag.test, a real
mongod, real Spark; ``collection_kinds``, ``view_capture``).

One source's runs, in file order: the first run names the view it cannot capture (an ``$unwind``
repeats its ``_id``) and the ``system.views`` collection in the discovery log and the summary, and
lands the other view's documents as ``c`` rows; writes to the base collection reach the view's state
as ``c``/``u``/``d`` rows after the next run; a run with the view unchanged writes no file, and its
verification leaves the view to its reads; a dropped view's documents land as deletes, once."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from cdc_support import assert_state_equals_collection
from conftest import make_source

from mongo_cdc.capture.collection_kinds import DUPLICATE_ID, SYSTEM_COLLECTION, VIEW_BATCH

VIEW, UNWOUND = "open_orders", "order_lines"


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    source = make_source(tmp_path_factory.mktemp("views"), replica_set.uri, "views")
    with replica_set.client() as client:
        client.drop_database(source.database)
        db = client[source.database]
        # order 3 alone has two lines: the $unwind repeats its _id
        lines = {3: [1, 2]}
        db.orders.insert_many(
            [
                {"_id": i, "status": ["open", "closed"][i % 2], "total": i, "lines": lines.get(i, [1])}
                for i in range(6)
            ]
        )
        db.create_collection(
            VIEW,
            viewOn="orders",
            pipeline=[{"$match": {"status": "open"}}, {"$project": {"total": 1, "status": 1}}],
        )
        db.create_collection(UNWOUND, viewOn="orders", pipeline=[{"$unwind": "$lines"}])
        yield source, client


def summary_of(run) -> dict:
    return run.get_task_instance("summary").xcom_pull(task_ids="summary")


def view_files(source) -> set[str]:
    """Every file of the view's raw, state and changes tables."""
    found = set()
    for directory, _, names in os.walk(source.lake_root):
        if VIEW in directory:
            found.update(os.path.join(directory, name) for name in names)
    return found


def view_batches(source) -> list[int]:
    return [batch.seq for batch in source.lake.batches() if batch.kind == VIEW_BATCH]


def test_discovery_names_what_it_does_not_capture_and_the_view_lands(scenario, capfd, caplog):
    source, client = scenario
    capfd.readouterr()
    summary = summary_of(source.run())
    # the tasks' log lines: printed, or (under the logging setup earlier tests in the process leave)
    # only passed to the loggers' handlers
    printed = "".join(capfd.readouterr()) + "\n".join(record.getMessage() for record in caplog.records)
    database = source.database
    expected = {
        f"{database}.{UNWOUND}": DUPLICATE_ID.format(value=3),
        f"{database}.system.views": SYSTEM_COLLECTION,
    }
    assert summary["not_captured"] == expected
    for namespace, reason in expected.items():
        assert f"{namespace}: not captured: {reason}" in printed  # discover's log
        assert f"not captured: {namespace}: {reason}" in printed  # the summary's
    # the collection is streamed as ever; the view's documents land as created, keyed by its _id
    assert_state_equals_collection(source, client, "orders")
    assert_state_equals_collection(source, client, VIEW)
    assert summary["events"][f"{database}.{VIEW}"] == {"c": 3}
    assert Counter(row["__op"] for row in source.change_rows(VIEW)) == {"c": 3}
    assert {row["source"]["sequence"] for row in source.raw_rows(VIEW)} == {"view"}
    assert source.state_rows(UNWOUND) == []


def test_writes_to_the_base_collection_reach_the_view_as_changes(scenario):
    source, client = scenario
    orders = client[source.database].orders
    orders.insert_one({"_id": 10, "status": "open", "total": 5})  # joins the view: c
    orders.update_one({"_id": 0}, {"$set": {"total": 99}})  # changes in it: u
    orders.update_one({"_id": 2}, {"$set": {"status": "closed"}})  # leaves it: d
    orders.delete_one({"_id": 4})  # gone: d
    orders.update_one({"_id": 1}, {"$set": {"total": 1}})  # never in it: nothing
    summary = summary_of(source.run())
    assert summary["events"][f"{source.database}.{VIEW}"] == {"c": 1, "u": 1, "d": 2}
    assert_state_equals_collection(source, client, VIEW)
    # the first read's three c rows, then one row per difference
    changes = sorted((row["_id"], row["__op"]) for row in source.change_rows(VIEW))
    assert changes == [(0, "c"), (0, "u"), (2, "c"), (2, "d"), (4, "c"), (4, "d"), (10, "c")]


def test_an_unchanged_view_writes_no_file_and_verification_leaves_it_to_its_reads(scenario):
    source, client = scenario
    before, batches = view_files(source), view_batches(source)
    assert len(batches) == 2  # a batch for each read that found differences
    summary = summary_of(source.run(conf={"verify": True}))
    assert view_files(source) == before
    assert view_batches(source) == batches
    assert sorted(summary["verification"]) == [f"{source.database}.orders"]
    assert f"{source.database}.{VIEW}" not in summary["events"]
    assert_state_equals_collection(source, client, VIEW)


def test_a_dropped_view_empties_its_state_once(scenario):
    """As a dropped collection's stream does: the view's documents land as deletes, then nothing."""
    source, client = scenario
    in_state = len(source.state_rows(VIEW))
    client[source.database].drop_collection(VIEW)
    summary = summary_of(source.run())
    assert summary["events"][f"{source.database}.{VIEW}"] == {"d": in_state}
    assert source.state_rows(VIEW) == []
    batches = view_batches(source)
    summary = summary_of(source.run())
    assert f"{source.database}.{VIEW}" not in summary["events"]
    assert view_batches(source) == batches
