"""The changes table's event-flattening options (Debezium ExtractNewDocumentState's), no Spark.

Golden tests reproduce the seed's examples (array encoding, nested structure flattening,
``$unset`` handling); the rest cover each option, the YAML keys and the Spark job's arguments.
"""

from __future__ import annotations

import bson
import pyarrow as pa
import pytest
import yaml
from bson import Int64, ObjectId
from bson.datetime_ms import DatetimeMS
from cdc_support import spark_job

from mongo_cdc import extjson, lake
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc.transform.arrow_columns import arrow_type
from mongo_cdc.transform.column_survey import type_of
from mongo_cdc.transform.column_types import BOOL, FALLBACK, INT, LONG, STRING, struct_type
from mongo_cdc.transform.flatten import change_row, changes_table_rows, encode_document
from mongo_cdc.transform.flatten_options import EVENT_FIELDS, FIXED_COLUMNS, FlatteningOptions
from mongo_cdc.transform.raw_events import ChangeEvent
from mongo_cdc.transform.table_layout import TableLayout, documents_to_batch

DOCUMENT_ENCODING = FlatteningOptions(array_encoding="document")
FLATTENED = FlatteningOptions(flatten_struct=True)
SOURCE = {
    "version": "mongo-cdc-0.1.0",
    "connector": "mongodb",
    "name": "shop",
    "ts_ms": 1_700_000_000_000,
    "snapshot": False,
    "db": "sales",
    "rs": "rs0",
    "collection": "orders",
    "ord": 3,
    "lsid": None,
    "txnNumber": None,
}


def decoded(document: dict) -> dict:
    return bson.decode(bson.encode(document), extjson.DECODE_OPTIONS)


def event(
    op: str | None,
    after: dict | None = None,
    update: dict | None = None,
    position=(7, "8207"),
    before: dict | None = None,
):
    """An event of document 1 (``after`` and ``before`` documents, encoded to BSON as the raw zone
    holds them)."""
    return ChangeEvent(
        document_id=1,
        document_id_json="1",
        op=op,
        ts_ms=1_700_000_000_123,
        after_bson=bson.encode(after) if after is not None else None,
        update_description=update,
        source=SOURCE,
        cluster_time=position[0],
        event_order=position[1],
        rs="rs0",
        before_bson=bson.encode(before) if before is not None else None,
    )


def removed(*fields: str) -> dict:
    return {"updatedFields": None, "removedFields": list(fields), "truncatedArrays": []}


def table_rows(events: list[ChangeEvent], options: FlatteningOptions) -> list[dict]:
    """The rows the transform writes for ``events``: each as {column: value}."""
    rows = [row for row in (change_row(e, options) for e in events) if row is not None]
    metadata = {
        name: pa.array([values[index] for values, _ in rows], type=arrow_type(column_type))
        for index, (name, column_type) in enumerate(options.metadata_columns)
    }
    layout = TableLayout(options.metadata_columns, reserved_names=["hour", "__raw_file"])
    _, batch = documents_to_batch(layout, metadata, [document for _, document in rows])
    return batch.to_pylist()


# -- golden: the seed's examples -----------------------------------------------------------

SEED_ARRAY_DOCUMENT = {"_id": 1, "a1": [{"a": 1, "b": "none"}, {"a": "c", "d": "something"}]}


def test_golden_document_encoding_of_a_heterogeneous_array():
    _, document = change_row(event("c", SEED_ARRAY_DOCUMENT), DOCUMENT_ENCODING)
    assert document == {
        "_id": 1,
        "a1": {"_0": {"a": 1, "b": "none"}, "_1": {"a": "c", "d": "something"}},
    }
    # Representable without fallback: each element keeps its own types...
    assert type_of(document) == struct_type(
        [
            ("_id", LONG),
            (
                "a1",
                struct_type(
                    [
                        ("_0", struct_type([("a", LONG), ("b", STRING)])),
                        ("_1", struct_type([("a", STRING), ("d", STRING)])),
                    ]
                ),
            ),
        ]
    )
    # ...where the default array encoding merges the elements and `a` falls back to EJSON text.
    _, as_array = change_row(event("c", SEED_ARRAY_DOCUMENT), FlatteningOptions())
    element_type = dict(type_of(as_array)[1])["a1"][1]
    assert dict(element_type[1])["a"] == FALLBACK


def test_golden_nested_structure_flattening():
    row = change_row(event("c", {"_id": 1, "a": {"b": 1, "c": "none"}, "d": 100}), FLATTENED)
    assert row[1] == {"_id": 1, "a_b": 1, "a_c": "none", "d": 100}


def test_golden_unset_with_full_documents_gives_the_removed_field_null():
    inserted = event("c", {"_id": 1, "a": "x"}, position=(1, "81"))
    unset = event("u", {"_id": 1}, removed("a"), position=(2, "82"))  # change_streams_update_full
    rows = table_rows([inserted, unset], FlatteningOptions())
    assert {key: rows[1][key] for key in ("_id", "a")} == {"_id": 1, "a": None}


def test_golden_unset_without_full_documents_gives_the_removed_field_null():
    unset = event("u", update=removed("a"), position=(2, "82"))  # change_streams
    # The seed's message is {"a": null}; a table row also keeps the key, `_id`.
    assert change_row(unset, FlatteningOptions())[1] == {"_id": 1, "a": None}
    inserted = event("c", {"_id": 1, "a": "x"}, position=(1, "81"))
    rows = table_rows([inserted, unset], FlatteningOptions())
    assert {key: rows[1][key] for key in ("_id", "a")} == {"_id": 1, "a": None}
    # a field only ever null has no column yet (mongo_cdc.transform.column_types): it reads as null too
    [row] = table_rows([unset], FlatteningOptions())
    assert row["_id"] == 1 and row.get("a") is None


# -- array.encoding ------------------------------------------------------------------------


def test_document_encoding_reaches_nested_arrays_and_documents_whatever_their_field_names():
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    document = {"_id": oid, "m": [[1, "x"], []], "n": {"l": [Int64(2)]}, "w": {"$oid": [1]}}
    encoded = encode_document(decoded(document), DOCUMENT_ENCODING)
    assert encoded == {
        "_id": oid,
        "m": {"_0": {"_0": 1, "_1": "x"}, "_1": None},  # an empty array has no struct to be
        "n": {"l": {"_0": Int64(2)}},
        "w": {"$oid": {"_0": 1}},  # a document with a field named $oid, not an ObjectId
    }
    assert type(encoded["n"]["l"]["_0"]) is Int64


def test_array_encoding_keeps_arrays_by_default():
    assert encode_document({"_id": 1, "l": [1, 2]}, FlatteningOptions()) == {"_id": 1, "l": [1, 2]}


# -- flatten.struct ------------------------------------------------------------------------


def test_flatten_uses_the_delimiter_at_every_level_and_keeps_arrays_and_values_whole():
    options = FlatteningOptions(flatten_struct=True, flatten_struct_delimiter=".")
    document = {
        "_id": {"k": 1},
        "a": {"b": {"c": 1}, "when": DatetimeMS(0), "empty": {}, "w": {"$numberLong": "5"}},
        "list": [{"x": 1}],
    }
    assert encode_document(decoded(document), options) == {
        "_id.k": 1,
        "a.b.c": 1,
        "a.when": DatetimeMS(0),
        "a.empty": {},
        "a.w.$numberLong": "5",
        "list": [{"x": 1}],
    }


def test_flatten_after_document_encoding_names_array_elements_by_index():
    options = FlatteningOptions(array_encoding="document", flatten_struct=True)
    row = change_row(event("c", SEED_ARRAY_DOCUMENT), options)
    assert row[1] == {"_id": 1, "a1__0_a": 1, "a1__0_b": "none", "a1__1_a": "c", "a1__1_d": "something"}


def test_flatten_keeps_both_values_when_two_paths_give_one_name():
    assert encode_document({"a": {"b": 1}, "a_b": 2}, FLATTENED) == {"a_b": 1, "_a_b": 2}


def test_flatten_of_an_update_without_after_flattens_the_updated_paths():
    update = {"updatedFields": bson.encode({"a.b": 5}), "removedFields": ["c.d"], "truncatedArrays": []}
    assert change_row(event("u", update=update), FLATTENED)[1] == {"_id": 1, "a_b": 5, "c_d": None}


# -- delete.tombstone.handling.mode --------------------------------------------------------

DELETE, TOMBSTONE = event("d"), event(None)


@pytest.mark.parametrize(
    ("mode", "delete_row", "tombstone_row"),
    [
        ("rewrite", "rewritten", None),
        ("rewrite-with-tombstone", "rewritten", "tombstone"),
        ("tombstone", "tombstone", None),
        ("drop", None, None),
    ],
)
def test_delete_tombstone_handling_modes(mode, delete_row, tombstone_row):
    options = FlatteningOptions(delete_tombstone_handling_mode=mode)
    expected = {
        None: None,
        "rewritten": (("d", SOURCE["ts_ms"], True, 7, "8207"), {"_id": 1}),
        "tombstone": ((None, None, True, 7, "8207"), {"_id": 1}),  # a key without a value
    }
    assert change_row(DELETE, options) == expected[delete_row]
    assert change_row(TOMBSTONE, options) == expected[tombstone_row]
    assert change_row(event("c", {"_id": 1}), options)[0][2] is False


# Debezium's ExtractNewDocumentStateTestIT.shouldGenerateRecordForDeleteEventsDeleteHandlingRewrite
# (DBZ-6725): under a pre-image capture mode, the raw delete event's before holds the document
PRE_IMAGE = {"_id": 1, "dataStr": "Hello", "nested": {"a": [1, 2]}}


@pytest.mark.parametrize(
    ("mode", "delete_row"),
    [
        ("rewrite", (("d", SOURCE["ts_ms"], True, 7, "8207"), PRE_IMAGE)),
        ("rewrite-with-tombstone", (("d", SOURCE["ts_ms"], True, 7, "8207"), PRE_IMAGE)),
        ("tombstone", ((None, None, True, 7, "8207"), {"_id": 1})),  # still a key without a value
        ("drop", None),
    ],
)
def test_a_rewritten_delete_row_holds_the_before_image(mode, delete_row):
    options = FlatteningOptions(delete_tombstone_handling_mode=mode)
    assert change_row(event("d", before=PRE_IMAGE), options) == delete_row


def test_a_delete_row_has_the_before_images_columns_encoded_per_the_options():
    [row] = table_rows([event("d", before=PRE_IMAGE)], FlatteningOptions())
    assert (row["_id"], row["dataStr"], row["nested"], row["__deleted"]) == (1, "Hello", {"a": [1, 2]}, True)
    options = FlatteningOptions(array_encoding="document", flatten_struct=True)
    _, document = change_row(event("d", before=PRE_IMAGE), options)
    assert document == {"_id": 1, "dataStr": "Hello", "nested_a__0": 1, "nested_a__1": 2}


def test_change_rows_column_wise_give_the_before_image_decoded_or_not():
    """The Spark job's path (``changes_table_rows``): a delete's before-image decoded by the caller, or
    read from the raw row where the caller decoded none; a delete without one keeps ``_id`` only."""
    raw = rows_to_table(
        [
            {
                "key": extjson.document_key(document_id),
                "op": op,
                "before": bson.encode(before) if before is not None else None,
                "source": SOURCE,
                "cluster_time": 7,
                "event_order": order,
            }
            for document_id, op, before, order in [
                (1, "d", PRE_IMAGE, "8207"),
                (1, None, None, "8207"),  # its tombstone
                (2, "d", None, "8208"),  # a delete without a pre-image
            ]
        ],
        seq=1,
    )
    options = FlatteningOptions(delete_tombstone_handling_mode="rewrite-with-tombstone")
    expected = [PRE_IMAGE, {"_id": 1}, {"_id": 2}]
    for given in ([decoded(PRE_IMAGE), None, None], [None, None, None]):
        indices, metadata, documents = changes_table_rows(raw, given, options)
        assert indices.to_pylist() == [0, 1, 2] and documents == expected
        assert metadata["__deleted"].to_pylist() == [True, True, True]
        assert metadata["__op"].to_pylist() == ["d", None, "d"]


# -- add.fields / add.fields.prefix --------------------------------------------------------


def test_add_fields_resolve_like_debezium_with_renames_and_prefix():
    options = FlatteningOptions(
        add_fields=("op", "ts_ms", "rs", "source.collection", "source.ts_ms:EVENT_TIMESTAMP"),
        add_fields_prefix="meta_",
    )
    added = ["meta_op", "meta_ts_ms", "meta_rs", "meta_source_collection", "meta_EVENT_TIMESTAMP"]
    assert [name for name, _ in options.metadata_columns] == added + [name for name, _ in FIXED_COLUMNS]
    metadata, _ = change_row(event("u", {"_id": 1}), options)
    assert metadata == ("u", 1_700_000_000_123, "rs0", "orders", 1_700_000_000_000, False, 7, "8207")


def test_default_add_fields_are_the_tables_historic_op_and_source_ts_columns():
    assert FlatteningOptions().metadata_columns == (
        ("__op", STRING),
        ("__source_ts_ms", LONG),
        *FIXED_COLUMNS,
    )
    assert FlatteningOptions(add_fields=()).metadata_columns == FIXED_COLUMNS


def test_every_addable_field_is_typed_as_in_the_raw_events():
    arrow_types = {
        pa.string(): STRING,
        pa.int64(): LONG,
        pa.int32(): INT,
        pa.bool_(): BOOL,
    }
    raw = {field.name: arrow_types[field.type] for field in lake.RAW_SCHEMA if field.name in ("op", "ts_ms")}
    raw.update({f"source.{f.name}": arrow_types[f.type] for f in lake.RAW_SCHEMA.field("source").type})
    assert EVENT_FIELDS == raw


def test_a_document_field_named_like_an_added_column_is_renamed_not_lost():
    [row] = table_rows([event("c", {"_id": 1, "__op": "mine"})], FlatteningOptions())
    assert (row["__op"], row["___op"]) == ("c", "mine")


# -- the YAML keys -------------------------------------------------------------------------


def load(tmp_path, **keys):
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump({"topic.prefix": "shop", **keys}))
    return load_source(str(path))


def test_yaml_keys_set_the_options(tmp_path):
    config = load(
        tmp_path,
        **{
            "array.encoding": "document",
            "flatten.struct": True,
            "flatten.struct.delimiter": "__",
            "delete.tombstone.handling.mode": "rewrite-with-tombstone",
            "add.fields": "op, source.rs:shard",
            "add.fields.prefix": "",
        },
    )
    assert config.flattening == FlatteningOptions(
        array_encoding="document",
        flatten_struct=True,
        flatten_struct_delimiter="__",
        delete_tombstone_handling_mode="rewrite-with-tombstone",
        add_fields=("op", "source.rs:shard"),
        add_fields_prefix="",
    )
    assert load(tmp_path, **{"add.fields": ["op", "rs"]}).add_fields == ("op", "rs")
    assert load(tmp_path, **{"add.fields": []}).flattening.metadata_columns == FIXED_COLUMNS
    assert load(tmp_path).flattening == FlatteningOptions()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"array.encoding": "list"}, "key 'array.encoding' is 'list'; allowed values: array, document"),
        (
            {"delete.tombstone.handling.mode": "none"},
            "key 'delete.tombstone.handling.mode' is 'none'; allowed values: drop, tombstone, rewrite, "
            "rewrite-with-tombstone",
        ),
        ({"flatten.struct": "yes"}, "key 'flatten.struct' must be true or false"),
        ({"flatten.struct.delimiter": ""}, "key 'flatten.struct.delimiter' must be a non-empty string"),
        ({"add.fields.prefix": 5}, "key 'add.fields.prefix' must be a string"),
        (
            {"add.fields": "op,source.shard"},
            "key 'add.fields' has 'source.shard'; allowed: op, ts_ms, source.<field> or <field> for "
            "the source fields version, connector, name, ts_ms, snapshot, db, rs, collection, ord, lsid, "
            "txnNumber, sequence, ts_us, ts_ns, wallTime, each optionally followed by ':<new name>'",
        ),
        ({"add.fields": "op:"}, "key 'add.fields' has 'op:'"),
        ({"add.fields": ["op", 3]}, "key 'add.fields' must be a list of field names"),
        ({"add.fields": "op,op"}, "key 'add.fields' gives column '__op'"),
        ({"add.fields": "op:deleted"}, "key 'add.fields' gives column '__deleted'"),
        ({"add.fields": "op:hour", "add.fields.prefix": ""}, "key 'add.fields' gives column 'hour'"),
    ],
)
def test_bad_values_are_refused_naming_file_key_and_allowed_values(tmp_path, keys, message):
    with pytest.raises(SourceConfigError) as error:
        load(tmp_path, **keys)
    assert str(error.value).startswith(f"{tmp_path / 'orders.yaml'}: ") and message in str(error.value)


# -- the Spark job's arguments -------------------------------------------------------------


def job_options(tmp_path, *arguments: str) -> FlatteningOptions:
    base = ["--lake-root", str(tmp_path), "--topic-prefix", "shop"]
    return spark_job().parse_args([*base, *arguments]).flattening


def test_the_job_reads_back_what_plan_transform_passes(tmp_path):
    options = FlatteningOptions(
        array_encoding="document",
        flatten_struct=True,
        flatten_struct_delimiter="-",
        delete_tombstone_handling_mode="drop",
        add_fields=("op", "source.ts_ms:at"),
        add_fields_prefix="--",
    )
    assert job_options(tmp_path, *options.spark_arguments()) == options
    assert job_options(tmp_path, *FlatteningOptions().spark_arguments()) == FlatteningOptions()
    assert job_options(tmp_path) == FlatteningOptions()  # an invocation without the options


@pytest.mark.parametrize(
    ("flattening", "message"),
    [
        ('{"add.fields": ["op", "bogus"]}', "key 'add.fields' has 'bogus'"),
        ('{"flatten.struct": "true"}', "key 'flatten.struct' has 'true' of the wrong type"),
        ('{"array.encoding": "list"}', "key 'array.encoding' is 'list'; allowed values: array, document"),
        ('{"flatten.structs": true}', "expected an object with some of the keys array.encoding, "),
        ("{not json", "--flattening: "),
    ],
)
def test_the_job_refuses_bad_options_with_exit_2(tmp_path, capsys, flattening, message):
    with pytest.raises(SystemExit) as exit_:
        job_options(tmp_path, "--flattening", flattening)
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and error.count("\n") == 1 and message in error
