"""What a pull holds and counts: the events read but not landed yet (``MicroBatch``), and what the
whole pull did (``PullResult``), which its task reports and its progress lines show."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from mongo_cdc.capture.raw_rows import RawRow


@dataclass
class PullResult:
    rs: str
    batch_seq: int = 0
    cluster_time: int = 0
    batches: int = 0
    events: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    newest_source_ts_ms: int | None = None
    ignored_operations: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Debezium's NumberOfDisconnects / NumberOfPrimaryElections, as seen by this pull
    disconnects: int = 0
    primary_elections: int = 0
    # events over 16 MB left out under cursor.oversize.handling.mode skip, per namespace
    oversized_skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # every event the change stream returned (captured or not): what the server-side filter let through
    events_received: int = 0
    # events read again after a move back (``stream_move``), dropped: the lake holds them already
    replayed_dropped: int = 0
    seconds: float = 0.0
    # the oplog window against the position the pull committed, measured when it ended
    # (oplog_window.OplogWindow; None when the oplog cannot be read)
    oplog: dict[str, Any] | None = None

    def add_counts(self, batch: MicroBatch) -> None:
        for namespace, ops in batch.events_by_op.items():
            for op, count in ops.items():
                self.events[namespace][op] += count
        for operation, count in batch.ignored_operations.items():
            self.ignored_operations[operation] += count
        for namespace, count in batch.oversized_skipped.items():
            self.oversized_skipped[namespace] += count
        newest = batch.newest_source_ts_ms
        if newest is not None and (self.newest_source_ts_ms is None or newest > self.newest_source_ts_ms):
            self.newest_source_ts_ms = newest

    def to_dict(self) -> dict[str, Any]:
        return {
            "rs": self.rs,
            "batch_seq": self.batch_seq,
            "cluster_time": self.cluster_time,
            "batches": self.batches,
            "events": {ns: dict(ops) for ns, ops in self.events.items()},
            "newest_source_ts_ms": self.newest_source_ts_ms,
            "ignored_operations": dict(self.ignored_operations),
            "disconnects": self.disconnects,
            "primary_elections": self.primary_elections,
            "oversized_skipped": dict(self.oversized_skipped),
            "events_received": self.events_received,
            "replayed_dropped": self.replayed_dropped,
            "seconds": self.seconds,
            "oplog": self.oplog,
        }


class MicroBatch:
    """Events read but not landed yet, with their counts: a reopened stream reads them again."""

    def __init__(self) -> None:
        # raw rows by the raw table they land in: <db>.<collection>
        self.rows: dict[str, list[RawRow]] = defaultdict(list)
        self.events = 0
        # BSON bytes of the documents in ``rows``: what a batch of large documents holds in memory
        self.document_bytes = 0
        self.events_by_op: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.ignored_operations: dict[str, int] = defaultdict(int)
        self.oversized_skipped: dict[str, int] = defaultdict(int)
        self.newest_source_ts_ms: int | None = None
        # the token of the last event read: every event up to it is in this batch or not captured
        self.last_token: dict | None = None
        # namespaces this batch copies completely (a rename's new name), as of copy_position
        self.copied: tuple[str, ...] = ()
        self.copy_position = 0

    def add(self, namespace: str, op: str, rows: list[RawRow], events: int = 1) -> None:
        self.rows[namespace].extend(rows)
        self.events += events
        for row in rows:
            description = row.update_description
            self.document_bytes += (
                len(row.after or b"")
                + len(row.before or b"")
                + (len(description["updatedFields"]) if description else 0)
            )
        self.events_by_op[namespace][op] += events
        ts_ms = rows[0].source_ts_ms
        if self.newest_source_ts_ms is None or ts_ms > self.newest_source_ts_ms:
            self.newest_source_ts_ms = ts_ms
