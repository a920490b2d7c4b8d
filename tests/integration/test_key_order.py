"""MongoDB's ``_id`` order from normalised keys (mongo_cdc.verify.key_order), and the ranges a
verification puts state rows in. The real mongod's ``_id`` index is the ground truth."""

from __future__ import annotations

import datetime as dt

import bson
from bson import Code, DatetimeConversion, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from bson.binary import Binary

from mongo_cdc.capture.chunking import ID_INDEX
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.transform.keys import document_key
from mongo_cdc.verify.key_order import RangeFinder, order_of_key


def encoded(bound: dict | None) -> bytes | None:
    return bson.encode(bound) if bound is not None else None


IDS = [
    MinKey(), None, float("nan"), float("-inf"), -5, Decimal128("-2.5"), 0, 0.25, 1, Int64(2), 2.5,
    Decimal128("1E+3"), float("inf"), "", "B", "a", "ab", "é", {}, {"a": 1}, {"a": "x"}, {"a": 1, "b": 1},
    {"b": 0}, Binary(b"zz", 0), Binary(b"a", 5), Binary(b"b", 0), ObjectId("000000000000000000000001"),
    ObjectId("ffffffffffffffffffffffff"), False, True, dt.datetime(1960, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), Timestamp(1, 2), Timestamp(2, 1),
    Code("x"), Code("x", {"a": 1}), MaxKey(),
]  # fmt: skip


def test_keys_sort_as_the_id_index_sorts_their_ids_and_rows_fall_in_the_range_that_reads_them(
    replica_set, db_name
):
    with replica_set.client(datetime_conversion=DatetimeConversion.DATETIME_MS) as client:
        collection = client[db_name].ids
        collection.insert_many([{"_id": value} for value in IDS])
        indexed = [document_key(doc["_id"]) for doc in collection.find({}, {"_id": 1}).sort("_id", 1)]
        assert sorted(indexed, key=order_of_key) == indexed
        assert sorted(reversed(indexed), key=order_of_key) == indexed

        # ranges cut every 5 _ids, as chunking cuts them (index-key bounds, open at both ends)
        cuts = [{"_id": doc["_id"]} for doc in collection.find({}, {"_id": 1}).sort("_id", 1)][5::5]
        bounds = list(zip([None, *cuts], [*cuts, None], strict=True))
        chunks = [
            Chunk(collection.full_name, index, len(bounds), ID_INDEX, *(encoded(bound) for bound in pair))
            for index, pair in enumerate(bounds)
        ]
        finder = RangeFinder(chunks)
        for chunk in chunks:
            low, high = chunk.bounds()
            cursor = collection.find({}, {"_id": 1}).hint([("_id", 1)])
            cursor = cursor.min(list(low.items())) if low is not None else cursor
            cursor = cursor.max(list(high.items())) if high is not None else cursor
            read = [document_key(doc["_id"]) for doc in cursor]
            if high is None:  # max is exclusive even when open: MaxKey is read on its own
                read.append(document_key(MaxKey()))
            assert [finder.index(key) for key in read] == [chunk.index] * len(read), chunk.describe()
