"""Column types of BSON-decoded documents, schema evolution and record batches
(mongo_cdc.transform.column_types, column_survey, arrow_columns and table_layout): no Spark involved."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from functools import reduce

import bson
import pyarrow as pa
import pytest
from bson import Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS
from deltalake import DeltaTable, write_deltalake

from mongo_cdc import extjson
from mongo_cdc.transform.arrow_columns import arrow_field, fields_from_arrow
from mongo_cdc.transform.column_survey import BatchTypes, FieldValues, column_type, type_of
from mongo_cdc.transform.column_types import (
    ARRAY,
    BINARY,
    BOOL,
    DATE,
    DECIMAL,
    DOUBLE,
    FALLBACK,
    LONG,
    NULL,
    OBJECT_ID,
    STRING,
    STRUCT,
    ColumnType,
    merge_types,
    struct_type,
    without_nulls,
)
from mongo_cdc.transform.table_layout import FALLBACK_SUFFIX, TableLayout, documents_to_batch

OID = ObjectId("65a1b2c3d4e5f60718293a4b")
METADATA = (("__op", STRING), ("__cluster_time", LONG))


def decoded(value):
    """``value`` as the transform sees it: through BSON and back."""
    return bson.decode(bson.encode({"v": value}), extjson.DECODE_OPTIONS)["v"]


def struct(**fields) -> ColumnType:
    return struct_type(fields.items())


def batch_of(layout: TableLayout, documents: list[dict]) -> tuple[TableLayout, pa.RecordBatch]:
    metadata = {"__op": pa.array(["c"] * len(documents)), "__cluster_time": pa.array(range(len(documents)))}
    return documents_to_batch(layout, metadata, [decoded(document) for document in documents])


def columns_of(layout: TableLayout) -> dict[str, ColumnType]:
    return {column.column: column.field_type for column in layout.document_columns}


# -- types -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (OID, OBJECT_ID),
        (DatetimeMS(1_700_000_000_000), DATE),
        (Decimal128("1.10"), DECIMAL),
        (Binary(b"x", 4), BINARY),
        (b"x", BINARY),
        (7, LONG),  # int32 and int64 are both long
        (Int64(7), LONG),
        (1.0, DOUBLE),
        (float("-inf"), DOUBLE),
        (True, BOOL),
        ("s", STRING),
        (None, NULL),
        ({"b": 1, "_id": "x"}, (STRUCT, (("_id", STRING), ("b", LONG)))),
        ([1, Int64(2), None], (ARRAY, LONG)),
        ([], (ARRAY, NULL)),
        ({}, FALLBACK),
        (Regex("^a", "i"), FALLBACK),
        (Timestamp(1, 2), FALLBACK),
        (MinKey(), FALLBACK),
        (MaxKey(), FALLBACK),
        (Code("f()"), FALLBACK),
        (Code("f()", {"x": 1}), FALLBACK),
        (DBRef("c", 1), FALLBACK),
        # field names are names: no Extended JSON wrapper is taken for a type
        ({"$set": 1}, (STRUCT, (("$set", LONG),))),
        ({"$numberLong": "5"}, (STRUCT, (("$numberLong", STRING),))),
        ({"a": None}, (STRUCT, (("a", NULL),))),
    ],
)
def test_type_of_every_bson_type(value, expected):
    assert type_of(decoded(value)) == expected


def test_values_that_are_not_decoded_bson_are_refused():
    with pytest.raises(TypeError, match="no column type for datetime values; decode documents with"):
        type_of(dt.datetime(2024, 1, 1))


def test_dates_outside_years_1_to_9999_fall_back():
    assert type_of(DatetimeMS(253_402_300_799_999)) == DATE  # 9999-12-31T23:59:59.999
    assert type_of(DatetimeMS(253_402_300_800_000)) == FALLBACK
    assert type_of(DatetimeMS(-62_135_596_800_001)) == FALLBACK
    assert column_type([DatetimeMS(0), DatetimeMS(-62_135_596_800_001)]) == FALLBACK


@pytest.mark.parametrize(
    ("left", "right", "merged"),
    [
        (NULL, LONG, LONG),
        (DATE, NULL, DATE),
        (LONG, STRING, FALLBACK),
        (OBJECT_ID, STRING, FALLBACK),
        (LONG, DOUBLE, FALLBACK),
        (FALLBACK, NULL, FALLBACK),
        ((ARRAY, NULL), (ARRAY, LONG), (ARRAY, LONG)),
        ((ARRAY, LONG), (ARRAY, STRING), (ARRAY, FALLBACK)),
        ((ARRAY, LONG), LONG, FALLBACK),
        ((STRUCT, (("a", LONG),)), FALLBACK, FALLBACK),
    ],
)
def test_merge_rules(left, right, merged):
    assert merge_types(left, right) == merged
    assert merge_types(right, left) == merged


def test_struct_merge_unions_fields_whatever_the_order():
    first = type_of(decoded({"_id": 1, "z": {"p": 1}, "a": 1}))
    second = type_of(decoded({"_id": 2, "m": "x", "z": {"q": Int64(1)}}))
    merged = merge_types(first, second)
    assert merged == merge_types(second, first)
    assert merged == struct(_id=LONG, a=LONG, m=STRING, z=struct(p=LONG, q=LONG))


POOL = [
    None,
    1,
    Int64(2),
    2.5,
    "s",
    True,
    OID,
    DatetimeMS(5),
    DatetimeMS(253_402_300_800_000),
    Decimal128("1"),
    b"b",
    {},
    Regex("x"),
    [],
    [None],
    [1, "x"],
    [{"a": 1}],
    {"a": 1},
    {"a": "x", "b": [1]},
    {"a": {"c": None}},
    {"a": {"c": [DatetimeMS(1)]}},
    {"b": []},
]


def test_column_wise_inference_equals_merging_each_values_type():
    rnd = random.Random(7)
    for _ in range(300):
        values = [decoded(rnd.choice(POOL)) for _ in range(rnd.randint(1, 6))]
        assert column_type(values) == reduce(merge_types, map(type_of, values), NULL)


def test_without_nulls_drops_what_only_nulls_typed():
    column = struct(a=NULL, b=(ARRAY, NULL), c=struct(d=NULL), e=LONG)
    assert without_nulls(column) == (STRUCT, (("e", LONG),))
    assert without_nulls(struct(a=NULL)) == NULL
    assert without_nulls((ARRAY, (ARRAY, NULL))) == NULL


# -- Arrow metadata ----------------------------------------------------------------------------


def test_arrow_fields_carry_each_levels_logical_type():
    field = arrow_field("l", (ARRAY, struct(o=OBJECT_ID, d=DATE)))
    assert field.type == pa.list_(
        pa.field("element", pa.struct([("d", pa.timestamp("us", tz="UTC")), ("o", pa.string())]))
    )
    assert field.metadata == {b"mongo_cdc.type": b'["array","struct"]'}
    assert field.type.value_type.field("o").metadata == {b"mongo_cdc.type": b'"objectId"'}
    [read] = fields_from_arrow([field])
    assert read.field_type == read.column_type == (ARRAY, struct(o=OBJECT_ID, d=DATE))


def test_tables_not_written_by_mongo_cdc_are_refused():
    schema = pa.schema([("__op", pa.string()), ("name", pa.string())])
    with pytest.raises(
        ValueError, match="column 'name' has no mongo_cdc.type field metadata: this table was not"
    ):
        TableLayout.from_arrow(schema, METADATA[:1])
    bad = pa.schema([pa.field("n", pa.int64(), metadata={"mongo_cdc.type": '"string"'})])
    with pytest.raises(
        ValueError, match="column 'n': mongo_cdc.type 'string' does not describe its type int64"
    ):
        TableLayout.from_arrow(bad, ())


# -- record batches ----------------------------------------------------------------------------


def test_record_batch_converts_every_type_losslessly():
    document = {
        "_id": OID,
        "when": DatetimeMS(-1),
        "price": Decimal128("-0.10"),
        "raw": Binary(b"\x00\xff", 5),
        "big": Int64(-(2**62)),
        "small": 5,
        "nan": float("nan"),
        "inf": float("inf"),
        "nested": {"x": [1, None], "o": [OID], "d": {"w": DatetimeMS(0)}},
        "text": "plain",
        "regex": Regex("^a", "i"),
        "wrapper": {"$numberLong": "5"},
    }
    layout, batch = batch_of(TableLayout(METADATA), [document])
    [row] = batch.to_pylist()
    assert row["_id"] == str(OID)
    assert row["when"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc)
    assert row["price"] == "-0.10"
    assert row["raw"] == b"\x00\xff"
    assert row["big"] == -(2**62) and row["small"] == 5
    assert math.isnan(row["nan"]) and row["inf"] == math.inf
    assert row["nested"] == {
        "d": {"w": dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)},
        "o": [str(OID)],
        "x": [1, None],
    }
    assert row["text"] == "plain"
    assert json.loads(row["regex"]) == {"$regularExpression": {"pattern": "^a", "options": "i"}}
    assert row["wrapper"] == {"$numberLong": "5"}
    assert (row["__op"], row["__cluster_time"]) == ("c", 0)
    assert TableLayout.from_arrow(batch.schema, METADATA).document_columns == layout.document_columns


def test_two_tables_of_the_same_documents_share_their_survey_and_field_arrays():
    # a snapshot's state and change rows: the same documents in two layouts with other metadata
    values = FieldValues([decoded({"_id": OID, "n": 1}), decoded({"_id": OID, "n": 2})])
    state, changes = TableLayout(METADATA), TableLayout(METADATA[1:])
    assert state.survey(values) is changes.survey(values)
    state, changes = state.evolved(state.survey(values)), changes.evolved(changes.survey(values))
    in_state = state.record_batch({"__op": pa.array(["r", "r"]), "__cluster_time": pa.array([1, 2])}, values)
    in_changes = changes.record_batch({"__cluster_time": pa.array([1, 2])}, values)
    for field in ("_id", "n"):  # one array: the same memory
        addresses = [
            [b.address for b in rows.column(field).buffers() if b] for rows in (in_state, in_changes)
        ]
        assert addresses[0] == addresses[1], field
    assert in_changes.to_pylist() == [
        {"__cluster_time": 1, "_id": str(OID), "n": 1},
        {"__cluster_time": 2, "_id": str(OID), "n": 2},
    ]
    # a stored column the values conflict with: that table's own typed values, without the misfits
    stored = TableLayout(METADATA).evolved(BatchTypes(struct(n=STRING), frozenset()))
    fallback = stored.evolved(stored.survey(values))
    rows = fallback.record_batch({"__op": pa.array(["r", "r"]), "__cluster_time": pa.array([1, 2])}, values)
    assert rows.column("n").to_pylist() == [None, None]
    assert rows.column("n" + FALLBACK_SUFFIX).to_pylist() == ["1", "2"]


def test_missing_fields_are_null_and_unsurveyed_documents_are_refused():
    layout, batch = batch_of(
        TableLayout(METADATA), [{"_id": 1, "s": {"a": 1, "b": "x"}}, {"_id": 2, "s": {"b": "y"}}]
    )
    assert [row["s"] for row in batch.to_pylist()] == [{"a": 1, "b": "x"}, {"a": None, "b": "y"}]
    metadata = {"__op": pa.array(["c"]), "__cluster_time": pa.array([1])}
    with pytest.raises(ValueError, match="documents have a field 'new' this table layout has no column for"):
        layout.record_batch(metadata, [{"_id": 3, "new": 1}])
    with pytest.raises(ValueError, match="metadata column '__cluster_time' has 2 values for 1 documents"):
        layout.record_batch({**metadata, "__cluster_time": pa.array([1, 2])}, [{"_id": 3}])
    assert layout.record_batch(metadata, [{"_id": 3, "new": None}]).num_rows == 1  # no typed value: fine


# -- evolution ---------------------------------------------------------------------------------


def test_first_batch_conflicts_make_fallback_columns_and_null_only_fields_get_none():
    layout, batch = batch_of(
        TableLayout(METADATA),
        [
            {"_id": 1, "n": 1, "s": {"a": 1, "b": "x"}, "none": None, "empty": [], "deep": {"x": None}},
            {"_id": "two", "n": "1", "s": {"a": "1"}, "none": None, "empty": []},
        ],
    )
    assert columns_of(layout) == {
        "_id": FALLBACK,
        "n": FALLBACK,
        "s": struct(a=FALLBACK, b=STRING),
    }
    assert [(row["_id"], row["n"], row["s"]["a"]) for row in batch.to_pylist()] == [
        ("1", "1", "1"),
        ('"two"', '"1"', '"1"'),
    ]


def test_new_fields_add_columns_and_nested_fields_and_keep_the_established_order():
    first, _ = batch_of(TableLayout(METADATA), [{"_id": 1, "s": {"b": 1}, "l": [{"x": 1}], "e": []}])
    later, batch = batch_of(
        first, [{"_id": 2, "a": True, "s": {"a": "x", "b": 2}, "l": [{"y": 1.5}], "e": [1]}]
    )
    assert columns_of(later) == {
        "_id": LONG,
        "l": (ARRAY, (STRUCT, (("x", LONG), ("y", DOUBLE)))),
        "s": (STRUCT, (("b", LONG), ("a", STRING))),  # a new field is appended
        "a": BOOL,
        "e": (ARRAY, LONG),  # an array's element type, once a value shows it
    }
    assert [field.name for field in batch.schema] == ["__op", "__cluster_time", "_id", "l", "s", "a", "e"]
    assert batch.to_pylist()[0]["s"] == {"b": 2, "a": "x"}


def test_a_conflicting_value_goes_to_a_fallback_sibling_and_fitting_rows_stay_typed():
    first, _ = batch_of(TableLayout(METADATA), [{"_id": 1, "n": 1, "s": {"a": 1}}])
    later, batch = batch_of(
        first,
        [
            {"_id": 2, "n": "x", "s": {"a": 2}},
            {"_id": 3, "n": 3, "s": {"a": "deep", "new": 1}},
            {"_id": 4, "n": Int64(4), "s": None},
        ],
    )
    assert columns_of(later) == {
        "_id": LONG,
        "n": LONG,  # never retyped
        "s": (STRUCT, (("a", LONG), ("new", LONG))),
        "n" + FALLBACK_SUFFIX: FALLBACK,
        "s" + FALLBACK_SUFFIX: FALLBACK,
    }
    rows = [(row["n"], row["n__fallback"], row["s"], row["s__fallback"]) for row in batch.to_pylist()]
    assert rows == [
        (None, '"x"', {"a": 2, "new": None}, None),
        (3, None, None, '{"a":"deep","new":1}'),
        (4, None, None, None),
    ]
    # the sibling stays: a later batch reuses it, and its fitting values stay typed
    again, batch = batch_of(
        TableLayout.from_arrow(batch.schema, METADATA), [{"_id": 5, "n": 1.5}, {"_id": 6, "n": 6}]
    )
    assert again.document_columns == later.document_columns
    assert [(row["n"], row["n__fallback"]) for row in batch.to_pylist()] == [(None, "1.5"), (6, None)]


def test_surveys_of_parts_merge_into_the_survey_of_the_whole():
    stored, _ = batch_of(TableLayout(METADATA), [{"_id": 1, "s": {"a": 1}, "l": [1]}])
    documents = [
        decoded(document)
        for document in [
            {"_id": 2, "s": {"b": "x"}, "new": []},
            {"_id": 3, "s": {"b": 1}, "l": ["x"]},
            {"_id": 4, "new": 5, "s": {"a": 1, "c": {"d": None}}},
            {"_id": 5, "s": {"c": {"d": 1}}},
        ]
    ]
    whole = stored.survey(documents)
    parts = [stored.survey(documents[:1]), stored.survey(documents[1:3]), stored.survey(documents[3:])]
    assert reduce(BatchTypes.merge, parts) == whole
    assert whole.conflicts == {"l"}
    layout = stored.evolved(whole)
    assert columns_of(layout)["new"] == FALLBACK  # [] and 5 within the batch: the first-batch rule
    assert columns_of(layout)["s"] == (
        STRUCT,
        (("a", LONG), ("b", FALLBACK), ("c", (STRUCT, (("d", LONG),)))),
    )


def test_new_names_never_take_established_metadata_or_sibling_names():
    first, _ = batch_of(
        TableLayout(METADATA, reserved_names=["hour"]), [{"_id": 1, "n": 1, "__op": "mine", "hour": 3}]
    )
    second, _ = batch_of(first, [{"_id": 2, "n": "x"}])
    third, batch = batch_of(second, [{"_id": 3, "n__fallback": "a field", "n": "y"}])
    names = {column.column: column.field for column in third.document_columns}
    assert names == {
        "_id": "_id",
        "___op": "__op",
        "_hour": "hour",
        "n": "n",
        "n__fallback": "n",  # the sibling came first
        "_n__fallback": "n__fallback",
    }
    [row] = batch.to_pylist()
    assert (row["n__fallback"], row["_n__fallback"]) == ('"y"', "a field")


def test_sanitized_names_stay_with_their_fields_across_batches():
    first, _ = batch_of(
        TableLayout(METADATA, sanitize_field_names=True), [{"_id": 1, "a-b": 1, "s": {"x.y": 1}}]
    )
    read = TableLayout.from_arrow(first.schema, METADATA, sanitize_field_names=True)
    later, batch = batch_of(read, [{"_id": 2, "a_b": 2, "a-b": 3, "s": {"x_y": "new", "x.y": 4}}])
    assert {column.column: column.field for column in later.document_columns} == {
        "_id": "_id",
        "a_b": "a-b",
        "_a_b": "a_b",
        "s": "s",
    }
    assert [field.name for field in batch.schema.field("s").type] == ["x_y", "_x_y"]
    [row] = batch.to_pylist()
    assert (row["a_b"], row["_a_b"], row["s"]) == (3, 2, {"x_y": 4, "_x_y": "new"})


def test_delta_keeps_the_metadata_and_merges_evolved_schemas(tmp_path):
    """delta-rs round trip: the table's schema reads back as the layout, and old rows read new
    columns (top-level and nested) as null."""
    path = str(tmp_path / "table")
    first, batch = batch_of(TableLayout(METADATA), [{"_id": OID, "s": {"a": 1}, "l": [{"d": DatetimeMS(0)}]}])
    write_deltalake(path, batch)
    stored = TableLayout.from_arrow(pa.schema(DeltaTable(path).schema().to_arrow()), METADATA)
    assert stored.document_columns == first.document_columns
    later, batch = batch_of(
        stored, [{"_id": 1, "s": {"a": 2, "b": "x"}, "l": [{"e": Decimal128("1")}], "new": True}]
    )
    write_deltalake(path, batch, mode="append", schema_mode="merge")
    table = DeltaTable(path)
    assert (
        TableLayout.from_arrow(pa.schema(table.schema().to_arrow()), METADATA).document_columns
        == later.document_columns
    )
    by_id = {row["_id"] or row["_id__fallback"]: row for row in table.to_pyarrow_table().to_pylist()}
    assert by_id[str(OID)]["s"] == {"a": 1, "b": None} and by_id[str(OID)]["new"] is None
    assert by_id["1"]["s"] == {"a": 2, "b": "x"} and by_id["1"]["l"] == [{"d": None, "e": "1"}]
