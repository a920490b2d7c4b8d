"""Debezium transaction metadata (begin and end records, each event's transaction block) and
heartbeats land as configured, against a real mongod.

Pulls run at core level (``pull_changes`` with an in-memory offset store) after a real snapshot;
one DAG run with Spark checks that the transform ignores the reserved directories.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from cdc_support import CdcSource
from pymongo import MongoClient

from mongo_cdc import lake
from mongo_cdc.capture.offsets import OffsetKeeper
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig, SourceConfigError, load_source
from mongo_cdc.lake.debezium_export import debezium_record, transaction_records
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc_dev.testing import ReplicaSet
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

RS = "rs0"
PREFIX = "txn"


@pytest.fixture
def client(replica_set: ReplicaSet):
    with make_client(replica_set.uri) as mongo:
        yield mongo


def _snapshotted(
    client: MongoClient, tmp_path: Path, db_name: str, **settings
) -> tuple[SourceConfig, OffsetKeeper]:
    """A source over ``db_name`` (collections a and b, one document each) with its snapshot taken."""
    config = database_source("txn", tmp_path / "lake", db_name, topic_prefix=PREFIX, **settings)
    client[db_name].a.insert_one({"_id": "seed-a"})
    client[db_name].b.insert_one({"_id": "seed-b"})
    keeper = memory_keeper(config, RS)
    run_snapshot(ReplicaSetCapture(client, config, keeper))
    return config, keeper


def _in_transaction(client: MongoClient, work) -> str:
    """Run ``work(session)`` as one committed multi-document transaction; its session's UUID."""
    with client.start_session() as session:
        session.with_transaction(work)
        return str(session.session_id["id"].as_uuid())


def _raw_rows(config: SourceConfig, db: str, collection: str) -> list[dict]:
    return CdcSource(config.name, db, config.lake_root, config.topic_prefix).raw_rows(collection)


def _source_lake(config: SourceConfig) -> SourceLake:
    return SourceLake(LakeLocation(config.lake_root), config.topic_prefix)


def _transaction_records(config: SourceConfig) -> list[dict]:
    return [record["value"] for record in transaction_records(_source_lake(config))]


def _landed_transaction_rows(config: SourceConfig) -> list[dict]:
    table = table_if_exists(_source_lake(config).source_uri(lake.TRANSACTION_DIR), {})
    return [] if table is None else table.to_pyarrow_dataset().to_table().to_pylist()


def test_transaction_across_two_collections_gets_begin_end_and_event_blocks(client, tmp_path, db_name):
    config, keeper = _snapshotted(client, tmp_path, db_name, provide_transaction_metadata=True)
    db = client[db_name]
    db.a.insert_one({"_id": "before"})

    def work(session):
        db.a.insert_one({"_id": 1}, session=session)
        db.b.insert_one({"_id": 1}, session=session)
        db.a.insert_one({"_id": 2}, session=session)
        db.a.update_one({"_id": 1}, {"$set": {"x": 1}}, session=session)
        db.b.delete_one({"_id": "seed-b"}, session=session)

    session_uuid = _in_transaction(client, work)
    db.b.insert_one({"_id": "after"})
    pull_changes(ReplicaSetCapture(client, config, keeper))

    begin, end = _transaction_records(config)
    assert re.fullmatch(rf"{session_uuid}:\d+", begin["id"]), begin["id"]
    assert begin == {"status": "BEGIN", "id": begin["id"], "event_count": None, "data_collections": None,
                     "ts_ms": begin["ts_ms"]}  # fmt: skip
    assert end["status"] == "END" and end["id"] == begin["id"] and end["event_count"] == 5
    assert end["data_collections"] == [
        {"data_collection": f"{db_name}.a", "event_count": 3},
        {"data_collection": f"{db_name}.b", "event_count": 2},
    ]
    rows = sorted(
        _raw_rows(config, db_name, "a") + _raw_rows(config, db_name, "b"),
        key=lambda r: (r["cluster_time"], r["event_order"], r["op"] is None),
    )
    in_txn = [r for r in rows if r["source"]["lsid"] is not None]
    assert [(r["source"]["collection"], r["op"]) for r in in_txn] == [
        ("a", "c"), ("b", "c"), ("a", "c"), ("a", "u"), ("b", "d"), ("b", None),
    ]  # fmt: skip
    events = in_txn[:5]
    assert [r["transaction"] for r in events] == [
        {"id": begin["id"], "total_order": total, "data_collection_order": per_collection}
        for total, per_collection in [(1, 1), (2, 1), (3, 2), (4, 3), (5, 2)]
    ]
    assert all(r["source"]["txnNumber"] is not None for r in in_txn)
    assert in_txn[5]["transaction"] is None  # a tombstone has no value, so no block
    outside = [r for r in rows if r["source"]["lsid"] is None]
    assert sorted(r["op"] for r in outside) == ["c", "c", "r", "r"]  # the snapshot, "before" and "after"
    assert all(r["transaction"] is None for r in outside)
    # the export renders the block, and the raw tree's readers do not take "transaction" for a database
    assert debezium_record(events[0])["value"]["transaction"]["total_order"] == 1
    assert _source_lake(config).namespaces() == [f"{db_name}.a", f"{db_name}.b"]
    assert keeper.load().open_transaction is None


def test_transaction_split_across_micro_batches_gets_one_begin_and_end(client, tmp_path, db_name):
    config, keeper = _snapshotted(
        client, tmp_path, db_name, provide_transaction_metadata=True, max_batch_size=2
    )
    db = client[db_name]
    _in_transaction(client, lambda s: [db.a.insert_one({"_id": i}, session=s) for i in range(5)])
    _in_transaction(client, lambda s: [db.b.insert_one({"_id": i}, session=s) for i in range(3)])
    pull_changes(ReplicaSetCapture(client, config, keeper))

    records = _transaction_records(config)
    assert [(r["status"], r["event_count"]) for r in records] == [
        ("BEGIN", None), ("END", 5), ("BEGIN", None), ("END", 3),
    ]  # fmt: skip
    assert records[0]["id"] == records[1]["id"] != records[2]["id"] == records[3]["id"]
    # the first transaction straddles batches: its BEGIN and END landed in different ones
    landed_in = {(row["status"], row["id"]): row["batch_seq"] for row in _landed_transaction_rows(config)}
    assert landed_in[("END", records[0]["id"])] > landed_in[("BEGIN", records[0]["id"])]
    first = [r["transaction"] for r in _raw_rows(config, db_name, "a") if r["op"] == "c"]
    assert [(t["total_order"], t["data_collection_order"]) for t in first] == [(i, i) for i in range(1, 6)]
    assert keeper.load().open_transaction is None


def test_transaction_interrupted_between_pulls_keeps_counting(client, tmp_path, db_name, monkeypatch):
    """A pull that dies after landing half a transaction: the next one finishes it with the right counts."""
    config, keeper = _snapshotted(
        client, tmp_path, db_name, provide_transaction_metadata=True, max_batch_size=2
    )
    db = client[db_name]
    _in_transaction(client, lambda s: [db.a.insert_one({"_id": i}, session=s) for i in range(5)])
    commit = OffsetKeeper.commit

    def commit_then_die(self, offset, **changes):
        committed = commit(self, offset, **changes)
        if "batch_seq" in changes:
            raise KeyboardInterrupt("the worker died")
        return committed

    monkeypatch.setattr(OffsetKeeper, "commit", commit_then_die)
    with pytest.raises(KeyboardInterrupt):
        pull_changes(ReplicaSetCapture(client, config, keeper))
    monkeypatch.undo()
    assert keeper.load().open_transaction["total_order"] == 2

    pull_changes(ReplicaSetCapture(client, config, keeper))
    records = _transaction_records(config)
    assert [(r["status"], r["event_count"]) for r in records] == [("BEGIN", None), ("END", 5)]
    orders = [r["transaction"]["total_order"] for r in _raw_rows(config, db_name, "a") if r["op"] == "c"]
    assert orders == [1, 2, 3, 4, 5]


def test_metadata_off_writes_no_records_and_no_blocks(client, tmp_path, db_name):
    config, keeper = _snapshotted(client, tmp_path, db_name)
    db = client[db_name]
    _in_transaction(client, lambda s: [db.a.insert_one({"_id": i}, session=s) for i in range(2)])
    pull_changes(ReplicaSetCapture(client, config, keeper))

    assert _landed_transaction_rows(config) == []
    streamed = [r for r in _raw_rows(config, db_name, "a") if r["op"] == "c"]
    assert len(streamed) == 2
    assert all(r["transaction"] is None and r["source"]["lsid"] is not None for r in streamed)


def _heartbeats(config: SourceConfig) -> list[dict]:
    table = table_if_exists(_source_lake(config).source_uri(lake.HEARTBEAT_DIR), {})
    return [] if table is None else table.to_pyarrow_dataset().to_table().to_pylist()


def test_heartbeats_land_on_a_quiet_pull_at_most_once_per_interval(client, tmp_path, db_name):
    config, keeper = _snapshotted(client, tmp_path, db_name, heartbeat_interval_ms=1)
    # only a collection the source does not capture changes
    client[f"{db_name}_other"].c.insert_one({"_id": 1})
    pull_changes(ReplicaSetCapture(client, config, keeper))

    (beat,) = _heartbeats(config)
    offset = keeper.load()
    assert (beat["server_name"], beat["rs"], beat["cluster_time"]) == (PREFIX, RS, offset.cluster_time)
    assert json.loads(beat["resume_token"])["_data"] == offset.resume_token["_data"]
    assert beat["ts_ms"] >= (offset.cluster_time >> 32) * 1000
    assert _source_lake(config).namespaces() == [f"{db_name}.a", f"{db_name}.b"]

    # the newest heartbeat is what the interval counts from, across pulls
    hourly = dataclasses.replace(config, heartbeat_interval_ms=3_600_000)
    pull_changes(ReplicaSetCapture(client, hourly, keeper))
    assert len(_heartbeats(config)) == 1
    pull_changes(ReplicaSetCapture(client, config, keeper))
    assert len(_heartbeats(config)) == 2


def test_no_heartbeats_when_disabled(client, tmp_path, db_name):
    config, keeper = _snapshotted(client, tmp_path, db_name)
    client[db_name].a.insert_one({"_id": "new"})
    pull_changes(ReplicaSetCapture(client, config, keeper))
    assert _heartbeats(config) == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("provide.transaction.metadata", "yes", "must be true or false"),
        ("heartbeat.interval.ms", -1, "must be an integer from 0 to 86400000"),
        ("heartbeat.interval.ms", "1000", "must be an integer from 0 to 86400000"),
        ("heartbeat.interval.ms", True, "must be an integer from 0 to 86400000"),
    ],
)
def test_bad_values_are_refused_at_parse_time(tmp_path, key, value, message):
    path = tmp_path / "src.yaml"
    path.write_text(yaml.safe_dump({"topic.prefix": "p", key: value}))
    with pytest.raises(SourceConfigError, match=rf"src.yaml: key '{re.escape(key)}' {message}"):
        load_source(str(path))


def test_settings_parse(tmp_path):
    path = tmp_path / "src.yaml"
    path.write_text(yaml.safe_dump({"topic.prefix": "p", "provide.transaction.metadata": True,
                                    "heartbeat.interval.ms": 0}))  # fmt: skip
    config = load_source(str(path))
    assert (config.provide_transaction_metadata, config.heartbeat_interval_ms) == (True, 0)


def test_a_database_named_transaction_is_refused_loudly(tmp_path):
    with pytest.raises(lake.ReservedDatabaseError, match=r"database.exclude.list: \[transaction\]"):
        lake.table_uri(LakeLocation(str(tmp_path)), "raw", "p", "transaction", "c")


def test_transform_ignores_transaction_and_heartbeat_directories(cdc_source, replica_set, db_name):
    source = cdc_source(db_name, **{"provide.transaction.metadata": True, "heartbeat.interval.ms": 1})
    with MongoClient(replica_set.uri) as mongo:
        mongo[db_name].a.insert_one({"_id": 0})
        source.run(skip_spark=True)
        _in_transaction(mongo, lambda s: [mongo[db_name][name].insert_one({"_id": 1}, session=s)
                                          for name in ("a", "b")])  # fmt: skip
    source.run()
    raw = os.path.join(source.lake_root, "raw", source.prefix)
    assert {lake.TRANSACTION_DIR, lake.HEARTBEAT_DIR} <= set(os.listdir(raw))
    assert sorted(os.listdir(os.path.join(source.lake_root, "state", source.prefix))) == [db_name]
    assert sorted(os.listdir(os.path.join(source.lake_root, "state", source.prefix, db_name))) == ["a", "b"]
    assert (len(source.state_rows("a")), len(source.state_rows("b"))) == (2, 1)
