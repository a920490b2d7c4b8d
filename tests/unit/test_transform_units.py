"""Pure-Python parts of the transform (mongo_cdc.transform): no Spark involved.

Column types and table layouts: tests/unit/test_columns.py; document keys:
tests/integration/test_document_keys.py.
"""

from __future__ import annotations

from typing import Any

import bson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import Decimal128, Int64, ObjectId
from bson.datetime_ms import DatetimeMS
from deltalake import write_deltalake

from mongo_cdc import extjson, lake
from mongo_cdc.bson_elements import DamagedBson
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.batch_log import BATCH_LOG_SCHEMA, Batch, BatchWindow
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.data_files import leaf_paths, write_data_file
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    apply_update,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_document, change_row
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import (
    RAW_COLUMNS,
    ChangeEvent,
    RowDocuments,
    applied_app_id,
    event_from_row,
    event_keys,
)

OID = ObjectId("65a1b2c3d4e5f60718293a4b")


def decoded(document: dict) -> dict:
    """``document`` as the transform sees it: BSON-decoded."""
    return bson.decode(bson.encode(document), extjson.DECODE_OPTIONS)


def event(op, position, after=None, update=None, document_id: Any = 1, rs="rs0") -> ChangeEvent:
    """An event as ``raw_events.event_from_row`` gives it; ``after`` a document, encoded to BSON here."""
    cluster_time, event_order = position
    return ChangeEvent(
        document_id=document_id,
        document_id_json=extjson.encode_str(document_id),
        op=op,
        ts_ms=1240,
        after_bson=bson.encode(after) if after is not None else None,
        update_description=update,
        source={"ts_ms": 1234, "rs": rs},
        cluster_time=cluster_time,
        event_order=event_order,
        rs=rs,
    )


def update(updated=None, removed=None, truncated=None) -> dict:
    return {
        "updatedFields": bson.encode(updated or {}),
        "removedFields": removed or [],
        "truncatedArrays": truncated or [],
    }


def version(document: dict | None, cluster_time: int, event_order: str, rs: str | None = "rs0"):
    """A stored version of document ``_id`` 1 (key ``"1"``)."""
    data = bson.encode(document) if document is not None else None
    return DocumentVersion("1", "1", data, cluster_time, event_order, rs)


def document_of(stored: DocumentVersion) -> dict | None:
    return bson.decode(stored.document, extjson.DECODE_OPTIONS) if stored.document is not None else None


# -- document_state ----------------------------------------------------------------------


def test_apply_update_removes_truncates_then_sets():
    document = bson.encode(
        {"_id": 1, "a": {"b": 1, "c": 2}, "arr": [1, 2, 3, 4], "gone": 1, "list": [{"x": 1}]}
    )
    document = apply_update(
        document,
        update(
            updated={"a.b": 10, "arr.1": "two", "list.0.y": 2, "new.deep": True, "pad.2": 1},
            removed=["gone", "a.c", "list.0.x"],
            truncated=[{"field": "arr", "newSize": 2}],
        ),
    )
    assert bson.decode(document) == {
        "_id": 1,
        "a": {"b": 10},
        "arr": [1, "two"],
        "list": [{"y": 2}],
        "new": {"deep": True},
        "pad": {"2": 1},  # a missing parent becomes a document, as with MongoDB's $set
    }


def test_apply_update_indexes_arrays_past_their_end_and_unsets_elements_to_null():
    document = bson.encode({"_id": 1, "arr": [1], "other": [1, 2]})
    document = apply_update(document, update(updated={"arr.3": 4}, removed=["other.0"]))
    assert bson.decode(document) == {"_id": 1, "arr": [1, None, None, 4], "other": [None, 2]}


def test_fold_applies_events_in_position_order():
    folded = fold_events(
        "1",
        None,
        [
            event("u", (5, "8205"), update=update(updated={"n": Int64(2)}, removed=["tmp"])),
            event("r", (5, ""), after={"_id": 1, "n": 1, "tmp": "x"}),  # a snapshot read sorts first
            event("u", (6, "8301"), update=update(updated={"m": 1})),
        ],
    )
    assert folded._replace(document=None) == version(None, 6, "8301")
    assert document_of(folded) == {"_id": 1, "n": 2, "m": 1}
    assert type(document_of(folded)["n"]) is Int64


def test_fold_keeps_the_bson_of_the_last_full_document_as_it_is():
    after = {"_id": 1, "w": {"$numberLong": "5"}, "z": 1, "a": 2}  # field order and names kept
    folded = fold_events("1", None, [event("c", (1, "81"), after=after)])
    assert folded.document == bson.encode(after)


def test_fold_skips_events_at_or_before_the_stored_position():
    stored = version({"_id": 1, "v": "new"}, 9, "8900")
    replayed = [
        event("c", (3, "8300"), after={"_id": 1, "v": "old"}),
        event("u", (9, "8900"), {"_id": 1, "v": "x"}),
    ]
    assert fold_events("1", stored, replayed) == stored


def test_fold_keeps_deletes_so_replayed_inserts_do_not_resurrect():
    deleted = fold_events("1", None, [event("c", (1, "81"), {"_id": 1}), event("d", (2, "82"))])
    assert deleted == version(None, 2, "82")
    assert fold_events("1", deleted, [event("c", (1, "81"), {"_id": 1})]) == deleted
    reinserted = fold_events("1", deleted, [event("c", (3, "83"), {"_id": 1, "again": True})])
    assert document_of(reinserted) == {"_id": 1, "again": True}


def test_fold_records_the_replica_set_of_the_last_applied_event():
    moved = fold_events(
        "1", None, [event("c", (1, "81"), {"_id": 1}), event("r", (5, ""), {"_id": 1}, rs="rs1")]
    )
    assert moved.rs == "rs1"
    stale = fold_events("1", moved, [event("u", (3, "83"), {"_id": 1, "old": True}, rs="rs0")])
    assert stale == moved


def test_fold_records_the_id_as_the_document_holds_it_now():
    # 1 and 1.0 are one _id in MongoDB: a replace may change its type, the key stays
    inserted = event("c", (1, "81"), {"_id": 1, "v": 1})
    replaced = event("u", (2, "82"), {"_id": 1.0, "v": 2})
    folded = fold_events("1", None, [inserted, replaced])
    assert (folded.key, folded.document_id_json) == ("1", "1.0")
    # an update's documentKey holds the _id as stored; an update without `after` keeps it
    updated = fold_events("1", folded, [event("u", (3, "83"), update=update({"v": 3}), document_id=1.0)])
    assert updated.document_id_json == "1.0" and document_of(updated) == {"_id": 1.0, "v": 3}
    assert type(document_of(updated)["_id"]) is float


def snapshot(rs: str, cluster_time: int, seq: int = 7) -> SnapshotManifest:
    return SnapshotManifest(rs, seq, cluster_time, ("db.c",))


def test_reconcile_deletes_a_document_its_replica_sets_snapshot_did_not_read():
    live = version({"_id": 1}, 4, "8400")
    assert reconcile_with_snapshots(live, [snapshot("rs0", 5), snapshot("rs0", 9)]) == version(None, 9, "")


def test_reconcile_keeps_documents_read_or_written_since_and_other_replica_sets():
    read_by_it = version({"_id": 1}, 5, "")
    written_since = version({"_id": 1}, 5, "8501")
    from_another_shard = version({"_id": 1}, 1, "8100", rs="rs1")
    of_unknown_origin = version({"_id": 1}, 1, "8100", rs=None)  # an old state version
    already_deleted = version(None, 2, "8200")
    for stored in (read_by_it, written_since, from_another_shard, of_unknown_origin, already_deleted):
        assert reconcile_with_snapshots(stored, [snapshot("rs0", 5)]) == stored


def test_a_renames_copy_at_a_snapshots_cluster_time_is_newer_than_the_snapshots_reads():
    """A rename with no write between it and a snapshot's position has that position's cluster time:
    its copy replaces what the snapshot read there, and its manifest deletes what the copy lacks."""
    copy = SnapshotManifest("rs0", 8, 5, ("db.c",), lake.RENAMED_COPY_ORDER)
    read_by_the_snapshot = version({"_id": 1, "v": "replaced"}, 5, "")
    copied = event("r", copy.position, {"_id": 1, "v": "renamed in"})
    assert document_of(fold_events("1", read_by_the_snapshot, [copied])) == {"_id": 1, "v": "renamed in"}
    assert reconcile_with_snapshots(read_by_the_snapshot, [copy]) == version(None, 5, lake.RENAMED_COPY_ORDER)
    # the copy's own reads stay, and so does an event at that cluster time (it folds over the copy)
    for kept in (version({"_id": 1}, 5, lake.RENAMED_COPY_ORDER), version({"_id": 1}, 5, "8500")):
        assert reconcile_with_snapshots(kept, [copy]) == kept


def test_a_batch_log_from_before_the_copy_order_keeps_its_copies_at_the_snapshot_order(tmp_path):
    """A log landed before ``snapshot_event_order`` existed gains the column on the next commit; its
    old copies' manifests stay at "" (their rows sit there), a new rename's copy is after them."""
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "p")
    old_schema = BATCH_LOG_SCHEMA.remove(BATCH_LOG_SCHEMA.get_field_index("snapshot_event_order"))
    old_copy = Batch("rs0", 1, "stream", {"_data": "8200"}, 5, snapshot_cluster_time=5, collections=("db.c",))
    old_row = {k: v for k, v in old_copy.to_row().items() if k != "snapshot_event_order"}
    write_deltalake(
        source_lake.source_uri(lake.BATCH_LOG), pa.Table.from_pylist([old_row], schema=old_schema)
    )
    source_lake.commit(
        Batch(
            "rs0", 2, "stream", {"_data": "8300"}, 6, snapshot_cluster_time=6, collections=("db.c",),
            snapshot_event_order=lake.RENAMED_COPY_ORDER,
        )
    )  # fmt: skip
    positions = [batch.manifest.position for batch in source_lake.batches()]
    assert positions == [(5, ""), (6, lake.RENAMED_COPY_ORDER)]


def test_a_drop_deletes_the_documents_of_its_replica_set_written_before_it():
    drop = ((5, "8500"), "rs0")
    before = version({"_id": 1}, 4, "8400")
    assert drop_with_collection(before, [drop, ((3, "8300"), "rs0")]) == version(None, 5, "8500")
    for kept in (version({"_id": 1}, 6, "8600"), version({"_id": 1}, 4, "8400", rs="rs1")):
        assert drop_with_collection(kept, [drop]) == kept


def test_snapshot_manifests_round_trip_through_the_batch_log_and_count_as_committed_batches(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "p")
    assert source_lake.batches() == [] and source_lake.committed() == {}
    manifest = SnapshotManifest("rs0", 12, lake.pack_cluster_time(1_700_000_000, 2), ("db.a", "db.b.c"))
    source_lake.commit(
        Batch(
            "rs0",
            12,
            "snapshot",
            {"_data": "8200"},
            manifest.cluster_time,
            snapshot_cluster_time=manifest.cluster_time,
            collections=manifest.collections,
        )
    )
    assert [batch.manifest for batch in source_lake.batches()] == [manifest]
    # no raw rows at all (every copied collection was empty): batch numbers still go on after it
    assert source_lake.committed() == {"rs0": 12}
    assert source_lake.last_batch("rs0").seq == 12 and source_lake.last_batch("rs1") is None
    assert source_lake.namespaces() == []


def test_fold_ignores_tombstones_and_updates_without_data():
    stored = version({"_id": 1}, 1, "81", rs=None)
    assert fold_events("1", stored, [event(None, (2, "82")), event("u", (3, "83"))]) == stored
    assert fold_events("1", None, [event(None, (2, "82"))]) is None


def test_fold_of_an_update_without_previous_version_starts_from_the_id():
    folded = fold_events(
        f'["oid","{OID}"]', None, [event("u", (1, "81"), update=update({"a.b": 1}), document_id=OID)]
    )
    assert document_of(folded) == {"_id": OID, "a": {"b": 1}}
    assert folded.document_id_json == extjson.encode_str(OID)


def test_fold_never_modifies_the_events_or_previous_documents():
    previous = version({"_id": 1, "a": {"b": [1, 2]}}, 1, "81")
    inserted = event("c", (2, "82"), after={"_id": 1, "c": {"d": 1}, "l": [1, 2, 3]})
    updates = [
        event(
            "u",
            (3, "83"),
            update=update({"c.d": 2, "new": {"x": 1}}, truncated=[{"field": "l", "newSize": 1}]),
        ),
        event("u", (4, "84"), update=update({"new.x": 2})),
    ]
    untouched = [e.after_bson or e.update_description["updatedFields"] for e in [inserted, *updates]]
    folded = fold_events("1", previous, [inserted, *updates])
    assert document_of(folded) == {"_id": 1, "c": {"d": 2}, "l": [1], "new": {"x": 2}}
    assert [e.after_bson or e.update_description["updatedFields"] for e in [inserted, *updates]] == untouched
    updated_previous = fold_events("1", previous, [event("u", (2, "82"), update=update({"a.b.0": 9}))])
    assert document_of(updated_previous) == {"_id": 1, "a": {"b": [9, 2]}}
    assert document_of(previous) == {"_id": 1, "a": {"b": [1, 2]}}


def test_an_update_of_a_damaged_document_names_the_document_and_the_damage():
    stored = version({"_id": 1, "a": "text"}, 1, "81")
    cut = stored._replace(document=stored.document[:-3])
    with pytest.raises(DamagedBson, match=r"document 1 at \(2, '82'\).*says it has 26 bytes, but 23"):
        fold_events("1", cut, [event("u", (2, "82"), update=update({"a": 1}))])
    damaged_update = {**update({"b": "x"}), "updatedFields": bson.encode({"b": "x"})[:-1] + b"!"}
    with pytest.raises(DamagedBson, match="does not end with a NUL"):
        fold_events("1", stored, [event("u", (2, "82"), update=damaged_update)])


def test_updates_set_bson_values_and_wrapper_like_field_names_as_they_are():
    document = bson.encode({"_id": 1})
    values = {
        "when": DatetimeMS(-5),
        "price": Decimal128("0.10"),
        "w": {"$numberLong": "5"},  # a document with a field named $numberLong, not an int64
        "a.$b": 1,
    }
    document = apply_update(document, update(values))
    assert bson.decode(document, extjson.DECODE_OPTIONS) == {
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
    assert change_row(event(lake.DROP, (5, "85"), document_id=None), FlatteningOptions()) is None


# -- raw_events --------------------------------------------------------------------------


def raw_rows(*batches: tuple[str, int]) -> pa.Table:
    """One raw row per (rs, batch_seq)."""
    rows = []
    for number, (rs, seq) in enumerate(batches):
        row = {
            "key": extjson.document_key(number),
            "op": "c",
            "source": {"rs": rs},
            "cluster_time": lake.pack_cluster_time(1_700_000_000, number),
            "event_order": f"82{number:02x}",
        }
        rows.append(rows_to_table([row], seq).to_pylist()[0])
    return pa.Table.from_pylist(rows, schema=lake.RAW_SCHEMA)


def selected(table: pa.Table, window: BatchWindow) -> list[tuple[str, int]]:
    """The (rs, batch_seq) of the rows ``window`` selects, asserted the same by its filter and its mask."""
    chosen = table.filter(window.filter())
    assert chosen.equals(table.filter(window.mask(table)))
    return [(row["source"]["rs"], row["batch_seq"]) for row in chosen.to_pylist()]


def _logged(rs: str, seq: int, *namespaces: str) -> Batch:
    return Batch(rs, seq, "stream", {"_data": "82"}, 1, namespaces=namespaces)


def test_batch_window_selects_committed_batches_past_the_applied_ones():
    rows = raw_rows(("rs0", 1), ("rs0", 2), ("rs0", 3), ("rs1", 1), ("rs2", 1), ("rs0", lake.HISTORY_SEQ))
    # rs0's batch 3 is not committed yet, rs2's batch 1 landed rows of another table only
    batches = [
        _logged("rs0", 1, "db.a"),
        _logged("rs0", 2, "db.a"),
        _logged("rs1", 1, "db.a"),
        _logged("rs2", 1, "db.b"),
    ]
    window = BatchWindow.of(batches, "db.a", applied={"rs0": 1})
    assert not window.is_empty
    assert selected(rows, window) == [("rs0", 2), ("rs1", 1)]
    assert BatchWindow.of(batches, "db.a", applied={"rs0": 2, "rs1": 5, "rs9": 4}).is_empty
    assert selected(rows, BatchWindow.of(batches, "db.c")) == []
    # a backfill's rebuilt hours read every committed row and the history rows
    every = BatchWindow.of(batches, "db.a", include_history=True)
    assert selected(rows, every) == [("rs0", 1), ("rs0", 2), ("rs1", 1), ("rs0", lake.HISTORY_SEQ)]


def test_rows_a_cut_short_landing_left_in_a_table_its_batch_did_not_list_do_not_count():
    rows = raw_rows(("rs0", 5), ("rs0", 6))
    # batch 5 was landed again without rows for db.a: the rows it left there are not the lake's
    window = BatchWindow.of([_logged("rs0", 5, "db.b"), _logged("rs0", 6, "db.a")], "db.a")
    assert selected(rows, window) == [("rs0", 6)]


def test_a_snapshot_committed_after_batches_streamed_beside_it_selects_its_rows_by_their_number():
    # snapshot rows landed as batch 2; pulls beside the copy committed 3 and 4, the snapshot then as 5
    rows = raw_rows(("rs0", 1), ("rs0", 2), ("rs0", 3), ("rs0", 4))
    snapshot = Batch("rs0", 5, "snapshot", {"_data": "82"}, 1, 1, ("db.a",), ("db.a",), rows_seq=2)
    batches = [_logged("rs0", 1, "db.a"), _logged("rs0", 3, "db.a"), _logged("rs0", 4, "db.b"), snapshot]
    # a table that applied the pulls (through 4) still applies the snapshot
    window = BatchWindow.of(batches, "db.a", applied={"rs0": 4})
    assert selected(rows, window) == [("rs0", 2)]
    assert window.may_hold(2, 2) and not window.may_hold(3, 5)
    # a table behind everything applies each row once
    assert selected(rows, BatchWindow.of(batches, "db.a")) == [("rs0", 1), ("rs0", 2), ("rs0", 3)]


def test_batch_window_skips_files_whose_batch_statistics_lie_outside_it():
    batches = [_logged("rs0", seq, "db.a") for seq in range(1, 7)] + [_logged("rs1", 1, "db.a")]
    window = BatchWindow.of(batches, "db.a", applied={"rs0": 4, "rs1": 1})
    assert not window.may_hold(1, 4)  # applied already
    assert not window.may_hold(7, 9)  # not committed yet
    assert window.may_hold(3, 5) and window.may_hold(6, 6)
    assert window.may_hold(None, None)  # no statistics: read it


def test_derived_tables_record_applied_batches_apart_from_the_landing():
    source_lake = SourceLake(LakeLocation("/lake"), "p")
    ids = {applied_app_id("state", "rs0"), applied_app_id("changes", "rs0"), source_lake.app_id("rs0")}
    assert len(ids | {applied_app_id("state", "rs1")}) == 4


def test_event_from_row_decodes_the_id_and_the_document_and_keeps_the_updated_fields_bson():
    row = {
        "key": extjson.document_key(OID),
        "op": "u",
        "ts_ms": 98,
        "after": bson.encode({"_id": OID, "w": {"$numberLong": "5"}}),
        "updateDescription": {
            "updatedFields": bson.encode({"a.b": Int64(1)}),
            "removedFields": ["c"],
            "truncatedArrays": [],
        },
        "source": {"ts_ms": 99, "rs": "rs0"},
        "cluster_time": 5,
        "event_order": "82",
    }
    [stored] = rows_to_table([row], 3).to_pylist()
    read = event_from_row(stored)
    assert read.document_id == OID and read.document_id_json == extjson.encode_str(OID)
    assert read.after == {"_id": OID, "w": {"$numberLong": "5"}}
    assert read.update_description["updatedFields"] == bson.encode({"a.b": Int64(1)})  # BSON as landed
    assert read.update_description["removedFields"] == ["c"]
    assert (read.op, read.ts_ms, read.source["ts_ms"]) == ("u", 98, 99)
    assert (read.position, read.rs) == ((5, "82"), "rs0")


def test_event_from_row_reads_dates_in_the_key_exactly():
    when = DatetimeMS(-62_135_596_800_001)  # before year 1: no datetime holds it
    [stored] = rows_to_table(
        [
            {
                "key": extjson.document_key(when),
                "op": "d",
                "source": {"rs": "rs0"},
                "cluster_time": 1,
                "event_order": "81",
            }
        ],
        1,
    ).to_pylist()
    assert event_from_row(stored).document_id == when


def test_data_files_write_unique_columns_without_a_dictionary_and_the_others_with_one(tmp_path):
    """``write_data_file`` names every leaf of the other columns for the Parquet writer's dictionary
    (a struct's fields, a list's elements, a map's keys and values, names with dots), so only the
    unique columns lose it."""
    rows = pa.table(
        {
            "__doc": ["x", "x"],
            "a.b": ["y", "y"],
            "s": [{"x": "z", "l": [{"y": 1}]}] * 2,
            "l": [["w"], ["w"]],
            "m": pa.array([[("k", 1)]] * 2, pa.map_(pa.string(), pa.int64())),
        }
    )
    file = write_data_file(LakeLocation(str(tmp_path)), "t", rows, (), unique_columns=("__doc",))
    metadata = pq.read_metadata(tmp_path / "t" / file.path).row_group(0)
    paths = [metadata.column(index).path_in_schema for index in range(metadata.num_columns)]
    assert paths == [path for field in rows.schema for path in leaf_paths(field)]
    dictionary = {
        metadata.column(index).path_in_schema: metadata.column(index).has_dictionary_page
        for index in range(metadata.num_columns)
    }
    assert dictionary == {path: path != "__doc" for path in paths}


@pytest.mark.parametrize(
    "ids",
    [
        [OID, ObjectId("65a1b2c3d4e5f60718293a4c")],  # one form: the others are not tried
        [OID, 7, "plain", Int64(8), 'quo"te', 2.5, {"a": 1}, -3, OID],  # every form, and the rest
        [2.5, {"a": 1}],  # none of the forms
    ],
)
def test_event_keys_column_wise_are_the_keys_and_ids_of_each_event(ids):
    raw = pa.array([extjson.document_key(document_id) for document_id in ids], pa.string())
    keys, id_jsons = event_keys(raw)
    rows = [{"key": key, "source": {"rs": "rs0"}} for key in raw.to_pylist()]
    events = [event_from_row(dict.fromkeys(RAW_COLUMNS) | row) for row in rows]
    assert keys.to_pylist() == [document_key(event.document_id) for event in events]
    assert id_jsons.to_pylist() == [event.document_id_json for event in events]


def test_row_documents_make_a_whole_document_of_a_row_once_and_take_rows_without_copies():
    column = pa.array([bson.encode({"_id": 1}), None, bson.encode({"_id": 3})], pa.binary())
    documents = RowDocuments(column)
    assert len(documents) == 3 and documents[1] is None
    assert documents[0].decoded() == {"_id": 1} and documents[-1].decoded() == {"_id": 3}
    taken = documents.take(pa.array([2, None, 0, 1], pa.uint64()))
    # the same row's document is the same object: decoded once for the state and changes tables
    assert taken[0] is documents[2] and taken[2] is documents[0] and taken[1] is None and taken[3] is None
    assert taken.missing().to_pylist() == [False, True, False, True]
    assert taken.bson.to_pylist() == [column[2].as_py(), None, column[0].as_py(), None]
    # an item replaced by a value of its own: it has a document, but no whole document's BSON
    own = taken.replaced({1: {"_id": 2}})
    assert own[1] == {"_id": 2} and own.take(pa.array([1, 0])) == [{"_id": 2}, documents[2]]
    assert own.missing().to_pylist() == [False, False, False, True]
    assert own.bson.to_pylist() == [column[2].as_py(), None, column[0].as_py(), None]
    # the same whole documents: the same rows of the same column, no value of its own
    assert taken.same_as(documents.take(pa.array([2, None, 0, 1], pa.int64())))
    assert documents.same_as(documents.take(pa.array([0, 1, 2])))
    assert not taken.same_as(documents.take(pa.array([2, None, 0, 0])))
    assert not own.same_as(taken) and not taken.same_as(RowDocuments(column))
    assert RowDocuments.of([{"a": 1}, None]) == [{"a": 1}, None]
