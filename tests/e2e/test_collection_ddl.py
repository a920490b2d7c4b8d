"""Drop, rename, dropDatabase and invalidate reach the state tables (real mongod and Spark; a fake stream
only for the invalidate, which a deployment-wide stream never gets from a real server).

Every scenario ends with each state table equal to its live collection and the raw zone holding
each event once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import bson
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from cdc_support import assert_state_equals_collection
from pymongo.errors import OperationFailure

from mongo_cdc.capture import streaming
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.lake import COLLECTION_KEY, pack_cluster_time
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def _assert_each_event_landed_once(source, collection: str) -> None:
    positions = Counter(
        (row["cluster_time"], row["event_order"], row["op"], row["key"])
        for row in source.raw_rows(collection)
        if row["op"] not in (None, "r")
    )
    assert not [position for position, count in positions.items() if count > 1]


def _ops(source, collection: str) -> list[str]:
    return [row["op"] for row in source.raw_rows(collection) if row["op"] is not None]


def test_drops_and_renames_reach_the_state_tables(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        db = client[db_name]
        db.keep.insert_many([{"_id": i} for i in range(3)])
        db.gone.insert_many([{"_id": i} for i in range(3)])
        db.old.insert_many([{"_id": i, "v": "old"} for i in range(3)])
        db.src.insert_one({"_id": "s"})
        db.target.insert_one({"_id": "t"})
        source.run(skip_spark=True)

        db.gone.insert_one({"_id": 3})
        db.gone.drop()
        db.gone.insert_one({"_id": 9})  # re-created: only this one is left
        db.old.insert_one({"_id": 3, "v": "old"})
        db.old.rename("new")
        db.new.insert_one({"_id": 4, "v": "new"})
        db.new.update_one({"_id": 0}, {"$set": {"v": "updated after the rename"}})
        db.src.rename("target", dropTarget=True)  # the target's own documents vanish
        db.keep.insert_one({"_id": 3})
        source.run()

        for collection in ("keep", "gone", "old", "new", "src", "target"):
            assert_state_equals_collection(source, client, collection)
            _assert_each_event_landed_once(source, collection)
        assert _ops(source, "gone") == ["r", "r", "r", "c", "drop", "c"]
        assert _ops(source, "old")[-2:] == ["c", "rename"]
        # copied when the pull reached the rename, so the copy shows the later insert too
        assert Counter(_ops(source, "new")) == {"r": 5, "c": 1, "u": 1}
        assert [row["key"] for row in source.raw_rows("gone") if row["op"] == "drop"] == [COLLECTION_KEY]

        # later runs leave it all as it is, and the renamed collection goes on streaming
        db.new.delete_one({"_id": 1})
        source.run()
        assert_state_equals_collection(source, client, "new")
        assert_state_equals_collection(source, client, "old")


def test_a_dropped_database_empties_its_collections(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        client[db_name].a.insert_many([{"_id": i} for i in range(3)])
        client[db_name].b.insert_many([{"_id": i} for i in range(3)])
        source.run(skip_spark=True)
        client.drop_database(db_name)
        client[db_name].a.insert_one({"_id": "after"})
        source.run()
        for collection in ("a", "b"):
            assert_state_equals_collection(source, client, collection)
            _assert_each_event_landed_once(source, collection)
        assert _ops(source, "b")[-1] == "drop"


def _token(seconds: int, suffix: str) -> dict:
    return {"_data": f"82{pack_cluster_time(seconds, 1):016X}{suffix}"}


def _insert(seconds: int, document_id: int) -> dict:
    return {
        "_id": _token(seconds, "01"),
        "operationType": "insert",
        "clusterTime": Timestamp(seconds, 1),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": document_id},
        "fullDocument": {"_id": document_id},
    }


class _FakeStream:
    def __init__(self, events: list[dict], end_token: dict) -> None:
        self.events = events
        self.end_token = end_token
        self.resume_token = events[0]["_id"]

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def try_next(self) -> RawBSONDocument | None:
        if self.events:
            event = self.events.pop(0)
            self.resume_token = event["_id"]
            return RawBSONDocument(bson.encode(event))  # as a pull reads its stream
        self.resume_token = self.end_token  # the post-batch resume token of an empty getMore
        return None


class _FakeClient:
    """A deployment whose first stream is invalidated after one insert; reopened, it has one more."""

    primary = None

    def __init__(self) -> None:
        self.watches: list[dict] = []
        self.admin = self

    def command(self, name: str) -> dict:
        return {"operationTime": Timestamp(130, 1)}

    @property
    def local(self) -> None:  # the oplog guard's reads: as for a user not allowed to read the oplog
        raise OperationFailure("not authorized on local", code=13)

    def watch(self, **options: object) -> _FakeStream:
        self.watches.append(options)
        if len(self.watches) == 1:
            invalidate = {
                "_id": _token(120, "02"),
                "operationType": "invalidate",
                "clusterTime": Timestamp(120, 1),
            }
            return _FakeStream([_insert(110, 1), invalidate], _token(120, "02"))
        return _FakeStream([_insert(125, 2)], _token(131, "04"))


def test_an_invalidated_stream_is_reopened_after_the_invalidate_with_nothing_lost(
    tmp_path: Path, monkeypatch
):
    """A fake client: a real server never invalidates a deployment-wide stream."""
    monkeypatch.setattr(streaming, "open_change_stream", lambda client, **options: client.watch(**options))
    config = database_source("inv", tmp_path / "lake", "shop")
    keeper = memory_keeper(config, "rs0")
    start = Batch("rs0", 1, "start", _token(100, "00"), pack_cluster_time(100, 1))
    keeper.commit_batch(Offset(), start)  # streaming starts here, in the lake and the offset
    client = _FakeClient()

    result = pull_changes(ReplicaSetCapture(client, config, keeper))

    assert result.events == {"shop.orders": {"c": 2}}
    first, reopened = client.watches
    assert first["resume_after"] == _token(100, "00")
    assert "resume_after" not in reopened and reopened["start_after"] == _token(120, "02")
    assert keeper.load().resume_token == _token(131, "04")
