"""Spark job: every collection's committed raw change events -> its ``state`` and ``changes`` tables.

    spark-submit spark_apps/cdc_transform.py --lake-root /lake --topic-prefix shop \\
        --committed '{"rs0": 42}'

``--committed`` maps each replica set to its committed ``batch_seq``; raw files with a larger
seq are writes in flight and are ignored. Each table keeps per replica set the last seq it
applied (``_mongo_cdc.json``), so a run reads only the files committed since.

* state: the previous version (from ``__doc``) plus the new events, folded per document, is
  written whole as a new version. Deleted documents' last positions are kept in the hidden
  ``_deleted`` directory so a replayed old insert cannot bring them back. A committed snapshot
  manifest (``raw/<prefix>/_snapshots``) past the watermark then reconciles the collection: a
  document of the snapshot's replica set that the snapshot did not read is deleted at its position
  (``document_state.reconcile_with_snapshots``). ``__rs`` names each document's replica set;
  versions written before that column existed get the table's only replica set, if it has one.
* changes: one file per raw file (same hour directory and base name, so a re-run overwrites).
  New files go into the current version while the column types stay the same; when the new
  events add a field or widen a type, the whole table is rebuilt from every committed raw file
  into a new version, so every file of a version has the same schema. The event-flattening
  options (``--flattening``: Debezium ExtractNewDocumentState's, as JSON keyed like the source
  YAML, see ``mongo_cdc.transform.flatten``) are recorded in the version's metadata too: a run
  with other options rebuilds the table, since they change its columns and rows. A backfill's
  history files (``lake.HistoryFile``) get change files like raw files do (the state never reads
  them); ``--rebuild-hours`` rewrites the change files of the given hour partitions.

Column types: see ``mongo_cdc.transform.ejson_types``; names: ``mongo_cdc.transform.table_layout``
(a top-level field named like a metadata column, or ``hour`` in changes, gets a leading ``_``).

Output: the last stdout line is a JSON summary, per ``<db>.<collection>``: ``new_events`` (raw
rows newly applied to the state), ``state_rows``, ``change_rows`` (in the table),
``change_rows_written`` (this run) and ``changes_rebuilt``. Bad arguments print one line to stderr
and exit 2 before Spark starts. spark-submit merges a Python app's stderr (the log) into its
stdout. Runs over the same lake must not overlap (the DAG runs one at a time).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from typing import Any

import orjson
import pyarrow.parquet as pq
from pyspark import RDD, StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import types as spark_types

from mongo_cdc import lake
from mongo_cdc.transform import ejson_types as types
from mongo_cdc.transform.document_state import (
    STATE_METADATA_COLUMNS,
    DocumentVersion,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_row
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import (
    ChangeEvent,
    advance_watermarks,
    committed_files,
    files_after,
    read_raw_file,
)
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.versioned_table import VersionedTable, write_metadata

log = logging.getLogger("cdc_transform")

RawOrHistory = lake.RawFile | lake.HistoryFile

DELETED_DIR = "_deleted"
# Which metadata columns a state version holds, in its _mongo_cdc.json: older versions lack __rs.
METADATA_COLUMNS_KEY = "metadata_columns"
LEGACY_STATE_COLUMNS = ("__id", "__doc", "__cluster_time", "__event_order")
# The flattening options a changes version was written with; versions without it had the defaults.
FLATTENING_KEY = "flattening"
# The history files (hour/name) a changes version has rows of.
HISTORY_KEY = "history"
# Spark writes changes partitioned by this column, one directory per raw file, then each
# directory's single file is moved to its final name; a document field may not take the name.
RAW_FILE_COLUMN = "__raw_file"
# The changes table's hour=... directories: readers add it as a column, so no field may take it.
HOUR_PARTITION_COLUMN = "hour"
HOUR_NAME = re.compile(r"hour=\d{4}-\d{2}-\d{2}T\d{2}")
STAGING_DIR = "_incoming"

_SPARK_SCALARS = {
    types.NULL: spark_types.StringType(),
    types.INT: spark_types.IntegerType(),
    types.LONG: spark_types.LongType(),
    types.DOUBLE: spark_types.DoubleType(),
    types.BOOL: spark_types.BooleanType(),
    types.STRING: spark_types.StringType(),
    types.OBJECT_ID: spark_types.StringType(),
    types.DATE: spark_types.TimestampType(),
    types.DECIMAL: spark_types.StringType(),
    types.BINARY: spark_types.BinaryType(),
    types.FALLBACK: spark_types.StringType(),
}


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _committed(text: str) -> dict[str, int]:
    try:
        committed = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(committed, dict) or not all(
        isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 for seq in committed.values()
    ):
        raise argparse.ArgumentTypeError('expected {"<replica set>": <batch_seq >= 0>, ...}')
    return committed


def _flattening(text: str) -> FlatteningOptions:
    try:
        return FlatteningOptions.from_json(json.loads(text))
    except ValueError as error:  # JSONDecodeError included
        raise argparse.ArgumentTypeError(str(error)) from None


def _hours(text: str) -> tuple[str, ...]:
    try:
        hours = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(hours, list) or not all(
        isinstance(hour, str) and HOUR_NAME.fullmatch(hour) for hour in hours
    ):
        raise argparse.ArgumentTypeError('expected ["hour=YYYY-MM-DDTHH", ...]')
    return tuple(hours)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _ArgumentParser(prog="cdc_transform", description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument("--committed", required=True, type=_committed, help='{"<rs>": <batch_seq>}')
    parser.add_argument(
        "--flattening",
        type=_flattening,
        default=FlatteningOptions(),
        help='the changes table\'s event flattening, e.g. {"flatten.struct": true} (defaults otherwise)',
    )
    parser.add_argument(
        "--rebuild-hours",
        type=_hours,
        default=(),
        help='JSON list of hour partitions whose change files are rewritten, e.g. ["hour=2024-05-01T13"]',
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.lake_root):
        parser.error(f"--lake-root {args.lake_root!r} is not a directory")
    if args.topic_prefix in ("", ".", "..") or os.sep in args.topic_prefix:
        parser.error(f"--topic-prefix {args.topic_prefix!r} is not a directory name")
    return args


def build_session() -> SparkSession:
    spark = (
        SparkSession.builder.appName("mongo-cdc-transform")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.caseSensitive", "true")  # documents may have fields "a" and "A"
        # INT96 (the default) is read by pyarrow as nanoseconds, which overflow outside 1677-2262.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.parquet.datetimeRebaseModeInWrite", "CORRECTED")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    # Small by default (each collection's data is modest); spark-submit --conf still wins.
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, spark.sparkContext.defaultParallelism)))
    return spark


def to_spark_type(column_type: types.ColumnType) -> spark_types.DataType:
    if isinstance(column_type, tuple):
        kind, inner = column_type
        if kind == types.ARRAY:
            return spark_types.ArrayType(to_spark_type(inner), containsNull=True)
        return spark_types.StructType(
            [
                spark_types.StructField(name, to_spark_type(field_type), nullable=True)
                for name, field_type in inner
            ]
        )
    return _SPARK_SCALARS[column_type]


def infer_document_type(documents: RDD) -> types.ColumnType:
    """The merged type of an RDD of parsed documents."""
    return documents.map(types.type_of_document).fold(types.NULL, types.merge_types)


def parquet_row_count(paths: list[str]) -> int:
    return sum(pq.ParquetFile(path).metadata.num_rows for path in paths)


def parquet_files(directory: str) -> list[str]:
    """The data files directly in ``directory`` and its partition directories."""
    found = []
    for parent, directories, names in os.walk(directory):
        directories[:] = [name for name in directories if not name.startswith(("_", "."))]
        found.extend(os.path.join(parent, name) for name in names if name.endswith(".parquet"))
    return [path for path in found if not os.path.basename(path).startswith(("_", "."))]


class CollectionTransform:
    """Brings one collection's state and changes tables up to the committed raw files."""

    def __init__(
        self,
        spark: SparkSession,
        lake_root: str,
        prefix: str,
        db: str,
        collection: str,
        committed: dict[str, int],
        snapshots: list[lake.SnapshotManifest],
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...] = (),
    ) -> None:
        """``snapshots``: every snapshot manifest of the source (this collection's are picked here)."""
        self.spark = spark
        self.committed = committed
        self.raw_files = committed_files(lake.list_raw_files(lake_root, prefix, db, collection), committed)
        self.history_files = lake.list_history_files(lake_root, prefix, db, collection)
        self.rebuild_hours = rebuild_hours
        namespace = f"{db}.{collection}"
        self.snapshots = [s for s in committed_files(snapshots, committed) if namespace in s.collections]
        self.state = VersionedTable.of_collection(lake_root, "state", prefix, db, collection)
        self.changes = VersionedTable.of_collection(lake_root, "changes", prefix, db, collection)
        self.flattening = flattening

    def run(self) -> dict[str, Any]:
        summary = self.update_state()
        summary.update(self.update_changes())
        return summary

    def read_events(self, files: list[RawOrHistory]) -> RDD:
        """(index in ``files``, ChangeEvent) for every row of ``files``."""
        paths = [raw.path for raw in files]
        slices = max(1, min(len(paths), self.spark.sparkContext.defaultParallelism * 4))
        return self.spark.sparkContext.parallelize(list(enumerate(paths)), slices).flatMap(
            lambda indexed: ((indexed[0], event) for event in read_raw_file(indexed[1]))
        )

    # -- state ---------------------------------------------------------------------------

    def update_state(self) -> dict[str, Any]:
        metadata = self.state.read_metadata()
        watermarks = metadata["watermarks"] if metadata else {}
        new_files = files_after(self.raw_files, watermarks)
        # a snapshot of a now empty collection has no raw file, only its manifest
        new_snapshots = files_after(self.snapshots, watermarks)
        current = self.state.current_version()
        if not new_files and not new_snapshots:
            return {
                "new_events": 0,
                "state_rows": parquet_row_count(parquet_files(current)) if current else 0,
            }

        previous = (
            self.previous_versions(current, metadata) if metadata else self.spark.sparkContext.emptyRDD()
        )
        # read once: the drops are collected first, then the rest is folded
        all_events = (
            self.read_events(new_files).map(lambda indexed: indexed[1]).persist(StorageLevel.MEMORY_AND_DISK)
        )
        drops = (
            all_events.filter(lambda event: event.op in lake.COLLECTION_OPERATIONS)
            .map(lambda event: (event.position, event.rs))
            .collect()
        )
        events = all_events.filter(lambda event: event.op not in lake.COLLECTION_OPERATIONS).map(
            lambda event: (event.document_id, event)
        )

        def fold_and_reconcile(grouped: tuple[str, tuple[Any, Any]]) -> DocumentVersion | None:
            document_id, (stored, document_events) = grouped
            version = fold_events(document_id, next(iter(stored), None), document_events)
            if version is None:
                return None
            return drop_with_collection(reconcile_with_snapshots(version, new_snapshots), drops)

        versions = (
            previous.map(lambda version: (version.document_id, version))
            .cogroup(events)
            .map(fold_and_reconcile)
            .filter(lambda version: version is not None)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        live = versions.filter(lambda version: version.document is not None)
        layout = TableLayout(
            STATE_METADATA_COLUMNS,
            infer_document_type(live.map(lambda version: orjson.loads(version.document))),
            sanitize_field_names=self.flattening.sanitize_field_names,
        )
        version_dir = self.state.next_version_dir()
        rows = live.map(lambda version: layout.row(tuple(version), orjson.loads(version.document)))
        self.spark.createDataFrame(rows, to_spark_type(layout.table_type)).write.parquet(version_dir)
        deleted = versions.filter(lambda version: version.document is None).map(tuple)
        self.spark.createDataFrame(deleted, _state_metadata_schema()).write.parquet(
            os.path.join(version_dir, DELETED_DIR)
        )
        versions.unpersist()
        all_events.unpersist()
        write_metadata(
            version_dir,
            {
                "watermarks": advance_watermarks(watermarks, self.committed),
                METADATA_COLUMNS_KEY: [name for name, _ in STATE_METADATA_COLUMNS],
            },
        )
        self.state.publish(version_dir)
        return {
            "new_events": parquet_row_count([raw.path for raw in new_files]),
            "state_rows": parquet_row_count(parquet_files(version_dir)),
        }

    def previous_versions(self, version_dir: str, metadata: dict[str, Any]) -> RDD:
        """Every document's version in a state version: live rows and deletion markers.

        A version written before ``__rs`` existed is read without it (a document field of that
        name may hold the column); its documents get the table's only replica set, or none.
        """
        columns = metadata.get(METADATA_COLUMNS_KEY, LEGACY_STATE_COLUMNS)
        schema = to_spark_type((types.STRUCT, tuple(c for c in STATE_METADATA_COLUMNS if c[0] in columns)))
        reader = self.spark.read.schema(schema)
        versions = reader.parquet(version_dir)
        deleted_dir = os.path.join(version_dir, DELETED_DIR)
        if os.path.isdir(deleted_dir):
            versions = versions.unionByName(reader.parquet(deleted_dir))
        if "__rs" in columns:
            return versions.rdd.map(lambda row: DocumentVersion(*row))
        only_rs = next(iter(metadata["watermarks"])) if len(metadata["watermarks"]) == 1 else None
        return versions.rdd.map(lambda row: DocumentVersion(*row, rs=only_rs))

    # -- changes -------------------------------------------------------------------------

    def update_changes(self) -> dict[str, Any]:
        metadata = self.changes.read_metadata()
        if metadata is None:
            return self.rebuild_changes()
        if metadata.get(FLATTENING_KEY, FlatteningOptions().to_json()) != self.flattening.to_json():
            log.info("other flattening options: rebuilding the changes table")
            return self.rebuild_changes()
        applied_history = set(metadata.get(HISTORY_KEY, []))
        new_files = files_after(self.raw_files, metadata["watermarks"]) + [
            history for history in self.history_files if _history_name(history) not in applied_history
        ]
        new_files += [
            written
            for written in self.raw_files + self.history_files
            if _hour_of(written) in self.rebuild_hours and written not in new_files
        ]
        stored_type = types.type_from_json(metadata["document_type"])
        if not new_files:
            return {"change_rows": metadata["rows"], "change_rows_written": 0, "changes_rebuilt": False}
        rows = _change_rows(self.read_events(new_files), self.flattening)
        if types.merge_types(stored_type, infer_document_type(rows.map(lambda row: row[2]))) != stored_type:
            log.info("new fields or wider types: rebuilding the changes table")
            return self.rebuild_changes()
        current = self.changes.current_version()
        written = self.write_change_files(rows, stored_type, new_files, current)
        # a rebuilt hour's files replace their earlier rows: count the table, not the sum
        total = parquet_row_count(parquet_files(current))
        write_metadata(
            current,
            {
                "watermarks": advance_watermarks(metadata["watermarks"], self.committed),
                "document_type": types.type_to_json(stored_type),
                "rows": total,
                FLATTENING_KEY: self.flattening.to_json(),
                HISTORY_KEY: sorted(map(_history_name, self.history_files)),
            },
        )
        return {"change_rows": total, "change_rows_written": written, "changes_rebuilt": False}

    def rebuild_changes(self) -> dict[str, Any]:
        files = self.raw_files + self.history_files
        if not files:
            return {"change_rows": 0, "change_rows_written": 0, "changes_rebuilt": False}
        rows = _change_rows(self.read_events(files), self.flattening)
        document_type = infer_document_type(rows.map(lambda row: row[2]))
        version_dir = self.changes.next_version_dir()
        written = self.write_change_files(rows, document_type, files, version_dir)
        write_metadata(
            version_dir,
            {
                "watermarks": advance_watermarks({}, self.committed),
                "document_type": types.type_to_json(document_type),
                "rows": written,
                FLATTENING_KEY: self.flattening.to_json(),
                HISTORY_KEY: sorted(map(_history_name, self.history_files)),
            },
        )
        self.changes.publish(version_dir)
        return {"change_rows": written, "change_rows_written": written, "changes_rebuilt": True}

    def write_change_files(
        self, rows: RDD, document_type: types.ColumnType, files: list[RawOrHistory], target_dir: str
    ) -> int:
        """Write ``rows`` as one file per raw file into ``target_dir``; the number of rows written."""
        reserved = [RAW_FILE_COLUMN, HOUR_PARTITION_COLUMN]
        layout = TableLayout(
            self.flattening.metadata_columns,
            document_type,
            reserved_names=reserved,
            sanitize_field_names=self.flattening.sanitize_field_names,
        )
        schema = spark_types.StructType(
            [spark_types.StructField(RAW_FILE_COLUMN, spark_types.IntegerType(), nullable=False)]
            + to_spark_type(layout.table_type).fields
        )
        staging = os.path.join(target_dir, STAGING_DIR)
        shutil.rmtree(staging, ignore_errors=True)  # left by a crashed run
        data = rows.map(lambda row: (row[0], *layout.row(row[1], row[2])))
        (
            self.spark.createDataFrame(data, schema)
            .repartition(RAW_FILE_COLUMN)
            .sortWithinPartitions(RAW_FILE_COLUMN, "__cluster_time", "__event_order")
            .write.partitionBy(RAW_FILE_COLUMN)
            .parquet(staging)
        )
        written = []
        for entry in sorted(os.listdir(staging)):
            if not entry.startswith(f"{RAW_FILE_COLUMN}="):
                continue
            raw = files[int(entry.split("=", 1)[1])]
            produced = parquet_files(os.path.join(staging, entry))
            if len(produced) != 1:
                raise RuntimeError(f"expected one changes file for {raw.path}, Spark wrote {produced}")
            hour_dir = os.path.basename(os.path.dirname(raw.path))
            destination = os.path.join(target_dir, hour_dir, os.path.basename(raw.path))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            os.replace(produced[0], destination)
            written.append(destination)
        shutil.rmtree(staging)
        return parquet_row_count(written)


def _hour_of(written: RawOrHistory) -> str:
    return os.path.basename(os.path.dirname(written.path))


def _history_name(history: lake.HistoryFile) -> str:
    return f"{history.hour}/{os.path.basename(history.path)}"


def _state_metadata_schema() -> spark_types.StructType:
    return to_spark_type((types.STRUCT, STATE_METADATA_COLUMNS))


def _change_rows(events: RDD, flattening: FlatteningOptions) -> RDD:
    """(raw file index, metadata values, encoded document) per event that has a changes row."""

    def rows_of(indexed: tuple[int, ChangeEvent]) -> list[tuple[int, tuple, dict]]:
        index, event = indexed
        row = change_row(event, flattening)
        return [] if row is None else [(index, *row)]

    return events.flatMap(rows_of)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # force: pyspark installs a root handler on stdout, where only the summary may go.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = build_session()
    try:
        summary = {}
        snapshots = lake.list_snapshot_manifests(args.lake_root, args.topic_prefix)
        for db, collection in lake.list_raw_collections(args.lake_root, args.topic_prefix):
            log.info("transforming %s.%s", db, collection)
            transform = CollectionTransform(
                spark,
                args.lake_root,
                args.topic_prefix,
                db,
                collection,
                args.committed,
                snapshots,
                args.flattening,
                args.rebuild_hours,
            )
            summary[f"{db}.{collection}"] = transform.run()
    finally:
        spark.stop()
    print(json.dumps({"collections": summary}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
