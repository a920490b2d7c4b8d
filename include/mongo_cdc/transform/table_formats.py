"""The derived tables' own columns: the one place that says what the transform writes besides fields.

* the ``state`` table's leading columns (``STATE_METADATA_COLUMNS``), those holding a value of each
  document's own (``PER_DOCUMENT_COLUMNS``), and those a stored version is read back from
  (``STORED_VERSION_COLUMNS``);
* the deletion markers' table (``DELETION_COLUMNS``, ``DELETION_SCHEMA``);
* rows staged for a MERGE or a rewrite: a table's rows and their deletion flag (``DELETED_FLAG``,
  ``staged_schema``).

The ``changes`` table's leading columns follow the flattening options
(``FlatteningOptions.metadata_columns``). Both the driver and the executors read this module: no
pyspark or deltalake import here.
"""

from __future__ import annotations

import pyarrow as pa

from mongo_cdc.transform import column_types

# The state table's leading columns (a DocumentVersion's, with the document rendered two ways).
STATE_METADATA_COLUMNS: tuple[tuple[str, column_types.ColumnType], ...] = (
    ("__key", column_types.STRING),
    ("__id", column_types.STRING),
    ("__doc", column_types.STRING),
    ("__doc_bson", column_types.BINARY),
    ("__cluster_time", column_types.LONG),
    ("__event_order", column_types.STRING),
    ("__rs", column_types.STRING),
)
# The state table's columns holding a value of each document's own (``write_data_file``'s unique
# columns, with the column of ``_id``).
PER_DOCUMENT_COLUMNS = ("__key", "__id", "__doc", "__doc_bson")
# A stored version's columns of the state table (``stored_versions``), in DocumentVersion's order.
STORED_VERSION_COLUMNS = ("__key", "__id", "__doc_bson", "__cluster_time", "__event_order", "__rs")

# The deletion markers' columns (lake.deletions_uri): a deleted document's last position.
DELETION_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
DELETION_SCHEMA = pa.schema(
    [
        ("__key", pa.string()),
        ("__cluster_time", pa.int64()),
        ("__event_order", pa.string()),
        ("__rs", pa.string()),
    ]
)
# A MERGE source row's deletion flag: never a column of the table.
DELETED_FLAG = "__merge_deleted"


def staged_schema(schema: pa.Schema) -> pa.Schema:
    """Rows of a table with ``schema`` as they are staged for a MERGE or a rewrite: ``DELETED_FLAG`` last."""
    return schema.append(pa.field(DELETED_FLAG, pa.bool_()))
