"""Files a writer left before its commit: never read, never in the way, deleted after the retention.

A killed writer leaves data files that no ``_delta_log`` entry names, either in an existing table's
directory (its staging directory included) or in the directory of a table whose first commit never
happened.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from mongo_cdc.lake.maintenance import maintain_table, remove_uncommitted_leftovers
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.storage import LakeLocation, table_if_exists

STRAY = pa.table({"id": [666]})


@pytest.fixture
def lake(local_or_s3_lake: LakeLocation) -> LakeLocation:
    return local_or_s3_lake


def leave(lake: LakeLocation, path: str, hours_old: float = 0) -> str:
    """A Parquet file at ``path`` (under the root) as a killed writer leaves it; its URI. ``hours_old``
    back-dates it (local lakes only: S3 objects carry the time they were written)."""
    with lake.open_output(*path.split("/")) as out:
        pq.write_table(STRAY, out)
    if hours_old:
        then = time.time() - hours_old * 3600
        os.utime(lake.table_uri(*path.split("/")), (then, then))
    return lake.table_uri(*path.split("/"))


def exists(lake: LakeLocation, uri: str) -> bool:
    fs, base = lake.filesystem()
    return fs.get_file_info(base + uri[len(lake.root) :]).type.name == "File"


def test_a_directory_without_a_log_is_a_table_not_yet_created(lake: LakeLocation) -> None:
    options = dict(lake.storage_options)
    uri = lake.table_uri("state", "p", "db", "c")
    leave(lake, "state/p/db/c/part-00000-killed-c000.snappy.parquet")
    assert table_if_exists(uri, options) is None

    write_deltalake(uri, pa.table({"id": [1, 2]}), storage_options=options)
    assert DeltaTable(uri, storage_options=options).version() == 0
    assert sorted(read_table(uri, options).column("id").to_pylist()) == [1, 2]


def test_vacuum_deletes_files_no_log_names_after_the_retention(tmp_path: Path) -> None:
    lake = LakeLocation(str(tmp_path))
    uri = lake.table_uri("raw", "p", "db", "c")
    write_deltalake(uri, pa.table({"id": [1], "hour": ["h0"]}), partition_by=["hour"])
    old = leave(lake, "raw/p/db/c/hour=h0/part-killed-old.snappy.parquet", hours_old=50)
    day = leave(lake, "raw/p/db/c/hour=h1/part-killed-day.snappy.parquet", hours_old=30)
    recent = leave(lake, "raw/p/db/c/hour=h1/part-killed-recent.snappy.parquet", hours_old=2)
    staged = leave(lake, "raw/p/db/c/_mongo_cdc_staging/x/part-0.parquet", hours_old=50)
    now = dt.datetime.now(dt.timezone.utc)

    done = maintain_table(uri, lake, optimize_interval_hours=0, retention_hours=48, now=now)
    assert done["files_vacuumed"] == 1
    assert (exists(lake, old), exists(lake, day), exists(lake, recent)) == (False, True, True)

    # a retention under a day still leaves a writer between its files and its commit a day
    done = maintain_table(uri, lake, optimize_interval_hours=0, retention_hours=0, now=now)
    assert done["files_vacuumed"] == 1
    assert (exists(lake, day), exists(lake, recent), exists(lake, staged)) == (False, True, True)
    assert read_table(uri).column("id").to_pylist() == [1]


def test_leftovers_outside_every_table_are_deleted_after_the_retention(lake: LakeLocation) -> None:
    options = dict(lake.storage_options)
    leftovers = [
        leave(lake, "state/p/db/new/part-00000-killed-c000.snappy.parquet"),
        leave(lake, "raw/p/db/new/hour=2026-01-01T00/part-killed.snappy.parquet"),
        leave(lake, "raw/p/_deletions/db/new/part-killed.snappy.parquet"),
        leave(lake, "changes/p/db/new/hour=2026-01-01T00/part-killed.snappy.parquet"),
        leave(lake, "raw/p/_batches/part-killed.snappy.parquet"),
    ]
    table = lake.table_uri("state", "p", "db", "c")
    write_deltalake(table, pa.table({"id": [1]}), storage_options=options)
    # a killed transform's staged rows: vacuum never looks under "_" directories
    leftovers.append(leave(lake, "state/p/db/c/_mongo_cdc_staging/run-1/state/part-0.snappy.parquet"))
    in_a_table = leave(lake, "state/p/db/c/part-killed.snappy.parquet")  # vacuum's business
    other_source = leave(lake, "state/q/db/new/part-killed.snappy.parquet")
    now = dt.datetime.now(dt.timezone.utc)

    assert remove_uncommitted_leftovers(lake, "p", retention_hours=1, now=now) == []
    assert remove_uncommitted_leftovers(lake, "p", 1, now + dt.timedelta(hours=2)) == []  # under a day
    removed = remove_uncommitted_leftovers(lake, "p", 1, now + dt.timedelta(hours=25))
    assert sorted(removed) == sorted(leftovers)
    assert not any(exists(lake, uri) for uri in leftovers)
    assert exists(lake, in_a_table) and exists(lake, other_source)
    assert read_table(table, options).column("id").to_pylist() == [1]
    assert remove_uncommitted_leftovers(lake, "p", 48, now + dt.timedelta(hours=47)) == []
