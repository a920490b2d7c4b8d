"""The fast path (``transform.bson_columns``): typed columns straight from BSON bytes.

a) every typed column holds exactly the document's value (a reference decoding of its BSON), or is
   null with the value in its fallback column; b) the fast and the lossless path give identical
   record batches, on a first batch and on a batch against an evolved layout; and the documents
   the fast path holds do take it (else both would pass with everything lossless).
"""

from __future__ import annotations

import datetime as dt
import math
import struct

import bson
import pyarrow as pa
import pytest
from bson import Decimal128, Int64, ObjectId
from bson.binary import Binary
from bson_by_hand import CASES, INVALID_UTF8_CASES, documents

from mongo_cdc import extjson
from mongo_cdc.transform import column_types
from mongo_cdc.transform.column_survey import FieldValues, type_of
from mongo_cdc.transform.split_values import split_documents
from mongo_cdc.transform.table_layout import TableLayout

METADATA = [("__row", column_types.LONG)]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _clean(start: int, count: int) -> list[bytes]:
    """Documents the fast path holds: every kind it takes, at every depth."""
    return [
        bson.encode(
            {
                "_id": 1_000 + i,  # the corpus' _ids are int32 too
                "oid": ObjectId(f"{i:024x}"),
                "name": f'customer-{i} "quoted" back\\slash \x7f é 名 \u2028',
                'we"ird\\name': i % 3 == 0,
                "n": i,
                "big": Int64(i * 1_000_003),
                "price": [1.5, float("nan"), float("inf"), -0.0][i % 4],
                "when": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i),
                "flag": i % 2 == 0,
                "data": bytes([i % 256, 0, 1]),
                "blob": Binary(bytes([i % 256]) * (i % 5), 0x80 + i % 2),  # empty ones too
                "tags": ["new", "vip", f"t{i}"][: i % 4],  # empty arrays too
                "addr": {"city": "Lisbon", "zip": None if i % 3 else f"{i:05d}", "geo": {"lat": 1.0 * i}},
                "orders": [{"id": i, "items": [{"sku": "a", "qty": 2}]}] if i % 5 else None,
                "grid": [[1, 2], [], None, [i]],
                **({"sometimes": "here"} if i % 7 == 0 else {}),
            }
        )
        for i in range(start, start + count)
    ]


# Each trap in fields of its own, so the clean documents stay fast; then traps in the clean
# documents' own fields, which send every document holding such a field to the lossless path.
TRAPS = [
    {"nan": float("nan")},
    {"nan": 2.5},
    {"over_2_53": Int64(2**53 + 1)},
    {"over_2_53": 0.5},  # a double next to an int64: no double column may take 2^53 + 1
    {"int_and_bool": 1},
    {"int_and_bool": True},
    {"double_and_bool": 1.0},
    {"double_and_bool": False},
    {"int32_and_int64": 1},
    {"int32_and_int64": Int64(2**62)},
    {"scalar_and_doc": {"a": 1}},
    {"scalar_and_doc": 5},
    {"scalar_and_array": [1, 2]},
    {"scalar_and_array": "x"},
    {"null_missing_empty": None},
    {"null_missing_empty": {}},
    {"null_missing_empty": {"x": 1}},
    {"mixed_elements": [1, "a", None, {"q": 1}, [2], True]},
    {"nested_mixed": {"a": [1, 2.5]}},
    {"decimal": Decimal128("1.10")},
    {"x" * 65: "a field name past the fast path's 64 bytes"},
    {"escapes": 'a "quoted" \\ back\\slash, a\ttab, a\x01 control, é, \u2028'},
    {"only_null": None},
    {"only_empty_arrays": []},
    {"doc_of_nulls": {"x": None}},
]
TRAPS_IN_CLEAN_FIELDS = [{"price": 3}, {"addr": "not a document"}, {"tags": "not an array"}]


def _traps_in_clean_fields() -> list[bytes]:
    return [bson.encode({"_id": 3_000 + i, **trap}) for i, trap in enumerate(TRAPS_IN_CLEAN_FIELDS)]


def _itself(document: dict) -> dict:
    return document


def _rows(raws: list[bytes]) -> pa.BinaryArray:
    return pa.array(raws, pa.binary())


def _decoded(raws: list[bytes]) -> list[dict]:
    return [bson.decode(raw, extjson.READ_OPTIONS) for raw in raws]


def _batch(layout: TableLayout, raws: list[bytes], fast: bool) -> tuple[TableLayout, pa.RecordBatch, object]:
    decoded = _decoded(raws)
    if fast:
        values = split_documents(layout.stored_fields, _rows(raws), decoded, _itself)
    else:
        values = FieldValues(decoded)
    layout = layout.evolved(layout.survey(values))
    rows = pa.array(range(len(raws)), pa.int64())
    return layout, layout.record_batch({"__row": rows}, values), values


def _corpus() -> list[bytes]:
    corpus = [bytes(document.raw) for document in documents(CASES + INVALID_UTF8_CASES, 1)]
    return corpus + _clean(0, 40) + [bson.encode({"_id": 2_000 + i, **trap}) for i, trap in enumerate(TRAPS)]


def _same(left: pa.RecordBatch, right: pa.RecordBatch) -> None:
    assert left.schema.equals(right.schema, check_metadata=True), (left.schema, right.schema)
    for name in left.schema.names:  # repr: NaN equals NaN, -0.0 differs from 0.0
        assert repr(left.column(name).to_pylist()) == repr(right.column(name).to_pylist()), name


def test_the_fast_path_gives_the_lossless_paths_table_and_takes_the_documents_it_holds():
    corpus = _corpus()
    layout = TableLayout(METADATA)
    fast_layout, fast, values = _batch(layout, corpus, fast=True)
    lossless_layout, lossless, _ = _batch(layout, corpus, fast=False)
    _same(fast, lossless)
    # __doc: the fast rows' text rendered in bulk from their bytes is extjson.from_bson's, and the
    # lossless rows' is theirs (binaries and control characters included: no fast row is left to it)
    texts = values.ejson(lambda row: None if row in taken_rows(values) else extjson.from_bson(corpus[row]))
    assert texts.to_pylist() == [extjson.from_bson(raw) for raw in corpus]
    clean = set(range(len(documents(CASES + INVALID_UTF8_CASES, 1)), len(corpus) - len(TRAPS)))
    taken = set(values.fast_rows.tolist())
    assert clean <= taken
    first_trap = len(corpus) - len(TRAPS)
    fast_traps = {TRAPS.index(trap) for trap in TRAPS if first_trap + TRAPS.index(trap) in taken}
    # NaN stays NaN, int32 and int64 are both long, a string is a string, and nulls, [] and
    # {"x": null} have no column:
    # all held exactly; every other trap's value would be coerced, nulled or is a fallback
    assert fast_traps == {0, 1, 8, 9, 14, 21, 22, 23, 24}
    # a later batch against the evolved layout, with traps in the established columns' fields
    later = _clean(100, 20) + _traps_in_clean_fields()
    _, fast_later, later_values = _batch(fast_layout, later, fast=True)
    _, lossless_later, _ = _batch(lossless_layout, later, fast=False)
    _same(fast_later, lossless_later)
    # each trap conflicts with its column: that document alone takes the lossless path
    assert set(later_values.fast_rows.tolist()) == set(range(20))


def test_traps_in_a_first_batchs_fields_send_every_document_holding_them_down_the_lossless_path():
    raws = _clean(0, 10) + _traps_in_clean_fields()
    _, fast, values = _batch(TableLayout(METADATA), raws, fast=True)
    _, lossless, _ = _batch(TableLayout(METADATA), raws, fast=False)
    _same(fast, lossless)
    assert fast.schema.field("price").type == pa.string()  # long next to double: a fallback column
    assert len(values.fast_rows) == 0


def test_every_typed_column_holds_the_documents_value_or_its_fallback_does():
    corpus = _corpus()
    layout, batch, _ = _batch(TableLayout(METADATA), corpus, fast=True)
    rows = batch.to_pylist()
    for raw, row in zip(corpus, rows, strict=True):
        document = bson.decode(raw, extjson.READ_OPTIONS)  # the reference decoding of __doc_bson
        for name, value in document.items():
            column = layout.typed_columns.get(name)
            if column is None:  # only null-typed values have no column
                assert column_types.without_nulls(type_of(value)) == column_types.NULL, (name, value)
                continue
            cell = row[column.column]
            fallback = layout.fallback_columns.get(name)
            text = row[fallback.column] if fallback is not None else None
            if value is None:
                assert cell is None and text is None
            elif cell is None:
                assert text == extjson.encode_str(value), (name, value)
            else:
                assert text is None
                _assert_holds(cell, column.field_type, value, name)
        for column in layout.document_columns:  # a field the document lacks is null everywhere
            if column.field not in document:
                assert row[column.column] is None


def _assert_holds(cell: object, column: column_types.ColumnType, value: object, where: str) -> None:
    """``cell`` (a column's value, as pyarrow reads it) is exactly ``value`` (decoded from BSON)."""
    if value is None:
        assert cell is None, where
        return
    if column == column_types.FALLBACK:
        assert cell == extjson.encode_str(value), where
    elif column == column_types.LONG:
        assert type(value) in (int, Int64) and cell == value, where
    elif column == column_types.DOUBLE:
        assert type(value) is float, where
        assert struct.pack("<d", cell) == struct.pack("<d", value) or math.isnan(cell) and math.isnan(value)
    elif column == column_types.BOOL:
        assert type(value) is bool and cell is value, where
    elif column == column_types.STRING:
        assert type(value) is str and cell == value, where
    elif column == column_types.OBJECT_ID:
        assert type(value) is ObjectId and cell == str(value), where
    elif column == column_types.DATE:
        assert cell == EPOCH + dt.timedelta(milliseconds=int(value)), where
    elif column == column_types.BINARY:
        assert isinstance(value, bytes) and cell == bytes(value), where
    elif column == column_types.DECIMAL:
        assert cell == str(value), where
    elif column[0] == column_types.STRUCT:
        assert isinstance(value, dict) and isinstance(cell, dict), where
        for name, field in column[1]:
            _assert_holds(cell[name], field, value.get(name), f"{where}.{name}")
    else:
        assert isinstance(value, list) and len(cell) == len(value), where
        for index, (inner, element) in enumerate(zip(cell, value, strict=True)):
            _assert_holds(inner, column[1], element, f"{where}[{index}]")


def test_an_int32_at_the_end_of_the_buffer_is_read_as_four_bytes():
    raws = [bson.encode({"a": 1.5, "n": Int64(2**40)}), bson.encode({"n": 7})]  # the int32 ends the buffer
    values = split_documents((), _rows(raws), _decoded(raws), _itself)
    assert values.arrow("n", column_types.LONG, pa.int64()).to_pylist() == [2**40, 7]


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1] + b"\x01",  # no terminator
        lambda raw: raw[:4] + b"\x63" + raw[5:],  # an unknown type
        lambda raw: struct.pack("<i", len(raw) + 9) + raw[4:],  # a length past the end
    ],
)
def test_damaged_bson_takes_the_lossless_path(damage):
    raws = _clean(0, 3)
    damaged = damage(raws[1])
    values = split_documents((), _rows([raws[0], damaged, raws[2]]), [{}, {}, {}], _itself)
    assert values.fast_rows.tolist() == [0, 2]


def taken_rows(values) -> set[int]:
    """The rows the fast path took (their texts are rendered in bulk, never one by one)."""
    return set(values.fast_rows.tolist())


def test_strings_to_escape_in_the_fast_texts_are_extjsons():
    """``__doc`` of strings with quotes and backslashes (escaped from the bytes), control characters
    (escaped by orjson, string by string), and none of them, in one field and in arrays, next to
    one another."""
    texts = ["plain", 'a "quoted" word', "back\\slash", "tab\tand\nnewline", "\x00", "é名 \u2028", "", '\\"']
    raws = [bson.encode({"_id": i, "s": text, "a": [text, "x"]}) for i, text in enumerate(texts)]
    raws += [bson.encode({"_id": 100, "s": "only plain"})]
    decoded = _decoded(raws)
    values = split_documents((), _rows(raws), decoded, _itself)
    assert len(values.fast_rows) == len(raws)
    rendered = values.ejson(lambda row: None)  # every row is fast: none is rendered one by one
    assert rendered.to_pylist() == [extjson.from_bson(raw) for raw in raws]
    assert rendered.to_pylist() == [extjson.encode_str(document) for document in decoded]
