"""The source settings: ``SourceConfig``, each field declared with its YAML key, default, value type and
description (``setting``), from which loading, validation and the reference page are derived.

Property names follow the Debezium MongoDB connector where one exists; the rest are ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from bson import Timestamp

from mongo_cdc.config.capture_mode_table import CAPTURE_MODES, FULL_UPDATE_TYPES, check_full_update_type
from mongo_cdc.config.dag_settings import DAG_SETTINGS, DagSettings
from mongo_cdc.config.field_rules import FieldRule
from mongo_cdc.config.namespace_filters import NamespaceFilters
from mongo_cdc.config.oversize_mode_table import OVERSIZE_MODES
from mongo_cdc.config.setting import Setting, declared_settings, required_setting, setting
from mongo_cdc.config.snapshot_mode_table import (
    HEAL_LOST_OPLOG,
    OPLOG_LOST_RECOVERIES,
    SNAPSHOT_MODES,
    START_POSITION_KEYS,
    check_start_position,
)
from mongo_cdc.config.values import (
    AddedFields,
    Boolean,
    Choice,
    FieldRules,
    Integer,
    Name,
    OperationSet,
    OpTime,
    RegexList,
    ResumeTokenData,
    String,
    Text,
)
from mongo_cdc.field_hashing import HashKey
from mongo_cdc.transform.flatten_options import (
    ARRAY_ENCODINGS,
    DELETE_TOMBSTONE_HANDLING_MODES,
    FlatteningOptions,
)

SKIPPABLE_OPERATIONS = ("c", "u", "d", "none")
# What a verification does about drift it finds (``mongo_cdc.verify``): heal and warn, heal and fail
# the task, or only report.
VERIFY_ON_DRIFT = ("repair", "fail", "report")
# The flattening keys' defaults are FlatteningOptions' own.
_FLATTENING_DEFAULTS = FlatteningOptions()


@dataclass(frozen=True)
class SourceConfig(NamespaceFilters):
    """One validated source: everything a DAG, a pull or the Spark transform needs to know.

    Every field but ``name``, ``path`` and ``dag`` is a source key, declared here once; the upper
    bounds of the integers come from what each one drives (the comments say what). ``dag`` holds the
    ``dag.*`` keys (``dag_settings``).
    """

    name: str  # the YAML file's name without its extension
    path: str  # the YAML file's absolute path
    topic_prefix: str = required_setting(
        "topic.prefix",
        Name(),
        "Logical name of the source: the first directory under `raw/`, `changes/` and `state/`, and "
        "`source.name` in raw events.",
        because="the logical name used in lake paths",
    )
    mongo_conn_id: str = setting(
        "mongodb.connection.id",
        "mongo_default",
        Text(),
        "Airflow connection of the MongoDB deployment",
    )
    spark_conn_id: str = setting(
        "spark.connection.id",
        "spark_default",
        Text(),
        "Airflow Spark connection used by `transform`",
    )
    lake_root: str = setting(
        "lake.root",
        "",  # load_source puts default_lake_root() here
        Text(),
        "The lake: a local directory (a relative path is resolved against the YAML file's folder) or "
        "an `s3://`, `gs://`, `abfs://` or `abfss://` URI, kept as written. Other schemes are "
        "refused.",
        shown_default="`[mongo_cdc] lake_root` (`$MONGO_CDC_LAKE_ROOT`), else `$AIRFLOW_HOME/mongo-cdc-lake`",
    )
    lake_conn_id: str | None = setting(
        "lake.connection.id",
        None,
        Text(),
        "Airflow connection with the credentials of a URI `lake.root` (see [the lake "
        "connection](deploying.md#the-lake-connection)). None: the environment's credentials.",
    )
    lake_optimize_interval_hours: int = setting(
        "lake.optimize.interval.hours",
        24,
        Integer(0),
        "Heal, then compact each table's small files (a state's sorted by key) when its last compaction "
        "is this old. `0`: never. Readers are never blocked.",
    )
    lake_retention_hours: int = setting(
        "lake.retention.hours",
        168,
        Integer(0),
        "Files no longer in a table (replaced by compaction, updates or deletes) are deleted after "
        "this long (vacuum), and no sooner, so [time travel](reading.md#reading-the-tables) reaches"
        " back this far, and a read may take this long. `0` deletes them in each maintenance run: no "
        "time travel, a read running across a maintenance run may fail, but a plain Parquet glob then"
        " sees only live rows (see *Not a glob*).",
    )
    verify_interval_hours: int = setting(
        "verify.interval.hours",
        24,
        Integer(0),
        "Scheduled runs whose interval starts on a multiple of this many hours (UTC, since the epoch: "
        "daily at midnight by default) [verify](semantics.md#verification) the lake against MongoDB; "
        "the trigger param `verify` asks for it in any run. `0`: only when asked.",
    )
    time_series_lateness_seconds: int = setting(
        "time.series.lateness.seconds",
        3600,
        Integer(0),
        "How late (after its own `timeField` time) a measurement of a [time-series "
        "collection](semantics.md#time-series-collections) may be written and still land at the next "
        "run: each run reads again the measurements timed from this long before the collection's "
        "landed watermark. Later ones land at the next reconcile.",
    )
    time_series_reconcile_interval_hours: int = setting(
        "time.series.reconcile.interval.hours",
        24,
        Integer(0),
        "Scheduled runs whose interval starts on a multiple of this many hours (UTC, as "
        "`verify.interval.hours`) compare each time-series collection with its state and land the "
        "measurements written late beyond `time.series.lateness.seconds`, updated or deleted; the "
        "trigger param `verify` asks for it in any run. `0`: only when asked.",
    )
    verify_on_drift: str = setting(
        "verify.on.drift",
        "repair",
        Choice(VERIFY_ON_DRIFT),
        "What a verification does with documents the lake has wrong: `repair` heals them (a warning "
        "in the log), `fail` heals them and then fails the `verify` task (Airflow's alerting fires), "
        "`report` only records them in `raw/<topic.prefix>/_verifications`.",
    )
    view_read_interval_runs: int = setting(
        "view.read.interval.runs",
        1,
        Integer(1),
        "A captured view has no change stream: it is read whole and the differences from its state "
        "land as change rows ([Views](semantics.md#views)). It is read in every run (`1`), or in the "
        "scheduled runs whose interval starts on a multiple of this many intervals since the epoch; "
        "manual runs always read it. Its tables are at most this many runs old.",
    )
    database_include: tuple[re.Pattern, ...] = setting(
        "database.include.list",
        (),
        RegexList(),
        "Regular expressions. Each must match the **whole** database name.",
        shown_default="empty (all)",
    )
    database_exclude: tuple[re.Pattern, ...] = setting(
        "database.exclude.list",
        (),
        RegexList(),
        "Regular expressions for databases to skip (whole-name match)",
    )
    collection_include: tuple[re.Pattern, ...] = setting(
        "collection.include.list",
        (),
        RegexList(),
        "Regular expressions. Each must match the whole `<db>.<collection>`.",
        shown_default="empty (all)",
    )
    collection_exclude: tuple[re.Pattern, ...] = setting(
        "collection.exclude.list",
        (),
        RegexList(),
        "Regular expressions for collections to skip (whole `<db>.<collection>`)",
    )
    snapshot_include: tuple[re.Pattern, ...] = setting(
        "snapshot.include.collection.list",
        (),
        RegexList(),
        "Regular expressions over the whole `<db>.<collection>`. Snapshots copy only the captured "
        "collections they match; the other captured collections are streamed only (their existing "
        "documents are never copied). A snapshot that leaves collections out keeps a replica set's "
        "streaming position when it still is in the oplog (as a re-snapshot of some collections "
        "does), so under `snapshot.mode: always` the streamed-only collections miss no event.",
        shown_default="empty (every captured collection)",
    )
    field_exclude: tuple[FieldRule, ...] = setting(
        "field.exclude.list",
        (),
        FieldRules("`<db>.<collection>.<field>`"),
        "A list or comma-separated string of `<db>.<collection>.<field>[.<nested>…]`; `*` in the "
        "database or collection part matches any characters. These fields are removed from `after` "
        "and `updateDescription` (`updatedFields` keys and dotted paths, `removedFields`, "
        "`truncatedArrays`), in snapshot reads and streamed events, so they never reach the lake (the "
        "rest of the document keeps its BSON bytes and types). A path goes into embedded documents "
        "and into every sub-document of an array "
        "(`shop.orders.items.cost`); a dotted update path's array positions (`items.0.cost`) match "
        "too. `_id` cannot be excluded.",
    )
    field_hash: tuple[FieldRule, ...] = setting(
        "field.hash.list",
        (),
        FieldRules("`<db>.<collection>.<field>`"),
        "Like `field.exclude.list`, but each value at these paths lands as a string of 64 hex digits: "
        "the HMAC-SHA-256 of its exact BSON type and bytes, keyed by the password of the connection "
        "`field.hash.connection.id`. Equal values hash equally in every collection and run (joinable); "
        '`1`, `1.0` and `"1"` differ. Inside a document or array at such a path every value is '
        "hashed and the structure kept. Applied before the renames, wherever the exclusions are, and "
        "in the verification's comparison. A table refuses rows hashed under another key or list "
        "until the collection is re-snapshotted (see [Hashed fields](semantics.md#hashed-fields)).",
    )
    field_hash_conn_id: str = setting(
        "field.hash.connection.id",
        "mongo_cdc_hash",
        Text(),
        "Airflow connection whose password is the `field.hash.list` key (never in the source file); "
        "read only when `field.hash.list` is set.",
    )
    # The key itself, read from that connection by the Airflow layer at task time (``with_hash_key``).
    field_hash_key: HashKey | None = field(default=None, repr=False, compare=False)
    field_renames: tuple[FieldRule, ...] = setting(
        "field.renames",
        (),
        FieldRules("`<db>.<collection>.<field>:<new name>`"),
        "Like `field.exclude.list`, each entry ending with `:<new name>` "
        "(`shop.orders.customer.name:fullName`), renaming the path's last field in the same places. "
        "Exclusions apply first, then the hashes (`field.hash.list`), then the renames in their "
        "order, each to the result of the previous one. A rename onto a field the document already "
        "has fails the task rather than overwrite it (as in Debezium). `_id` cannot be renamed.",
    )
    sanitize_field_names: bool = setting(
        "sanitize.field.names",
        _FLATTENING_DEFAULTS.sanitize_field_names,
        Boolean(),
        "`true`: the changes and state tables' column names, and their nested struct field names, "
        "become valid Avro names like Debezium's: every character other than `A-Za-z0-9_` and a "
        "leading digit become `_` (`unit-price` gives `unit_price`). A sanitized name that collides "
        "with another field gets underscores prepended (`a-b` next to `a_b` becomes `_a_b`). The raw "
        "zone's `after` and the state's `__doc` keep the document's own names. Changing it rebuilds "
        "the changes table.",
    )
    snapshot_mode: str = setting(
        "snapshot.mode",
        "initial",
        Choice(tuple(SNAPSHOT_MODES)),
        "`initial`: snapshot when the replica set has no completed snapshot, then stream. If its "
        "stored position has left the oplog, the pull fails and says how to "
        "[re-snapshot](semantics.md#re-snapshots). `when_needed`: like `initial`, but a position that"
        " has left the oplog is recovered by itself (`oplog.lost.recovery`). `always`: snapshot every "
        "shard at every run, then stream. `initial_only`: snapshot, never stream. `no_data` and `never` "
        "(identical here): copy nothing, and stream from the position of the first run, or from "
        "`capture.start.op.time` / `capture.start.resume.token`. Under every mode the trigger can ask "
        "for a re-snapshot.",
    )
    oplog_lost_recovery: str = setting(
        "oplog.lost.recovery",
        HEAL_LOST_OPLOG,
        Choice(OPLOG_LOST_RECOVERIES),
        "With `snapshot.mode` `when_needed` only: what a shard whose stored position has left the "
        "oplog does. `heal`: its stream starts again at a new position and, in the same run, every "
        "collection of the shard is [verified](semantics.md#verification) against MongoDB and only "
        "the documents that differ are read again, each landing as one `c`, `u` or `d` change marked "
        "`source.sequence` `recovery` ([healing a lost oplog](semantics.md#healing-a-lost-oplog)). "
        "`resnapshot`: every collection of the shard is copied again (a full "
        "[re-snapshot](semantics.md#re-snapshots)).",
    )
    capture_start_op_time: Timestamp | None = setting(
        "capture.start.op.time",
        None,
        OpTime(),
        "With `snapshot.mode` `no_data` or `never` only: a replica set the lake has never landed "
        "starts streaming at this cluster time (`startAtOperationTime`), so the events from it on "
        "(it included) land, and nothing is copied. It must still be in the replica set's oplog: "
        "the first run refuses an older one, naming the oplog's first op-time. A replica set the "
        "lake already holds batches of (a reset offset, a shard back from retirement) streams from "
        "now. See [starting at an op-time or a token](offsets.md#starting-at-an-op-time-or-a-token).",
        shown_default="none (now)",
    )
    capture_start_resume_token: str | None = setting(
        "capture.start.resume.token",
        None,
        ResumeTokenData(),
        "Like `capture.start.op.time`, but the stream resumes **after** the event of this resume "
        "token (its `_data`, as an event's `_id` or a Debezium offset holds it): that event does not "
        "land, the ones after it do. Not with `capture.start.op.time`.",
        shown_default="none (now)",
    )
    capture_mode: str = setting(
        "capture.mode",
        "change_streams_update_full",
        Choice(tuple(CAPTURE_MODES)),
        "What events carry (Debezium's four modes). `change_streams_update_full`: updates carry the "
        "full document in `after` (see the next key). `change_streams`: updates carry only "
        "`updateDescription`, and the state table applies it to the previous version. "
        "`change_streams_with_pre_image` / `change_streams_update_full_with_pre_image`: the same two,"
        " plus `before`, the document before each update, replace and delete "
        '(`fullDocumentBeforeChange: "whenAvailable"`; never for inserts or snapshot reads). '
        "Pre-images need [`changeStreamPreAndPostImages`](semantics.md#pre--and-post-images) on every"
        " captured collection.",
    )
    capture_mode_full_update_type: str = setting(
        "capture.mode.full.update.type",
        "lookup",
        Choice(FULL_UPDATE_TYPES),
        "How the two `update_full` modes fill an update's `after`. `lookup` (`fullDocument: "
        '"updateLookup"`): the document **when the stream returns the event**, which may already hold'
        " later writes, or be null if the document is gone by then. `post_image` (`fullDocument: "
        '"whenAvailable"`): the post-image MongoDB stored with the event, exactly as that write left '
        "it; needs [`changeStreamPreAndPostImages`](semantics.md#pre--and-post-images). With a mode "
        "that has no full document, `post_image` is refused.",
    )
    snapshot_chunk_size: int = setting(
        "snapshot.chunk.size",
        100_000,
        Integer(1, 100_000_000),  # larger chunks would make retries re-read hours
        "About how many documents one [snapshot chunk](semantics.md#chunked-snapshots) holds: the "
        "unit that is copied, committed and retried on its own.",
    )
    snapshot_max_tasks: int = setting(
        "snapshot.max.tasks",
        4,
        Integer(1, 1024),  # Airflow's default [core] max_map_length: mapped instances of one task
        "At most this many `snapshot_copy` task instances share a run's chunks (bounded by Airflow's "
        "default `max_map_length`).",
    )
    snapshot_max_threads: int = setting(
        "snapshot.max.threads",
        1,
        Integer(1, 64),  # one cursor and one writer thread per chunk copied in parallel
        "Chunks one `snapshot_copy` instance copies at once",
    )
    snapshot_fetch_size: int = setting(
        "snapshot.fetch.size",
        0,
        Integer(0, 1_000_000),  # documents per cursor batch; the server caps a batch at 16 MB anyway
        "Cursor batch size of snapshot reads (the server caps a batch at 16 MB anyway). "
        "`0` uses the server default for a collection read whole, and about an eighth of the chunk "
        "(at least 100) for an `_id` range, so mongod reads the next batch while the last one is "
        "encoded.",
    )
    max_batch_size: int = setting(
        "max.batch.size",
        16384,
        Integer(1, 1_000_000),  # change events held in memory for one landed file
        "Change events per landed micro-batch, held in memory until landed. Also the "
        "change stream cursor's batch size. Debezium's default is 2048, but here each micro-batch "
        "is a Parquet file and two Delta commits (about 37 ms of CPU): at 2048 small events that "
        "was about half of a pull's CPU per event.",
    )
    max_queue_size_in_bytes: int = setting(
        "max.queue.size.in.bytes",
        16 * 1024 * 1024,
        Integer(0, 1024**4),  # a bound on memory: any real one is far below
        "A micro-batch also lands once its documents (BSON of `after`, `before` and `updatedFields`) "
        "reach this many bytes, so large documents do not multiply a pull's memory by "
        "`max.batch.size` (0: no limit; Debezium's default is 0). Measured peak RSS of a pull, 16 "
        "MiB (`make bench`): 8,000 documents of 64 KB 449-475 MiB, 300,000 small events 348 MiB.",
    )
    tombstones_on_delete: bool = setting(
        "tombstones.on.delete",
        True,
        Boolean(),
        "Write a tombstone row (same `key`, `op` null) after every delete",
    )
    skipped_operations: frozenset[str] = setting(
        "skipped.operations",
        frozenset(),
        OperationSet(SKIPPABLE_OPERATIONS),
        "A list or comma-separated string of `c`, `u`, `d` or `none`. Streamed events of these ops "
        "are dropped. `u` covers both update and replace. Snapshot reads are never skipped.",
    )
    connect_backoff_initial_delay_ms: int = setting(
        "connect.backoff.initial.delay.ms",
        1000,
        Integer(1, 3_600_000),  # one hour between reconnection attempts
        "Wait before the first reconnection when a pull loses its change stream (see [fault "
        "handling](limits.md)). Each further attempt waits twice as long. "
        "Must be ≤ the max below.",
    )
    connect_backoff_max_delay_ms: int = setting(
        "connect.backoff.max.delay.ms",
        120_000,
        Integer(1, 3_600_000),  # one hour
        "Cap on the wait between reconnection attempts",
    )
    connect_max_attempts: int = setting(
        "connect.max.attempts",
        16,
        Integer(1, 1000),
        "Reconnection attempts in a row before the pull task fails. A successful read starts the count over.",
    )
    cursor_oversize_handling_mode: str = setting(
        "cursor.oversize.handling.mode",
        "fail",
        Choice(tuple(OVERSIZE_MODES)),
        "What a pull does with a change event over MongoDB's 16 MB limit (an update with its "
        "looked-up document, say), which the server cannot send (BSONObjectTooLarge). `fail`: the "
        "pull stops with a message saying so and how to go on; the offset stays at the last landed "
        "batch. `skip`: such an event is left out (a pipeline stage measures it with `$bsonSize` and "
        "replaces it by a marker), logged with its namespace, key and size, and counted per "
        "collection under `oversized_skipped` in the pull's result; the document's next event or a "
        "re-snapshot brings its state up to date. `split`: `$changeStreamSplitLargeEvent` with the "
        "fragments joined again; it needs MongoDB 7.0 or 6.0.9+, and an older server is refused when "
        "the pull starts.",
    )
    cursor_oversize_skip_threshold: int = setting(
        "cursor.oversize.skip.threshold",
        0,
        Integer(0, 16 * 1024 * 1024),  # MongoDB's document size limit
        "Under `skip`, events whose documents (`fullDocument`, `fullDocumentBeforeChange`, "
        "`updateDescription`) add up to more than this many bytes are skipped too. `0`: only those "
        "the server cannot send. At most MongoDB's document limit: a larger threshold never applies.",
    )
    provide_transaction_metadata: bool = setting(
        "provide.transaction.metadata",
        False,
        Boolean(),
        "`true`: [transaction metadata](semantics.md#transaction-metadata-and-heartbeats), i.e. "
        "BEGIN/END records under `raw/<prefix>/transaction/` and a `transaction` block on every event"
        " of a multi-document transaction",
    )
    oplog_headroom_warn_intervals: int = setting(
        "oplog.headroom.warn.intervals",
        3,
        Integer(0, 1000),
        "The pull warns when its replica set's committed position would leave the oplog within this "
        "many schedule intervals (`dag.schedule`'s) at the current write rate; see the "
        "[oplog-window guard](semantics.md#oplog-window-guard). `0` turns the warning off.",
    )
    oplog_headroom_fail: bool = setting(
        "oplog.headroom.fail",
        False,
        Boolean(),
        "`true`: instead of warning, the pull fails before reading anything (the offset stays, still "
        "in the oplog), so the on-call hears of it while a bigger oplog or a more frequent schedule "
        "still saves the position",
    )
    heartbeat_interval_ms: int = setting(
        "heartbeat.interval.ms",
        0,
        Integer(0, 86_400_000),  # one day
        "Land a [heartbeat](semantics.md#transaction-metadata-and-heartbeats) of each replica set's "
        "position under `raw/<prefix>/__heartbeat/` at most once per this many ms, even when nothing "
        "captured changed. `0` turns heartbeats off. At most a day.",
    )
    array_encoding: str = setting(
        "array.encoding",
        _FLATTENING_DEFAULTS.array_encoding,
        Choice(ARRAY_ENCODINGS),
        "How the [changes table](lake-format.md#changes-one-row-per-event-changesprefixdbcollection) "
        "holds arrays. `array`: an array column whose element types are merged, so elements of "
        "different types make it a fallback. `document`: a struct with fields `_0`, `_1`, … (one per "
        "index), so each element keeps its own type. An empty array becomes null (Parquet has no "
        "empty structs).",
    )
    flatten_struct: bool = setting(
        "flatten.struct",
        _FLATTENING_DEFAULTS.flatten_struct,
        Boolean(),
        "`true`: the changes table lifts the fields of embedded documents to top-level columns named "
        "`<parent><delimiter><field>` (`a: {b: 1}` becomes `a_b`), at every level. Arrays stay whole.",
    )
    flatten_struct_delimiter: str = setting(
        "flatten.struct.delimiter",
        _FLATTENING_DEFAULTS.flatten_struct_delimiter,
        String(allow_empty=False),
        "The non-empty string between the names joined by `flatten.struct`",
    )
    delete_tombstone_handling_mode: str = setting(
        "delete.tombstone.handling.mode",
        _FLATTENING_DEFAULTS.delete_tombstone_handling_mode,
        Choice(DELETE_TOMBSTONE_HANDLING_MODES),
        "What the changes table keeps of deletes and tombstones: `rewrite` (a delete row, `__deleted`"
        " true, holding `before`'s fields under the `*_with_pre_image` capture modes, else `_id` "
        "only; no tombstone rows), `rewrite-with-tombstone` (the same, plus a tombstone row per "
        "tombstone), `tombstone` (each delete becomes a tombstone row), `drop` (neither). See "
        "[changes](lake-format.md#changes-one-row-per-event-changesprefixdbcollection). The default is "
        "`rewrite`, the table's behaviour before the option existed. Debezium's documentation names "
        'no single default: it says "no default" for the key, `tombstone` in its list of modes, and '
        "its legacy `delete.handling.mode` defaults to `drop`.",
    )
    add_fields: tuple[str, ...] = setting(
        "add.fields",
        _FLATTENING_DEFAULTS.add_fields,
        AddedFields(),
        "A list or comma-separated string of event fields to add to every changes row as columns: "
        "`op`, `ts_ms` (when mongo-cdc processed the event), `source.<field>` (`version`, "
        "`connector`, `name`, `ts_ms`, `snapshot`, `db`, `rs`, `collection`, `ord`, `lsid`, "
        "`txnNumber`, `sequence`, `ts_us`, `ts_ns`, `wallTime`), or a bare source field name (`rs` "
        "means `source.rs`). Each entry can end with `:<new name>`. The column is the prefix plus the"
        " name, with `_` for the dot (`source.rs` gives `__source_rs`, `rs` gives `__rs`, "
        "`source.ts_ms:at` gives `__at`). The default gives the columns the table always had, `__op` "
        "and `__source_ts_ms` (Debezium's default adds none). A list replaces the default, and `[]` "
        "adds nothing.",
    )
    add_fields_prefix: str = setting(
        "add.fields.prefix",
        _FLATTENING_DEFAULTS.add_fields_prefix,
        String(),
        "Prepended to every `add.fields` column name. It may be empty.",
    )
    dag: DagSettings = field(default_factory=DagSettings)  # the dag.* keys

    def __post_init__(self) -> None:
        self.flattening  # noqa: B018 - builds the options, so clashing ones are refused here
        check_full_update_type(self.capture_mode, self.capture_mode_full_update_type)
        check_start_position(self.snapshot_mode, self.start_position_key)

    @property
    def start_position_key(self) -> str | None:
        """The key that sets where a stream without a copy starts (one of START_POSITION_KEYS), if any."""
        values = (self.capture_start_op_time, self.capture_start_resume_token)
        given = [key for key, value in zip(START_POSITION_KEYS, values, strict=True) if value is not None]
        return given[0] if given else None

    @property
    def flattening(self) -> FlatteningOptions:
        """The changes table's event flattening (ExtractNewDocumentState's options): same field names."""
        return FlatteningOptions(
            **{option.name: getattr(self, option.name) for option in fields(FlatteningOptions)}
        )

    @property
    def capture_filter(self) -> dict[str, list[str]]:
        """The namespace filters as their patterns: what an offset records its stream captured with."""
        return {key: [p.pattern for p in getattr(self, name)] for key, name in _CAPTURE_FILTER.items()}

    def with_capture_filter(self, recorded: dict[str, list[str]]) -> SourceConfig:
        """This source with the namespace filters ``recorded`` (a ``capture_filter``)."""
        patterns = {
            name: tuple(re.compile(p) for p in recorded.get(key, ())) for key, name in _CAPTURE_FILTER.items()
        }
        return replace(self, **patterns)

    def with_hash_key(self, key: HashKey) -> SourceConfig:
        """This source with the ``field.hash.list`` key, which never comes from its file."""
        return replace(self, field_hash_key=key)


# Every source key and its declaration, in the order of SourceConfig's fields, then the dag.* keys.
SETTINGS: dict[str, Setting] = {
    **{declared.key: declared for declared in declared_settings(SourceConfig)},
    **DAG_SETTINGS,
}

# The fields deciding which namespaces are captured (captures_collection), by their keys.
_CAPTURE_FILTER = {
    declared.key: declared.attribute
    for declared in SETTINGS.values()
    if declared.attribute
    in ("database_include", "database_exclude", "collection_include", "collection_exclude")
}
