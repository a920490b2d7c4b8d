"""Snapshot reads of one collection as raw-table rows, without decoding a document (``SnapshotColumns``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from mongo_cdc.capture.field_filters import CollectionFieldRules
from mongo_cdc.capture.raw_rows import now_ms
from mongo_cdc.capture.raw_tables import keys_and_documents, raw_documents
from mongo_cdc.lake import RAW_SCHEMA, hour_partition


class SnapshotColumns:
    """Snapshot reads of one collection as Arrow record batches: the hot path of a snapshot.

    Only ``key`` and ``after`` differ per document. ``after`` is the server's batch itself, cut
    into documents without copying (rewritten by elements where field rules change documents); keys of
    ObjectId ``_id``s are built in bulk. The constant columns are built once per batch size and sliced:
    as long as the longest batch so far, so a small collection's copy builds a few rows, not
    ``max_rows``.
    """

    def __init__(
        self,
        source_block: dict[str, Any],
        cluster_time: int,
        seq: int,
        fields: CollectionFieldRules | None = None,
        max_rows: int = 50_000,
        event_order: str = "",  # a rename's copy: RENAMED_COPY_ORDER
    ) -> None:
        self._fields = fields
        self.max_rows = max_rows
        constant = pa.Table.from_pylist(
            [
                {
                    "key": "",
                    "op": "r",
                    "ts_ms": 0,
                    "before": None,
                    "after": None,
                    "updateDescription": None,
                    "source": source_block,
                    "cluster_time": cluster_time,
                    "event_order": event_order,
                    "transaction": None,
                    "batch_seq": seq,
                    "hour": hour_partition(cluster_time),
                }
            ],
            schema=RAW_SCHEMA,
        )
        self._constant = constant.to_batches()[0]  # the row, repeated as batches need it (``_rows``)

    def record_batches(self, batch: bytes) -> Iterator[pa.RecordBatch]:
        """The rows of one batch of raw documents (concatenated BSON), ``max_rows`` at most a record batch."""
        documents = raw_documents(batch)
        for start in range(0, len(documents), self.max_rows):
            yield self._rows(documents.slice(start, self.max_rows))

    def _rows(self, documents: pa.BinaryArray) -> pa.RecordBatch:
        count = len(documents)
        keys, afters = keys_and_documents(documents, self._fields)
        if self._constant.num_rows < count:  # a small collection's batches are small
            rows = min(self.max_rows, max(count, 2 * self._constant.num_rows))
            self._constant = self._constant.take(pa.array([0] * rows, pa.int32()))
        columns = self._constant.slice(0, count).columns
        columns[RAW_SCHEMA.get_field_index("key")] = keys
        columns[RAW_SCHEMA.get_field_index("after")] = afters
        columns[RAW_SCHEMA.get_field_index("ts_ms")] = pa.repeat(pa.scalar(now_ms(), pa.int64()), count)
        return pa.RecordBatch.from_arrays(columns, schema=RAW_SCHEMA)
