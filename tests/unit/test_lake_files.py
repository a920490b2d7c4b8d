"""Appends written as Parquet files by pyarrow and committed by delta-rs (lake.raw_files, landing)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake import RAW_SCHEMA
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation

HOUR = 3600 << 32  # packed cluster time of 1970-01-01T01


def _row(key: str, cluster_time: int) -> dict:
    return {
        "key": key,
        "op": "c",
        "after": b"\x05\x00\x00\x00\x00",
        "source": {"rs": "rs0", "db": "db", "collection": "items", "ts_ms": 1, "snapshot": False},
        "cluster_time": cluster_time,
        "event_order": f"82{cluster_time:016X}",
    }


def test_an_append_lands_one_file_per_hour_with_delta_statistics(tmp_path: Path):
    lake = SourceLake(LakeLocation(str(tmp_path)), "p")
    rows = [_row("a", HOUR + 1), _row("b", 2 * HOUR + 5), _row("c", HOUR + 2)]
    lake.write_raw("rs0", 7, "db.items", rows_to_table(rows, 7))

    table = DeltaTable(lake.raw_uri("db.items"))
    assert table.version() == 0 and table.transaction_version(lake.app_id("rs0")) == 7
    actions = pa.table(table.get_add_actions(flatten=True)).sort_by("partition.hour").to_pylist()
    assert [a["partition.hour"] for a in actions] == ["1970-01-01T01", "1970-01-01T02"]
    first = actions[0]
    assert first["num_records"] == 2
    assert (first["min.batch_seq"], first["max.batch_seq"]) == (7, 7)
    assert (first["min.cluster_time"], first["max.cluster_time"]) == (HOUR + 1, HOUR + 2)
    assert (first["min.key"], first["max.key"]) == ("a", "c")
    assert first["null_count.before"] == 2 and first["null_count.after"] == 0
    # the files hold the raw schema without the partition column, as delta-rs writes them
    for uri in table.file_uris():
        assert uri.endswith(".snappy.parquet")
        assert pq.read_schema(uri).remove_metadata() == RAW_SCHEMA.remove(RAW_SCHEMA.get_field_index("hour"))
    landed = table.to_pyarrow_dataset().to_table().sort_by("key")
    assert landed.column("key").to_pylist() == ["a", "b", "c"]
    assert landed.column("hour").to_pylist() == ["1970-01-01T01", "1970-01-01T02", "1970-01-01T01"]

    # the next batch appends to the table
    lake.write_raw("rs0", 8, "db.items", rows_to_table([_row("d", HOUR + 3)], 8))
    table = DeltaTable(lake.raw_uri("db.items"))
    assert table.version() == 1 and table.transaction_version(lake.app_id("rs0")) == 8
    assert table.to_pyarrow_dataset().count_rows() == 4


def test_an_append_streams_a_reader_through_the_writer_thread(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("mongo_cdc.lake.raw_files.TARGET_FILE_BYTES", 1)  # a new file after every batch
    lake = SourceLake(LakeLocation(str(tmp_path)), "p")
    batches = [rows_to_table([_row(f"k{i}", HOUR + i)], 3).to_batches()[0] for i in range(5)]
    lake.write_raw("rs0", 3, "db.items", pa.RecordBatchReader.from_batches(RAW_SCHEMA, iter(batches)))
    table = DeltaTable(lake.raw_uri("db.items"))
    assert len(table.file_uris()) == 5
    minimum_keys = pa.table(table.get_add_actions(flatten=True)).column("min.key").to_pylist()
    assert sorted(minimum_keys) == [f"k{i}" for i in range(5)]


def test_a_reader_that_fails_commits_nothing(tmp_path: Path):
    lake = SourceLake(LakeLocation(str(tmp_path)), "p")

    def failing():
        yield rows_to_table([_row("a", HOUR)], 3).to_batches()[0]
        raise RuntimeError("the cursor died")

    with pytest.raises(RuntimeError, match="the cursor died"):
        lake.write_raw("rs0", 3, "db.items", pa.RecordBatchReader.from_batches(RAW_SCHEMA, failing()))
    assert not (tmp_path / "raw" / "p" / "db" / "items" / "_delta_log").exists()


def test_a_table_created_meanwhile_by_another_writer_is_appended_to(tmp_path: Path, monkeypatch):
    # two shards landing the same collection: the other one's commit created the table after this
    # writer looked (a race a test cannot time, so its look is made to miss the table)
    first, second = (SourceLake(LakeLocation(str(tmp_path)), "p") for _ in range(2))
    first.write_raw("rs1", 4, "db.items", rows_to_table([_row("a", HOUR)], 4))
    monkeypatch.setattr(second, "_table", lambda uri: None)
    second.write_raw("rs0", 9, "db.items", rows_to_table([_row("b", HOUR)], 9))
    table = DeltaTable(first.raw_uri("db.items"))
    assert table.transaction_version(first.app_id("rs1")) == 4
    assert table.transaction_version(second.app_id("rs0")) == 9
    assert sorted(table.to_pyarrow_dataset().to_table().column("key").to_pylist()) == ["a", "b"]
