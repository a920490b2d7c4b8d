"""Reading the lake's Delta tables from Python and from a Spark without Delta's jars.

A Delta table's directory also holds files that are no longer part of it (replaced or deleted
rows, kept for time travel until vacuum removes them), so reading every Parquet file under it
counts rows twice or brings deleted ones back. Readers take the live files of one version from
the Delta log, as these functions (and every Delta reader: delta-rs, DuckDB's ``delta_scan``,
Polars, delta-spark, Trino) do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc.lake.errors import naming_damaged_files
from mongo_cdc.lake.storage import TableVersion, open_table
from mongo_cdc.lake.table_reads import Where, read_rows

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def read_table(
    table_uri: str,
    storage_options: Mapping[str, str] | None = None,
    columns: Sequence[str] | None = None,
    filters: Any = None,
    version: TableVersion = None,
) -> pa.Table:
    """One version of a table as Arrow (``filters``: deltalake's DNF tuples or a pyarrow expression),
    in plain types (``table_reads.plain``) whatever types its files hold.

    A missing or truncated data file raises ``LakeFileError`` naming it and the fix.
    """
    with naming_damaged_files(table_uri, storage_options, version):
        table = open_table(table_uri, storage_options, version)
        return read_rows(table, columns, _where(filters))


def _where(filters: Any) -> Where | None:
    """``read_table``'s ``filters`` as a ``Where``: tuples also skip files by their statistics."""
    if filters is None or isinstance(filters, pc.Expression):
        return None if filters is None else Where(filters, None)
    conjunctions = filters if all(isinstance(item, list) for item in filters) else [filters]
    columns = tuple(dict.fromkeys(column for conjunction in conjunctions for column, _, _ in conjunction))
    return Where(pq.filters_to_expression(filters), columns, filters)


def spark_table(
    spark: SparkSession,
    table_uri: str,
    storage_options: Mapping[str, str] | None = None,
    version: TableVersion = None,
) -> DataFrame:
    """One version of a table as a Spark DataFrame, without delta-spark.

    delta-rs lists the version's live files (``storage_options`` are for delta-rs only); Spark
    reads them with ``spark.read.parquet`` and ``basePath`` at the table, so partition columns
    (``hour``) come back, typed and ordered as the Delta schema says. For an object-store table
    the cluster needs its own Hadoop access to the store: ``s3://`` paths are read as ``s3a://``
    (hadoop-aws and ``spark.hadoop.fs.s3a.*`` credentials), ``gs://`` needs the GCS connector and
    ``abfs[s]://`` hadoop-azure. On a cluster with delta-spark, read the table natively instead:
    ``spark.read.format("delta").option("versionAsOf", n).load(uri)``.

    A data file that is missing when Spark lists the files raises ``LakeFileError``; one that
    goes missing or is damaged later fails the Spark action with Spark's own error, which names
    the file.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    table = open_table(table_uri, storage_options, version)
    schema = from_arrow_schema(_arrow_schema(table))
    files = [_hadoop_uri(uri) for uri in table.file_uris()]
    if not files:
        return spark.createDataFrame([], schema)
    with naming_damaged_files(table_uri, storage_options, version):
        frame = spark.read.schema(schema).option("basePath", _hadoop_uri(table_uri)).parquet(*files)
    return frame.select(*schema.fieldNames())  # Spark puts partition columns last


def _arrow_schema(table: Any) -> pa.Schema:
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def _hadoop_uri(uri: str) -> str:
    """Hadoop's name for a delta-rs URI: S3 is ``s3a://`` outside EMR (where ``s3a`` works too)."""
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri
