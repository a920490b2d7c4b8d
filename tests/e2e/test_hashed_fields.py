"""``field.hash.list`` against a real mongod and the real Spark job: in every capture mode no clear
value reaches any file of the lake, equal values hash equally across collections, the verification
finds no drift; a key change is refused until a re-snapshot; the key comes from an Airflow
connection, and without it the run fails before anything lands."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from pathlib import Path

import bson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdc_support import CdcSource

from mongo_cdc.capture.field_hash_marks import FieldHashChanged
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config.field_rules import parse_rules
from mongo_cdc.field_hashing import HashKey
from mongo_cdc.verify.verification import verify_replica_set
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

SECRET = "a long random secret of the tests"
IMAGES_ON = {"changeStreamPreAndPostImages": {"enabled": True}}
# Clear values sharing no run of bytes with each other, so a compressed file would still hold them
# as literals; CONTROL is not hashed and must be found, or the scan proves nothing.
EMAIL, EMAIL_2, SSN, SSN_2 = "qzv7k@mail-a.test", "wx3jp@mail-b.test", "SSN-4821-77", "SSN-9036-13"
PHONE, PHONE_2, PHONE_3 = "TEL-31-5550-1", "TEL-62-8807-2", "TEL-95-2244-3"
CONTROL = "CTRL-clear-h8d2"
CLEAR = (EMAIL, EMAIL_2, SSN, SSN_2, PHONE, PHONE_2, PHONE_3)
MODES = (
    "change_streams",
    "change_streams_update_full",
    "change_streams_with_pre_image",
    "change_streams_update_full_with_pre_image",
)


def hashed(value: str, secret: str = SECRET) -> str:
    """The HMAC of a BSON string element (type 0x02, then its int32 length, bytes and NUL), by hand."""
    data = value.encode() + b"\x00"
    element = b"\x02" + len(data).to_bytes(4, "little") + data
    return hmac.new(secret.encode(), element, hashlib.sha256).hexdigest()


def hashing_source(tmp_path: Path, db_name: str, secret: str = SECRET, **settings):
    entries = [f"{db_name}.users.profile.ssn", f"{db_name}.*.email", f"{db_name}.users.contacts.phone"]
    config = database_source(
        "pii",
        tmp_path / "lake",
        re.escape(db_name),
        field_hash=parse_rules("field.hash.list", entries),
        **settings,
    )
    return config.with_hash_key(HashKey(secret.encode()))


def files_holding(lake_root: str, values: tuple[str, ...]) -> dict[str, list[str]]:
    """Every file of the lake holding one of ``values``: in its bytes, or in the decompressed
    content of a Parquet file (its columns as uncompressed Arrow IPC bytes)."""
    found: dict[str, list[str]] = {}
    for path in Path(lake_root).rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            data += sink.getvalue().to_pybytes()
        if held := [value for value in values if value.encode() in data]:
            found[str(path.relative_to(lake_root))] = held
    return found


@pytest.mark.parametrize("mode", MODES)
def test_no_clear_value_reaches_the_lake_and_hashes_join_across_collections(
    replica_set, db_name, tmp_path, mode
):
    config = hashing_source(tmp_path, db_name, capture_mode=mode)
    keeper = memory_keeper(config, replica_set.name)
    with make_client(replica_set.uri) as client:
        db = client[db_name]
        for name in ("users", "orders"):
            db.create_collection(name, **IMAGES_ON)
        db.users.insert_one(
            {
                "_id": 1,
                "email": EMAIL,
                "profile": {"ssn": SSN, "age": 41},
                "contacts": [{"phone": PHONE}],
                "note": CONTROL,
            }
        )
        db.orders.insert_one({"_id": 10, "email": EMAIL, "total": 5})
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        db.users.insert_one({"_id": 2, "email": EMAIL_2, "profile": {"ssn": SSN_2}, "contacts": []})
        db.users.update_one({"_id": 1}, {"$set": {"contacts.0.phone": PHONE_2, "profile.age": 42}})
        db.users.update_one({"_id": 2}, {"$push": {"contacts": {"phone": PHONE_3}}})
        db.orders.insert_one({"_id": 11, "email": EMAIL_2, "total": 7})
        db.orders.delete_one({"_id": 10})
        pull_changes(ReplicaSetCapture(client, config, keeper))
        source = CdcSource(config.name, db_name, config.lake_root, config.topic_prefix)
        source.transform()
        verified = verify_replica_set(ReplicaSetCapture(client, config, keeper), "report")

    assert files_holding(config.lake_root, CLEAR) == {}
    assert files_holding(config.lake_root, (CONTROL,))  # the scan finds what is there in clear
    users = {row["_id"]: row for row in source.state_rows("users")}
    orders = {row["_id"]: row for row in source.state_rows("orders")}
    assert users[1]["email"] == hashed(EMAIL) and orders[11]["email"] == users[2]["email"] == hashed(EMAIL_2)
    assert (users[1]["profile"]["ssn"], users[1]["profile"]["age"]) == (hashed(SSN), 42)
    assert [c["phone"] for c in users[1]["contacts"]] == [hashed(PHONE_2)]
    assert [c["phone"] for c in users[2]["contacts"]] == [hashed(PHONE_3)]
    changes = source.change_rows("orders")
    assert sorted((row["__op"], row["email"]) for row in changes if row["__op"] in ("r", "c")) == [
        ("c", hashed(EMAIL_2)),
        ("r", hashed(EMAIL)),
    ]
    assert verified.drift == 0 and not verified.failed and verified.skipped is None


def test_a_key_change_is_refused_until_a_resnapshot_adopts_it(replica_set, db_name, tmp_path):
    config = hashing_source(tmp_path, db_name)
    rotated = hashing_source(tmp_path, db_name, secret="the rotated secret")
    keeper = memory_keeper(config, replica_set.name)
    users = f"{db_name}.users"
    with make_client(replica_set.uri) as client:
        client[db_name].users.insert_one({"_id": 1, "email": EMAIL})
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        client[db_name].users.insert_one({"_id": 2, "email": EMAIL_2})
        with pytest.raises(FieldHashChanged, match=re.escape(f'"collections": ["{users}"]')):
            pull_changes(ReplicaSetCapture(client, rotated, keeper))
        with pytest.raises(FieldHashChanged):
            verify_replica_set(ReplicaSetCapture(client, rotated, keeper), "repair")
        assert len(keeper.lake.committed_raw(users)) == 1  # nothing landed under the new key
        run_snapshot(ReplicaSetCapture(client, rotated, keeper), only=[users])
        pull_changes(ReplicaSetCapture(client, rotated, keeper))
    landed = [
        (row["op"], bson.decode(row["after"])["email"])
        for row in keeper.lake.committed_raw(users).to_pylist()
    ]
    new_key = "the rotated secret"
    assert sorted(landed) == [
        ("c", hashed(EMAIL_2, new_key)),
        ("r", hashed(EMAIL)),
        ("r", hashed(EMAIL, new_key)),
        ("r", hashed(EMAIL_2, new_key)),
    ]


def test_the_key_is_the_password_of_an_airflow_connection(cdc_source, replica_set, db_name, monkeypatch):
    """Through the DAG: without the connection ``discover`` fails and nothing lands; with it the
    snapshot hashes with its password."""
    with replica_set.client() as client:
        client[db_name].users.insert_one({"_id": 1, "email": EMAIL})
    source = cdc_source(
        db_name, **{"field.hash.list": f"{db_name}.users.email", "field.hash.connection.id": "pii_key"}
    )
    monkeypatch.delenv("AIRFLOW_CONN_PII_KEY", raising=False)
    run = source.run(expect="failed", skip_spark=True)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["discover"] == "failed"
    assert not os.path.exists(source.lake_root)  # nothing landed, not even a table
    monkeypatch.setenv("AIRFLOW_CONN_PII_KEY", json.dumps({"conn_type": "generic", "password": SECRET}))
    source.run(skip_spark=True)  # snapshot_start records the mark, snapshot_copy hashes: both need the key
    landed = [(row["op"], bson.decode(row["after"])["email"]) for row in source.raw_rows("users")]
    assert landed == [("r", hashed(EMAIL))]
