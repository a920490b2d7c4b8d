"""Filtered re-snapshots through the trigger's ``filters`` (Airflow dag.test, a real mongod, real
Spark): a field filter re-reads exactly its documents and deletes nothing; an ``_id`` range filter
also deletes the state documents of its range that MongoDB no longer has, and no other; a wrong
filter fails the run before anything is copied.

The pipeline is kept blind to the writes before each re-snapshot (``stream_past_everything_...``),
so only the re-snapshot can bring the state up to date.
"""

from __future__ import annotations

import json

import pytest
from cdc_support import (
    assert_state_equals_documents,
    stored_offset,
    stream_past_everything_written_so_far,
)
from conftest import make_source

from mongo_cdc import extjson

COLLECTION = "items"
NAMESPACE = f"filtered.{COLLECTION}"
IDS: list = [*range(60), "s1", "s2"]
# numbers and strings: the _id column holds their Extended JSON text
FALLBACK = frozenset({"_id"})


def _item(document_id) -> dict:
    red = isinstance(document_id, str) or document_id % 3 == 0
    return {"_id": document_id, "color": "red" if red else "blue", "version": 1}


def _ids(values) -> set[str]:
    return {extjson.encode_str(value) for value in values}


def _snapshot_reads(source) -> set[str]:
    """The _ids of the last snapshot's raw rows, each read once, checking it has one change row (op
    r at its position) per raw row."""
    snapshot = stored_offset(source, "rs0").snapshot
    raw = [row for row in source.raw_rows(COLLECTION) if row["batch_seq"] == snapshot["seq"]]
    assert all(row["op"] == "r" for row in raw)
    changes = [
        row["_id"]
        for row in source.change_rows(COLLECTION)
        if row["__op"] == "r" and row["__cluster_time"] == snapshot["cluster_time"]
    ]
    assert len(changes) == len(set(changes)) == len(raw), "one change row per document read"
    # a raw row's key is {"id": <the _id's Extended JSON>}
    read = [json.loads(row["key"])["id"] for row in raw]
    assert len(read) == len(set(read))
    return set(read)


def _state_ids(source) -> set[str]:
    return {row["__id"] for row in source.state_rows(COLLECTION)}


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    source = make_source(tmp_path_factory.mktemp("filtered"), replica_set.uri, "filtered")
    with replica_set.client() as client:
        client.drop_database(source.database)
        client[source.database][COLLECTION].insert_many([_item(i) for i in IDS])
        source.run()  # the initial snapshot
        yield source, client


def test_a_field_filter_re_reads_exactly_its_documents_and_deletes_nothing(scenario):
    source, client = scenario
    items = client[source.database][COLLECTION]
    items.delete_many({"_id": {"$in": [1, 3]}})  # a blue one and a red one
    items.update_many({"_id": {"$in": [6, 7]}}, {"$set": {"version": 2}})  # a red one and a blue one
    stream_past_everything_written_so_far(source, client, "rs0")

    source.run(conf={"resnapshot": True, "filters": {NAMESPACE: {"color": "red"}}})

    red = [document["_id"] for document in items.find({"color": "red"})]
    assert _snapshot_reads(source) == _ids(red)
    state = {row["__id"]: row for row in source.state_rows(COLLECTION)}
    # the red document changed while nobody streamed is up to date; the blue one is not re-read
    assert state[extjson.encode_str(6)]["version"] == 2 and state[extjson.encode_str(7)]["version"] == 1
    # deleted from MongoDB, yet kept: a field filter proves no document gone
    assert {extjson.encode_str(1), extjson.encode_str(3)} <= set(state)
    snapshot = next(b for b in source.lake.batches() if b.seq == stored_offset(source, "rs0").snapshot["seq"])
    assert snapshot.manifest_of(NAMESPACE) is None
    # tidy up for the next test: the state follows MongoDB again
    source.run(conf={"resnapshot": True, "collections": [NAMESPACE]})
    assert_state_equals_documents(source, COLLECTION, list(items.find()), FALLBACK)


def test_an_id_range_filter_deletes_only_the_missing_documents_of_its_range(scenario):
    source, client = scenario
    items = client[source.database][COLLECTION]
    # in the range, and outside it: above it, and a string (type bracketing: {$gte: 5} is numbers only)
    items.delete_many({"_id": {"$in": [10, 11, 50, "s1"]}})
    items.update_one({"_id": 12}, {"$set": {"version": 3}})
    stream_past_everything_written_so_far(source, client, "rs0")

    source.run(conf={"resnapshot": True, "filters": {NAMESPACE: {"_id": {"$gte": 5, "$lt": 20}}}})

    in_range = [i for i in range(5, 20) if i not in (10, 11)]
    assert _snapshot_reads(source) == _ids(in_range)
    state = _state_ids(source)
    assert not _ids([10, 11]) & state
    assert _ids([50, "s1"]) <= state  # gone from MongoDB, but not in the range the copy read
    rows = {row["__id"]: row for row in source.state_rows(COLLECTION)}
    assert rows[extjson.encode_str(12)]["version"] == 3
    expected = list(items.find()) + [_item(50), _item("s1")]
    assert_state_equals_documents(source, COLLECTION, expected, FALLBACK)


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (
            {NAMESPACE: {"_id": {"$oid": "nope"}}},
            'param "filters": the filter of filtered.items is not valid Extended JSON',
        ),
        (
            {"filtered.itemz": {"color": "red"}},
            'param "collections": unknown collection filtered.itemz; the captured collections of source '
            "'filtered' are: filtered.items",
        ),
        (
            {NAMESPACE: {"color": {"$almost": "red"}}},
            'param "filters": MongoDB refuses the filter of filtered.items: unknown operator: $almost',
        ),
    ],
)
def test_a_wrong_filter_fails_discover_before_anything_is_copied(scenario, capfd, filters, message):
    source, client = scenario
    seq_before = stored_offset(source, "rs0").batch_seq
    capfd.readouterr()
    run = source.run(conf={"resnapshot": True, "filters": filters}, expect="failed", skip_spark=True)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["discover"] == "failed" and states["transform"] == "upstream_failed"
    assert message in "".join(capfd.readouterr())
    assert stored_offset(source, "rs0").batch_seq == seq_before
