"""Every reader docs/reading.md names sees exactly a Delta table's live rows; a Parquet glob does not."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from reader_support import duckdb_connection

from mongo_cdc.lake.errors import LakeFileError
from mongo_cdc.lake.readers import read_table, spark_table
from mongo_cdc.lake.storage import LakeLocation

HOURS = ("2026-01-01T00", "2026-01-01T01", "2026-01-01T02")


def build_table(uri: str, options: dict[str, str] | None = None) -> tuple[set[int], set[int]]:
    """A changes-like table partitioned by hour: 3 appends, then deletes that rewrite files.

    Returns the ids live at version 2 (before the deletes) and at the latest version.
    """
    for version, hour in enumerate(HOURS):
        ids = range(version * 10, version * 10 + 10)
        write_deltalake(
            uri,
            pa.table({"id": list(ids), "doc": [f"d{i}" for i in ids], "hour": [hour] * 10}),
            partition_by=["hour"],
            mode="append",
            storage_options=options,
        )
    table = DeltaTable(uri, storage_options=options)
    table.delete("id % 3 = 0")  # rewrites every file: each had a multiple of 3
    table.delete("hour = '2026-01-01T02'")  # removes a whole partition's file
    before = set(range(30))
    return before, {i for i in before if i % 3 and i < 20}


@pytest.fixture
def table_uri(tmp_path: Path) -> tuple[str, set[int], set[int]]:
    uri = str(tmp_path / "lake" / "changes" / "p" / "db" / "c")
    before, live = build_table(uri)
    return uri, before, live


def test_readers_see_exactly_the_live_rows(table_uri, spark) -> None:
    uri, before, live = table_uri
    assert set(read_table(uri, columns=["id"]).column("id").to_pylist()) == live
    assert set(read_table(uri, version=2).column("id").to_pylist()) == before
    # delta-rs travels by a commit file's modification time, not history()'s "timestamp" (taken
    # before the file is written: under load a millisecond or more earlier, which reads version 1)
    committed = Path(uri, "_delta_log", f"{2:020d}.json").stat().st_mtime_ns
    at = dt.datetime.fromtimestamp(committed / 1e9, tz=dt.timezone.utc)
    assert read_table(uri, version=at).num_rows == len(before)  # time travel by timestamp

    connection = duckdb_connection()
    rows = connection.sql(f"SELECT id, hour FROM delta_scan('{uri}')").fetchall()
    assert {row[0] for row in rows} == live and len(rows) == len(live)
    assert {row[1] for row in rows} == set(HOURS[:2])
    old = connection.sql(f"SELECT count(*) FROM delta_scan('{uri}', version => 2)").fetchone()[0]
    assert old == len(before)

    assert set(pl.read_delta(uri)["id"].to_list()) == live
    assert pl.scan_delta(uri, version=2).select(pl.len()).collect().item() == len(before)

    started = time.monotonic()
    frame = spark_table(spark, uri)
    assert frame.columns == ["id", "doc", "hour"]
    assert dict(frame.dtypes)["hour"] == "string"
    assert sorted(row.id for row in frame.collect()) == sorted(live)
    assert {row.hour for row in frame.select("hour").distinct().collect()} == set(HOURS[:2])
    assert spark_table(spark, uri, version=2).count() == len(before)
    print(f"spark_table: 3 reads in {time.monotonic() - started:.2f}s")


def test_a_parquet_glob_sees_removed_files(table_uri) -> None:
    """Why docs/reading.md sends readers to delta_scan: files of old versions stay until vacuum."""
    uri, before, live = table_uri
    globbed = duckdb.sql(f"SELECT id FROM read_parquet('{uri}/**/*.parquet')").fetchall()
    assert len(globbed) > len(live)
    assert {row[0] for row in globbed} == before  # deleted rows come back, some of them twice


def test_spark_table_names_a_missing_file(table_uri, spark) -> None:
    uri, _, _ = table_uri
    missing = sorted(DeltaTable(uri).file_uris())[0]
    os.remove(missing)
    with pytest.raises(LakeFileError, match=rf"{re.escape(missing)} \(missing\).*re-snapshot the collection"):
        spark_table(spark, uri)


def test_empty_table(tmp_path: Path, spark) -> None:
    uri = str(tmp_path / "empty")
    DeltaTable.create(
        uri, schema=pa.schema([("id", pa.int64()), ("hour", pa.string())]), partition_by=["hour"]
    )
    assert read_table(uri).num_rows == 0
    frame = spark_table(spark, uri)
    assert frame.columns == ["id", "hour"] and frame.count() == 0


def test_s3_table_through_deltalake_and_polars(s3_lake: LakeLocation) -> None:
    uri = s3_lake.table_uri("changes", "p", "db", "c")
    options = dict(s3_lake.storage_options)
    _, live = build_table(uri, options)
    assert set(read_table(uri, options, columns=["id"]).column("id").to_pylist()) == live
    assert set(pl.read_delta(uri, storage_options=options)["id"].to_list()) == live
