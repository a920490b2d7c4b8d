"""MongoDB's own notion of a document, end to end: ``_id``s it takes for one document are one state
row, and every document it accepts round-trips byte for byte, whatever its field names."""

from __future__ import annotations

import bson
from bson import Decimal128, Int64
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from cdc_support import assert_state_equals_collection

RAW = CodecOptions(document_class=RawBSONDocument)


def test_ids_mongodb_takes_for_one_document_are_one_state_row(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        items.insert_many(
            [{"_id": 1, "v": "int32"}, {"_id": Int64(2), "v": "int64"}, {"_id": 3.0, "v": "double"}]
        )
        source.run()
        # writes through equal _ids of other types: a replace may even store another type
        items.replace_one({"_id": Int64(1)}, {"_id": 1.0, "v": "replaced as a double"})
        items.update_one({"_id": 2.0}, {"$set": {"v": "updated through a double"}})
        items.update_one({"_id": Decimal128("3")}, {"$set": {"w": 1}})
        items.delete_one({"_id": 3})
        items.insert_one({"_id": Int64(3), "v": "re-inserted as an int64"})
        source.run()
        rows = source.state_rows("items")
        assert len(rows) == items.count_documents({}) == 3
        assert sorted(row["__id"] for row in rows) == sorted(
            ['{"$numberLong":"3"}', '{"$numberLong":"2"}', "1.0"]
        )
        # _ids of three types in the first batch: the _id column holds their Extended JSON
        assert_state_equals_collection(source, client, "items", frozenset({"_id"}))


def test_documents_with_dollar_dotted_and_wrapper_like_field_names_round_trip_exactly(
    cdc_source, replica_set, db_name
):
    source = cdc_source(db_name)
    odd = {
        "_id": "odd",
        "w": {"$numberLong": "5"},  # a field named like an int64 wrapper: it is a string field
        "d": {"$date": "not a date", "$oid": 7},
        "op": {"$set": {"x": 1}},
        "a.b": {"c.d": "dotted names"},
    }
    with replica_set.client() as client:
        items = client[db_name].items
        items.insert_one(odd)
        source.run()  # the snapshot reads it
        items.insert_one({**odd, "_id": "streamed"})
        items.replace_one({"_id": "odd"}, {**odd, "w": {"$numberLong": "6"}})
        source.run()  # the stream brings the others
        raw_documents = {doc["_id"]: doc.raw for doc in items.with_options(codec_options=RAW).find()}
        rows = {row["__id"]: row for row in source.state_rows("items")}
        assert {row["__id"] for row in rows.values()} == {'"odd"', '"streamed"'}
        for document_id, raw in raw_documents.items():
            row = rows[f'"{document_id}"']
            assert row["__doc_bson"] == raw  # the server's bytes
            # the typed columns take the names as names
            assert row["w"] == bson.decode(raw)["w"] and isinstance(row["w"]["$numberLong"], str)
            assert row["a.b"] == {"c.d": "dotted names"}
        # the raw zone holds the same bytes for every event
        afters = [r["after"] for r in source.raw_rows("items") if r["op"] in ("r", "c", "u")]
        assert set(afters) >= set(raw_documents.values())
