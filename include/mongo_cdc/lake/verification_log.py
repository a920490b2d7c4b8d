"""The verification log (``raw/<topic.prefix>/_verifications``): what each verification found.

One row per collection and ``_id`` range a verification checked (``mongo_cdc.verify``): the
documents MongoDB holds and the state holds in it, the drift (missing, extra, different) with up to
``EXAMPLE_KEYS`` of its keys (the state's ``__key``), the verification's position and what was done
about it. A collection that could not be verified in a run gets one row with ``range_index`` -1 and
the reason in ``note``. Append-only; readers query it like any Delta table (docs/reading.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa

EXAMPLE_KEYS = 10

VERIFICATION_LOG_SCHEMA = pa.schema(
    [
        pa.field("verification_id", pa.string(), nullable=False),  # one per replica set and run
        pa.field("rs", pa.string(), nullable=False),
        pa.field("namespace", pa.string(), nullable=False),
        pa.field("range_index", pa.int32(), nullable=False),  # 0-based in _id order; -1: not verified
        pa.field("ranges", pa.int32(), nullable=False),
        pa.field("range", pa.string()),  # the bounds as text: [low, high)
        pa.field("source_count", pa.int64()),
        pa.field("lake_count", pa.int64()),
        pa.field("missing", pa.int64()),  # in MongoDB, not in the state
        pa.field("extra", pa.int64()),  # in the state, not in MongoDB
        pa.field("different", pa.int64()),  # in both, with other contents
        pa.field("example_keys", pa.list_(pa.string())),  # state __key values of drifted documents
        # the verification's position (packed cluster time): the source was compared as of then, and
        # the repairs sit there
        pa.field("cluster_time", pa.int64()),
        pa.field("state_batch_seq", pa.int64()),  # the last batch of rs the state had applied
        pa.field("action", pa.string(), nullable=False),  # clean, repaired, reported, skipped
        pa.field("repair_batch_seq", pa.int64()),  # the batch that landed the repairs (null: none)
        pa.field("note", pa.string()),
        pa.field("verified_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

CLEAN = "clean"
REPAIRED = "repaired"
REPORTED = "reported"
SKIPPED = "skipped"


@dataclass
class RangeReport:
    """One row of the verification log."""

    namespace: str
    range_index: int
    ranges: int
    range: str | None
    source_count: int | None = None
    lake_count: int | None = None
    missing: int = 0
    extra: int = 0
    different: int = 0
    example_keys: list[str] = field(default_factory=list)
    action: str = CLEAN
    note: str | None = None

    @property
    def drift(self) -> int:
        return self.missing + self.extra + self.different

    def to_row(
        self, verification_id: str, rs: str, cluster_time: int | None, state_batch_seq: int | None,
        repair_batch_seq: int | None, verified_at: dt.datetime,
    ) -> dict:  # fmt: skip
        return {
            "verification_id": verification_id,
            "rs": rs,
            "namespace": self.namespace,
            "range_index": self.range_index,
            "ranges": self.ranges,
            "range": self.range,
            "source_count": self.source_count,
            "lake_count": self.lake_count,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "example_keys": self.example_keys[:EXAMPLE_KEYS],
            "cluster_time": cluster_time,
            "state_batch_seq": state_batch_seq,
            "action": self.action,
            "repair_batch_seq": repair_batch_seq if self.drift and self.action != REPORTED else None,
            "note": self.note,
            "verified_at": verified_at,
        }
