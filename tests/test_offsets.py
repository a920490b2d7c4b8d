"""Offsets: strict parsing of hand-edited Variables, and the pending-files protocol."""

from __future__ import annotations

import json

import pytest

from mongo_cdc.offsets import (
    MemoryOffsetStore,
    Offset,
    OffsetError,
    OffsetKeeper,
    WriterConflict,
    parse_offset,
)

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
        (json.dumps({"format": 1, "batch_seq": 1, "pending": "x"}), "'pending' must be a list"),
        (json.dumps({"batch_seq": 1}), "'format' must be 1"),
    ],
)
def test_corrupted_offset_names_the_variable_and_how_to_reset_it(text, problem):
    with pytest.raises(OffsetError) as failure:
        parse_offset(KEY, text)
    message = str(failure.value)
    assert problem in message and KEY in message and f"airflow variables delete {KEY}" in message


def test_uncommitted_batch_files_are_deleted_before_a_retry(tmp_path):
    keeper = OffsetKeeper(MemoryOffsetStore(), "shop", "rs0")
    committed = keeper.commit(Offset(), batch_seq=4)
    landed = tmp_path / "rs0-000000000005-0000.parquet"
    staged = keeper.begin_batch(committed, [str(landed)])
    landed.write_bytes(b"written, never committed")
    assert keeper.load().pending == (str(landed),)

    cleaned = keeper.discard_uncommitted(keeper.load())
    assert not landed.exists()
    assert cleaned.pending == () and keeper.load().pending == () and staged.batch_seq == 4


ME = {"dag_id": "mongo_cdc__shop", "run_id": "scheduled__2026", "task_id": "shard_sync.pull", "map_index": 0}
OTHER = {**ME, "run_id": "manual__2026"}


def test_a_second_writer_is_refused_while_the_first_is_running():
    keeper = OffsetKeeper(MemoryOffsetStore(), "shop", "rs0")
    keeper.commit(Offset(), batch_seq=1)
    keeper.claim(OTHER, still_running=lambda holder: True)
    with pytest.raises(WriterConflict) as refused:
        keeper.claim(ME, still_running=lambda holder: holder == {**OTHER, "since": holder["since"]})
    message = str(refused.value)
    assert KEY in message and "manual__2026" in message and "shard_sync.pull" in message
    assert keeper.load().writer["run_id"] == "manual__2026"  # the refused task changed nothing


def test_a_claim_left_by_a_task_that_is_gone_is_taken_over_and_released():
    keeper = OffsetKeeper(MemoryOffsetStore(), "shop", "rs0")
    keeper.commit(Offset(), batch_seq=1)
    keeper.claim(OTHER, still_running=lambda holder: True)
    keeper.claim(ME, still_running=lambda holder: False)  # the other task crashed
    assert keeper.load().writer["run_id"] == ME["run_id"]
    keeper.claim(ME, still_running=lambda holder: True)  # a retry of the same task is no second writer
    keeper.release(OTHER)
    assert keeper.load().writer is not None  # only the holder releases
    keeper.release(ME)
    assert keeper.load().writer is None
