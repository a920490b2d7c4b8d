"""Every engine docs/reading.md names reads every state table of a real DAG run and gets exactly the
live documents; with ``lake.retention.hours: 0`` even a DuckDB glob over the lake does."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import bson
import pytest
from cdc_support import documents
from conftest import make_source
from datagen import COLLECTIONS, load, random_writes
from reader_support import duckdb_connection

from mongo_cdc import extjson
from mongo_cdc.lake import table_uri
from mongo_cdc.lake.readers import read_table, spark_table

HOUR = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def a_run_with_deletes(airflow_db, replica_set, tmp_path_factory):
    """Two hourly runs (each compacting and vacuuming at retention 0), the second after random
    writes that delete documents; returns the source and, per collection, the live ``__id``s."""
    database = "state_readers"
    directory = tmp_path_factory.mktemp("readers")
    source = make_source(
        directory,
        replica_set.uri,
        database,
        **{"lake.optimize.interval.hours": 1, "lake.retention.hours": 0},
    )
    with replica_set.client() as client:
        db = client[database]
        load(db, {"customers": 120, "orders": 120, "products": 80})
        source.run(logical_date=HOUR)
        writes = random_writes(db, 240, seed=9)
        source.run(logical_date=HOUR + dt.timedelta(hours=1))
        live = {
            collection: sorted(
                extjson.encode_str(doc["_id"]) for doc in documents(client, database, collection)
            )
            for collection in COLLECTIONS
        }
    deleted = {c: {ejson for ejson, op in writes.of(c) if op == "d"} for c in COLLECTIONS}
    assert all(deleted.values()), "every collection should have had deletes"
    return source, live


def test_deltalake_duckdb_and_spark_read_exactly_the_live_documents(a_run_with_deletes, spark) -> None:
    source, live = a_run_with_deletes
    connection = duckdb_connection()
    for collection in COLLECTIONS:
        uri = table_uri(source.location, "state", source.prefix, source.database, collection)
        by_deltalake = read_table(uri, columns=["__id", "__doc_bson"])
        assert sorted(by_deltalake.column("__id").to_pylist()) == live[collection], collection
        # the rows are the documents, not only their ids
        ids = [bson.decode(doc)["_id"] for doc in by_deltalake.column("__doc_bson").to_pylist()]
        assert sorted(extjson.encode_str(i) for i in ids) == live[collection]

        by_duckdb = [row[0] for row in connection.sql(f"SELECT __id FROM delta_scan('{uri}')").fetchall()]
        assert sorted(by_duckdb) == live[collection], collection

        by_spark = [row["__id"] for row in spark_table(spark, uri).select("__id").collect()]
        assert sorted(by_spark) == live[collection], collection


def test_a_duckdb_glob_over_the_lake_never_counts_deleted_documents(a_run_with_deletes) -> None:
    """Each run's maintenance vacuums the files its MERGE replaced, and deletion markers live in
    the raw zone, so the state zone's data files hold the live documents only (a state table is not
    partitioned: its data files sit next to ``_delta_log/``, whose checkpoints the glob leaves out)."""
    source, live = a_run_with_deletes
    state_zone = f"{source.lake_root}/state/{source.prefix}/{source.database}"
    rows = (
        duckdb_connection()
        .sql(f"SELECT __id, filename FROM read_parquet('{state_zone}/*/*.parquet', filename = true)")
        .fetchall()
    )
    counted = Counter((filename.split("/")[-2], document_id) for document_id, filename in rows)
    for collection in COLLECTIONS:
        assert sorted(i for c, i in counted if c == collection) == live[collection], collection
    assert max(counted.values()) == 1, "a document counted twice"
