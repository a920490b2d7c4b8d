"""``__doc`` parses back to the document's BSON (issue 47 item 6): the text is rendered from the
bytes (``extjson.from_bson``), on the lossless path and the fast path alike, so every value keeps
what a decode into Python would lose: the deprecated types (Symbol, DBPointer, Undefined) are
written with their canonical wrappers, wherever they stand (sub-documents, arrays, a code's scope).

A document parsed as the Extended JSON specification reads it (``bson_of_extjson``: pymongo's
``json_util.loads`` with the deprecated wrappers kept) encodes back to its exact bytes, for every
document but those holding a value the text cannot spell bit for bit; pymongo's ``json_util.loads``
alone does for every document without a deprecated type or a DBRef-like key set in another
order than ``$ref``, ``$id``, ``$db``.
"""

from __future__ import annotations

import struct

import bson
import pyarrow as pa
import pytest
from bson import DBRef, ObjectId
from bson.json_util import loads
from bson_by_hand import (
    CASES,
    DBPOINTER,
    INVALID_UTF8_CASES,
    LOADS_OPTIONS,
    OBJECT_ID,
    SYMBOL,
    UNDEFINED,
    array,
    bson_of_extjson,
    code_with_scope,
    corpus_document,
    document,
    documents,
    embedded,
)

from mongo_cdc import extjson
from mongo_cdc.bson_elements import DamagedBson
from mongo_cdc.lake.debezium_export import debezium_record
from mongo_cdc.transform import column_survey
from mongo_cdc.transform.raw_events import RowDocuments
from mongo_cdc.transform.slice_tasks import FAST_PATH_MIN_ROWS, document_texts, field_values
from mongo_cdc.transform.split_values import SplitValues
from mongo_cdc.transform.table_layout import TableLayout

# values whose text holds the value but not its bits: NaN payloads and signs (the text says NaN),
# non-canonical decimals and decimal NaN payloads (the text is the decimal's value), and strings
# that are not valid UTF-8 (U+FFFD in JSON); __doc_bson holds them exactly
LOSSY_VALUES = {"nan with a payload", "negative signalling nan", "decimal128 non-canonical",
                "decimal128 nan with a payload"}  # fmt: skip
LOSSY_CASES = {"nan_payloads", "decimals", "invalid_utf8"}
DEPRECATED_CASES = {"undefined", "db_pointer", "symbol", "every value", "deprecated"}
# json_util.loads reads an object with a string $ref and an $id as a DBRef, which bson.encode writes
# with $ref and $id first (and refuses as a whole document): these documents hold one
DBREF_LIKE_CASES = {"dbref_like", "every value"}

# each deprecated type at the top, in a sub-document, in an array, in an array's sub-document, in
# a code's scope, and next to a DBRef-like key set
DEPRECATED = document(
    [
        ("_id", (0x10, struct.pack("<i", 99))),
        ("symbol", SYMBOL),
        ("pointer", DBPOINTER),
        ("undefined", UNDEFINED),
        ("nested", embedded([("symbol", SYMBOL), ("deeper", embedded([("pointer", DBPOINTER)]))])),
        (
            "list",
            array([SYMBOL, DBPOINTER, UNDEFINED, embedded([("undefined", UNDEFINED)]), array([SYMBOL])]),
        ),
        ("scope", code_with_scope("x + y", [("x", SYMBOL), ("y", UNDEFINED)])),
        ("ref", embedded([("$ref", SYMBOL), ("$id", DBPOINTER), ("$db", UNDEFINED)])),
    ]
)


def _cases() -> list[tuple[str, bytes]]:
    named = [(name, bytes(raw.raw)) for (name, _), raw in zip(CASES + INVALID_UTF8_CASES, documents(
        CASES + INVALID_UTF8_CASES, 1), strict=True)]  # fmt: skip
    every_value = [(name, value) for name, value in corpus_document(0) if name not in LOSSY_VALUES]
    return [*named, ("every value", document(every_value)), ("deprecated", DEPRECATED)]


CORPUS = _cases()


@pytest.mark.parametrize(("name", "data"), CORPUS, ids=[name for name, _ in CORPUS])
def test_every_document_parses_back_to_its_bytes_but_the_values_text_cannot_spell(name, data):
    text = extjson.from_bson(data)
    assert (bson_of_extjson(text) == data) is (name not in LOSSY_CASES), text


@pytest.mark.parametrize(("name", "data"), CORPUS, ids=[name for name, _ in CORPUS])
def test_json_util_loads_gives_the_bytes_back_for_every_document_without_a_deprecated_type(name, data):
    if name in LOSSY_CASES:
        return
    parsed = loads(extjson.from_bson(data), json_options=LOADS_OPTIONS)
    if isinstance(parsed, DBRef):  # bson.encode takes no DBRef as a whole document
        parsed = parsed.as_doc()
    same = bson.encode(parsed) == data
    assert same is (name not in DEPRECATED_CASES | DBREF_LIKE_CASES)


def test_the_deprecated_types_are_written_with_their_canonical_wrappers():
    text = extjson.from_bson(DEPRECATED)
    pointer = '{"$dbPointer":{"$ref":"db.collection","$id":{"$oid":"65a1b2c3d4e5f60718293a4b"}}}'
    symbol, undefined = '{"$symbol":"a symbol"}', '{"$undefined":true}'
    assert text == (
        '{"_id":99,'
        f'"symbol":{symbol},"pointer":{pointer},"undefined":{undefined},'
        f'"nested":{{"symbol":{symbol},"deeper":{{"pointer":{pointer}}}}},'
        f'"list":[{symbol},{pointer},{undefined},{{"undefined":{undefined}}},[{symbol}]],'
        f'"scope":{{"$code":"x + y","$scope":{{"x":{symbol},"y":{undefined}}}}},'
        f'"ref":{{"$ref":{symbol},"$id":{pointer},"$db":{undefined}}}}}'
    )


def test_json_util_reads_the_deprecated_wrappers_as_the_python_types_it_has():
    """What docs/lake-format.md says of pymongo: it has no types for them, and reads them as a str,
    a DBRef and None (so ``bson.encode`` writes a string, a sub-document and a null)."""
    parsed = loads(extjson.from_bson(document([("s", SYMBOL), ("p", DBPOINTER), ("u", UNDEFINED)])))
    assert parsed == {"s": "a symbol", "p": DBRef("db.collection", ObjectId(OBJECT_ID)), "u": None}


@pytest.mark.parametrize("rows", [1, FAST_PATH_MIN_ROWS])
def test_doc_is_the_text_of_doc_bson_on_the_lossless_and_the_fast_path(rows):
    """The state's ``__doc`` (``slice_tasks.document_texts``), with few rows (every document lossless)
    and with enough for the fast path (the deprecated types' documents lossless beside fast ones)."""
    plain = [
        bson.encode({"_id": 10_000 + row, "name": f"n{row}", "blob": b"\x00\x01"}) for row in range(rows)
    ]
    raws = [data for _, data in CORPUS] + plain
    document_bson = pa.array(raws, pa.binary())
    values = field_values(TableLayout(()), document_bson, RowDocuments(document_bson))
    assert isinstance(values, SplitValues if rows >= FAST_PATH_MIN_ROWS else column_survey.FieldValues)
    if isinstance(values, SplitValues):
        assert set(values.fast_rows.tolist()) >= set(range(len(CORPUS), len(raws)))
    texts = document_texts(values, document_bson).to_pylist()
    assert texts == [extjson.from_bson(data) for data in raws]
    lossless = {name for name, _ in CORPUS} & LOSSY_CASES
    assert [bson_of_extjson(text) == data for text, data in zip(texts, raws, strict=True)] == [
        name not in lossless for name, _ in CORPUS
    ] + [True] * rows


@pytest.mark.parametrize(("name", "data"), CORPUS, ids=[name for name, _ in CORPUS])
def test_a_document_without_a_deprecated_type_has_the_text_of_its_values_decoded(name, data):
    """What changed is only what a decode loses: every other document's text is ``extjson.encode``'s
    of it decoded, as before (invalid UTF-8 read with U+FFFD alike)."""
    decoded_text = extjson.encode_str(bson.decode(data, extjson.READ_OPTIONS))
    assert (extjson.from_bson(data) == decoded_text) is (name not in DEPRECATED_CASES)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],  # cut short
        lambda data: data[:-1] + b"\x01",  # no closing NUL
        lambda data: data[:4] + b"\x63" + data[5:],  # an unknown type
        lambda data: data[:4] + b"\x02" + data[5:],  # an int32 read as a string: its length overruns
        lambda data: struct.pack("<i", len(data) + 9) + data[4:],  # a length past the end
    ],
)
def test_damaged_bson_is_refused_not_rendered(damage):
    with pytest.raises(DamagedBson):
        extjson.from_bson(damage(DEPRECATED))


def test_the_debezium_export_renders_documents_as_doc_is():
    """The export's ``before``, ``after`` and ``updatedFields`` are the raw BSON's text, deprecated
    types with their wrappers (docs/reading.md, "Debezium-compatible export")."""
    fields = document([("nested.symbol", SYMBOL), ("pointer", DBPOINTER)])
    row = {"key": '{"id":"99"}', "op": "u", "before": DEPRECATED, "after": DEPRECATED, "ts_ms": 1,
           "updateDescription": {"updatedFields": fields, "removedFields": [], "truncatedArrays": []},
           "source": {}, "transaction": None}  # fmt: skip
    value = debezium_record(row)["value"]
    assert value["before"] == value["after"] == extjson.from_bson(DEPRECATED)
    assert value["updateDescription"]["updatedFields"] == extjson.from_bson(fields)
    assert '{"$symbol":"a symbol"}' in value["updateDescription"]["updatedFields"]
