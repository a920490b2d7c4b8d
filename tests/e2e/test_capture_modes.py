"""Debezium's four capture modes and capture.mode.full.update.type against a real mongod.

Each mode is run over the same history: what lands in ``before``, ``after`` and
``updateDescription`` is what 002_34518fa5104a0e2e.txt ("Document data", "$unset handling")
says each mode carries.
"""

from __future__ import annotations

import dataclasses
import os
import re

import bson
import pytest
import yaml
from bson import json_util
from cdc_support import CdcSource, assert_state_equals_collection

from mongo_cdc.capture.capture_modes import ImagesNotEnabledError, watch_options
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig, SourceConfigError, load_source
from mongo_cdc.lake.debezium_export import debezium_record, raw_rows
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

PRE_IMAGE_MODES = ("change_streams_with_pre_image", "change_streams_update_full_with_pre_image")
FULL_MODES = ("change_streams_update_full", "change_streams_update_full_with_pre_image")
IMAGES_ON = {"changeStreamPreAndPostImages": {"enabled": True}}

# one document's life after the snapshot, and another's two quick updates. (A pipeline update
# whose delta is not smaller than the document is logged as a replacement: the notes keep it a delta.)
NOTES = "n" * 200
V1 = {"_id": 1, "name": "a", "tags": [1, 2, 3, 4], "x": 1, "notes": NOTES}
V2 = {"_id": 1, "name": "b", "tags": [1, 2, 3, 4], "notes": NOTES}  # $set name, $unset x
V3 = {"_id": 1, "name": "b", "tags": [1, 2], "notes": NOTES}  # pipeline update truncating tags
V4 = {"_id": 1, "other": True}  # replace
W1, W2, W3 = ({"_id": 2, "n": n} for n in range(3))


def _config(tmp_path, db_name: str, **settings) -> SourceConfig:
    return database_source("shop", tmp_path / "lake", re.escape(db_name), **settings)


def _document(data: bytes | None) -> dict | None:
    return None if data is None else bson.decode(data)


def _capture(replica_set, db_name: str, config: SourceConfig) -> list[dict]:
    keeper = memory_keeper(config, "rs0")
    with make_client(replica_set.uri) as client:
        db = client[db_name]
        db.create_collection("items", **IMAGES_ON)
        db.items.insert_one({"_id": 0, "snapshotted": True})
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        db.items.insert_one(V1)
        db.items.update_one({"_id": 1}, {"$set": {"name": "b"}, "$unset": {"x": ""}})
        db.items.update_one({"_id": 1}, [{"$set": {"tags": {"$slice": ["$tags", 2]}}}])
        db.items.replace_one({"_id": 1}, V4)
        db.items.delete_one({"_id": 1})
        db.items.insert_one(W1)
        db.items.update_one({"_id": 2}, {"$set": {"n": 1}})
        db.items.update_one({"_id": 2}, {"$set": {"n": 2}})
        pull_changes(ReplicaSetCapture(client, config, keeper))
    return raw_rows(SourceLake(LakeLocation(config.lake_root), config.topic_prefix), f"{db_name}.items")


@pytest.mark.parametrize(
    ("mode", "full_update_type"),
    [(mode, "lookup") for mode in ("change_streams", "change_streams_update_full", *PRE_IMAGE_MODES)]
    + [(mode, "post_image") for mode in FULL_MODES],
)
def test_each_mode_lands_the_documented_before_after_and_update_description(
    replica_set, db_name, tmp_path, mode, full_update_type
):
    config = _config(tmp_path, db_name, capture_mode=mode, capture_mode_full_update_type=full_update_type)
    rows = _capture(replica_set, db_name, config)
    pre, full, post_image = mode in PRE_IMAGE_MODES, mode in FULL_MODES, full_update_type == "post_image"

    def update_after(exact: dict, looked_up: dict | None) -> dict | None:
        """An update's ``after``: the post-image, or the document as found when the stream was read."""
        return (exact if post_image else looked_up) if full else None

    def before(document: dict) -> dict | None:
        return document if pre else None

    # (op, before, after) of every row in oplog order; the tombstone follows the delete
    expected = [
        ("r", None, {"_id": 0, "snapshotted": True}),  # snapshot reads have no before
        ("c", None, V1),
        ("u", before(V1), update_after(V2, None)),  # looked up after the delete: nothing found
        ("u", before(V2), update_after(V3, None)),
        ("u", before(V3), V4),  # a replace always carries the new document
        ("d", before(V4), None),
        (None, None, None),
        ("c", None, W1),
        ("u", before(W1), update_after(W2, W3)),  # lookup reads the later document
        ("u", before(W2), update_after(W3, W3)),
    ]
    assert [(r["op"], _document(r["before"]), _document(r["after"])) for r in rows] == expected

    descriptions = [r["updateDescription"] for r in rows]
    set_unset, truncate = descriptions[2], descriptions[3]
    assert bson.decode(set_unset["updatedFields"]) == {"name": "b"}
    assert set_unset["removedFields"] == ["x"] and set_unset["truncatedArrays"] == []
    assert bson.decode(truncate["updatedFields"]) == {} and truncate["removedFields"] == []
    assert truncate["truncatedArrays"] == [{"field": "tags", "newSize": 2}]
    assert bson.decode(descriptions[8]["updatedFields"]) == {"n": 1}
    assert [i for i, d in enumerate(descriptions) if d is not None] == [2, 3, 8, 9]  # updates only


@pytest.mark.parametrize("mode", [*PRE_IMAGE_MODES, "change_streams_update_full"])
def test_a_rewritten_delete_row_holds_the_before_image_when_the_mode_records_one(
    replica_set, db_name, tmp_path, mode
):
    """Debezium's DBZ-6725 end to end: pulled from mongod, transformed by the Spark job. The delete
    row holds the pre-image's fields; without a pre-image mode, ``_id`` only. Its tombstone row is
    a key without a value either way, and the delete still deletes from the state."""
    config = _config(tmp_path, db_name, capture_mode=mode)
    _capture(replica_set, db_name, config)
    source = CdcSource(config.name, db_name, config.lake_root, config.topic_prefix)
    source.transform(
        *FlatteningOptions(delete_tombstone_handling_mode="rewrite-with-tombstone").spark_arguments()
    )

    def fields(row: dict) -> dict:
        """The row's non-null document fields."""
        return {k: v for k, v in row.items() if not k.startswith("__") and k != "hour" and v is not None}

    rows = sorted(
        (row for row in source.change_rows("items") if row["__deleted"]),
        key=lambda row: row["__op"] is None,  # one document's delete and its tombstone
    )
    assert [(row["__op"], fields(row)) for row in rows] == [
        ("d", V4 if mode in PRE_IMAGE_MODES else {"_id": 1}),
        (None, {"_id": 1}),  # the tombstone
    ]
    with replica_set.client() as client:
        assert_state_equals_collection(source, client, "items")


def test_source_block_and_export_carry_every_debezium_field(replica_set, db_name, tmp_path):
    config = _config(
        tmp_path,
        db_name,
        capture_mode="change_streams_update_full_with_pre_image",
        capture_mode_full_update_type="post_image",
    )
    rows = _capture(replica_set, db_name, config)
    snapshot_read, create, update = rows[0]["source"], rows[1]["source"], rows[2]
    for source in (snapshot_read, create):
        assert (source["ts_us"], source["ts_ns"]) == (source["ts_ms"] * 1000, source["ts_ms"] * 1_000_000)
        assert source["sequence"] is None
    assert snapshot_read["snapshot"] is True and snapshot_read["wallTime"] is None
    # a change event's wallTime: when the write happened, to the millisecond (MongoDB 6.0+)
    assert create["snapshot"] is False and create["wallTime"] == create["ts_ms"]
    assert create["wallTime"] <= rows[1]["ts_ms"]

    value = debezium_record(update)["value"]
    assert json_util.loads(value["before"]) == V1 and json_util.loads(value["after"]) == V2
    assert (value["ts_us"], value["ts_ns"]) == (update["ts_ms"] * 1000, update["ts_ms"] * 1_000_000)
    assert set(value["source"]) >= {"sequence", "ts_us", "ts_ns", "wallTime", "lsid", "txnNumber", "ord"}
    assert debezium_record(rows[0])["value"]["before"] is None


@pytest.mark.parametrize(
    ("mode", "full_update_type", "expected"),
    [
        ("change_streams", "lookup", {}),
        ("change_streams_update_full", "lookup", {"full_document": "updateLookup"}),
        ("change_streams_update_full", "post_image", {"full_document": "whenAvailable"}),
        ("change_streams_with_pre_image", "lookup", {"full_document_before_change": "whenAvailable"}),
        (
            "change_streams_update_full_with_pre_image",
            "post_image",
            {"full_document": "whenAvailable", "full_document_before_change": "whenAvailable"},
        ),
    ],
)
def test_watch_options_are_debeziums(tmp_path, mode, full_update_type, expected):
    config = _config(tmp_path, "db", capture_mode=mode, capture_mode_full_update_type=full_update_type)
    assert watch_options(config) == expected


def _prepare_collections(client, db_name: str) -> None:
    db = client[db_name]
    db.create_collection("with_images", **IMAGES_ON)
    for name in ("orders", "customers", "scratch"):
        db.create_collection(name)
        db[name].insert_one({"_id": 1})


def _lake_files(config: SourceConfig) -> list[str]:
    found = []
    for parent, _, names in os.walk(config.lake_root):
        found.extend(os.path.join(parent, name) for name in names)
    return sorted(found)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"capture_mode": "change_streams_with_pre_image"}, "capture.mode 'change_streams_with_pre_image'"),
        ({"capture_mode_full_update_type": "post_image"}, "capture.mode.full.update.type 'post_image'"),
    ],
)
def test_missing_images_refuse_the_snapshot_naming_every_collection(
    replica_set, db_name, tmp_path, settings, reason
):
    config = _config(tmp_path, db_name, **settings)
    config = dataclasses.replace(config, collection_exclude=(re.compile(re.escape(f"{db_name}.scratch")),))
    keeper = memory_keeper(config, "rs0")
    with make_client(replica_set.uri) as client:
        _prepare_collections(client, db_name)
        with pytest.raises(ImagesNotEnabledError) as failure:
            run_snapshot(ReplicaSetCapture(client, config, keeper))
    message = str(failure.value)
    assert reason in message
    assert f"do not record them: {db_name}.customers, {db_name}.orders." in message
    enable = "changeStreamPreAndPostImages: {enabled: true}"
    for name in ("customers", "orders"):
        assert f'use {db_name}; db.runCommand({{collMod: "{name}", {enable}}})' in message
    assert "with_images" not in message and "scratch" not in message  # enabled, or not captured
    assert keeper.load() is None and _lake_files(config) == []


def test_missing_images_refuse_the_pull_leaving_offset_and_lake_untouched(replica_set, db_name, tmp_path):
    lookup = _config(tmp_path, db_name)
    keeper = memory_keeper(lookup, "rs0")
    with make_client(replica_set.uri) as client:
        _prepare_collections(client, db_name)
        run_snapshot(ReplicaSetCapture(client, lookup, keeper))
        committed, landed = keeper.load(), _lake_files(lookup)
        client[db_name].orders.insert_one({"_id": 2})
        pre_image = dataclasses.replace(lookup, capture_mode="change_streams_update_full_with_pre_image")
        with pytest.raises(ImagesNotEnabledError, match=f"{db_name}.customers, {db_name}.orders, "):
            pull_changes(ReplicaSetCapture(client, pre_image, keeper))
        assert keeper.load() == committed and _lake_files(lookup) == landed

        # the fix the message gives, and the pull goes ahead
        for name in ("orders", "customers", "scratch"):
            client[db_name].command({"collMod": name, **IMAGES_ON})
        result = pull_changes(ReplicaSetCapture(client, pre_image, keeper))
    assert result.events[f"{db_name}.orders"] == {"c": 1}


def _write(tmp_path, content: dict):
    path = tmp_path / "shop.yaml"
    path.write_text(yaml.safe_dump(content))
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"capture.mode": "oplog"},
            "key 'capture.mode' is 'oplog'; allowed values: change_streams_update_full, change_streams, "
            "change_streams_with_pre_image, change_streams_update_full_with_pre_image",
        ),
        (
            {"capture.mode.full.update.type": "required"},
            "key 'capture.mode.full.update.type' is 'required'; allowed values: lookup, post_image",
        ),
        (
            {"capture.mode": "change_streams_with_pre_image", "capture.mode.full.update.type": "post_image"},
            "key 'capture.mode.full.update.type' is 'post_image', but capture.mode "
            "'change_streams_with_pre_image' puts no full document in updates; use capture.mode "
            "change_streams_update_full, change_streams_update_full_with_pre_image, or drop the key",
        ),
    ],
)
def test_bad_capture_settings_are_refused_at_parse_time(tmp_path, content, message):
    path = _write(tmp_path, {"topic.prefix": "p", **content})
    with pytest.raises(SourceConfigError) as failure:
        load_source(path)
    assert str(failure.value) == f"{path}: {message}"


def test_capture_settings_parse(tmp_path):
    config = load_source(_write(tmp_path, {"topic.prefix": "p"}))
    defaults = (config.capture_mode, config.capture_mode_full_update_type)
    assert defaults == ("change_streams_update_full", "lookup")
    config = load_source(
        _write(
            tmp_path,
            {
                "topic.prefix": "p",
                "capture.mode": "change_streams_update_full_with_pre_image",
                "capture.mode.full.update.type": "post_image",
            },
        )
    )
    assert (config.capture_mode, config.capture_mode_full_update_type) == (
        "change_streams_update_full_with_pre_image",
        "post_image",
    )


def test_pre_image_mode_through_the_dag_refuses_then_reaches_state(cdc_source, replica_set, db_name):
    """End to end: the refusal fails the run, the fix lets it go on, and the state table (built from
    update descriptions alone, as this mode has no full documents) equals the collection."""
    source = cdc_source(db_name, **{"capture.mode": "change_streams_with_pre_image"})
    with replica_set.client() as client:
        db = client[db_name]
        db.create_collection("items", **IMAGES_ON)
        db.create_collection("plain")
        db.items.insert_many([V1, W1])
        db.plain.insert_one({"_id": 1})
        refused = source.run(expect="failed", skip_spark=True)
        failed = {ti.task_id for ti in refused.get_task_instances() if ti.state == "failed"}
        # the refusal is the shard's; the summary then names the shard that did not sync, and
        # stuck_collections fails a run whose transform did not run
        assert failed == {
            "snapshot_start",
            "shard_sync.pull",
            "shard_sync.snapshot",
            "plan_transform",
            "summary",
            "stuck_collections",
        }
        assert source.raw_rows("items") == []

        db.command({"collMod": "plain", **IMAGES_ON})
        source.run(skip_spark=True)  # the snapshot; Spark folds it in with the changes below
        db.items.update_one({"_id": 1}, {"$set": {"name": "b"}, "$unset": {"x": ""}})
        db.items.update_one({"_id": 1}, [{"$set": {"tags": {"$slice": ["$tags", 2]}}}])
        db.items.update_one({"_id": 2}, {"$set": {"n": 1}})
        db.items.replace_one({"_id": 2}, {"_id": 2, "replaced": True})
        db.plain.delete_one({"_id": 1})
        source.run()
        for collection in ("items", "plain"):
            assert_state_equals_collection(source, client, collection)
    befores = [bson.decode(r["before"]) for r in source.raw_rows("items") if r["op"] == "u"]
    assert befores == [V1, V2, W1, {"_id": 2, "n": 1}]
