"""The state's MERGE on Spark's executors (issue 51): its ranges' tasks run on a local SparkContext.

* the cases of tests/unit/test_state_merge.py (tests/support/merge_cases.py), stated and drawn by
  Hypothesis: the MERGE by ranges, its tasks on Spark, gives the rows delta-rs' MERGE
  (``merge_into``) gives, from the same stored and source rows;
* a state table of several files, updated through a real mongod, the pull and the Spark job's
  ``main`` in this process: its MERGE rewrites only the files whose key range holds a changed
  document, in as many Spark tasks as the ranges reached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from cdc_support import spark_job
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from merge_cases import by_merge_into, by_ranges, random_case, stated_case

from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import LakeLocation, file_actions, row_count
from mongo_cdc.transform.state_merge import REWRITE_MAX_ROWS
from mongo_cdc.transform.stored_rows import keyed_files
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

# above state_merge.REWRITE_MAX_ROWS: the state is MERGEd, not written again whole
DOCUMENTS = REWRITE_MAX_ROWS + 500


def on_spark(context):
    """Run a MERGE's ranges as ``CollectionRun.run_tasks`` does: one Spark task each."""

    def run(parts: Sequence, task) -> list:
        return context.parallelize(list(parts), max(1, len(parts))).map(task).collect() if parts else []

    return run


def test_the_stated_case_merged_by_ranges_on_spark_is_the_reference_merge(tmp_path, spark_context):
    stored, source, gone = stated_case()
    expected = by_merge_into(tmp_path / "reference", stored, source, gone)
    for files, tasks in [(1, 1), (3, 2), (8, 4)]:
        ranged, merged, _ = by_ranges(
            tmp_path / f"r{files}", stored, source, gone, files, tasks, run=on_spark(spark_context)
        )
        assert ranged == expected
        assert merged.removed  # the copy's position deletes rows: files were written again


@settings(
    max_examples=16, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(
    seed=st.integers(0, 2**32 - 1),
    files=st.integers(1, 6),
    tasks=st.integers(1, 4),
    overlapping=st.booleans(),
)
def test_from_the_same_stored_and_source_rows_both_engines_give_the_same_rows(
    tmp_path_factory, spark_context, seed, files, tasks, overlapping
):
    root = tmp_path_factory.mktemp("merge")
    stored, source, gone, _ = random_case(seed)
    expected = by_merge_into(root / "reference", stored, source, gone)
    ranged, _, _ = by_ranges(
        root / "ranges", stored, source, gone, files, tasks, overlapping, run=on_spark(spark_context)
    )
    assert ranged == expected


def test_a_merge_of_several_files_rewrites_only_those_holding_a_changed_document(
    replica_set, spark_context, tmp_path, capfd
):
    database = f"executor_merge_{os.getpid()}"
    config = database_source("merge", tmp_path / "lake", re.escape(database))
    keeper = memory_keeper(config, "rs0")
    location = LakeLocation(str(tmp_path / "lake"))
    uri = table_uri(location, "state", "merge", database, "items")
    main = spark_job().main
    args = ["--lake-root", str(tmp_path / "lake"), "--topic-prefix", "merge"]
    with replica_set.client() as client:
        client.drop_database(database)
        items = client[database].items
        # zero-padded string _ids: their keys sort as they were inserted, so each run's inserts
        # make a file of a key range of its own
        items.insert_many([{"_id": f"a{n:05}", "n": n} for n in range(DOCUMENTS)])
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        assert main(args, context=spark_context) == 0
        for run in range(3):
            items.insert_many([{"_id": f"b{run}-{n:03}", "n": n} for n in range(50)])
            pull_changes(ReplicaSetCapture(client, config, keeper))
            assert main(args, context=spark_context) == 0
        before = DeltaTable(uri)
        files = keyed_files(file_actions(before), "")
        changed = ("a00007", "b1-003")
        keys = {f'["s","{key}"]' for key in changed}
        holding = {file.path for file in files if any(file.min_key <= key <= file.max_key for key in keys)}
        assert len(files) >= 4 and len(holding) == 2

        for key in changed:
            items.update_one({"_id": key}, {"$set": {"n": -1}})
        pull_changes(ReplicaSetCapture(client, config, keeper))
        capfd.readouterr()
        assert main(args, context=spark_context) == 0
        log = capfd.readouterr().err  # the job's log
        after = DeltaTable(uri)
        client.drop_database(database)

    kept = {file.path for file in keyed_files(file_actions(after), "")}
    assert {file.path for file in files} - kept == holding  # only those files were written again
    # the run's one staged file spans both keys: each range between them is a task's too (it reads
    # no file there, none holding a key of the source)
    tasks = re.search(rf"{database}\.items state merge: (\d+) Spark tasks handed", log)
    assert tasks is not None and int(tasks.group(1)) >= 2
    assert row_count(after) == DOCUMENTS + 150
    rows = after.to_pyarrow_table(columns=["__id", "n"]).to_pylist()
    assert sorted(row["__id"] for row in rows if row["n"] == -1) == ['"a00007"', '"b1-003"']
