"""Pure-Python parts of the transform (mongo_cdc.transform): no Spark involved."""

from __future__ import annotations

import datetime as dt
import json
import math
import os

import bson
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS

from mongo_cdc import extjson, lake
from mongo_cdc.transform import ejson_types as types
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    apply_update,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_document, change_row
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import (
    ChangeEvent,
    advance_watermarks,
    committed_files,
    files_after,
    read_raw_file,
)
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.versioned_table import METADATA_FILE, VersionedTable, write_metadata

OID = ObjectId("65a1b2c3d4e5f60718293a4b")


def ejson(value: dict) -> str:
    return extjson.encode_str(bson.decode(bson.encode(value), extjson.DECODE_OPTIONS))


def parsed(value):
    """``value`` as the transform sees it: BSON -> mongo-cdc EJSON -> orjson."""
    return orjson.loads(ejson({"v": value}))["v"]


def event(op, position, after=None, update=None, document_id=1, rs="rs0") -> ChangeEvent:
    cluster_time, event_order = position
    return ChangeEvent(
        document_id=json.dumps(document_id),
        op=op,
        ts_ms=1240,
        after=ejson(after) if after is not None else None,
        update_description=update,
        source={"ts_ms": 1234, "rs": rs},
        cluster_time=cluster_time,
        event_order=event_order,
        rs=rs,
    )


def update(updated=None, removed=None, truncated=None) -> dict:
    return {
        "updatedFields": ejson(updated or {}),
        "removedFields": removed or [],
        "truncatedArrays": truncated or [],
    }


# -- ejson_types -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (OID, types.OBJECT_ID),
        (DatetimeMS(1_700_000_000_000), types.DATE),
        (Decimal128("1.10"), types.DECIMAL),
        (Binary(b"x", 4), types.BINARY),
        (7, types.INT),
        (Int64(7), types.LONG),
        (1.0, types.DOUBLE),
        (float("-inf"), types.DOUBLE),
        (True, types.BOOL),
        ("s", types.STRING),
        (None, types.NULL),
        ({"b": 1, "_id": "x"}, (types.STRUCT, (("_id", types.STRING), ("b", types.INT)))),
        ([1, Int64(2), None], (types.ARRAY, types.LONG)),
        ([], (types.ARRAY, types.NULL)),
        ({}, types.FALLBACK),
        (Regex("^a", "i"), types.FALLBACK),
        (Timestamp(1, 2), types.FALLBACK),
        (MinKey(), types.FALLBACK),
        (MaxKey(), types.FALLBACK),
        (Code("f()"), types.FALLBACK),
        (bson.DBRef("c", 1), types.FALLBACK),
        ({"$set": 1}, types.FALLBACK),  # a $-prefixed field name is kept as EJSON text too
    ],
)
def test_type_of_every_bson_type(value, expected):
    assert types.type_of(parsed(value)) == expected


def test_dates_outside_sparks_years_fall_back():
    assert types.type_of(parsed(DatetimeMS(253_402_300_799_999))) == types.DATE  # 9999-12-31T23:59:59.999
    assert types.type_of(parsed(DatetimeMS(253_402_300_800_000))) == types.FALLBACK
    assert types.type_of(parsed(DatetimeMS(-62_135_596_800_001))) == types.FALLBACK


@pytest.mark.parametrize(
    ("left", "right", "merged"),
    [
        (types.NULL, types.INT, types.INT),
        (types.DATE, types.NULL, types.DATE),
        (types.INT, types.LONG, types.LONG),
        (types.INT, types.STRING, types.FALLBACK),
        (types.OBJECT_ID, types.STRING, types.FALLBACK),
        (types.LONG, types.DOUBLE, types.FALLBACK),
        (types.INT, types.DOUBLE, types.FALLBACK),
        (types.FALLBACK, types.NULL, types.FALLBACK),
        ((types.ARRAY, types.INT), (types.ARRAY, types.LONG), (types.ARRAY, types.LONG)),
        ((types.ARRAY, types.INT), (types.ARRAY, types.STRING), (types.ARRAY, types.FALLBACK)),
        ((types.ARRAY, types.INT), types.INT, types.FALLBACK),
        ((types.STRUCT, (("a", types.INT),)), types.FALLBACK, types.FALLBACK),
    ],
)
def test_merge_rules(left, right, merged):
    assert types.merge_types(left, right) == merged
    assert types.merge_types(right, left) == merged


def test_struct_merge_unions_fields_whatever_the_order():
    first = types.type_of_document(parsed({"_id": 1, "z": {"p": 1}, "a": 1}))
    second = types.type_of_document(parsed({"_id": 2, "m": "x", "z": {"q": Int64(1)}}))
    merged = types.merge_types(first, second)
    assert merged == types.merge_types(second, first)
    assert merged == (
        types.STRUCT,
        (
            ("_id", types.INT),
            ("a", types.INT),
            ("m", types.STRING),
            ("z", (types.STRUCT, (("p", types.INT), ("q", types.LONG)))),
        ),
    )


def test_type_json_round_trip():
    column_type = types.type_of_document(parsed({"_id": OID, "a": [{"b": [1]}], "c": Regex("x")}))
    stored = json.loads(json.dumps(types.type_to_json(column_type)))
    assert types.type_from_json(stored) == column_type


def test_to_column_value_converts_losslessly():
    document = parsed(
        {
            "_id": OID,
            "when": DatetimeMS(-1),
            "price": Decimal128("-0.10"),
            "raw": Binary(b"\x00\xff", 5),
            "big": Int64(-(2**62)),
            "small": 5,
            "nan": float("nan"),
            "inf": float("inf"),
            "nested": {"x": [1, None]},
            "text": "plain",
            "regex": Regex("^a", "i"),
        }
    )
    column_type = types.type_of_document(document)
    column_type = types.merge_types(column_type, (types.STRUCT, (("small", types.LONG), ("text", types.INT))))
    names = [name for name, _ in column_type[1]]
    values = dict(zip(names, types.to_column_value(document, column_type), strict=True))
    assert values["_id"] == str(OID)
    assert values["when"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc)
    assert values["price"] == "-0.10"
    assert values["raw"] == b"\x00\xff"
    assert values["big"] == -(2**62) and values["small"] == 5
    assert math.isnan(values["nan"]) and values["inf"] == math.inf
    assert values["nested"] == ([1, None],)
    assert values["text"] == '"plain"'  # string vs int: fallback, the string quoted
    assert orjson.loads(values["regex"]) == {"$regularExpression": {"pattern": "^a", "options": "i"}}


def test_to_column_value_fills_missing_struct_fields_with_null():
    struct = (types.STRUCT, (("a", types.INT), ("b", types.STRING)))
    assert types.to_column_value({"b": "x"}, struct) == (None, "x")
    assert types.to_column_value(None, struct) is None


# -- document_state ----------------------------------------------------------------------


def test_apply_update_removes_truncates_then_sets():
    document = parsed({"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3, 4], "gone": 1, "list": [{"x": 1}]})
    apply_update(
        document,
        update(
            updated={"a.b": 10, "arr.1": "two", "list.0.y": 2, "new.deep": True, "pad.2": 1},
            removed=["gone", "a.c", "list.0.x"],
            truncated=[{"field": "arr", "newSize": 2}],
        ),
    )
    assert document == {
        "_id": 1,
        "a": {"b": 10},
        "arr": [1, "two"],
        "list": [{"y": 2}],
        "new": {"deep": True},
        "pad": {"2": 1},  # a missing parent becomes a document, as with MongoDB's $set
    }


def test_apply_update_indexes_arrays_past_their_end_and_unsets_elements_to_null():
    document = {"_id": 1, "arr": [1], "other": [1, 2]}
    apply_update(document, update(updated={"arr.3": 4}, removed=["other.0"]))
    assert document == {"_id": 1, "arr": [1, None, None, 4], "other": [None, 2]}


def test_fold_applies_events_in_position_order():
    version = fold_events(
        "1",
        None,
        [
            event("u", (5, "8205"), update=update(updated={"n": Int64(2)}, removed=["tmp"])),
            event("r", (5, ""), after={"_id": 1, "n": 1, "tmp": "x"}),  # a snapshot read sorts first
            event("u", (6, "8301"), update=update(updated={"m": 1})),
        ],
    )
    assert version == DocumentVersion("1", '{"_id":1,"n":{"$numberLong":"2"},"m":1}', 6, "8301", "rs0")


def test_fold_skips_events_at_or_before_the_stored_position():
    stored = DocumentVersion("1", ejson({"_id": 1, "v": "new"}), 9, "8900", "rs0")
    replayed = [
        event("c", (3, "8300"), after={"_id": 1, "v": "old"}),
        event("u", (9, "8900"), {"_id": 1, "v": "x"}),
    ]
    assert fold_events("1", stored, replayed) == stored


def test_fold_keeps_deletes_so_replayed_inserts_do_not_resurrect():
    deleted = fold_events("1", None, [event("c", (1, "81"), {"_id": 1}), event("d", (2, "82"))])
    assert deleted == DocumentVersion("1", None, 2, "82", "rs0")
    assert fold_events("1", deleted, [event("c", (1, "81"), {"_id": 1})]) == deleted
    reinserted = fold_events("1", deleted, [event("c", (3, "83"), {"_id": 1, "again": True})])
    assert orjson.loads(reinserted.document) == {"_id": 1, "again": True}


def test_fold_records_the_replica_set_of_the_last_applied_event():
    moved = fold_events(
        "1", None, [event("c", (1, "81"), {"_id": 1}), event("r", (5, ""), {"_id": 1}, rs="rs1")]
    )
    assert moved.rs == "rs1"
    stale = fold_events("1", moved, [event("u", (3, "83"), {"_id": 1, "old": True}, rs="rs0")])
    assert stale == moved


def snapshot(rs: str, cluster_time: int, seq: int = 7) -> lake.SnapshotManifest:
    return lake.SnapshotManifest(rs, seq, cluster_time, ("db.c",))


def test_reconcile_deletes_a_document_its_replica_sets_snapshot_did_not_read():
    live = DocumentVersion("1", ejson({"_id": 1}), 4, "8400", "rs0")
    assert reconcile_with_snapshots(live, [snapshot("rs0", 5), snapshot("rs0", 9)]) == DocumentVersion(
        "1", None, 9, "", "rs0"
    )


def test_reconcile_keeps_documents_read_or_written_since_and_other_replica_sets():
    read_by_it = DocumentVersion("1", ejson({"_id": 1}), 5, "", "rs0")
    written_since = DocumentVersion("1", ejson({"_id": 1}), 5, "8501", "rs0")
    from_another_shard = DocumentVersion("1", ejson({"_id": 1}), 1, "8100", "rs1")
    of_unknown_origin = DocumentVersion("1", ejson({"_id": 1}), 1, "8100")  # an old state version
    already_deleted = DocumentVersion("1", None, 2, "8200", "rs0")
    for version in (read_by_it, written_since, from_another_shard, of_unknown_origin, already_deleted):
        assert reconcile_with_snapshots(version, [snapshot("rs0", 5)]) == version


def test_snapshot_manifests_round_trip_and_count_as_landed_batches(tmp_path):
    root = str(tmp_path)
    assert lake.list_snapshot_manifests(root, "p") == []
    manifest = lake.SnapshotManifest("rs0", 12, lake.pack_cluster_time(1_700_000_000, 2), ("db.a", "db.b.c"))
    path = lake.write_snapshot_manifest(root, "p", manifest)
    assert path == lake.snapshot_manifest_path(root, "p", "rs0", 12)
    assert lake.list_snapshot_manifests(root, "p") == [manifest]
    # no raw file at all (every copied collection was empty): batch numbers still go on after it
    assert lake.highest_raw_seq(root, "p", "rs0") == 12 and lake.highest_raw_seq(root, "p", "rs1") == 0
    assert lake.list_raw_collections(root, "p") == []


def test_fold_ignores_tombstones_and_updates_without_data():
    stored = DocumentVersion("1", ejson({"_id": 1}), 1, "81")
    assert fold_events("1", stored, [event(None, (2, "82")), event("u", (3, "83"))]) == stored
    assert fold_events("1", None, [event(None, (2, "82"))]) is None


def test_fold_of_an_update_without_previous_version_starts_from_the_id():
    version = fold_events(
        '{"$oid":"65a1b2c3d4e5f60718293a4b"}', None, [event("u", (1, "81"), update=update({"a.b": 1}))]
    )
    assert orjson.loads(version.document) == {"_id": {"$oid": str(OID)}, "a": {"b": 1}}


# -- flatten -----------------------------------------------------------------------------


def test_change_document_of_each_operation():
    assert change_document(event("c", (1, "81"), after={"_id": 1, "a": Int64(1)})) == {
        "_id": 1,
        "a": {"$numberLong": "1"},
    }
    partial = event("u", (2, "82"), update=update(updated={"a.b": 1, "c": "x"}, removed=["d", "e.f"]))
    assert change_document(partial) == {"_id": 1, "a": {"b": 1}, "c": "x", "d": None, "e": {"f": None}}
    assert change_document(event("d", (3, "83"))) == {"_id": 1}
    assert change_document(event(None, (3, "83"))) is None


def test_change_row_metadata_by_default_is_op_source_ts_and_marks_only_deletes():
    assert change_row(event("d", (3, "83")), FlatteningOptions()) == (("d", 1234, True, 3, "83"), {"_id": 1})
    assert change_row(event("u", (4, "84"), after={"_id": 1}), FlatteningOptions())[0][2] is False


# -- table_layout ------------------------------------------------------------------------


def test_layout_renames_document_fields_that_take_reserved_names():
    document = {"_id": 1, "__op": "mine", "___op": "also mine", "hour": 3}
    layout = TableLayout((("__op", types.STRING),), types.type_of_document(document), reserved_names=["hour"])
    names = [name for name, _ in layout.table_type[1]]
    assert names == ["__op", "_id", "___op", "____op", "_hour"]  # fields sort "___op" before "__op"
    assert layout.row(("u",), document) == ("u", 1, "also mine", "mine", 3)


# -- raw_events --------------------------------------------------------------------------


def raw(rs: str, seq: int) -> lake.RawFile:
    return lake.RawFile(f"/x/{rs}-{seq}", rs, seq, 0)


def test_raw_file_selection_by_committed_seq_and_watermarks():
    files = [raw("rs0", 1), raw("rs0", 2), raw("rs0", 3), raw("rs1", 1), raw("rs2", 1)]
    committed = committed_files(files, {"rs0": 2, "rs1": 5})
    assert committed == [raw("rs0", 1), raw("rs0", 2), raw("rs1", 1)]
    assert files_after(committed, {"rs0": 1}) == [raw("rs0", 2), raw("rs1", 1)]
    manifests = [snapshot("rs0", 1, seq=2), snapshot("rs0", 1, seq=3)]
    assert files_after(committed_files(manifests, {"rs0": 2}), {"rs0": 1}) == manifests[:1]
    assert advance_watermarks({"rs0": 4, "rs9": 1}, {"rs0": 2, "rs1": 5}) == {"rs0": 4, "rs1": 5, "rs9": 1}


def test_read_raw_file_gives_events_with_the_key_id(tmp_path):
    path = lake.raw_file_path(
        str(tmp_path), "p", "db", "c", lake.pack_cluster_time(1_700_000_000, 3), "rs0", 1, 0
    )
    os.makedirs(os.path.dirname(path))
    row = {
        "key": extjson.document_key(OID),
        "op": "c",
        "ts_ms": 98,
        "after": ejson({"_id": OID}),
        "source": {"ts_ms": 99},
        "cluster_time": 5,
        "event_order": "82",
    }
    pq.write_table(pa.Table.from_pylist([row], schema=lake.RAW_SCHEMA), path)
    [read] = read_raw_file(path)
    assert read.document_id == extjson.encode_str(OID)
    assert (read.op, read.ts_ms, read.source["ts_ms"]) == ("c", 98, 99)
    assert (read.position, read.rs) == ((5, "82"), "rs0")


# -- versioned_table ---------------------------------------------------------------------


def test_publish_repoints_atomically_and_keeps_two_versions(tmp_path):
    table = VersionedTable.of_collection(str(tmp_path), "state", "p", "db", "c")
    assert table.current_version() is None and table.read_metadata() is None
    published = []
    for number in range(1, 4):
        version = table.next_version_dir()
        assert version.endswith(f"v{number:06d}")
        os.makedirs(version)
        write_metadata(version, {"watermarks": {"rs0": number}})
        table.publish(version)
        published.append(version)
    crashed = table.next_version_dir()
    os.makedirs(crashed)  # a run died before publishing it
    version = table.next_version_dir()
    os.makedirs(version)
    table.publish(version)
    assert sorted(os.listdir(table.versions_dir)) == ["v000003", "v000005"]
    assert not os.path.isabs(os.readlink(table.public_path))
    assert table.current_version() == os.path.realpath(version)
    assert table.read_metadata() is None  # v000005 got no metadata
    assert sorted(os.listdir(published[-1])) == [METADATA_FILE]
