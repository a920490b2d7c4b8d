"""A change event over 16 MB stops the pull with the fix or is skipped and counted, as
``cursor.oversize.handling.mode`` says, on a real mongod.

An update that adds ~7 MB to an ~8 MB document makes an event of ~23 MB with the looked-up
document: the server cannot send it, and in the default mode the pull must stop with a clear
message while ``skip`` leaves that one event out, counted, and lands everything around it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mongo_cdc.capture.oversized_events import FragmentJoiner, OversizedEventError, supports_split
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig, SourceConfigError, load_source
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

MB = 1024 * 1024


def _config(tmp_path: Path, database: str, **settings: object) -> SourceConfig:
    return database_source("oversized", tmp_path / "lake", database, **settings)


def _landed(config: SourceConfig, database: str) -> list[tuple[str, str]]:
    source_lake = SourceLake(LakeLocation(config.lake_root), config.topic_prefix)
    rows = source_lake.committed_raw(f"{database}.docs", columns=["key", "op", "cluster_time"]).to_pylist()
    rows.sort(key=lambda row: row["cluster_time"])
    return [(json.loads(row["key"])["id"], row["op"]) for row in rows]


def _write_around_an_oversized_update(client, database: str) -> None:
    docs = client[database].docs
    docs.insert_one({"_id": "before"})
    docs.insert_one({"_id": "big", "a": "a" * (8 * MB)})
    docs.update_one({"_id": "big"}, {"$set": {"b": "b" * (7 * MB)}})  # the event is ~23 MB
    docs.insert_one({"_id": "after"})


@pytest.fixture
def client(replica_set):
    with make_client(replica_set.uri) as client:
        yield client


def test_fail_mode_stops_with_the_fix_and_leaves_the_offset(client, replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name)  # cursor.oversize.handling.mode: fail, the default
    keeper = memory_keeper(config, replica_set.name)
    start_without_snapshot(client, replica_set.name, keeper)
    before = keeper.load()
    _write_around_an_oversized_update(client, db_name)

    with pytest.raises(OversizedEventError) as failure:
        pull_changes(ReplicaSetCapture(client, config, keeper))

    message = str(failure.value)
    assert "larger than MongoDB's 16 MB limit (BSONObjectTooLarge)" in message
    assert f"Offset '{keeper.key}' is unchanged" in message
    assert "cursor.oversize.handling.mode: skip" in message
    # one batch reaches the oversized event (it starts with the two inserts): nothing of it landed
    assert keeper.load().resume_token == before.resume_token
    assert _landed(config, db_name) == []


def test_skip_mode_counts_the_oversized_event_and_lands_the_rest(client, replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name, cursor_oversize_handling_mode="skip")
    keeper = memory_keeper(config, replica_set.name)
    start_without_snapshot(client, replica_set.name, keeper)
    _write_around_an_oversized_update(client, db_name)

    result = pull_changes(ReplicaSetCapture(client, config, keeper)).to_dict()

    assert result["oversized_skipped"] == {f"{db_name}.docs": 1}
    assert _landed(config, db_name) == [
        ('"before"', "c"), ('"big"', "c"), ('"after"', "c")
    ]  # fmt: skip
    assert result["events"] == {f"{db_name}.docs": {"c": 3}}
    # a second pull starts past it: nothing read twice
    assert pull_changes(ReplicaSetCapture(client, config, keeper)).to_dict()["events"] == {}


def test_skip_threshold_skips_smaller_events_too(client, replica_set, db_name, tmp_path):
    config = _config(
        tmp_path, db_name, cursor_oversize_handling_mode="skip", cursor_oversize_skip_threshold=1 * MB
    )
    keeper = memory_keeper(config, replica_set.name)
    start_without_snapshot(client, replica_set.name, keeper)
    client[db_name].docs.insert_many([{"_id": "small"}, {"_id": "medium", "a": "a" * (2 * MB)}])

    result = pull_changes(ReplicaSetCapture(client, config, keeper)).to_dict()

    assert result["oversized_skipped"] == {f"{db_name}.docs": 1}
    assert _landed(config, db_name) == [('"small"', "c")]


def test_split_mode_is_refused_by_a_server_without_it(client, replica_set, db_name, tmp_path):
    assert not supports_split(client), "the test server (6.0.5) predates $changeStreamSplitLargeEvent"
    config = _config(tmp_path, db_name, cursor_oversize_handling_mode="split")
    keeper = memory_keeper(config, replica_set.name)
    start_without_snapshot(client, replica_set.name, keeper)
    before = keeper.load()

    with pytest.raises(OversizedEventError, match=r"runs MongoDB 6\.0\.5, which cannot split large change"):
        pull_changes(ReplicaSetCapture(client, config, keeper))
    assert keeper.load() == before


def test_fragments_of_a_split_event_are_joined_under_the_last_token():
    """Hand-built fragments: a 6.0.5 server cannot produce split events."""
    joiner = FragmentJoiner()
    first = {"_id": {"_data": "01"}, "splitEvent": {"fragment": 1, "of": 2}, "operationType": "update",
             "fullDocument": {"_id": 1, "a": "x"}}  # fmt: skip
    last = {"_id": {"_data": "02"}, "splitEvent": {"fragment": 2, "of": 2},
            "updateDescription": {"updatedFields": {"a": "x"}}}  # fmt: skip
    plain = {"_id": {"_data": "03"}, "operationType": "insert"}

    assert joiner.add(first) is None
    assert joiner.pending  # the pull must not land or commit at a fragment's position
    assert joiner.add(last) == {
        "_id": {"_data": "02"},
        "operationType": "update",
        "fullDocument": {"_id": 1, "a": "x"},
        "updateDescription": {"updatedFields": {"a": "x"}},
    }
    assert joiner.add(plain) is plain
    with pytest.raises(OversizedEventError, match="fragment 2 of 2 arrived after 0 fragments"):
        FragmentJoiner().add(last)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("cursor.oversize.handling.mode", "drop", "allowed values: fail, skip, split"),
        ("cursor.oversize.skip.threshold", -1, "must be an integer from 0 to 16777216"),
    ],
)
def test_bad_oversize_settings_are_refused(tmp_path, key, value, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(f"topic.prefix: shop\n{key}: {value}\n")
    with pytest.raises(SourceConfigError, match=re.escape(expected)):
        load_source(str(path))
