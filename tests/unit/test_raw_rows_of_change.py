"""Change events read raw become raw rows without decoding their documents (issue 19): the resume
token and the namespace are read from their bytes, documents land as the event's bytes, and the
rows' keys are built in bulk, the same as one by one."""

from __future__ import annotations

import gc
import tracemalloc

import bson
from bson import ObjectId, Timestamp
from bson.datetime_ms import DatetimeMS

from mongo_cdc import extjson
from mongo_cdc.capture.change_cursor import RAW_EVENT_OPTIONS, event_fields
from mongo_cdc.capture.collection_events import collection_row
from mongo_cdc.capture.raw_rows import SourceInfo, raw_rows_of_change
from mongo_cdc.capture.raw_tables import raw_rows_table
from mongo_cdc.lake import COLLECTION_KEY

SOURCE = SourceInfo("prefix", "rs0")
WALL_MS = 1_700_000_000_123


def _event(token: dict, document_id: object, operation: str = "insert") -> dict:
    event = {
        "_id": token,
        "operationType": operation,
        "clusterTime": Timestamp(1_700_000_000, 3),
        "wallTime": DatetimeMS(WALL_MS),
        "ns": {"db": "db", "coll": "items"},
        "documentKey": {"_id": document_id},
    }
    if operation == "insert":
        event["fullDocument"] = {"_id": document_id, "x": 1}
    raw = bson.decode(bson.encode(event), RAW_EVENT_OPTIONS)
    raw["_id"]  # what the change stream reads of every event
    return event_fields(raw)


def test_a_raw_events_resume_token_and_namespace_read_as_the_server_sent_them() -> None:
    sliced = _event({"_data": "8265A1B2C3000000012B"}, 1)
    assert sliced["_id"] == {"_data": "8265A1B2C3000000012B"}
    assert _event({"_data": "82", "more": 1}, 2)["_id"] == {"_data": "82", "more": 1}  # another layout
    # a token of 4 KB or more (a large _id's) comes as a view of the reply: read the same
    large = {"_data": "82" + "AB" * 3000}
    assert _event(large, 3)["_id"] == large
    assert sliced["ns"] == {"db": "db", "coll": "items"}


def test_rows_of_a_batch_are_keyed_in_bulk_as_one_by_one() -> None:
    object_id = ObjectId()
    inserted = _event({"_data": "8201"}, object_id)
    deleted = _event({"_data": "8202"}, 5, "delete")
    dropped = _event({"_data": "8203"}, 6, "drop")
    rows = [
        *raw_rows_of_change(inserted, SOURCE, tombstones=False),
        *raw_rows_of_change(deleted, SOURCE, tombstones=True),
        collection_row(dropped, SOURCE),
    ]
    ids = (object_id, 5, 5)
    expected = [extjson.document_key(document_id) for document_id in ids]
    for keyed in (rows[:1], rows[:3]):  # ObjectIds in bulk; other _id types one by one
        assert raw_rows_table(keyed, 1).column("key").to_pylist() == expected[: len(keyed)]
    table = raw_rows_table(rows, 1)
    assert table.column("key").to_pylist() == [*expected, COLLECTION_KEY]
    assert table.column("op").to_pylist() == ["c", "d", None, "drop"]
    assert table.column("after").to_pylist()[0] == inserted["fullDocument"].raw
    source = table.column("source").to_pylist()[0]
    assert (source["ts_ms"], source["ord"], source["wallTime"], source["rs"]) == (WALL_MS, 3, WALL_MS, "rs0")


def test_documents_of_4_kb_and_more_land_as_bytes_and_free_their_memory_after() -> None:
    """pymongo (4.18 on) gives a raw document of 4 KB or more as a memoryview of its reply; converted
    to Arrow as one, its memory was never freed (a pull of 64 KB documents grew with every batch)."""
    body = "x" * 64_000

    def large_rows() -> list:
        event = _event({"_data": "8201"}, ObjectId())
        event["fullDocument"] = bson.decode(
            bson.encode({"event": {"_id": 1, "body": body}}), RAW_EVENT_OPTIONS
        )["event"]
        return raw_rows_of_change(event, SOURCE, tombstones=False)

    assert isinstance(large_rows()[0].after, bytes)
    raw_rows_table(large_rows(), 1)  # the first table's one-off allocations (pyarrow's, the types')
    tracemalloc.start()
    try:
        for _ in range(20):
            raw_rows_table(large_rows(), 1)
        gc.collect()
        left, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert left < 64_000, f"{left:,} bytes of 20 tables of a 64 KB document are still allocated"
