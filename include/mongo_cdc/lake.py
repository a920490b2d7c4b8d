"""Lake layout and the raw-event Parquet schema: the contract between the pull tasks and Spark.

Layout under ``lake.root``::

    raw/<topic.prefix>/<db>/<collection>/hour=<YYYY-MM-DDTHH>/<rs>-<seq>-<part>.parquet
    raw/<topic.prefix>/_snapshots/<rs>-<seq>.json     (one manifest per snapshot batch)
    raw/<topic.prefix>/<db>/<collection>/hour=<YYYY-MM-DDTHH>/<rs>-history.parquet  (backfilled)
    raw/<topic.prefix>/transaction/hour=<YYYY-MM-DDTHH>/<rs>-<seq>-<part>.parquet  (BEGIN/END records)
    raw/<topic.prefix>/__heartbeat/hour=<YYYY-MM-DDTHH>/<rs>-<ts_ms>.parquet   (heartbeats)
    changes/<topic.prefix>/<db>/<collection>   -> symlink to the current version directory
    state/<topic.prefix>/<db>/<collection>     -> symlink to the current version directory
    _versions/<changes|state>/<topic.prefix>/<db>/<collection>/v<NNNNNN>/...

``seq`` is the replica set's batch sequence number (committed in its offset); a raw file
belongs to the lake only once its ``seq`` is at or below the committed ``batch_seq``. The same
holds for a snapshot manifest: it says which collections its batch copied *completely*, so the
transform can drop the documents the snapshot no longer found (even from a now empty collection,
which has no raw file in that batch), and for transaction records.

A history file holds what a backfill run pulled from the oplog for an hour older than anything
the live sync landed for that replica set (``backfill``). It belongs to no batch: the changes
table shows its events, the state table never reads it (its events are older than the state).

``transaction`` is a reserved name under ``raw/<topic.prefix>/``: a database of that name cannot be
captured (its directory would be taken for the transaction records).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

RAW_SCHEMA = pa.schema(
    [
        # Debezium key payload as JSON text: {"id": "<Extended JSON of _id>"}
        pa.field("key", pa.string(), nullable=False),
        # r (snapshot read), c, u, d; null marks a tombstone (key with no value)
        pa.field("op", pa.string()),
        # when mongo-cdc processed the event (ms since epoch)
        pa.field("ts_ms", pa.int64()),
        pa.field("before", pa.string()),
        pa.field("after", pa.string()),
        pa.field(
            "updateDescription",
            pa.struct(
                [
                    pa.field("updatedFields", pa.string()),
                    pa.field("removedFields", pa.list_(pa.string())),
                    pa.field(
                        "truncatedArrays",
                        pa.list_(
                            pa.struct([pa.field("field", pa.string()), pa.field("newSize", pa.int32())])
                        ),
                    ),
                ]
            ),
        ),
        pa.field(
            "source",
            pa.struct(
                [
                    pa.field("version", pa.string()),
                    pa.field("connector", pa.string()),
                    pa.field("name", pa.string()),
                    pa.field("ts_ms", pa.int64()),
                    pa.field("snapshot", pa.bool_()),
                    pa.field("db", pa.string()),
                    pa.field("rs", pa.string()),
                    pa.field("collection", pa.string()),
                    pa.field("ord", pa.int32()),
                    pa.field("lsid", pa.string()),
                    pa.field("txnNumber", pa.int64()),
                    # appended (not in Debezium's order) so files written before them stay a prefix
                    pa.field("sequence", pa.string()),
                    pa.field("ts_us", pa.int64()),
                    pa.field("ts_ns", pa.int64()),
                    # the event's wall-clock time in ms (change events only; MongoDB 6.0+)
                    pa.field("wallTime", pa.int64()),
                ]
            ),
        ),
        # oplog position: (t << 32) | i of the event's cluster time (snapshot reads: the snapshot's)
        pa.field("cluster_time", pa.int64(), nullable=False),
        # resume token _data (hex, bytewise ordered); "" for snapshot reads
        pa.field("event_order", pa.string(), nullable=False),
        # Debezium's transaction block (provide.transaction.metadata); null outside a transaction
        pa.field(
            "transaction",
            pa.struct(
                [
                    pa.field("id", pa.string()),
                    pa.field("total_order", pa.int64()),
                    pa.field("data_collection_order", pa.int64()),
                ]
            ),
        ),
    ]
)

# Raw ``op`` values of rows that stand for a whole collection (``collection_events``): no
# document, key COLLECTION_KEY.
DROP = "drop"
RENAME = "rename"
COLLECTION_OPERATIONS = frozenset({DROP, RENAME})
COLLECTION_KEY = '{"id":null}'

_FILE_NAME = re.compile(r"^(?P<rs>.+)-(?P<seq>\d{12})-(?P<part>\d{4})\.parquet$")
_HISTORY_NAME = re.compile(r"^(?P<rs>.+)-history\.parquet$")
_MANIFEST_NAME = re.compile(r"^(?P<rs>.+)-(?P<seq>\d{12})\.json$")
# Under raw/<prefix>/ next to the database directories; the leading underscore keeps every reader
# of the raw tree (list_raw_collections, Spark, pyarrow) from taking it for a database.
SNAPSHOTS_DIR = "_snapshots"
# Also next to the database directories. A database may be named "transaction", so that name is
# refused for capture (raw_collection_dir) rather than silently read as transaction records.
TRANSACTION_DIR = "transaction"
HEARTBEAT_DIR = "__heartbeat"


@dataclass(frozen=True)
class RawFile:
    """A raw file's identity, parsed from its name."""

    path: str
    rs: str
    seq: int
    part: int


@dataclass(frozen=True)
class SnapshotManifest:
    """A snapshot batch copied these collections completely, as they were at ``cluster_time``."""

    rs: str
    seq: int
    cluster_time: int
    collections: tuple[str, ...]  # "<db>.<collection>"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class ReservedDatabaseError(ValueError):
    """A captured database has the name of a directory the lake reserves under ``raw/<prefix>/``."""


def raw_collection_dir(lake_root: str, prefix: str, db: str, collection: str) -> str:
    if db == TRANSACTION_DIR:
        raise ReservedDatabaseError(
            f"database '{db}' cannot be captured by topic.prefix '{prefix}': raw/{prefix}/{db} is reserved "
            f"for transaction metadata records. Exclude it (database.exclude.list: [{db}])."
        )
    return os.path.join(lake_root, "raw", prefix, db, collection)


def raw_dir(lake_root: str, prefix: str, name: str) -> str:
    """A reserved directory under ``raw/<prefix>/`` (``TRANSACTION_DIR``, ``HEARTBEAT_DIR``)."""
    return os.path.join(lake_root, "raw", prefix, name)


def hour_partition(cluster_time: int) -> str:
    """``hour=YYYY-MM-DDTHH`` (UTC) of a packed cluster time."""
    seconds = cluster_time >> 32
    hour = dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H")
    return f"hour={hour}"


def raw_file_name(rs: str, seq: int, part: int) -> str:
    return f"{rs}-{seq:012d}-{part:04d}.parquet"


def history_file_name(rs: str) -> str:
    return f"{rs}-history.parquet"


def raw_file_path(
    lake_root: str, prefix: str, db: str, collection: str, cluster_time: int, rs: str, seq: int, part: int
) -> str:
    return os.path.join(
        raw_collection_dir(lake_root, prefix, db, collection),
        hour_partition(cluster_time),
        raw_file_name(rs, seq, part),
    )


def parse_raw_file(path: str) -> RawFile | None:
    match = _FILE_NAME.match(os.path.basename(path))
    if not match:
        return None
    return RawFile(path, match["rs"], int(match["seq"]), int(match["part"]))


def _hour_files(base: str) -> list[str]:
    """Every file path in the hour partitions under ``base``, in hour order."""
    paths = []
    for hour in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        hour_dir = os.path.join(base, hour)
        if hour.startswith("hour=") and os.path.isdir(hour_dir):
            paths.extend(os.path.join(hour_dir, name) for name in sorted(os.listdir(hour_dir)))
    return paths


def list_raw_files(lake_root: str, prefix: str, db: str, collection: str) -> list[RawFile]:
    """Every raw file of one collection, in (rs, seq, part) order."""
    return list_batch_files(raw_collection_dir(lake_root, prefix, db, collection))


def list_batch_files(base: str) -> list[RawFile]:
    """Every ``hour=*/<rs>-<seq>-<part>.parquet`` file under ``base``, in (rs, seq, part) order."""
    found = [raw for raw in map(parse_raw_file, _hour_files(base)) if raw]
    return sorted(found, key=lambda f: (f.rs, f.seq, f.part))


@dataclass(frozen=True)
class HistoryFile:
    """A backfilled hour of one replica set's events (see the module docstring)."""

    path: str
    rs: str

    @property
    def hour(self) -> str:
        return os.path.basename(os.path.dirname(self.path))


def list_history_files(lake_root: str, prefix: str, db: str, collection: str) -> list[HistoryFile]:
    """Every history file of one collection, in hour order."""
    paths = _hour_files(raw_collection_dir(lake_root, prefix, db, collection))
    return [history for history in map(parse_history_file, paths) if history]


def parse_history_file(path: str) -> HistoryFile | None:
    match = _HISTORY_NAME.match(os.path.basename(path))
    return HistoryFile(path, match["rs"]) if match else None


def list_raw_collections(lake_root: str, prefix: str) -> list[tuple[str, str]]:
    """(db, collection) pairs that have a raw directory (not the reserved ``_*`` and ``transaction``)."""
    base = os.path.join(lake_root, "raw", prefix)
    pairs = []
    if not os.path.isdir(base):
        return pairs
    for db in sorted(os.listdir(base)):
        db_dir = os.path.join(base, db)
        if db.startswith(("_", ".")) or db == TRANSACTION_DIR or not os.path.isdir(db_dir):
            continue
        pairs.extend((db, coll) for coll in sorted(os.listdir(db_dir)) if not coll.startswith((".", "_")))
    return pairs


def snapshot_manifest_path(lake_root: str, prefix: str, rs: str, seq: int) -> str:
    return os.path.join(lake_root, "raw", prefix, SNAPSHOTS_DIR, f"{rs}-{seq:012d}.json")


def write_snapshot_manifest(lake_root: str, prefix: str, manifest: SnapshotManifest) -> str:
    """Write a manifest atomically (a reader never sees half of one); return its path."""
    path = snapshot_manifest_path(lake_root, prefix, manifest.rs, manifest.seq)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(manifest.to_json())
    os.replace(temporary, path)
    return path


def list_snapshot_manifests(lake_root: str, prefix: str) -> list[SnapshotManifest]:
    """Every snapshot manifest of a source, committed or not, in (rs, seq) order."""
    directory = os.path.join(lake_root, "raw", prefix, SNAPSHOTS_DIR)
    manifests = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if _MANIFEST_NAME.match(name):
            with open(os.path.join(directory, name), encoding="utf-8") as file:
                data = json.load(file)
            manifests.append(
                SnapshotManifest(data["rs"], data["seq"], data["cluster_time"], tuple(data["collections"]))
            )
    return manifests


def table_path(lake_root: str, table: str, prefix: str, db: str, collection: str) -> str:
    """Public path of a derived table (``table`` is ``changes`` or ``state``)."""
    return os.path.join(lake_root, table, prefix, db, collection)


def versions_dir(lake_root: str, table: str, prefix: str, db: str, collection: str) -> str:
    return os.path.join(lake_root, "_versions", table, prefix, db, collection)


def pack_cluster_time(t: int, i: int) -> int:
    return (t << 32) | i


def highest_raw_seq(lake_root: str, prefix: str, rs: str) -> int:
    """The highest batch number a replica set has landed so far (0 if none), manifests included.

    Batch numbers must keep increasing even when an offset is deleted to force a new snapshot:
    the transform only applies batches past its watermark. (A snapshot of empty collections
    lands a manifest and no raw file.)
    """
    highest = 0
    for db, collection in list_raw_collections(lake_root, prefix):
        for raw in list_raw_files(lake_root, prefix, db, collection):
            if raw.rs == rs:
                highest = max(highest, raw.seq)
    for manifest in list_snapshot_manifests(lake_root, prefix):
        if manifest.rs == rs:
            highest = max(highest, manifest.seq)
    # a batch may hold nothing but a transaction's END record
    for raw in list_batch_files(raw_dir(lake_root, prefix, TRANSACTION_DIR)):
        if raw.rs == rs:
            highest = max(highest, raw.seq)
    return highest


def earliest_landed_position(lake_root: str, prefix: str, rs: str) -> int | None:
    """Packed cluster time of the oldest event or snapshot read the live sync landed for ``rs``.

    Older history is only in the oplog; a backfill pulls it (``backfill``). None: nothing landed.
    """
    positions = [m.cluster_time for m in list_snapshot_manifests(lake_root, prefix) if m.rs == rs]
    for db, collection in list_raw_collections(lake_root, prefix):
        files = [raw for raw in list_raw_files(lake_root, prefix, db, collection) if raw.rs == rs]
        if files:
            # partitions hold events by cluster time: the oldest is in the first hour
            first_hour = min(os.path.dirname(raw.path) for raw in files)
            for raw in files:
                if os.path.dirname(raw.path) == first_hour:
                    column = pq.read_table(raw.path, columns=["cluster_time"]).column("cluster_time")
                    positions.append(pc.min(column).as_py())
    return min(positions, default=None)
