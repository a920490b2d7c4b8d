"""Through Airflow: a corrupted offset fails the run naming its Variable and writes nothing; a writer
claim left by a crashed task does not block the next run; an offset saved unchanged in the Airflow
UI keeps working, and one of the previous format the UI broke fails at once with the exact fix."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from airflow.models import Variable
from airflow.utils.session import create_session
from airflow_ui import as_the_ui_saves
from cdc_support import assert_state_equals_collection
from datagen import FALLBACK_FIELDS, load, random_writes

from mongo_cdc.capture.offsets import offset_key, parse_offset
from mongo_cdc.lake.storage import table_if_exists


def _raw_files(source) -> list[str]:
    """Every data file of the raw tables, and each table's version."""
    tables = [
        table_if_exists(source.lake.raw_uri(f"{source.database}.{c}"), {}) for c in ("customers", "orders")
    ]
    return sorted(uri for table in tables for uri in [str(table.version()), *table.file_uris()])


def test_a_corrupted_offset_fails_the_run_naming_the_variable_and_writes_nothing(
    cdc_source, replica_set, db_name
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        load(client[db_name], {"customers": 20, "orders": 20})
        source.run(skip_spark=True)
        client[db_name].customers.insert_one({"_id": "after"})
        key = offset_key(source.name, "rs0")
        Variable.set(key, '{"format": 1, "batch_seq": "seven"')  # a hand edit gone wrong
        files = _raw_files(source)
        run = source.run(expect="failed", skip_spark=True)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["shard_sync.pull"] == "failed" and states["shard_sync.snapshot"] == "failed"
        assert states["plan_transform"] == "failed" and states["transform"] == "upstream_failed"  # no Spark
        assert _raw_files(source) == files
        assert Variable.get(key) == '{"format": 1, "batch_seq": "seven"'


def test_a_claim_left_by_a_crashed_task_does_not_block_the_next_run(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        load(client[db_name], {"customers": 20})
        source.run(skip_spark=True)
        key = offset_key(source.name, "rs0")
        offset = json.loads(Variable.get(key))
        offset["writer"] = {
            "dag_id": source.dag_id,
            "run_id": "gone",
            "task_id": "shard_sync.pull",
            "map_index": 0,
        }
        Variable.set(key, json.dumps(offset))
        client[db_name].customers.insert_one({"_id": "after the crash"})
        source.run(skip_spark=True)
        assert json.loads(Variable.get(key))["writer"] is None
        assert any(r["op"] == "c" for r in source.raw_rows("customers"))


@contextmanager
def _stored_variable(key: str) -> Iterator[Variable]:
    with create_session() as session:
        yield session.query(Variable).filter_by(key=key).one()


def _ui_save(key: str) -> None:
    """Open the Variable in Airflow's UI and save it unchanged (its description stays)."""
    with _stored_variable(key) as stored:
        stored.set_val(as_the_ui_saves(key, stored.val))


def _first_run(source, db) -> str:
    """Snapshot and stream two collections; the replica set's offset key."""
    load(db, {"customers": 20, "orders": 20})
    source.run(skip_spark=True)
    return offset_key(source.name, "rs0")


def _next_run_catches_up(source, client, seed: int) -> None:
    random_writes(client[source.database], 60, seed=seed)
    source.run()
    for collection in ("customers", "orders"):
        assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])


def test_an_offset_saved_unchanged_in_the_airflow_ui_keeps_the_next_run_going(
    cdc_source, replica_set, db_name
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        key = _first_run(source, client[db_name])
        _ui_save(key)
        _next_run_catches_up(source, client, seed=5)
    with _stored_variable(key) as stored:  # what the UI shows next to it
        assert "the lake's batch log" in stored.description


def _in_format_1(text: str) -> str:
    """An offset as the previous version wrote it: ``resume_token``, integer cluster times."""
    data = json.loads(text)
    data.update(format=1, resume_token=data.pop("resume_after"), cluster_time=int(data["cluster_time"]))
    if "cluster_time" in data["snapshot"]:
        data["snapshot"]["cluster_time"] = int(data["snapshot"]["cluster_time"])
    return json.dumps(data, sort_keys=True)


def test_an_offset_of_the_previous_format_the_ui_broke_fails_at_once_with_the_lakes_exact_fix(
    cdc_source, replica_set, db_name, monkeypatch, capfd, caplog
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        key = _first_run(source, client[db_name])
        caplog.clear()
        Variable.set(key, _in_format_1(Variable.get(key)))
        _ui_save(key)  # its resume token masked, its cluster times rounded
        monkeypatch.setenv("MONGO_CDC_TASK_RETRIES", "3")  # as in production: a retry would show
        capfd.readouterr()
        run = source.run(expect="failed", skip_spark=True)
        printed = "".join(capfd.readouterr())  # Airflow's own task log lines
        failed = run.get_task_instance("snapshot_start", map_index=0)
        assert (failed.state, failed.try_number, failed.max_tries) == ("failed", 1, 3)
        tries = {ti.task_id: ti.try_number for ti in run.get_task_instances()}
        assert max(tries.values()) == 1, tries  # retries are on, yet no task was retried
        # the one-line message is the task log's first error line, before Airflow's traceback
        first = next(record for record in caplog.records if record.levelno >= logging.ERROR)
        message = first.getMessage()
        assert message.startswith(f"offset '{key}'") and "\n" not in message
        airflow_error = re.search(r"^(\S+)Z \[error", printed, re.MULTILINE)
        assert first.created <= dt.datetime.fromisoformat(airflow_error.group(1) + "+00:00").timestamp()
        command = re.search(r"`(airflow variables set [^`]*)`", message).group(1)
        program, verb, action, fixed_key, value = shlex.split(command)
        assert (program, verb, action, fixed_key) == ("airflow", "variables", "set", key)
        last = source.lake.last_batch("rs0")
        fixed = parse_offset(key, value)
        assert (fixed.resume_token, fixed.cluster_time, fixed.batch_seq) == (
            last.resume_token, last.cluster_time, last.seq
        )  # fmt: skip
        Variable.set(key, value)  # the fix, as an on-call would paste it
        monkeypatch.setenv("MONGO_CDC_TASK_RETRIES", "0")
        _next_run_catches_up(source, client, seed=6)
