"""Offsets: strict parsing of hand-edited Variables, healing from the lake or refusal, one writer."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pyarrow as pa
import pytest
from airflow_ui import JS_SAFE_INTEGER, as_the_rest_api_shows, as_the_ui_saves
from deltalake import DeltaTable

from mongo_cdc.capture.offsets import (
    MemoryOffsetStore,
    Offset,
    OffsetError,
    OffsetKeeper,
    WriterConflict,
    parse_offset,
)
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.snapshot_log import SnapshotPlan
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
        (json.dumps({"batch_seq": 1}), "'format' must be 2"),
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
    # stored as returned, but for the time stamp each save sets (a second may have passed)
    assert replace(keeper.load(), updated_at="") == replace(healed, updated_at="")


def test_a_running_snapshot_the_lake_committed_is_healed_to_complete(tmp_path):
    lake = _lake_with_batches(tmp_path, 1)
    lake.commit(Batch("rs0", 2, "snapshot", _token(102), 102, 102, ("db.items",)))
    keeper = _keeper(lake)
    running = {"status": "running", "seq": 2, "cluster_time": 102}
    keeper.commit(Offset(), resume_token=_token(101), cluster_time=101, batch_seq=1, snapshot=running)
    assert keeper.load_checked().snapshot == {**running, "status": "complete"}


def test_a_snapshot_committed_after_batches_streamed_beside_it_is_healed_by_its_rows_number(tmp_path):
    # snapshot 2 started, pulls beside its copy committed 3 and 4, then its batch committed as 5
    lake = _lake_with_batches(tmp_path, 1, 3, 4)
    lake.commit(Batch("rs0", 5, "snapshot", _token(104), 104, 102, ("db.items",), rows_seq=2))
    keeper = _keeper(lake)
    running = {"status": "running", "seq": 2, "cluster_time": 102}
    keeper.commit(Offset(), resume_token=_token(104), cluster_time=104, batch_seq=4, snapshot=running)
    healed = keeper.load_checked()
    assert healed.batch_seq == 5 and healed.snapshot == {**running, "status": "complete"}
    # an offset rebuilt from the lake alone names the snapshot by its plan's number
    assert keeper.lake_offset(lake.last_batch("rs0")).snapshot["seq"] == 2


def test_the_next_batch_skips_the_number_a_running_snapshot_reserved():
    running = {"status": "running", "seq": 4, "cluster_time": 102}
    assert Offset(batch_seq=3, snapshot=running).next_seq == 5
    assert Offset(batch_seq=6, snapshot=running).next_seq == 7  # pulls beside the copy went on
    assert Offset(batch_seq=3, snapshot={**running, "status": "complete"}).next_seq == 4
    assert Offset(batch_seq=3).next_seq == 4


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


# A real packed cluster time ((t << 32) | i): far past 2**53, where JavaScript rounds numbers.
NOW = (1_763_737_200 << 32) | 7


def _every_number(value) -> list[int]:
    if isinstance(value, dict):
        return [n for item in value.values() for n in _every_number(item)]
    if isinstance(value, list):
        return [n for item in value for n in _every_number(item)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def test_an_offset_saved_unchanged_in_the_airflow_ui_keeps_every_value():
    offset = Offset(
        resume_token={"_data": f"82{NOW:016X}0004", "_typeBits": b"\x81\x80"},
        cluster_time=NOW,
        batch_seq=42,
        snapshot={"status": "complete", "seq": 1, "cluster_time": NOW - 99, "documents": 17,
                  "captured": {"collection.include.list": ["shop[.]secret_.*"]}},  # fmt: skip
        # a transaction counting events of collections whose names Airflow deems sensitive
        open_transaction={"id": "5f1:3", "cluster_time": NOW + 1, "ts_ms": 1_763_737_200_000,
                          "total_order": 4, "data_collections": {"shop.api_tokens": 3, "shop.passwords": 1}},
        writer={"dag_id": "mongo_cdc__shop", "run_id": "manual__1", "task_id": "shard_sync.pull",
                "map_index": 0},
    )  # fmt: skip
    text = offset.to_json()
    assert "***" not in as_the_rest_api_shows(KEY, text)  # nothing masked
    assert max(_every_number(json.loads(text))) <= JS_SAFE_INTEGER  # nothing JavaScript rounds
    saved = parse_offset(KEY, as_the_ui_saves(KEY, text))
    assert saved == parse_offset(KEY, text) and saved.updated_at
    assert (saved.resume_token, saved.cluster_time, saved.snapshot, saved.open_transaction) == (
        offset.resume_token, offset.cluster_time, offset.snapshot, offset.open_transaction
    )  # fmt: skip


@pytest.mark.parametrize("key", ["capture.start.op.time", "capture.start.resume.token"])
def test_where_a_configured_start_began_survives_the_airflow_ui(key):
    """``snapshot.start`` (``stream_start``) names the key as a value, never as a key Airflow masks."""
    started = {"status": "complete", "skipped": True, "start": {"from": key, "op_time": "1767225600:3"}}
    offset = Offset(
        resume_token={"_data": f"82{NOW:016X}0004"}, cluster_time=NOW, batch_seq=1, snapshot=started
    )
    text = offset.to_json()
    assert "***" not in as_the_rest_api_shows(KEY, text)
    assert parse_offset(KEY, as_the_ui_saves(KEY, text)).snapshot == started


# An offset as the previous version wrote it (format 1), with every field it could hold.
FORMAT_1 = json.dumps(
    {
        "format": 1,
        "resume_token": {"_data": f"82{NOW:016X}0004",
                         "_typeBits": {"$binary": {"base64": "gYA=", "subType": "00"}}},
        "cluster_time": NOW,
        "batch_seq": 2,
        "snapshot": {"status": "complete", "seq": 1, "cluster_time": NOW - 99, "documents": 17,
                     "completed_at": "2026-11-21T15:38:55+00:00"},
        "retired_at": "",
        "open_transaction": {"id": "5f1:3", "cluster_time": NOW, "ts_ms": 1_763_737_200_000, "total_order": 4,
                             "data_collections": {"shop.orders": 3}},
        "writer": None,
        "updated_at": "2026-11-21T15:39:14+00:00",
    }
)  # fmt: skip


def test_offsets_written_in_format_1_keep_loading_and_are_saved_in_format_2():
    offset = parse_offset(KEY, FORMAT_1)
    assert offset.resume_token == {"_data": f"82{NOW:016X}0004", "_typeBits": b"\x81\x80"}
    assert (offset.cluster_time, offset.batch_seq, offset.snapshot["cluster_time"]) == (NOW, 2, NOW - 99)
    assert offset.open_transaction["cluster_time"] == NOW
    assert offset.open_transaction["data_collections"] == {"shop.orders": 3}
    saved = json.loads(offset.to_json())
    assert saved["format"] == 2 and "resume_token" not in saved
    assert saved["cluster_time"] == str(NOW) and saved["snapshot"]["cluster_time"] == str(NOW - 99)
    assert saved["open_transaction"]["data_collections"] == [["shop.orders", 3]]
    assert replace(parse_offset(KEY, offset.to_json()), updated_at=offset.updated_at) == offset


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"cluster_time": NOW}, "'cluster_time' must be null or a string of digits"),
        ({"snapshot": {"status": "complete", "cluster_time": 7.4e18}}, "'snapshot.cluster_time' must be"),
        ({"resume_token": {"_data": "82"}, "resume_after": None},
         "'resume_after' and 'cluster_time' must be set"),
        ({"open_transaction": {"id": "x", "cluster_time": "1", "ts_ms": 1, "total_order": 1,
                               "data_collections": {"shop.orders": 3}}},
         "a list of [namespace, count] pairs"),
    ],
)  # fmt: skip
def test_format_2_is_as_strict_as_format_1(change, problem):
    text = json.dumps({**json.loads(parse_offset(KEY, FORMAT_1).to_json()), **change})
    with pytest.raises(OffsetError, match="is corrupted") as refused:
        parse_offset(KEY, text)
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    ("stored", "refusal"),
    [
        # the masked token still parses: refused as another position than the lake's
        (
            json.dumps({**json.loads(FORMAT_1), "resume_token": {"_data": "82"}}),
            "the resume token was edited",
        ),
        # masked binary _typeBits are no Extended JSON: refused as corrupted
        (FORMAT_1, "is not a resume token in Extended JSON"),
    ],
)
def test_the_fix_for_an_offset_the_ui_masked_and_rounded_is_the_lakes_own_position(tmp_path, stored, refusal):
    lake = SourceLake(LakeLocation(str(tmp_path / "lake")), "shop")
    token = {"_data": f"82{NOW:016X}0004"}
    plan = SnapshotPlan(
        "rs0", 1, token, NOW - 99, (), False, False, "2026-11-21T15:38:00+00:00", ("db.items",), ()
    )
    lake.record_plan(plan)
    lake.commit(Batch("rs0", 1, "snapshot", token, NOW - 99, NOW - 99, ("db.items",)))
    lake.commit(Batch("rs0", 2, "stream", token, NOW))
    keeper = _keeper(lake)
    # today's format, opened and saved unchanged in the UI: token masked, cluster times rounded
    keeper.store.set(KEY, as_the_ui_saves(KEY, stored))
    with pytest.raises(OffsetError, match=refusal) as refused:
        keeper.load_checked()
    [command] = [part for part in str(refused.value).split("`") if part.startswith("airflow variables set")]
    program, verb, action, key, value = shlex.split(command)
    assert (program, verb, action, key) == ("airflow", "variables", "set", KEY)
    fixed = parse_offset(KEY, value)
    assert (fixed.resume_token, fixed.cluster_time, fixed.batch_seq) == (token, NOW, 2)
    assert fixed.snapshot["cluster_time"] == NOW - 99 and fixed.snapshot["status"] == "complete"
    assert fixed.open_transaction is None and fixed.writer is None  # the lake's last batch has none
    keeper.store.set(KEY, value)  # the fix, as an on-call would paste it
    assert keeper.load_checked() == fixed


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
