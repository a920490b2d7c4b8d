"""Runs after a state table was rewritten by a MERGE keep landing (issue 27's reproduction).

A delta-rs MERGE writes ``__key`` as ``string_view``; keyed reads of such a table failed in pyarrow,
so an update without a full document (``$inc`` then delete before the pull: lookup finds nothing)
failed every later run, and once the deletion markers were MERGEd, every collection's transform.
Through real DAG runs (``dag.test``), a real mongod and a real Spark, in file order.
"""

from __future__ import annotations

import pytest
from cdc_support import assert_state_equals_collection
from conftest import make_source

from mongo_cdc import extjson


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    source = make_source(tmp_path_factory.mktemp("after_merge"), replica_set.uri, "after_merge")
    with replica_set.client() as client:
        client.drop_database(source.database)
        items = client[source.database].items
        items.insert_many([{"_id": n, "n": n, "name": f"item {n}"} for n in range(20)])
        source.run()  # the snapshot: a new state table, written in one commit
        yield source, client, items


def _run_and_compare(source, client) -> None:
    source.run()
    assert_state_equals_collection(source, client, "items")


def test_a_second_run_merges_inserts_and_an_update(scenario):
    source, client, items = scenario
    items.insert_many([{"_id": n, "n": n} for n in range(20, 23)])
    items.update_one({"_id": 3}, {"$set": {"name": "three"}})
    _run_and_compare(source, client)


def test_an_update_whose_lookup_finds_nothing_applies_to_the_merged_state(scenario):
    source, client, items = scenario
    items.update_one({"_id": 5}, {"$inc": {"n": 1}})
    items.delete_one({"_id": 5})  # before the pull: the update's lookup finds no document
    _run_and_compare(source, client)
    fives = [row for row in source.raw_rows("items") if row["key"] == extjson.document_key(5)]
    assert [(row["op"], row["after"]) for row in fives[1:]] == [("u", None), ("d", None), (None, None)]


def test_runs_after_the_deletion_markers_were_merged_keep_landing(scenario):
    source, client, items = scenario
    items.delete_one({"_id": 7})  # the markers table exists: this deletion is MERGEd into it
    _run_and_compare(source, client)
    items.insert_one({"_id": 7, "n": 70})  # a re-insert reads the merged markers
    items.update_one({"_id": 8}, {"$inc": {"n": 1}})
    _run_and_compare(source, client)
