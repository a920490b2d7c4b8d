"""Whatever MongoDB stores lands as MongoDB's bytes, through every capture mode, and stops no run:
every BSON type (deprecated ones, NaN payloads, non-canonical decimals, every binary subtype), odd
field names (``$``-prefixed at any level, DBRef-like key sets, dotted, empty, unicode) and strings
that are not valid UTF-8 (issue 19; issue 25 item 3), inserted before and after the snapshot, then
updated."""

from __future__ import annotations

import bson
import orjson
import pytest
from bson_by_hand import CASES, INVALID_UTF8_CASES, RAW, bson_of_extjson, document, documents, embedded, raw

from mongo_cdc import extjson
from mongo_cdc.capture.document_ids import document_id
from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.transform.table_formats import STATE_METADATA_COLUMNS
from mongo_cdc.transform.table_layout import TableLayout

IMAGES_ON = {"changeStreamPreAndPostImages": {"enabled": True}}
AFTER_SNAPSHOT = 1000  # _ids of the documents inserted after the snapshot start here
# Modes whose updates carry the whole document: the state is exact today. Under change_streams and
# change_streams_with_pre_image the state is rebuilt from updateDescription; it becomes exact with
# updates applied on BSON elements (branch bson-updates), which adds those modes here.
LOOKUP_MODES = ("change_streams_update_full", "change_streams_update_full_with_pre_image")
MODES = (*LOOKUP_MODES, "change_streams", "change_streams_with_pre_image")
# the state is built and compared in these (a transform each): with the full document looked up,
# and from updatedFields applied to the stored version by BSON elements
STATE_EXACT_MODES = (*LOOKUP_MODES, "change_streams")


def _stored(collection) -> dict[int, bytes]:
    return {document_id(doc.raw): doc.raw for doc in collection.with_options(codec_options=RAW).find()}


@pytest.mark.parametrize("mode", MODES)
def test_every_bson_type_name_and_invalid_utf8_string_lands_as_mongodbs_bytes(
    cdc_source, replica_set, db_name, mode
):
    exact_state = mode in STATE_EXACT_MODES
    source = cdc_source(db_name, **{"capture.mode": mode})
    cases = CASES + INVALID_UTF8_CASES
    updates = {}  # _id -> (the update, the updatedFields it shows): a $set of the case's first value
    with replica_set.client() as client:
        items = client[db_name].create_collection("items", **IMAGES_ON)
        before = documents(cases, 0)
        items.insert_many(before)  # a raw insert: the server keeps these bytes
        source.run(skip_spark=True)  # the snapshot reads them; the transform folds them in below
        after = documents(cases, AFTER_SNAPSHOT)
        items.insert_many(after)
        for first_id in (0, AFTER_SNAPSHOT):
            for index, (_, elements) in enumerate(cases):
                updated = [("updated", elements[0][1])]  # the case's first value, as it was
                update = raw([("$set", embedded(updated))])
                items.update_one({"_id": first_id + index}, update)
                updates[first_id + index] = document(updated)
        items.update_one({"_id": AFTER_SNAPSHOT}, {"$unset": {"v": ""}})
        items.update_one({"_id": AFTER_SNAPSHOT + [n for n, _ in cases].index("array")},
                         [{"$set": {"v": {"$slice": ["$v", 1]}}}])  # fmt: skip
        source.run(skip_spark=not exact_state)
        stored = _stored(items)

    raw_rows = source.raw_rows("items")
    inserted = {document_id(doc.raw): doc.raw for doc in before + after}
    reads = {document_id(row["after"]): row["after"] for row in raw_rows if row["op"] in ("r", "c")}
    assert reads == inserted  # snapshot reads and inserts: the bytes written, as the server keeps them
    set_fields = [
        (orjson.loads(row["key"])["id"], row["updateDescription"]["updatedFields"])
        for row in raw_rows
        if row["op"] == "u"
    ]
    assert {key: fields for key, fields in set_fields if b"updated" in fields} == {
        str(key): updated for key, updated in updates.items()
    }  # the server's own bytes
    if mode in LOOKUP_MODES:  # lookups read the documents once every write was made
        assert {row["after"] for row in raw_rows if row["op"] == "u"} <= set(stored.values())
    if "pre_image" in mode:  # each document's first update shows it as inserted
        firsts = {}
        for row in raw_rows:
            if row["op"] == "u":
                firsts.setdefault(row["key"], row["before"])
        assert set(firsts.values()) == set(inserted.values())
    if not exact_state:
        return
    state = {document_id(row["__doc_bson"]): row for row in source.state_rows("items")}
    assert {key: row["__doc_bson"] for key, row in state.items()} == stored
    for row in state.values():
        orjson.loads(row["__doc"])  # JSON, whatever the document holds
    _assert_lossless_columns(source)
    invalid = state[AFTER_SNAPSHOT + len(CASES)]
    # a string that is not valid UTF-8 reads with U+FFFD in the typed columns; its bytes stay in __doc_bson
    assert (invalid["text"], invalid["ok"], invalid["inner"], invalid["texts"]) == (
        "caf\ufffd",
        "fine",
        {"w": "\ufffd\ufffd"},
        ["\ufffd\ufffd"],
    )


def _assert_lossless_columns(source) -> None:
    """Issue 21: whichever path the Spark job took for each document, every state row's typed and
    fallback columns are what the lossless path makes of its ``__doc_bson``, and ``__doc`` is
    ``extjson``'s text of it."""
    uri = table_uri(source.location, "state", source.prefix, source.database, "items")
    table = table_if_exists(uri, dict(source.storage_options)).to_pyarrow_dataset().to_table()
    layout = TableLayout.from_arrow(table.schema, STATE_METADATA_COLUMNS)
    documents = [bson.decode(data, extjson.READ_OPTIONS) for data in table.column("__doc_bson").to_pylist()]
    metadata = {name: table.column(name).combine_chunks() for name, _ in STATE_METADATA_COLUMNS}
    lossless = layout.record_batch(metadata, documents)
    for name in [column.column for column in layout.document_columns]:
        assert repr(table.column(name).to_pylist()) == repr(lossless.column(name).to_pylist()), name
    # __doc is the text of __doc_bson's bytes, and reads back to them (issue 47 item 6), but where
    # a value's bits cannot be spelled (NaN payloads, non-canonical decimals, invalid UTF-8)
    texts, exact = table.column("__doc").to_pylist(), table.column("__doc_bson").to_pylist()
    assert texts == [extjson.from_bson(data) for data in exact]
    cases = [document.get("case") for document in documents]
    assert {
        case for text, data, case in zip(texts, exact, cases, strict=True) if bson_of_extjson(text) != data
    } == {
        "nan_payloads",
        "decimals",
        "invalid_utf8",
    }
