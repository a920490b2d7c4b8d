"""The bench's cluster rows (``mongo_cdc_dev.bench.cluster_executors.cluster_rows``): the two-executor
run's wall time as a ratio to the one-executor run's, its budget, and the executors its MERGE job's
tasks ran on, read from the jobs the drivers logged."""

from __future__ import annotations

from collections import Counter

from mongo_cdc_dev.bench.cluster_executors import NO_MERGE, ONE_TASK, ClusterRun, cluster_rows
from mongo_cdc_dev.bench.transform import TransformRun
from mongo_cdc_dev.spark_event_log import SparkJob

WHAT = "4,000 spread changes, 100,000 docs"


def _run(executors: int, seconds: float, merge_tasks: dict[str, int] | None) -> ClusterRun:
    jobs = [SparkJob("", frozenset({0}), 2, Counter({"0": 2}), 1.0)]
    if merge_tasks is not None:
        description = "bench.docs: state MERGE of 4 key ranges"
        jobs.append(SparkJob(description, frozenset({1}), 4, Counter(merge_tasks), seconds / 2))
    return ClusterRun(executors, TransformRun(seconds, 1.0, {}, 1.0, "driver JVM", 1.0, 1.0), jobs)


def _by_path(rows: list) -> dict:
    return {row.path.removeprefix(WHAT): row for row in rows}


def test_two_executors_are_compared_with_one_and_must_both_run_merge_tasks() -> None:
    rows = _by_path(cluster_rows("s", WHAT, [_run(2, 30.0, {"0": 2, "1": 2}), _run(1, 40.0, {"0": 4})]))
    assert rows[" on a 1-executor cluster: wall"].value == 40.0
    assert rows[" on a 2-executor cluster: the MERGE's Spark job"].value == 15.0
    assert rows[" on a 2-executor cluster: its Spark jobs, summed"].value == 16.0
    ratio = rows[": wall, 2 executors vs 1"]
    assert (ratio.ratio, ratio.met) == (0.75, True)
    rewrite = rows[": the MERGE's Spark job, 2 executors vs 1"]
    assert (rewrite.ratio, rewrite.met) == (0.75, True)
    ran = rows[" on a 2-executor cluster: executors that ran MERGE tasks"]
    assert (ran.value, ran.met) == (2, True)
    assert rows[" on a 2-executor cluster: executors that ran tasks"].value == 2

    # slower with two, and every MERGE task on one executor: both budgets missed
    rows = _by_path(cluster_rows("s", WHAT, [_run(2, 50.0, {"1": 4}), _run(1, 40.0, {"0": 4})]))
    assert (rows[": wall, 2 executors vs 1"].ratio, rows[": wall, 2 executors vs 1"].met) == (1.25, False)
    assert rows[" on a 2-executor cluster: executors that ran MERGE tasks"].met is False


def test_a_merge_of_one_key_range_is_one_task_whatever_the_executors() -> None:
    runs = [_run(2, 30.0, {"0": 1}), _run(1, 40.0, {"0": 1})]
    runs[0].jobs[-1].tasks = 1
    rows = _by_path(cluster_rows("s", WHAT, runs))
    ran = rows[" on a 2-executor cluster: executors that ran MERGE tasks"]
    assert (ran.value, ran.met, ran.note) == (1, False, ONE_TASK)
    assert rows[" on a 2-executor cluster: executors that ran tasks"].met is False
    # another job of the run had tasks for the second executor: the run did have two
    runs[0].jobs[0].executors.update({"1": 1})
    assert _by_path(cluster_rows("s", WHAT, runs))[" on a 2-executor cluster: executors that ran tasks"].met


def test_a_state_written_again_whole_has_no_merge_job_to_show() -> None:
    rows = _by_path(cluster_rows("s", WHAT, [_run(2, 12.0, None), _run(1, 10.0, None)]))
    ran = rows[" on a 2-executor cluster: executors that ran MERGE tasks"]
    assert (ran.value, ran.met, ran.note) == (None, None, NO_MERGE)
    assert rows[" on a 1-executor cluster: the MERGE's Spark job"].note == NO_MERGE
    assert rows[": the MERGE's Spark job, 2 executors vs 1"].ratio is None
