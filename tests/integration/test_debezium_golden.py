"""Golden tests from the seed documents: Debezium's customer 1004 events and its _id key table."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import bson
import pytest
from bson import Binary, Int64, ObjectId, json_util

from mongo_cdc import extjson
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.lake.debezium_export import debezium_record, main, raw_rows, write_json_lines
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

# 000_2a07268966eb8866.txt, "Examples of representing document _id fields in event key payloads"
KEY_TABLE = [
    (1234, '{ "id" : "1234" }'),
    (12.34, '{ "id" : "12.34" }'),
    ("1234", '{ "id" : "\\"1234\\"" }'),
    (
        {"hi": "kafka", "nums": [10.0, 100.0, 1000.0]},
        '{ "id" : "{\\"hi\\" : \\"kafka\\", \\"nums\\" : [10.0, 100.0, 1000.0]}" }',
    ),
    (ObjectId("596e275826f08b2730779e1f"), '{ "id" : "{\\"$oid\\" : \\"596e275826f08b2730779e1f\\"}" }'),
    (Binary(b"kafka", 0), '{ "id" : "{\\"$binary\\" : \\"a2Fma2E=\\", \\"$type\\" : \\"00\\"}" }'),
]
# the same document, as the seed's create event shows it
SEED_AFTER = (
    '{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : "Kretchmar",'
    '"email" : "annek@noanswer.org"}'
)
EJSON = json_util.JSONOptions(datetime_conversion=bson.DatetimeConversion.DATETIME_MS)


def _bson(ejson_text: str) -> bytes:
    """Extended JSON (any dialect: the seed's legacy one or ours) to exact BSON bytes."""
    return bson.encode({"v": json_util.loads(ejson_text, json_options=EJSON)})


@pytest.mark.parametrize(("document_id", "seed_key"), KEY_TABLE)
def test_keys_encode_every_id_type_as_debezium_does(document_id, seed_key):
    ours = json.loads(extjson.document_key(document_id))
    seed = json.loads(seed_key)
    assert set(ours) == {"id"}
    # same value and same BSON type; only whitespace and the EJSON dialect of $binary may differ
    assert _bson(ours["id"]) == _bson(seed["id"])
    if not isinstance(document_id, Binary):
        assert re.sub(r"\s", "", ours["id"]) == re.sub(r"\s", "", seed["id"])


@pytest.fixture
def customer_1004_events(replica_set, db_name, tmp_path):
    config = database_source("inventory", tmp_path, db_name, topic_prefix="fulfillment")
    keeper = memory_keeper(config, "rs0")
    with make_client(replica_set.uri) as client:
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        customers = client[db_name].customers
        customers.insert_one(json_util.loads(SEED_AFTER))
        customers.update_one({"_id": Int64(1004)}, {"$set": {"first_name": "Anne Marie"}})
        customers.update_one({"_id": Int64(1004)}, {"$unset": {"email": ""}})
        customers.delete_one({"_id": Int64(1004)})
        pull_changes(ReplicaSetCapture(client, config, keeper))
    return config, raw_rows(keeper.lake, f"{db_name}.customers"), db_name


def test_customer_1004_create_update_delete_match_the_seed_events(customer_1004_events):
    _, rows, db_name = customer_1004_events
    assert [r["op"] for r in rows] == ["c", "u", "u", "d", None]  # the delete is followed by a tombstone
    assert {r["key"] for r in rows} == {'{"id":"{\\"$numberLong\\":\\"1004\\"}"}'}
    create, update, unset, delete, tombstone = (debezium_record(r) for r in rows)

    assert _bson(create["value"]["after"]) == _bson(SEED_AFTER)
    # the text Debezium consumers read, byte for byte: the raw zone's BSON rendered as mongo-cdc EJSON
    assert create["value"]["after"] == (
        '{"_id":{"$numberLong":"1004"},"first_name":"Anne","last_name":"Kretchmar","email":"annek@noanswer.org"}'
    )
    source = create["value"]["source"]
    assert (source["connector"], source["name"], source["db"], source["rs"], source["collection"]) == (
        "mongodb",
        "fulfillment",
        db_name,
        "rs0",
        "customers",
    )
    assert source["snapshot"] is False and source["ts_ms"] > 0 and source["ord"] >= 1
    assert create["value"]["ts_ms"] >= source["ts_ms"]

    # the seed's patch {"$set": {"first_name": "Anne Marie"}}, as a change stream describes it
    description = update["value"]["updateDescription"]
    assert description["updatedFields"] == '{"first_name":"Anne Marie"}'
    assert description["removedFields"] == []
    # update.full looks the document up when the stream is read; it is deleted by then
    assert update["value"]["after"] is None
    # 002_34518fa5104a0e2e.txt, "$unset handling": removedFields lists the removed field
    assert unset["value"]["updateDescription"]["removedFields"] == ["email"]

    assert delete["value"]["op"] == "d" and delete["value"]["after"] is None
    assert tombstone == {"key": delete["key"], "value": None}


def test_export_writes_one_json_line_per_record(customer_1004_events, tmp_path, capsys):
    config, rows, db_name = customer_1004_events
    buffer = io.StringIO()
    assert write_json_lines((debezium_record(r) for r in rows), buffer) == 5
    out = tmp_path / "customers.jsonl"
    assert (
        main(
            [
                "--lake-root",
                config.lake_root,
                "--topic-prefix",
                "fulfillment",
                "--collection",
                f"{db_name}.customers",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_text() == buffer.getvalue()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert set(lines[0]["value"]) == {
        "before",
        "after",
        "updateDescription",
        "source",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
        "transaction",
    }
    assert "5 records" in capsys.readouterr().err


def _export(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m mongo_cdc.lake.debezium_export`` as a user runs it, from ``cwd``."""
    command = [sys.executable, "-m", "mongo_cdc.lake.debezium_export", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_export_command_takes_relative_paths(customer_1004_events, tmp_path):
    config, rows, db_name = customer_1004_events
    expected = io.StringIO()
    write_json_lines((debezium_record(r) for r in rows), expected)
    work = tmp_path / "work"
    work.mkdir()
    lake_root = os.path.relpath(config.lake_root, work)  # e.g. ../lake
    arguments = (
        "--lake-root",
        lake_root,
        "--topic-prefix",
        "fulfillment",
        "--collection",
        f"{db_name}.customers",
    )
    done = _export(*arguments, "--output", "out/customers.jsonl", cwd=work)
    assert done.returncode == 1  # no such folder: said, without a traceback
    assert done.stderr == "error: cannot write --output out/customers.jsonl: No such file or directory\n"
    (work / "out").mkdir()
    done = _export(*arguments, "--output", "out/customers.jsonl", cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / "out" / "customers.jsonl").read_text() == expected.getvalue()
    assert done.stderr == "5 records\n"


def test_the_export_command_refuses_an_unknown_collection_naming_the_known_ones(
    customer_1004_events, tmp_path
):
    config, _, db_name = customer_1004_events
    known = f"{db_name}.customers"
    done = _export("--lake-root", config.lake_root, "--topic-prefix", "fulfillment",
                   "--collection", f"{db_name}.customer", "--output", "out.jsonl", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == (
        f"error: no collection '{db_name}.customer' in the lake at {config.lake_root} under topic prefix "
        f"'fulfillment'; its collections: {known}\n"
    )
    assert not (tmp_path / "out.jsonl").exists()
    # another topic prefix: a lake without batches, and what to check
    done = _export("--lake-root", config.lake_root, "--topic-prefix", "dbserver1", "--collection", known,
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1
    assert "which has no committed batch: check --lake-root and --topic-prefix" in done.stderr
    assert done.stdout == ""
