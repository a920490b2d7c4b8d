"""Documents stay the bytes MongoDB stores, through the DAG, under ``capture.mode: change_streams``.

Documents of every BSON type (tests/support/bson_by_hand.py) are snapshotted, then updated: the
state applies each ``updatedFields`` to the stored version, and its ``__doc_bson`` must be the
collection's bytes, the deprecated types in untouched fields included. A second collection has
field rules, which must leave every other element's bytes as they were (issue 19, acceptance c).

The pull re-encodes a streamed event's ``updatedFields`` for now, so the values set here are the
ones a decode and encode keep (``round_trips``); the deprecated types are set in
tests/integration/test_update_fidelity.py, from the server's own bytes.
"""

from __future__ import annotations

from bson.raw_bson import RawBSONDocument
from bson_by_hand import (
    ARRAY_VALUES,
    DOCUMENT_FIELDS,
    RAW,
    UNDEFINED,
    VALUES,
    array,
    corpus_document,
    document,
    embedded,
    int32,
    raw,
    round_trips,
    string,
)

KEPT = [name for name, value in VALUES.items() if round_trips(value)]  # what the pull can set today
NAME = [("first", (0x02, string("Ada"))), ("last", UNDEFINED)]


def sets(fields) -> RawBSONDocument:
    return raw([("$set", embedded(fields))])


def updates() -> list[object]:
    found: list[object] = [
        sets([("document.a", VALUES["decimal128 non-canonical"]), ("document.b", VALUES["regex"])]),
        sets([("array.6", VALUES["maxkey"]), ("missing.parent", VALUES["code"])]),
        {"$unset": {"int32": "", "document.a": "", "array.0": ""}},
        [{"$set": {"long": {"$slice": ["$long", 3]}}}],
        [{"$set": {"nested.long": {"$slice": ["$nested.long", 1]}}}],
    ]
    for index, name in enumerate(KEPT):  # a value of each type: where a field stands, and new
        found += [
            sets([(name, VALUES[KEPT[(index + 1) % len(KEPT)]])]),
            sets([(f"new {name}", VALUES[name])]),
        ]
    return found


def ruled_document(document_id: int, name: list) -> list:
    return [*corpus_document(document_id), ("secret", (0x02, string("s"))), ("name", embedded(name))]


def as_ruled(elements: list) -> bytes:
    """What the rules below leave of a document, built by hand: ``secret`` and ``document.$dollar``
    excluded, ``name`` renamed ``title`` and each ``x`` of ``array``'s documents renamed ``y``."""
    fields = {
        "document": embedded([field for field in DOCUMENT_FIELDS if field[0] != "$dollar"]),
        "array": array([*ARRAY_VALUES[:2], embedded([("y", UNDEFINED)]), ARRAY_VALUES[3]]),
    }
    return document(
        ("title" if name == "name" else name, fields.get(name, value))
        for name, value in elements
        if name != "secret"
    )


def test_state_documents_are_the_stored_bytes_after_updates_and_field_rules(cdc_source, replica_set, db_name):
    db = replica_set.client()[db_name]
    updated, ruled = (db.get_collection(name, codec_options=RAW) for name in ("updated", "ruled"))
    updated.insert_many([raw(corpus_document(1)), raw(corpus_document(2))])
    ruled.insert_one(raw(ruled_document(1, NAME)))
    source = cdc_source(
        db_name,
        **{
            "capture.mode": "change_streams",
            "field.exclude.list": [f"{db_name}.ruled.secret", f"{db_name}.ruled.document.$dollar"],
            "field.renames": [f"{db_name}.ruled.name:title", f"{db_name}.ruled.array.x:y"],
        },
    )
    source.run(skip_spark=True)  # the snapshot: its rows are folded with the updates below
    [snapshot_read] = source.raw_rows("ruled")
    assert snapshot_read["after"] == as_ruled(ruled_document(1, NAME))

    for update in updates():
        assert updated.update_one({"_id": 1}, update).modified_count == 1, update
    updated.update_one({"_id": 2}, {"$set": {"string": "only this"}})
    ruled.update_one({"_id": 1}, {"$set": {"name.first": "Bea", "secret": "s2", "int32": 7}})
    ruled.update_one({"_id": 1}, {"$unset": {"secret": "", "name.last": ""}})
    source.run()

    streamed = [row for row in source.raw_rows("updated") if row["op"] == "u"]
    assert len(streamed) == len(updates()) + 1
    assert {entry["field"] for row in streamed for entry in row["updateDescription"]["truncatedArrays"]} == {
        "long",
        "nested.long",
    }
    state = {row["__id"]: row["__doc_bson"] for row in source.state_rows("updated")}
    assert state == {str(d["_id"]): bytes(d.raw) for d in updated.find()}

    [ruled_state] = source.state_rows("ruled")
    after = [
        (name, (0x10, int32(7)) if name == "int32" else value)
        for name, value in ruled_document(1, [("first", (0x02, string("Bea")))])
    ]
    assert ruled_state["__doc_bson"] == as_ruled(after)
