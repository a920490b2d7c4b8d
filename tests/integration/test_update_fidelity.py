"""Updates applied to BSON (``transform.document_state``) give what mongod itself stores.

Each update runs against a real mongod, on a document of the corpus (tests/support/bson_by_hand.py:
every BSON type, the deprecated ones, odd bits and field names); its change event is read raw
(``updatedFields`` as the server's own bytes) and applied to the document's bytes before it. The
result must be the collection's bytes after it, byte for byte.
"""

from __future__ import annotations

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson_by_hand import DBPOINTER, SYMBOL, UNDEFINED, VALUES, corpus_document, embedded, raw

from mongo_cdc.transform.document_state import apply_update, fold_events
from mongo_cdc.transform.raw_events import ChangeEvent

RAW = CodecOptions(document_class=RawBSONDocument)
CORPUS = corpus_document(1)
TYPES = list(VALUES)


def sets(fields: list[tuple[str, tuple[int, bytes]]]) -> RawBSONDocument:
    """``{$set: fields}`` as raw BSON: pymongo cannot write the deprecated types."""
    return raw([("$set", embedded(fields))])


def updates() -> list[object]:
    """Every kind of update, each small beside the document (a large one is logged as a replace)."""
    found: list[object] = [
        sets([("document.a", SYMBOL), ("document.added", DBPOINTER)]),  # in place; appended inside
        sets([("array.1", UNDEFINED), ("array.3.0", SYMBOL)]),  # array elements, nested ones too
        sets([("array.7", VALUES["minkey"])]),  # past the end: nulls before it
        sets([("array.2.y.deeper", SYMBOL)]),  # a missing parent becomes a document
        sets([("array.9.z", SYMBOL)]),  # in an array too, after nulls
        sets([("dbref-like document.$id", VALUES["int64"])]),
        sets([("z first", SYMBOL), ("a second", UNDEFINED)]),  # new fields: mongod orders them
        {"$unset": {"int32": "", "document.a": "", "array.0": ""}},  # array.0 is left null
        {"$unset": {"no such field": "", "document.nope": ""}, "$set": {"x": 1}},
        # mongod logs the arrays $push and $pop change whole, and a pipeline's cut as a truncation
        {"$push": {"long": {"$each": [], "$slice": 8}}},
        {"$pop": {"long": 1}},
        {"$push": {"long": {"$each": ["y" * 40], "$slice": 4}}},
        [{"$set": {"long": {"$slice": ["$long", 2]}}}],
        [{"$set": {"nested.long": {"$slice": ["$nested.long", 3]}}}],
    ]
    for index, name in enumerate(TYPES):  # a value of each type, replacing one where it stands, and new
        replacement = VALUES[TYPES[(index + 1) % len(TYPES)]]
        found += [sets([(name, replacement)]), sets([(f"new {name}", VALUES[name])])]
    return found


def description(event: RawBSONDocument) -> dict:
    """The event's updateDescription as the raw table holds it: ``updatedFields`` the server's bytes."""
    update = event["updateDescription"]
    return {
        "updatedFields": bytes(update["updatedFields"].raw),
        "removedFields": list(update["removedFields"]),
        "truncatedArrays": [
            {"field": entry["field"], "newSize": entry["newSize"]} for entry in update["truncatedArrays"]
        ],
    }


def test_updates_applied_to_bson_give_the_bytes_mongod_stores(replica_set, db_name):
    collection = replica_set.client()[db_name].get_collection("corpus", codec_options=RAW)
    collection.insert_one(raw(CORPUS))
    first = bytes(collection.find_one().raw)
    assert first == raw(CORPUS).raw  # mongod keeps what it was given
    versions, events = [first], []
    with collection.watch() as stream:
        for update in updates():
            assert collection.update_one({"_id": 1}, update).modified_count == 1, update
            event = stream.next()
            assert event["operationType"] == "update", (update, bson.decode(event.raw))
            events.append(description(event))
            versions.append(bytes(collection.find_one().raw))

    for before, update, after in zip(versions[:-1], events, versions[1:], strict=True):
        assert apply_update(before, update) == after, update
    # the cases above reached every part of an update description
    assert [update["removedFields"] for update in events if update["removedFields"]] == [
        ["int32", "document.a"]
    ]
    assert [update["truncatedArrays"] for update in events if update["truncatedArrays"]] == [
        [{"field": "long", "newSize": 2}],
        [{"field": "nested.long", "newSize": 3}],
    ]

    # folded in one go, as the state does with a document's batch of updates
    folded = fold_events(
        "1",
        None,
        [
            ChangeEvent(1, "1", "c", 0, first, None, {"rs": "rs0"}, 1, "80", "rs0"),
            *(
                ChangeEvent(1, "1", "u", 0, None, update, {"rs": "rs0"}, 2 + i, "81", "rs0")
                for i, update in enumerate(events)
            ),
        ],
    )
    assert folded.document == versions[-1]
