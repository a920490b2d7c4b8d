"""The batch log (``raw/<topic.prefix>/_batches``): one row per landed batch, the lake's ledger.

A batch belongs to the lake once its row is here (``landing`` commits it last). ``Batch`` is one
row; ``BatchWindow`` says which raw rows of one collection a derived table applies: the committed
batches past the table's, in the tables their log rows name.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from bson import json_util

from mongo_cdc import extjson
from mongo_cdc.lake.layout import HISTORY_SEQ, SnapshotManifest
from mongo_cdc.lake.table_reads import Where

BATCH_LOG_SCHEMA = pa.schema(
    [
        pa.field("rs", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        # snapshot (a copy of collections), stream (change events), start (a position, no data)
        pa.field("kind", pa.string(), nullable=False),
        # where streaming resumes after this batch (Extended JSON) and its packed cluster time
        pa.field("resume_token", pa.string()),
        pa.field("cluster_time", pa.int64()),
        # the snapshot manifest: these collections were copied completely as of this position
        pa.field("snapshot_cluster_time", pa.int64()),
        pa.field("collections", pa.list_(pa.string())),
        # the raw tables (<db>.<collection>) this batch wrote rows to
        pa.field("namespaces", pa.list_(pa.string())),
        # counters of a transaction the batch ended inside of (transactions.OpenTransaction)
        pa.field("open_transaction", pa.string()),
        pa.field("landed_at", pa.timestamp("us", tz="UTC")),
        # the manifest's event_order: RENAMED_COPY_ORDER for a rename's copy, "" for a snapshot (null
        # in rows landed before the column existed, whose copies' rows sit at "" too)
        pa.field("snapshot_event_order", pa.string()),
        # a batch of a rename's copy (capture.collection_events): the rename's resume token data and
        # the BSON (hex) of {_id: ...} of the last document copied so far, JSON; null in other batches
        pa.field("renamed_copy", pa.string()),
        # a filtered re-snapshot's _id ranges, JSON {"<db>.<collection>": <the range filter's Extended
        # JSON>}: of these manifest collections, only the documents in the range were copied (null: none)
        pa.field("snapshot_id_ranges", pa.string()),
        # the batch_seq its raw rows carry when it is not the batch's own number: a snapshot's chunks
        # land under the number reserved when it started, and batches streamed while it copied
        # commit before it (null: its own, as in every row landed before the column existed)
        pa.field("rows_seq", pa.int64()),
        # a time-series batch's windows (capture.time_series), JSON {"<db>.<collection>": [<start ms or
        # null>, <end ms>]}: every measurement timed in the window that MongoDB held when the batch read
        # it is landed by it or an earlier batch, and the batch landed none timed after the end (null:
        # no time-series collection read)
        pa.field("time_windows", pa.string()),
    ]
)


@dataclass(frozen=True)
class Batch:
    """One row of the batch log."""

    rs: str
    seq: int
    kind: str
    resume_token: dict | None
    cluster_time: int | None
    snapshot_cluster_time: int | None = None
    collections: tuple[str, ...] | None = None
    namespaces: tuple[str, ...] = ()
    open_transaction: dict | None = None
    snapshot_event_order: str = ""
    renamed_copy: dict | None = None  # {"rename": <the rename's token data>, "after": <hex BSON {_id}>}
    # (namespace, IdRange text) of the manifest's collections a filtered re-snapshot read a range of
    snapshot_id_ranges: tuple[tuple[str, str], ...] = ()
    rows_seq: int | None = None  # the batch_seq of its raw rows, when not ``seq`` (see the schema)
    # (namespace, (start ms or None, end ms)) of the time-series collections it read (see the schema)
    time_windows: tuple[tuple[str, tuple[int | None, int]], ...] = ()

    @property
    def raw_seq(self) -> int:
        """The ``batch_seq`` its raw rows carry."""
        return self.seq if self.rows_seq is None else self.rows_seq

    @property
    def manifest(self) -> SnapshotManifest | None:
        if self.collections is None or self.snapshot_cluster_time is None:
            return None
        return SnapshotManifest(
            self.rs, self.seq, self.snapshot_cluster_time, self.collections, self.snapshot_event_order
        )

    def manifest_of(self, namespace: str) -> SnapshotManifest | None:
        """The manifest's word on ``namespace`` alone (None: it does not reconcile it), with the
        ``_id`` range it copied, if it copied only one."""
        manifest = self.manifest
        if manifest is None or namespace not in manifest.collections:
            return None
        id_range = dict(self.snapshot_id_ranges).get(namespace)
        return SnapshotManifest(manifest.rs, manifest.seq, manifest.cluster_time, (namespace,),
                                manifest.event_order, id_range)  # fmt: skip

    def to_row(self) -> dict:
        return {
            "rs": self.rs,
            "seq": self.seq,
            "kind": self.kind,
            "resume_token": extjson.encode_str(self.resume_token) if self.resume_token is not None else None,
            "cluster_time": self.cluster_time,
            "snapshot_cluster_time": self.snapshot_cluster_time,
            "collections": list(self.collections) if self.collections is not None else None,
            "namespaces": list(self.namespaces),
            "open_transaction": json.dumps(self.open_transaction) if self.open_transaction else None,
            "landed_at": dt.datetime.now(dt.timezone.utc),
            "snapshot_event_order": self.snapshot_event_order,
            "renamed_copy": json.dumps(self.renamed_copy) if self.renamed_copy else None,
            "snapshot_id_ranges": json.dumps(dict(self.snapshot_id_ranges))
            if self.snapshot_id_ranges
            else None,
            "rows_seq": self.rows_seq,
            "time_windows": json.dumps({ns: list(window) for ns, window in self.time_windows})
            if self.time_windows
            else None,
        }

    @classmethod
    def from_row(cls, row: dict) -> Batch:
        token = row["resume_token"]
        return cls(
            rs=row["rs"],
            seq=row["seq"],
            kind=row["kind"],
            resume_token=json_util.loads(token) if token is not None else None,
            cluster_time=row["cluster_time"],
            snapshot_cluster_time=row["snapshot_cluster_time"],
            collections=tuple(row["collections"]) if row["collections"] is not None else None,
            namespaces=tuple(row["namespaces"] or ()),
            open_transaction=json.loads(row["open_transaction"]) if row["open_transaction"] else None,
            snapshot_event_order=row.get("snapshot_event_order") or "",
            renamed_copy=json.loads(row["renamed_copy"]) if row.get("renamed_copy") else None,
            snapshot_id_ranges=tuple(json.loads(row.get("snapshot_id_ranges") or "{}").items()),
            rows_seq=row.get("rows_seq"),
            time_windows=tuple(
                (ns, (start, end)) for ns, (start, end) in json.loads(row.get("time_windows") or "{}").items()
            ),
        )


def last_batches(batches: Iterable[Batch]) -> dict[str, Batch]:
    """Each replica set's last committed batch among ``batches``, by replica set name."""
    last: dict[str, Batch] = {}
    for batch in batches:
        if batch.rs not in last or batch.seq > last[batch.rs].seq:
            last[batch.rs] = batch
    return dict(sorted(last.items()))


@dataclass(frozen=True)
class BatchWindow:
    """Which raw rows of one collection a table applies: per replica set, the ``batch_seq`` of the
    rows of the committed batches that wrote rows for it (``seqs``). A batch's rows count only in the
    tables its log row names: a landing cut short may have left rows in a table the batch, landed
    again, did not touch."""

    seqs: Mapping[str, tuple[int, ...]]
    include_history: bool = False

    @classmethod
    def of(
        cls,
        batches: Iterable[Batch],
        namespace: str,
        applied: Mapping[str, int] | None = None,
        include_history: bool = False,
    ) -> BatchWindow:
        """The batches of ``batches`` with rows for ``namespace`` past ``applied`` (per replica set;
        batch numbers, the order they committed in), as the number their rows carry: a snapshot
        committed after batches streamed beside its copy still applies where they were applied."""
        seqs: dict[str, set[int]] = {}
        for batch in batches:
            if namespace in batch.namespaces and batch.seq > (applied or {}).get(batch.rs, 0):
                seqs.setdefault(batch.rs, set()).add(batch.raw_seq)
        return cls({rs: tuple(sorted(found)) for rs, found in seqs.items()}, include_history)

    @property
    def is_empty(self) -> bool:
        return not any(self.seqs.values()) and not self.include_history

    def filter(self) -> pc.Expression:
        keep = pc.field("batch_seq") == HISTORY_SEQ if self.include_history else pc.scalar(False)
        for rs, seqs in self.seqs.items():
            keep = keep | (
                (pc.field("source", "rs") == rs) & pc.field("batch_seq").isin(pa.array(seqs, pa.int64()))
            )
        return keep

    def where(self) -> Where:
        """``filter()`` for ``table_reads.read_rows``, skipping files that hold none of the batches."""
        seqs = sorted({seq for found in self.seqs.values() for seq in found})
        if self.include_history:
            seqs.insert(0, HISTORY_SEQ)
        return Where(self.filter(), ("source", "batch_seq"), [("batch_seq", "in", seqs)] if seqs else None)

    def mask(self, rows: pa.Table) -> pa.ChunkedArray:
        """``filter()`` as a boolean column of raw ``rows`` (which need ``source`` and ``batch_seq``),
        by compute kernels: a dataset projection costs a millisecond a call, which a transform of many
        small collections pays twice per collection."""
        seqs, rs = rows.column("batch_seq"), pc.struct_field(rows.column("source"), "rs")
        keep = pc.equal(seqs, HISTORY_SEQ)
        if not self.include_history:
            keep = pc.and_kleene(keep, False)  # every row false, a column like the rows'
        for name, found in self.seqs.items():
            keep = pc.or_kleene(
                keep, pc.and_kleene(pc.equal(rs, name), pc.is_in(seqs, pa.array(found, pa.int64())))
            )
        return pc.fill_null(keep, False)

    def may_hold(self, min_seq: int | None, max_seq: int | None) -> bool:
        """Whether a file whose ``batch_seq`` statistics are [min_seq, max_seq] may hold window rows."""
        if max_seq is None or min_seq is None:
            return True
        if self.include_history and min_seq <= HISTORY_SEQ:
            return True
        return any(min_seq <= seq <= max_seq for seqs in self.seqs.values() for seq in seqs)
