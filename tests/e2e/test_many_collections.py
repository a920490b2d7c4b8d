"""A source of many small collections (issue 28) lands each one exactly as MongoDB holds it, and a
collection that fails holds back none of the others, however many run beside it.

Two DAG runs: the first snapshots every collection; then every collection changes (an insert and an
update each) and one collection's state table is damaged, so the second run's transform of it fails
while the others, transformed side by side, land."""

from __future__ import annotations

from cdc_support import assert_state_equals_collection, truncate_state_files

from mongo_cdc.lake.batch_log import last_batches
from mongo_cdc.transform.applied_mark import read_mark

COLLECTIONS = 200
DOCUMENTS = 3  # per collection
BROKEN = "c0100"  # in the middle of the collections' order: failures before and after it are possible


def names() -> list[str]:
    return [f"c{index:04d}" for index in range(COLLECTIONS)]


def summary_of(run) -> dict:
    return run.get_task_instance("summary").xcom_pull(task_ids="summary")


def test_many_collections_land_exactly_and_one_failing_holds_back_none_of_the_others(
    cdc_source, replica_set, db_name, capfd
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        db = client[db_name]
        for name in names():
            db[name].insert_many([{"_id": index, "name": name, "n": index} for index in range(DOCUMENTS)])
        run = source.run()
        assert summary_of(run)["batches_behind"] == {f"{db_name}.{name}": 0 for name in names()}
        for name in names():
            assert_state_equals_collection(source, client, name)

        truncate_state_files(source, BROKEN)
        for name in names():
            db[name].insert_one({"_id": DOCUMENTS, "name": name, "n": DOCUMENTS})
            db[name].update_one({"_id": 0}, {"$set": {"n": 100}})
        capfd.readouterr()
        run = source.run(expect="failed")
        output = "".join(capfd.readouterr())
        states = {ti.task_id: ti.state for ti in run.get_task_instances() if ti.map_index < 1}
        assert (states["transform"], states["summary"], states["stuck_collections"]) == (
            "failed",
            "success",
            "failed",
        )
        broken = f"{db_name}.{BROKEN}"
        behind = summary_of(run)["batches_behind"]
        assert {namespace for namespace, count in behind.items() if count} == {broken}
        # the job names the one collection, and only it, among the 200 it ran side by side
        count = behind[broken]
        named = f"{broken} ({count} batch{'' if count == 1 else 'es'} behind)"
        assert f"the transform failed for {named}; the other collections landed" in output
        # the job's applied mark: the next runs read the tables of the failed collection only, until
        # a batch names another
        mark = read_mark(source.lake)
        assert mark is not None and mark.lagging == {broken}
        assert mark.through == {rs: batch.seq for rs, batch in last_batches(source.lake.batches()).items()}
        for name in names():
            if name != BROKEN:
                assert_state_equals_collection(source, client, name)
                # exactly once: a change row per event (the snapshot's reads, the insert, the update)
                assert sorted(row["__op"] for row in source.change_rows(name)) == [
                    "c",
                    *["r"] * DOCUMENTS,
                    "u",
                ]
