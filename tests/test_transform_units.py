"""Pure-Python parts of the transform (mongo_cdc.transform): no Spark involved.

Column types and table layouts: tests/test_columns.py; document keys: tests/test_document_keys.py.
"""

from __future__ import annotations

import os

import bson
import pyarrow as pa
import pyarrow.parquet as pq
from bson import Decimal128, Int64, ObjectId
from bson.datetime_ms import DatetimeMS

from mongo_cdc import extjson, lake
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
from mongo_cdc.transform.versioned_table import METADATA_FILE, VersionedTable, write_metadata

OID = ObjectId("65a1b2c3d4e5f60718293a4b")


def decoded(document: dict) -> dict:
    """``document`` as the transform sees it: BSON-decoded."""
    return bson.decode(bson.encode(document), extjson.DECODE_OPTIONS)


def ejson(value: dict) -> str:
    return extjson.encode_str(decoded(value))


def event(op, position, after=None, update=None, document_id=1, rs="rs0") -> ChangeEvent:
    cluster_time, event_order = position
    return ChangeEvent(
        document_id=document_id,
        op=op,
        ts_ms=1240,
        after=decoded(after) if after is not None else None,
        update_description=update,
        source={"ts_ms": 1234, "rs": rs},
        cluster_time=cluster_time,
        event_order=event_order,
        rs=rs,
    )


def update(updated=None, removed=None, truncated=None) -> dict:
    return {
        "updatedFields": decoded(updated or {}),
        "removedFields": removed or [],
        "truncatedArrays": truncated or [],
    }


# -- document_state ----------------------------------------------------------------------


def test_apply_update_removes_truncates_then_sets():
    document = decoded({"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3, 4], "gone": 1, "list": [{"x": 1}]})
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
    assert version == DocumentVersion("1", {"_id": 1, "n": 2, "m": 1}, 6, "8301", "rs0")
    assert type(version.document["n"]) is Int64


def test_fold_skips_events_at_or_before_the_stored_position():
    stored = DocumentVersion("1", {"_id": 1, "v": "new"}, 9, "8900", "rs0")
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
    assert reinserted.document == {"_id": 1, "again": True}


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
    live = DocumentVersion("1", {"_id": 1}, 4, "8400", "rs0")
    assert reconcile_with_snapshots(live, [snapshot("rs0", 5), snapshot("rs0", 9)]) == DocumentVersion(
        "1", None, 9, "", "rs0"
    )


def test_reconcile_keeps_documents_read_or_written_since_and_other_replica_sets():
    read_by_it = DocumentVersion("1", {"_id": 1}, 5, "", "rs0")
    written_since = DocumentVersion("1", {"_id": 1}, 5, "8501", "rs0")
    from_another_shard = DocumentVersion("1", {"_id": 1}, 1, "8100", "rs1")
    of_unknown_origin = DocumentVersion("1", {"_id": 1}, 1, "8100")  # an old state version
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
    stored = DocumentVersion("1", {"_id": 1}, 1, "81")
    assert fold_events("1", stored, [event(None, (2, "82")), event("u", (3, "83"))]) == stored
    assert fold_events("1", None, [event(None, (2, "82"))]) is None


def test_fold_of_an_update_without_previous_version_starts_from_the_id():
    version = fold_events(
        f'["oid","{OID}"]', None, [event("u", (1, "81"), update=update({"a.b": 1}), document_id=OID)]
    )
    assert version.document == {"_id": OID, "a": {"b": 1}}


def test_fold_never_modifies_the_events_or_previous_documents():
    previous = DocumentVersion("1", {"_id": 1, "a": {"b": [1, 2]}}, 1, "81", "rs0")
    inserted = event("c", (2, "82"), after={"_id": 1, "c": {"d": 1}, "l": [1, 2, 3]})
    updates = [
        event(
            "u",
            (3, "83"),
            update=update({"c.d": 2, "new": {"x": 1}}, truncated=[{"field": "l", "newSize": 1}]),
        ),
        event("u", (4, "84"), update=update({"new.x": 2})),
    ]
    untouched = [decoded(e.after or e.update_description["updatedFields"]) for e in [inserted, *updates]]
    version = fold_events("1", previous, [inserted, *updates])
    assert version.document == {"_id": 1, "c": {"d": 2}, "l": [1], "new": {"x": 2}}
    assert [e.after or e.update_description["updatedFields"] for e in [inserted, *updates]] == untouched
    updated_previous = fold_events("1", previous, [event("u", (2, "82"), update=update({"a.b.0": 9}))])
    assert updated_previous.document == {"_id": 1, "a": {"b": [9, 2]}}
    assert previous.document == {"_id": 1, "a": {"b": [1, 2]}}


def test_updates_set_bson_values_and_wrapper_like_field_names_as_they_are():
    document = decoded({"_id": 1})
    values = {
        "when": DatetimeMS(-5),
        "price": Decimal128("0.10"),
        "w": {"$numberLong": "5"},  # a document with a field named $numberLong, not an int64
        "a.$b": 1,
    }
    apply_update(document, update(values))
    assert document == {
        "_id": 1,
        "when": DatetimeMS(-5),
        "price": Decimal128("0.10"),
        "w": {"$numberLong": "5"},
        "a": {"$b": 1},
    }


# -- flatten -----------------------------------------------------------------------------


def test_change_document_of_each_operation():
    inserted = change_document(event("c", (1, "81"), after={"_id": 1, "a": Int64(1), "w": {"$oid": "x"}}))
    assert inserted == {"_id": 1, "a": Int64(1), "w": {"$oid": "x"}}
    assert type(inserted["a"]) is Int64
    partial = event("u", (2, "82"), update=update(updated={"a.b": 1, "c": "x"}, removed=["d", "e.f"]))
    assert change_document(partial) == {"_id": 1, "a": {"b": 1}, "c": "x", "d": None, "e": {"f": None}}
    assert change_document(event("d", (3, "83"))) == {"_id": 1}
    assert change_document(event(None, (3, "83"))) is None


def test_change_row_metadata_by_default_is_op_source_ts_and_marks_only_deletes():
    assert change_row(event("d", (3, "83")), FlatteningOptions()) == (("d", 1234, True, 3, "83"), {"_id": 1})
    assert change_row(event("u", (4, "84"), after={"_id": 1}), FlatteningOptions())[0][2] is False


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
    assert read.document_id == OID
    assert read.after == {"_id": OID}
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
