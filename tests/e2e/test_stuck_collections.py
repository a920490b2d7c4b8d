"""A collection whose transform fails holds back no other, and
is loud. Its state table's data file is damaged (a real failure of its MERGE) while both
collections keep landing: every run fails naming it and the committed batches it is behind (in
the Spark job's summary and log, the ``summary`` task and its tables' asset events), the other
collection lands, and once the file is restored the next run catches it up and reports 0."""

from __future__ import annotations

import json
import subprocess

from cdc_support import assert_state_equals_collection, asset_events, truncate_state_files
from deltalake import DeltaTable

from mongo_cdc_airflow.assets import TABLE_ZONES, table_asset_uri

BROKEN, FINE = "a_broken", "z_fine"  # the broken one first: the transform starts them in name order


def task_states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances() if ti.map_index < 1}


def batches_behind(run) -> dict[str, int]:
    return run.get_task_instance("summary").xcom_pull(task_ids="summary")["batches_behind"]


def test_a_failing_collection_is_reported_every_run_until_it_catches_up_and_holds_back_no_other(
    cdc_source, replica_set, db_name, capfd
):
    source = cdc_source(db_name)
    broken, fine = f"{db_name}.{BROKEN}", f"{db_name}.{FINE}"

    def uris(namespace: str) -> dict[str, str]:
        return {
            zone: table_asset_uri(source.location, zone, source.prefix, namespace) for zone in TABLE_ZONES
        }

    with replica_set.client() as client:
        db = client[db_name]
        for collection in (BROKEN, FINE):
            db[collection].insert_many([{"_id": i, "n": i} for i in range(10)])
        run = source.run()
        assert batches_behind(run) == {broken: 0, fine: 0}
        assert task_states(run)["stuck_collections"] == "skipped"
        landed = source.lake.committed()
        originals = truncate_state_files(source, BROKEN)
        versions = {
            zone: DeltaTable(uris(broken)[zone].removeprefix("file://")).version() for zone in TABLE_ZONES
        }

        expected_behind = 0
        for round_number in (1, 2):
            # both collections keep changing; the broken one's MERGE reads its damaged file
            db[BROKEN].update_one({"_id": round_number}, {"$set": {"n": 100 + round_number}})
            db[BROKEN].insert_one({"_id": 10 + round_number, "n": round_number})
            db[FINE].insert_many([{"_id": 100 * round_number + i} for i in range(3)])
            db[FINE].delete_one({"_id": round_number})
            capfd.readouterr()
            run = source.run(expect="failed")
            output = "".join(capfd.readouterr())
            states = task_states(run)
            assert (states["transform"], states["summary"], states["stuck_collections"]) == (
                "failed",
                "success",
                "failed",
            )
            # the batches the pulls committed since the file broke with rows of the broken collection
            expected_behind = sum(
                1
                for batch in source.lake.batches()
                if broken in batch.namespaces and batch.seq > landed.get(batch.rs, 0)
            )
            assert expected_behind >= round_number  # it grows as its batches keep landing
            assert batches_behind(run) == {broken: expected_behind, fine: 0}
            behind = f"{broken} ({expected_behind} batch{'' if expected_behind == 1 else 'es'} behind)"
            assert f"the transform failed for {behind}; the other collections landed" in output
            # the other collection landed in the very run its predecessor in name order failed
            assert_state_equals_collection(source, client, FINE)
            # each table's asset event says how far it is behind, every run; the broken ones are unchanged
            events = asset_events(source.dag_id, run.run_id)
            assert set(events) == {*uris(broken).values(), *uris(fine).values()}
            for zone in TABLE_ZONES:
                assert events[uris(broken)[zone]]["batches_behind"] == expected_behind
                assert events[uris(broken)[zone]]["table_version"] == versions[zone]
                assert events[uris(fine)[zone]]["batches_behind"] == 0

        # the Spark job itself: the failed collection in its summary, a non-zero exit, one stderr line
        done = subprocess.run(source.transform_command(), capture_output=True, text=True, check=False)
        assert done.returncode == 1 and done.stdout.strip(), done.stderr[-5000:]
        # spark-submit passes the driver's stderr on in its stdout: the log, the message, the summary
        *log, message, last = done.stdout.strip().splitlines()
        summary = json.loads(last)
        assert list(summary["collections"]) == []  # the fine one has nothing new: it does not run
        assert list(summary["failed"]) == [broken]
        assert summary["failed"][broken]["batches_behind"] == expected_behind
        # the error's type and first line: delta-rs names the damaged file its MERGE could not read
        assert any(path.name in summary["failed"][broken]["error"] for path in originals)
        assert message.startswith(f"cdc_transform: the transform failed for {behind}; the other")
        failure = next(index for index, line in enumerate(log) if f"FAILED: {behind}" in line)
        assert log[failure + 1] == "Traceback (most recent call last):"

        # the cause removed: the next run catches the collection up, and the reports go back to 0
        for path, data in originals.items():
            path.write_bytes(data)
        run = source.run()
        assert task_states(run)["stuck_collections"] == "skipped"
        assert batches_behind(run) == {broken: 0, fine: 0}
        events = asset_events(source.dag_id, run.run_id)
        assert {events[uri]["batches_behind"] for uri in uris(broken).values()} == {0}
        for collection in (BROKEN, FINE):
            assert_state_equals_collection(source, client, collection)
