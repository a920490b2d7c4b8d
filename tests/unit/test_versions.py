"""``versions.single_event_versions``: a slice's documents with one event, column-wise, as the old
row-by-row fold gives them."""

from __future__ import annotations

import bson
import pyarrow as pa
import pyarrow.compute as pc
from bson import Int64, ObjectId

from mongo_cdc import extjson, lake
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.transform.document_state import DocumentVersion
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import WholeDocument, event_keys
from mongo_cdc.transform.versions import VERSION_SCHEMA, single_event_versions, versions_table

OID = ObjectId("65a1b2c3d4e5f60718293a4b")
MANIFEST = SnapshotManifest("rs0", 1, lake.pack_cluster_time(1_700_000_000, 5), ("db.c",))


def event(number: int, document_id: object, op: str | None, document: dict | None = None) -> dict:
    return {
        "key": extjson.document_key(document_id),
        "op": op,
        "after": bson.encode(document or {"_id": document_id}) if op in ("c", "u", "r") else None,
        "source": {"rs": "rs0"},
        "cluster_time": lake.pack_cluster_time(1_700_000_000, number),
        "event_order": f"82{number:04x}",
    }


def test_most_rows_are_their_versions_and_the_others_are_folded_as_before() -> None:
    rows = rows_to_table(
        [
            event(6, OID, "r"),  # as it is
            event(7, 7, "r", {"_id": Int64(7), "v": 1}),  # its document's _id is an int64
            event(8, "a", "d"),  # a delete: no document
            event(9, "b", None),  # a tombstone: no version
            event(3, "c", "c"),  # before the snapshot that did not read it: deleted there
            event(10, "d", "c"),  # a marker after it: no version
            event(11, "e", "c"),  # a marker before it: as it is, and its marker's row
            event(12, "f", "c"),  # folded apart: not here
        ],
        1,
    )
    keys, ids = event_keys(rows.column("key"))
    single = pc.invert(pc.equal(keys, document_key("f")))
    deletes = pc.fill_null(pc.equal(rows.column("op"), "d"), False)
    documents = [
        WholeDocument(data) if data is not None else None for data in rows.column("after").to_pylist()
    ]
    marker_d = DocumentVersion(
        keys[5].as_py(), "", None, lake.pack_cluster_time(1_700_000_000, 20), "", "rs0"
    )
    marker_e = DocumentVersion(keys[6].as_py(), "", None, lake.pack_cluster_time(1_700_000_000, 1), "", "rs0")
    markers = {marker_d.key: marker_d, marker_e.key: marker_e}

    versions, chosen = single_event_versions(
        rows, keys, ids, single, deletes, documents, markers, [MANIFEST], []
    )

    assert versions.schema == VERSION_SCHEMA
    after = rows.column("after").to_pylist()
    time, order = rows.column("cluster_time").to_pylist(), rows.column("event_order").to_pylist()
    assert (
        versions.to_pylist()
        == versions_table(
            [
                DocumentVersion(keys[0].as_py(), ids[0].as_py(), after[0], time[0], order[0], "rs0"),
                DocumentVersion(keys[1].as_py(), '{"$numberLong":"7"}', after[1], time[1], order[1], "rs0"),
                DocumentVersion(keys[2].as_py(), ids[2].as_py(), None, time[2], order[2], "rs0"),
                DocumentVersion(keys[4].as_py(), ids[4].as_py(), None, *MANIFEST.position, "rs0"),
                DocumentVersion(keys[6].as_py(), ids[6].as_py(), after[6], time[6], order[6], "rs0"),
            ]
        ).to_pylist()
    )
    assert chosen == [documents[0], documents[1], None, None, documents[6]]


def test_versions_without_one_to_fold_one_by_one_are_the_rows_themselves() -> None:
    rows = rows_to_table([event(6, ObjectId(), "r"), event(7, "s", "r")], 1)
    keys, ids = event_keys(rows.column("key"))
    everything = pa.array([True, True])
    documents = [WholeDocument(data) for data in rows.column("after").to_pylist()]

    versions, chosen = single_event_versions(
        rows, keys, ids, everything, pa.array([False, False]), documents, {}, [MANIFEST], []
    )

    assert versions.column("document").to_pylist() == rows.column("after").to_pylist()
    assert versions.column("key").to_pylist() == keys.to_pylist()
    assert chosen == documents
