"""The lake: where every table lives, what a raw row holds, and how batches land exactly once.

The package's face is the layout (``layout``: table paths and the raw-event schema), re-exported
here so callers write ``lake.RAW_SCHEMA`` and ``lake.table_uri(...)``. The rest, by module:

* ``storage``: where the lake lives (a path or an object-store URI) and its credentials.
* ``landing``: exactly-once landing of raw batches (``SourceLake``).
* ``batch_log``: the ledger of landed batches (``Batch``), and which a table applies (``BatchWindow``).
* ``snapshot_log``: each snapshot's plan (``SnapshotPlan``, ``Chunk``) and its copied chunks.
* ``raw_files``: the Parquet files of an append, streamed by pyarrow and committed by delta-rs.
* ``table_reads``: filtered reads of a table's rows, whatever Arrow string type a writer chose.
* ``readers``: a table's live files and rows, for Python and for a Spark without Delta's jars.
* ``errors``: damaged data files named with their fix; lakes in the previous layout refused.
* ``maintenance``: compaction and vacuum, and the files of commits that never happened.
* ``debezium_export``: raw events rendered as Debezium change-event records.

Nothing here imports the capture or the transform.
"""

from mongo_cdc.lake.layout import (
    APPLIED_MARK,
    BATCH_LOG,
    COLLECTION_KEY,
    COLLECTION_OPERATIONS,
    DELETIONS_DIR,
    DROP,
    HEARTBEAT_DIR,
    HISTORY_SEQ,
    HOUR_COLUMN,
    RAW_SCHEMA,
    RENAME,
    RENAMED_COPY_ORDER,
    SNAPSHOT_LOG,
    SOURCE_TYPE,
    STAGING_DIR,
    TRANSACTION_DIR,
    TRANSACTION_TYPE,
    UPDATE_DESCRIPTION_TYPE,
    VERIFICATION_LOG,
    ZONES,
    ReservedDatabaseError,
    SnapshotManifest,
    check_database_name,
    deletions_path,
    deletions_uri,
    hour_partition,
    name_of_parts,
    name_parts,
    pack_cluster_time,
    source_table_path,
    source_table_uri,
    table_names,
    table_path,
    table_uri,
)

__all__ = [
    "APPLIED_MARK",
    "BATCH_LOG",
    "COLLECTION_KEY",
    "COLLECTION_OPERATIONS",
    "DELETIONS_DIR",
    "DROP",
    "HEARTBEAT_DIR",
    "HISTORY_SEQ",
    "HOUR_COLUMN",
    "RAW_SCHEMA",
    "RENAME",
    "RENAMED_COPY_ORDER",
    "SNAPSHOT_LOG",
    "VERIFICATION_LOG",
    "SOURCE_TYPE",
    "STAGING_DIR",
    "TRANSACTION_DIR",
    "TRANSACTION_TYPE",
    "UPDATE_DESCRIPTION_TYPE",
    "ZONES",
    "ReservedDatabaseError",
    "SnapshotManifest",
    "check_database_name",
    "deletions_path",
    "deletions_uri",
    "hour_partition",
    "pack_cluster_time",
    "name_of_parts",
    "name_parts",
    "source_table_path",
    "source_table_uri",
    "table_names",
    "table_path",
    "table_uri",
]
