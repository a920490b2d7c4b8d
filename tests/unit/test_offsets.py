"""Offsets: strict parsing of hand-edited Variables, healing from the lake or refusal, one writer."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from mongo_cdc.capture.events import rows_to_table
from mongo_cdc.capture.offsets import (
    MemoryOffsetStore,
    Offset,
    OffsetError,
    OffsetKeeper,
    WriterConflict,
    parse_offset,
)
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation

KEY = "mongo_cdc.shop.rs0"


def test_round_trip_keeps_binary_type_bits_of_resume_tokens():
    offset = Offset(resume_token={"_data": "8200", "_typeBits": b"\x81\x80"}, cluster_time=7, batch_seq=3)
    parsed = parse_offset(KEY, offset.to_json())
    assert parsed.resume_token == {"_data": "8200", "_typeBits": b"\x81\x80"}
    assert (parsed.cluster_time, parsed.batch_seq) == (7, 3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"format": 1, "batch_seq": -1}), "'batch_seq' must be a non-negative integer"),
        (
            json.dumps({"format": 1, "batch_seq": 1, "resume_token": "abc", "cluster_time": 1}),
            "'resume_token' must be",
        ),
        (json.dumps({"format": 1, "batch_seq": 1, "resume_token": {"_data": "82"}}), "must be set together"),
        (json.dumps({"format": 1, "batch_seq": 1, "pending": ["/lake/raw/x.parquet"]}), "old lake layout"),
        (json.dumps({"batch_seq": 1}), "'format' must be 1"),
    ],
)
def test_corrupted_offset_names_the_variable_and_how_to_reset_it(text, problem):
    with pytest.raises(OffsetError) as failure:
        parse_offset(KEY, text)
    message = str(failure.value)
    assert problem in message and KEY in message and f"airflow variables delete {KEY}" in message


def _token(cluster_time: int) -> dict:
    return {"_data": f"82{cluster_time:016X}0004"}


def _lake_with_batches(tmp_path, *seqs: int) -> SourceLake:
    lake = SourceLake(LakeLocation(str(tmp_path / "lake")), "shop")
    for seq in seqs:
        lake.commit(Batch("rs0", seq, "stream", _token(100 + seq), 100 + seq))
    return lake


def _keeper(lake: SourceLake) -> OffsetKeeper:
    return OffsetKeeper(MemoryOffsetStore(), "shop", "rs0", lake)


def _raw_row(key: str, seq: int) -> dict:
    return {
        "key": key,
        "op": "c",
        "source": {"rs": "rs0", "db": "db", "collection": "items"},
        "cluster_time": 100 << 32,
        "event_order": f"82{seq:04d}",
    }


def test_rows_of_a_batch_landed_again_replace_those_of_the_landing_that_was_cut_short(tmp_path):
    lake = _lake_with_batches(tmp_path)
    lake.write_raw("rs0", 1, "db.items", rows_to_table([_raw_row("a", 1)], 1))
    # batch 2 landed once (then a crash before its commit), and again, read anew from batch 1's position
    lake.write_raw("rs0", 2, "db.items", rows_to_table([_raw_row("b", 2), _raw_row("c", 2)], 2))
    lake.write_raw("rs0", 2, "db.items", rows_to_table([_raw_row("b", 2)], 2))
    table = DeltaTable(lake.raw_uri("db.items"))
    rows = pa.table(table.to_pyarrow_dataset().to_table(columns=["key", "batch_seq"])).to_pylist()
    assert sorted((row["key"], row["batch_seq"]) for row in rows) == [("a", 1), ("b", 2)]
    assert table.transaction_version(lake.app_id("rs0")) == 2


def test_an_offset_behind_the_lake_is_healed_from_it(tmp_path):
    lake = _lake_with_batches(tmp_path, 1, 2, 3)
    keeper = _keeper(lake)
    # a crash between the lake commit of batch 3 and the Variable write, or a lowered batch_seq
    keeper.commit(Offset(), resume_token=_token(101), cluster_time=101, batch_seq=1)
    healed = keeper.load_checked()
    assert (healed.batch_seq, healed.cluster_time, healed.resume_token) == (3, 103, _token(103))
    assert keeper.load() == healed


def test_a_running_snapshot_the_lake_committed_is_healed_to_complete(tmp_path):
    lake = _lake_with_batches(tmp_path, 1)
    lake.commit(Batch("rs0", 2, "snapshot", _token(102), 102, 102, ("db.items",)))
    keeper = _keeper(lake)
    running = {"status": "running", "seq": 2, "cluster_time": 102}
    keeper.commit(Offset(), resume_token=_token(101), cluster_time=101, batch_seq=1, snapshot=running)
    assert keeper.load_checked().snapshot == {**running, "status": "complete"}


def test_an_offset_ahead_of_the_lake_is_refused_naming_both_positions_and_the_fix(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path, 1, 2))
    keeper.commit(Offset(), resume_token=_token(109), cluster_time=109, batch_seq=9)
    with pytest.raises(OffsetError) as refused:
        keeper.load_checked()
    message = str(refused.value)
    assert "batch 9" in message and "last committed batch of this replica set is 2" in message
    assert f"airflow variables set {KEY}" in message and '"batch_seq": 2' in message


def test_a_token_the_lake_did_not_commit_is_refused(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path, 1, 2))
    # batch 2's number with a position of another replica set
    keeper.commit(Offset(), resume_token=_token(555), cluster_time=555, batch_seq=2)
    with pytest.raises(OffsetError) as refused:
        keeper.load_checked()
    assert "belongs to another replica set" in str(refused.value)
    assert keeper.load().cluster_time == 555  # nothing was overwritten


def test_an_offset_for_a_lake_without_batches_is_refused(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path))
    keeper.commit(Offset(), resume_token=_token(101), cluster_time=101, batch_seq=1)
    with pytest.raises(OffsetError, match="the lake has no batch of this replica set"):
        keeper.load_checked()


def test_without_an_offset_batches_are_numbered_after_the_lakes(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path, 1, 2, 3))
    assert keeper.load_checked() is None
    assert keeper.next_offset().batch_seq == 3


ME = {"dag_id": "mongo_cdc__shop", "run_id": "scheduled__2026", "task_id": "shard_sync.pull", "map_index": 0}
OTHER = {**ME, "run_id": "manual__2026"}


def test_a_second_writer_is_refused_while_the_first_is_running(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path))
    keeper.commit(Offset(), batch_seq=1)
    keeper.claim(OTHER, still_running=lambda holder: True)
    with pytest.raises(WriterConflict) as refused:
        keeper.claim(ME, still_running=lambda holder: holder == {**OTHER, "since": holder["since"]})
    message = str(refused.value)
    assert KEY in message and "manual__2026" in message and "shard_sync.pull" in message
    assert keeper.load().writer["run_id"] == "manual__2026"  # the refused task changed nothing


def test_a_claim_left_by_a_task_that_is_gone_is_taken_over_and_released(tmp_path):
    keeper = _keeper(_lake_with_batches(tmp_path))
    keeper.commit(Offset(), batch_seq=1)
    keeper.claim(OTHER, still_running=lambda holder: True)
    keeper.claim(ME, still_running=lambda holder: False)  # the other task crashed
    assert keeper.load().writer["run_id"] == ME["run_id"]
    keeper.claim(ME, still_running=lambda holder: True)  # a retry of the same task is no second writer
    keeper.release(OTHER)
    assert keeper.load().writer is not None  # only the holder releases
    keeper.release(ME)
    assert keeper.load().writer is None
