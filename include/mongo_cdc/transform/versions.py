"""Versions of documents column-wise: a slice's documents with one event in the run, as
``slice_tasks.write_state`` writes them.

A document with one event in a run is folded (``document_state.fold_events``) into the version that
event holds, the row as it is, for all but a few rows: those are folded one by one
(``single_event_versions``). Runs on the executors, like ``slice_tasks``: pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    current_id_json,
    drop_with_collection,
    own_type_ids,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.raw_events import RowDocuments, WholeDocument

# Versions of documents column-wise (``DocumentVersion``'s fields), as ``write_state`` takes them.
VERSION_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("document_id_json", pa.string()),
        ("document", pa.binary()),
        ("cluster_time", pa.int64()),
        ("event_order", pa.string()),
        ("rs", pa.string()),
    ]
)


def single_event_versions(
    rows: pa.Table,
    keys: pa.Array,
    ids: pa.Array,
    single: pa.Array,
    deletes: pa.Array,
    documents: RowDocuments | Sequence[WholeDocument | None],
    markers: dict[str, DocumentVersion],
    manifests: Iterable[SnapshotManifest],
    drops: Iterable[tuple[tuple[int, str], str]],
) -> tuple[pa.Table, RowDocuments]:
    """The versions (``fold_events``) of the documents with one event in the run (``single`` rows of
    raw ``rows``, with their ``keys``, ``ids`` (``event_keys``), ``deletes`` and ``documents``: a
    delete, or a whole document), column-wise, and their documents. A row whose version is not the
    row as it is (its document's own _id of another type than the event's, a deletion marker of
    ``markers`` after it, a snapshot of ``manifests`` or a drop of ``drops`` deleting it) is folded
    one by one."""
    documents = documents if isinstance(documents, RowDocuments) else RowDocuments.of(documents)
    after = rows.column("after").combine_chunks()
    count = rows.num_rows
    replica_sets = pc.struct_field(rows.column("source").combine_chunks(), "rs")
    cluster_times = rows.column("cluster_time").combine_chunks()
    orders = rows.column("event_order").combine_chunks()
    versions = pa.Table.from_arrays(
        [
            keys,
            ids,
            pc.if_else(deletes, pa.nulls(count, after.type), after),
            cluster_times,
            orders,
            replica_sets,
        ],
        schema=VERSION_SCHEMA,
    )
    # a tombstone, or an update whose lookup found nothing, has no version
    held = pc.and_(single, pc.or_(deletes, pc.is_valid(after)))
    one_by_one = pc.and_(pc.invert(deletes), pc.invert(own_type_ids(ids)))
    if markers:
        one_by_one = pc.or_(one_by_one, pc.is_in(keys, pa.array(list(markers), pa.string())))
    # the latest position (per replica set) a manifest or drop of the run deletes documents before:
    # a snapshot's own rows sit after its manifest's position, so most rows skip both checks
    deleting: dict[str, tuple[int, str]] = {}
    manifests, drops = tuple(manifests), tuple(drops)
    for rs, position in [(m.rs, m.position) for m in manifests] + [(rs, position) for position, rs in drops]:
        deleting[rs] = max(position, deleting.get(rs, position))
    for rs, (cluster_time, order) in deleting.items():
        before = pc.or_(
            pc.less(cluster_times, cluster_time),
            pc.and_(pc.equal(cluster_times, cluster_time), pc.less(orders, order)),
        )
        one_by_one = pc.or_(one_by_one, pc.and_(pc.equal(replica_sets, rs), before))
    one_by_one = pc.and_(held, pc.fill_null(one_by_one, True))
    kept = pc.indices_nonzero(pc.and_(held, pc.invert(one_by_one)))
    if not pc.any(one_by_one).as_py():
        return versions.take(kept), documents.take(kept)
    folded, folded_rows, folded_documents = [], [], []
    indices = pc.indices_nonzero(one_by_one)
    chosen = [column.to_pylist() for column in versions.take(indices).columns]
    for index, *values in zip(indices.to_pylist(), *chosen, strict=True):
        row = DocumentVersion(*values)
        # fold_events of a document's only event: a delete, or a full document
        document = documents[index]
        version = (
            row
            if row.document is None
            else row._replace(document_id_json=current_id_json(document, row.document_id_json))
        )
        marker = markers.get(version.key)
        # an older event landed after the delete does not bring the document back; the marker's
        # own delete still deletes (a run made again after its markers' commit, whose state
        # commit lost a race or crashed)
        if marker is not None and version.position < marker.position:
            continue
        if version.rs in deleting and version.position < deleting[version.rs]:
            version = drop_with_collection(reconcile_with_snapshots(version, manifests), drops)
        folded.append(version)
        folded_rows.append(index)
        folded_documents.append(index if version.document is not None else None)
    # the versions in row order, as the rows were
    order = pc.sort_indices(pa.concat_arrays([kept, pa.array(folded_rows, pa.uint64())]))
    all_versions = pa.concat_tables([versions.take(kept), versions_table(folded)]).take(order)
    document_rows = pa.concat_arrays([kept, pa.array(folded_documents, pa.uint64())])
    return all_versions, documents.take(document_rows.take(order))


def versions_table(versions: list[DocumentVersion]) -> pa.Table:
    """``versions`` column-wise (``VERSION_SCHEMA``)."""
    return pa.Table.from_arrays(
        [
            pa.array([version[index] for version in versions], field.type)
            for index, field in enumerate(VERSION_SCHEMA)
        ],
        schema=VERSION_SCHEMA,
    )
