"""A writer killed before a new table's first commit leaves Parquet files in a directory without a
``_delta_log`` (issue 25 item 4). They stop nothing: the next run creates the collection's tables
there without reading them, and the transform's maintenance deletes them after the retention."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from cdc_support import assert_state_equals_collection
from deltalake import DeltaTable

from mongo_cdc import lake

STRAY_ID = "left-by-a-killed-writer"


def leave_stray_file(directory: str, hours_old: float) -> Path:
    """A Parquet file shaped like the table's rows, as a writer killed before its commit leaves it."""
    path = Path(directory) / "part-00000-00000000-0000-0000-0000-000000000000-c000.snappy.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"__id": [STRAY_ID], "n": [666]}), path)
    then = time.time() - hours_old * 3600
    os.utime(path, (then, then))
    return path


def test_a_new_collections_leftovers_neither_stop_nor_reach_its_tables(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        database = client[db_name]
        database["orders"].insert_many([{"_id": i, "n": i} for i in range(5)])
        source.run()

        database["fresh"].insert_many([{"_id": i, "n": i} for i in range(7)])
        state_uri = lake.table_uri(source.location, "state", source.prefix, db_name, "fresh")
        raw_uri = lake.table_uri(source.location, "raw", source.prefix, db_name, "fresh")
        strays = [leave_stray_file(uri, hours_old=25) for uri in (state_uri, raw_uri)]
        source.run()  # discover, the pull that creates the raw table, the transform that creates state

        assert_state_equals_collection(source, client, "fresh")
        assert STRAY_ID not in {row["__id"] for row in source.state_rows("fresh")}
        assert_state_equals_collection(source, client, "orders")
        for uri, stray in zip((state_uri, raw_uri), strays, strict=True):
            assert stray.exists()
            assert stray.name not in {Path(f).name for f in DeltaTable(uri).file_uris()}

        settings = json.dumps({"optimize_interval_hours": 0, "retention_hours": 1})
        source.transform("--maintain", settings)
        assert not any(stray.exists() for stray in strays)
        assert_state_equals_collection(source, client, "fresh")
