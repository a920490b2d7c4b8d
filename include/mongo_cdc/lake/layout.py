"""Lake layout and the raw-event schema: the contract between the pull tasks and the transform.

Every table is a Delta table (committed with delta-rs) under ``lake.root``::

    raw/<topic.prefix>/<db>/<collection>      raw events, append-only, partitioned by ``hour``
    raw/<topic.prefix>/_batches               the batch log: one row per landed batch (``landing``)
    raw/<topic.prefix>/_snapshots             the snapshots' chunk plans and copied chunks (``landing``)
    raw/<topic.prefix>/_verifications         the verifications' reports, one row per _id range checked
    raw/<topic.prefix>/transaction            BEGIN/END records (provide.transaction.metadata)
    raw/<topic.prefix>/__heartbeat            heartbeats (heartbeat.interval.ms)
    raw/<topic.prefix>/_deletions/<db>/<coll> the state's deletion markers (the transform)
    changes/<topic.prefix>/<db>/<collection>  one row per event (the transform)
    state/<topic.prefix>/<db>/<collection>    one row per live document (the transform)

``batch_seq`` is the replica set's batch number. A raw row belongs to the lake once its batch is
in the batch log (``batch_log.Batch``); rows of a batch whose landing was cut short are replaced
when the batch lands again. History rows a backfill pulled from the oplog have ``batch_seq`` 0:
they belong to no batch, the changes table shows them and the state never reads them.

``transaction``, ``__heartbeat`` and names starting with ``_`` are reserved under
``raw/<topic.prefix>/``: a database named ``transaction`` cannot be captured.

``<db>`` and ``<collection>`` are the names escaped by ``name_parts`` (docs/lake-format.md, "Table
paths"): a name of ASCII letters, digits, ``_``, ``-`` and ``.`` is its own path; in any other
name, each other character's UTF-8 bytes are written ``!XX`` (``logs/2024`` is ``logs!2F2024``).
``!`` itself is escaped, so an escaped name never equals another name, and no store or reader
(delta-rs decodes ``%XX``, URLs end at ``#`` and ``?``, Hadoop globs ``*``, ``{``) reads it as
anything but itself. An escaped name longer than a path segment (255 bytes) continues in a
subdirectory, each segment but the last ending with ``!``.
"""

from __future__ import annotations

import datetime as dt
import re
import string
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa

from mongo_cdc.lake.storage import LakeLocation

# Debezium's update description, its updatedFields a BSON document keyed by the dotted paths.
UPDATE_DESCRIPTION_TYPE = pa.struct(
    [
        pa.field("updatedFields", pa.binary()),
        pa.field("removedFields", pa.list_(pa.string())),
        pa.field(
            "truncatedArrays",
            pa.list_(pa.struct([pa.field("field", pa.string()), pa.field("newSize", pa.int32())])),
        ),
    ]
)

SOURCE_TYPE = pa.struct(
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
        pa.field("sequence", pa.string()),
        pa.field("ts_us", pa.int64()),
        pa.field("ts_ns", pa.int64()),
        # the event's wall-clock time in ms (change events only; MongoDB 6.0+)
        pa.field("wallTime", pa.int64()),
    ]
)

TRANSACTION_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("total_order", pa.int64()),
        pa.field("data_collection_order", pa.int64()),
    ]
)

RAW_SCHEMA = pa.schema(
    [
        # Debezium key payload as JSON text: {"id": "<Extended JSON of _id>"}
        pa.field("key", pa.string(), nullable=False),
        # r (snapshot read), c, u, d; null marks a tombstone (key with no value); drop/rename
        pa.field("op", pa.string()),
        # when mongo-cdc processed the event (ms since epoch)
        pa.field("ts_ms", pa.int64()),
        # the documents as the BSON bytes MongoDB sent: lossless for every document it accepts
        pa.field("before", pa.binary()),
        pa.field("after", pa.binary()),
        pa.field("updateDescription", UPDATE_DESCRIPTION_TYPE),
        pa.field("source", SOURCE_TYPE),
        # oplog position: (t << 32) | i of the event's cluster time (snapshot reads: the snapshot's)
        pa.field("cluster_time", pa.int64(), nullable=False),
        # resume token _data (hex, bytewise ordered); "" for snapshot reads
        pa.field("event_order", pa.string(), nullable=False),
        # Debezium's transaction block (provide.transaction.metadata); null outside a transaction
        pa.field("transaction", TRANSACTION_TYPE),
        # the replica set's batch that landed the row (0: backfilled history)
        pa.field("batch_seq", pa.int64(), nullable=False),
        # UTC hour of cluster_time, YYYY-MM-DDTHH: the partition column
        pa.field("hour", pa.string(), nullable=False),
    ]
)
HOUR_COLUMN = "hour"
HISTORY_SEQ = 0

# Raw ``op`` values of rows that stand for a whole collection (``collection_events``): no
# document, key COLLECTION_KEY.
DROP = "drop"
RENAME = "rename"
COLLECTION_OPERATIONS = frozenset({DROP, RENAME})
COLLECTION_KEY = '{"id":null}'
# The ``event_order`` of the documents a rename into a captured collection copies, and of that
# copy's manifest: after a snapshot read's "" at the same cluster time (the copy is read after the
# rename, so after any snapshot position taken at its cluster time), before every change event's
# (a hex resume token, "82..."), so an event at that cluster time still folds over the copy.
RENAMED_COPY_ORDER = "0"

BATCH_LOG = "_batches"
SNAPSHOT_LOG = "_snapshots"
VERIFICATION_LOG = "_verifications"
APPLIED_MARK = "_applied"
DELETIONS_DIR = "_deletions"
TRANSACTION_DIR = "transaction"
HEARTBEAT_DIR = "__heartbeat"
ZONES = ("raw", "changes", "state")
# inside a state table: the transform's MERGE sources and rebuilt tables, staged before the commit
# ("_": no Delta reader or vacuum looks in it)
STAGING_DIR = "_mongo_cdc_staging"


@dataclass(frozen=True)
class SnapshotManifest:
    """A snapshot batch copied these collections completely, as they were at ``cluster_time``."""

    rs: str
    seq: int
    cluster_time: int
    collections: tuple[str, ...]  # "<db>.<collection>"
    event_order: str = ""  # RENAMED_COPY_ORDER for a rename's copy, "" for a snapshot
    # a filtered re-snapshot of one collection read only the documents of this _id range
    # (``id_ranges.IdRange.text``): the others are none of its business. None: the whole collection
    id_range: str | None = None

    @property
    def position(self) -> tuple[int, str]:
        """Where the documents it read sit at or after: the state deletes those before it."""
        return self.cluster_time, self.event_order


class ReservedDatabaseError(ValueError):
    """A captured database has the name of a table the lake reserves under ``raw/<prefix>/``."""


def check_database_name(prefix: str, db: str) -> None:
    if db == TRANSACTION_DIR or db.startswith("_"):
        raise ReservedDatabaseError(
            f"database '{db}' cannot be captured by topic.prefix '{prefix}': raw/{prefix}/{db} is reserved "
            f"for mongo-cdc's own tables. Exclude it (database.exclude.list: [{db}])."
        )


PLAIN_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-.")
NAME_ESCAPE = "!"
SEGMENT_LENGTH = 255  # the longest file name of common filesystems (ext4, XFS, APFS), in bytes
_ESCAPED_BYTES = re.compile(rf"(?:{NAME_ESCAPE}[0-9A-F]{{2}})+")


def name_parts(name: str) -> tuple[str, ...]:
    """The path segments of a database or collection name in a table path (the module's docstring).

    Plain names (ASCII letters, digits, ``_``, ``-``, ``.``, not starting with ``.``) are their own
    single segment, as before names were escaped, so existing lakes keep their paths."""
    tokens = [
        character
        if character in PLAIN_CHARACTERS and not (index == 0 and character == ".")
        else "".join(f"{NAME_ESCAPE}{byte:02X}" for byte in character.encode("utf-8"))
        for index, character in enumerate(name)
    ]
    segments, current = [], ""
    for token in tokens:  # never splits an escape: a segment is whole characters, and the "!" mark
        if len(current) + len(token) > SEGMENT_LENGTH - len(NAME_ESCAPE):
            segments.append(current + NAME_ESCAPE)
            current = ""
        current += token
    return (*segments, current)


def name_of_parts(parts: tuple[str, ...] | list[str]) -> str:
    """The database or collection name whose ``name_parts`` these are."""
    escaped = "".join(part[: -len(NAME_ESCAPE)] for part in parts[:-1]) + parts[-1]
    return _ESCAPED_BYTES.sub(
        lambda run: bytes.fromhex(run[0].replace(NAME_ESCAPE, "")).decode("utf-8"), escaped
    )


def table_parts(zone: str, prefix: str, db: str, collection: str) -> tuple[str, ...]:
    """The path of a collection's table in ``zone`` under the lake root, segment by segment."""
    return (zone, prefix, *name_parts(db), *name_parts(collection))


def table_path(zone: str, prefix: str, db: str, collection: str) -> str:
    """The path of a collection's table in ``zone`` under the lake root: ``state/shop/db/logs!2F2024``."""
    return "/".join(table_parts(zone, prefix, db, collection))


def table_names(path: str) -> tuple[str, str, str]:
    """The zone, database and collection of the table at ``path`` (a ``table_uri`` or a
    ``table_path``, not a deletions table); empty strings where the path is shorter than a table's."""
    segments = path.rstrip("/").split("/")
    names, end = [], len(segments)
    for _ in range(2):  # the collection, then the database: read from the end, as a root may hold "!"
        start = end - 1
        while start > 0 and segments[start - 1].endswith(NAME_ESCAPE):  # continued from there
            start -= 1
        names.insert(0, name_of_parts(segments[start:end]))
        end = start
    if end < 2:
        return "", "", ""
    return segments[end - 2], names[0], names[1]


def table_uri(lake: LakeLocation, zone: str, prefix: str, db: str, collection: str) -> str:
    """URI of a collection's table in ``zone`` (raw, changes or state)."""
    if zone == "raw":
        check_database_name(prefix, db)
    return lake.table_uri(*table_parts(zone, prefix, db, collection))


def deletions_uri(lake: LakeLocation, prefix: str, db: str, collection: str) -> str:
    """The deletion markers of a collection's state: the last position of each deleted document.

    Outside ``state/``, so no reader of the state (nor a glob over it) counts deleted documents."""
    return lake.table_uri(*_deletions_parts(prefix, db, collection))


def deletions_path(prefix: str, db: str, collection: str) -> str:
    """``deletions_uri``'s path under the lake root."""
    return "/".join(_deletions_parts(prefix, db, collection))


def _deletions_parts(prefix: str, db: str, collection: str) -> tuple[str, ...]:
    return ("raw", prefix, DELETIONS_DIR, *name_parts(db), *name_parts(collection))


def source_table_uri(lake: LakeLocation, prefix: str, name: str) -> str:
    """A source-wide table under ``raw/<prefix>/`` (``BATCH_LOG``, ``SNAPSHOT_LOG``, ``TRANSACTION_DIR``,
    ``HEARTBEAT_DIR``, ``VERIFICATION_LOG``, ``APPLIED_MARK``)."""
    return lake.table_uri("raw", prefix, name)


def source_table_path(prefix: str, name: str) -> str:
    """``source_table_uri``'s path under the lake root."""
    return f"raw/{prefix}/{name}"


def hour_partition(cluster_time: int) -> str:
    """The UTC hour (``YYYY-MM-DDTHH``) of a packed cluster time: the ``hour`` partition value."""
    return _hour_text((cluster_time >> 32) // 3600)


@lru_cache(maxsize=256)
def _hour_text(hours: int) -> str:
    # every row of a pull gets one: formatted once per hour, not once per row
    return dt.datetime.fromtimestamp(hours * 3600, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H")


def pack_cluster_time(t: int, i: int) -> int:
    return (t << 32) | i
