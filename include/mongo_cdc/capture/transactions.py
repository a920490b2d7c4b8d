"""Debezium's transaction metadata (``provide.transaction.metadata``): BEGIN/END records and event blocks.

Every data event of a multi-document transaction gets a ``transaction`` block
``{id, total_order, data_collection_order}``; each transaction gets a BEGIN record before its first
event and an END record (``event_count``, ``data_collections``) once it is over. They land in the
Delta table ``raw/<topic.prefix>/transaction`` with the micro-batch that read them, as part of
its batch (``landing``).

The id is ``<lsid.id>:<txnNumber>``: a session's UUID and its transaction number, which together
name one transaction of one replica set. Only captured events count: a transaction that changed
no captured collection gets no records.

A change stream shows a committed transaction whole, its events one after another with the same
cluster time, so a transaction is over when the next event is not part of it or when the stream
has nothing more to show. It can straddle micro-batches: the counters of a transaction still open
when a batch lands are committed with that batch (offset field ``open_transaction``), so a stream
reopened there, in this pull or the next, carries on counting.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from bson.binary import Binary

from mongo_cdc.capture.raw_rows import event_position
from mongo_cdc.lake import hour_partition

TRANSACTION_SCHEMA = pa.schema(
    [
        pa.field("status", pa.string(), nullable=False),  # BEGIN or END
        pa.field("id", pa.string(), nullable=False),
        pa.field("event_count", pa.int64()),  # END only
        pa.field(
            "data_collections",  # END only: [{data_collection: "<db>.<collection>", event_count}]
            pa.list_(
                pa.struct([pa.field("data_collection", pa.string()), pa.field("event_count", pa.int64())])
            ),
        ),
        # the transaction's commit time (the source ts_ms of its events)
        pa.field("ts_ms", pa.int64()),
        pa.field("rs", pa.string(), nullable=False),
        # the commit's oplog position, shared by every event of the transaction
        pa.field("cluster_time", pa.int64(), nullable=False),
        # the replica set's batch that landed the record, and the partition (as in raw tables)
        pa.field("batch_seq", pa.int64(), nullable=False),
        pa.field("hour", pa.string(), nullable=False),
    ]
)


def transaction_id(change: dict) -> str | None:
    """``<lsid.id>:<txnNumber>`` of a change-stream event, None outside a multi-document transaction."""
    lsid, txn_number = change.get("lsid"), change.get("txnNumber")
    if lsid is None or txn_number is None:
        return None
    session = lsid["id"]
    if isinstance(session, Binary) and session.subtype in (3, 4):  # how the client decodes UUIDs varies
        session = session.as_uuid(session.subtype)
    return f"{session}:{int(txn_number)}"


@dataclass
class OpenTransaction:
    """A transaction whose END is not written yet, with its counters so far."""

    id: str
    cluster_time: int
    ts_ms: int
    total_order: int = 0
    data_collections: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cluster_time": self.cluster_time,
            "ts_ms": self.ts_ms,
            "total_order": self.total_order,
            "data_collections": dict(self.data_collections),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenTransaction:
        return cls(
            data["id"],
            data["cluster_time"],
            data["ts_ms"],
            data["total_order"],
            defaultdict(int, data["data_collections"]),
        )


class TransactionTracker:
    """One pull's transaction bookkeeping; does nothing when ``provide.transaction.metadata`` is off.

    ``committed`` is the state as of the last landed batch: a reopened change stream reads again
    from there, so ``rewind`` drops what was counted since.
    """

    def __init__(self, enabled: bool, rs: str, committed: dict[str, Any] | None) -> None:
        self.enabled = enabled
        self.rs = rs
        self._committed = OpenTransaction.from_dict(committed) if enabled and committed else None
        self.current = copy.deepcopy(self._committed)
        self.records: list[dict[str, Any]] = []  # BEGIN/END records read since the last landed batch

    @property
    def in_transaction(self) -> bool:
        return self.current is not None

    def observe(self, change: dict) -> None:
        """See every change-stream event (captured or not), in order: the end of a transaction shows here."""
        if self.current is not None and transaction_id(change) != self.current.id:
            self.finish()

    def annotate(self, change: dict) -> dict[str, Any] | None:
        """The ``transaction`` block of a captured data event's row (counting it); None outside a
        transaction."""
        txn_id = transaction_id(change) if self.enabled else None
        if txn_id is None:
            return None
        if self.current is None:
            # the commit's position and time: its events' source cluster time and ts_ms
            self.current = OpenTransaction(txn_id, *event_position(change))
            self.records.append(self._record("BEGIN", self.current))
        namespace = f"{change['ns']['db']}.{change['ns']['coll']}"
        self.current.total_order += 1
        self.current.data_collections[namespace] += 1
        return {
            "id": txn_id,
            "total_order": self.current.total_order,
            "data_collection_order": self.current.data_collections[namespace],
        }

    def finish(self) -> None:
        """End the open transaction, if any: the stream showed all of it."""
        if self.current is not None:
            self.records.append(self._record("END", self.current))
            self.current = None

    def batch_table(self, seq: int) -> pa.Table | None:
        """The records of batch ``seq`` being landed, or None when it has none."""
        if not self.records:
            return None
        rows = [
            {**record, "batch_seq": seq, "hour": hour_partition(record["cluster_time"])}
            for record in self.records
        ]
        return pa.Table.from_pylist(rows, schema=TRANSACTION_SCHEMA)

    def state(self) -> dict[str, Any] | None:
        """What the offset keeps of the open transaction once the batch being landed commits."""
        return self.current.to_dict() if self.current is not None else None

    def landed(self) -> None:
        self._committed = copy.deepcopy(self.current)
        self.records = []

    def rewind(self) -> None:
        self.current = copy.deepcopy(self._committed)
        self.records = []

    def _record(self, status: str, transaction: OpenTransaction) -> dict[str, Any]:
        end = status == "END"
        return {
            "status": status,
            "id": transaction.id,
            "event_count": transaction.total_order if end else None,
            "data_collections": (
                [
                    {"data_collection": namespace, "event_count": count}
                    for namespace, count in sorted(transaction.data_collections.items())
                ]
                if end
                else None
            ),
            "ts_ms": transaction.ts_ms,
            "rs": self.rs,
            "cluster_time": transaction.cluster_time,
        }
