"""Every captured collection has its state and changes tables from the run that copies it on, even
an empty one (Airflow dag.test, a real mongod, real Spark): each reader docs/reading.md names reads
them as empty tables with the metadata columns, not "table not found". Documents inserted later
land in them (their columns added); a collection emptied and re-snapshotted, one created later and
re-snapshotted while empty, and one renamed while empty read empty too. The scenario's tests run in
file order, on one source's runs."""

from __future__ import annotations

import os
import shutil

import polars as pl
import pyarrow as pa
import pytest
from cdc_support import assert_state_equals_collection
from conftest import make_source
from deltalake import DeltaTable
from reader_support import check_every_reader, duckdb_connection

from mongo_cdc.lake import APPLIED_MARK, HOUR_COLUMN, source_table_path, table_path
from mongo_cdc.lake.readers import spark_table

EMPTY, FILLED, LATER, RENAMED = "empty", "filled", "created_later", "renamed"
DERIVED_ZONES = ("state", "changes")


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    source = make_source(tmp_path_factory.mktemp("empty_collections"), replica_set.uri, "empty_collections")
    with replica_set.client() as client:
        client.drop_database(source.database)
        db = client[source.database]
        db.create_collection(EMPTY)
        db[FILLED].insert_many([{"_id": i, "name": f"n{i}", "size": i * 1.5} for i in range(20)])
        source.run()  # the initial snapshot
        yield source, client


def uri_of(source, zone: str, collection: str) -> str:
    """A table's path: what DuckDB's delta_scan and the file system take."""
    return os.path.join(source.lake_root, table_path(zone, source.prefix, source.database, collection))


def metadata_fields(source, zone: str) -> list[pa.Field]:
    """The metadata columns (``__``-prefixed, and ``hour``) of a zone's table with rows, as written."""
    schema = pa.schema(DeltaTable(uri_of(source, zone, FILLED)).schema().to_arrow())
    return [field for field in schema if field.name.startswith("__") or field.name == HOUR_COLUMN]


# filtered reads of columns every state and changes table has (check_every_reader's predicates)
PREDICATES = [("__cluster_time", ">", 0, pa.int64()), ("__event_order", "=", "", pa.string())]


def assert_every_reader_reads_no_rows(spark, uri: str) -> None:
    """deltalake, Polars, DuckDB's delta_scan and spark_table each read 0 rows with the table's columns,
    whole and filtered, and no error."""
    table = DeltaTable(uri)
    names = pa.schema(table.schema().to_arrow()).names
    whole = table.to_pyarrow_table()
    assert whole.num_rows == 0 and whole.column_names == names, uri
    frame = pl.scan_delta(uri).collect()
    assert frame.height == 0 and frame.columns == names, uri
    scan = duckdb_connection().sql(f"SELECT * FROM delta_scan('{uri}')")
    assert scan.fetchall() == [] and scan.columns == names, uri
    by_spark = spark_table(spark, uri)
    assert by_spark.count() == 0 and by_spark.columns == names, uri
    # each filtered read equals its reader's whole read filtered afterwards: empty
    assert check_every_reader(uri, PREDICATES, spark) == 0, uri


def assert_empty_tables_with_the_metadata_columns(source, spark, collection: str) -> None:
    """The collection's state and changes tables hold exactly the metadata columns a table with rows
    has (names, types, order), and every reader reads them as empty tables."""
    for zone in DERIVED_ZONES:
        uri = uri_of(source, zone, collection)
        schema = pa.schema(DeltaTable(uri).schema().to_arrow())
        assert schema.remove_metadata() == pa.schema(metadata_fields(source, zone)).remove_metadata(), zone
        assert_every_reader_reads_no_rows(spark, uri)


def test_an_empty_collection_has_empty_tables_every_reader_reads(scenario, spark) -> None:
    source, client = scenario
    assert_state_equals_collection(source, client, FILLED)
    assert_empty_tables_with_the_metadata_columns(source, spark, EMPTY)
    # the raw zone holds no table: no row landed for it, and the transform reads none
    assert not os.path.exists(uri_of(source, "raw", EMPTY))
    assert source.raw_rows(EMPTY) == []


def test_a_run_again_leaves_the_empty_tables_as_they_are(scenario) -> None:
    source, _ = scenario
    versions = {zone: DeltaTable(uri_of(source, zone, EMPTY)).version() for zone in DERIVED_ZONES}
    source.run()
    assert {zone: DeltaTable(uri_of(source, zone, EMPTY)).version() for zone in DERIVED_ZONES} == versions


def test_documents_inserted_later_land_in_the_tables_with_their_columns(scenario) -> None:
    source, client = scenario
    db = client[source.database]
    db[EMPTY].insert_many([{"_id": i, "label": f"l{i}", "tags": ["a", "b"][: i % 3]} for i in range(5)])
    db[EMPTY].update_one({"_id": 1}, {"$set": {"nested": {"x": 1}}})
    source.run()
    assert_state_equals_collection(source, client, EMPTY)
    assert [row["__op"] for row in source.change_rows(EMPTY)].count("c") == 5
    changes = pa.schema(DeltaTable(uri_of(source, "changes", EMPTY)).schema().to_arrow())
    assert {"_id", "label", "tags", "nested"} <= set(changes.names)


def test_an_emptied_collection_and_one_created_later_read_empty_after_a_resnapshot(scenario, spark) -> None:
    source, client = scenario
    db = client[source.database]
    db[EMPTY].delete_many({})
    db.create_collection(LATER)  # created after the first snapshot: the stream has no event of it
    source.run(conf={"resnapshot": True})
    assert_state_equals_collection(source, client, EMPTY)
    assert_every_reader_reads_no_rows(spark, uri_of(source, "state", EMPTY))
    assert source.change_rows(EMPTY), "the emptied collection's changes keep its history"
    assert_empty_tables_with_the_metadata_columns(source, spark, LATER)
    assert_state_equals_collection(source, client, FILLED)


def test_an_empty_collection_renamed_has_empty_tables_under_its_new_name(scenario, spark) -> None:
    source, client = scenario
    client[source.database][LATER].rename(RENAMED)  # the pull copies it, empty, under the new name
    source.run()
    assert_empty_tables_with_the_metadata_columns(source, spark, RENAMED)


def test_a_run_killed_between_the_two_tables_creates_the_missing_one_next(
    cdc_source, replica_set, db_name, spark
) -> None:
    source = cdc_source(db_name)
    with replica_set.client() as client:
        client[db_name].create_collection(EMPTY)
        client[db_name][FILLED].insert_one({"_id": 1, "name": "n1"})
        source.run()
        state_version = DeltaTable(uri_of(source, "state", EMPTY)).version()
        # the lake as a transform killed after the state table's commit leaves it: no changes table,
        # and no applied mark of that run (the job writes it after its commits)
        shutil.rmtree(uri_of(source, "changes", EMPTY))
        shutil.rmtree(os.path.join(source.lake_root, source_table_path(source.prefix, APPLIED_MARK)))
        source.run()
    assert_empty_tables_with_the_metadata_columns(source, spark, EMPTY)
    assert DeltaTable(uri_of(source, "state", EMPTY)).version() == state_version
