"""The state-at-scale section's cluster rows (issue 51): the spread changes' state MERGE on a Spark
standalone cluster, run by one executor and by two.

The smaller state's lake, with its spread changes landed and not yet transformed, is copied once for
each run (``copied_lakes``), so both transform the same landed changes on the same state. A cluster of
two workers of one core each (``spark_cluster.StandaloneCluster``) runs the job (``spark-submit`` in
client mode on this machine, as the DAG's transform task submits it) on one copy with one executor
(``spark.cores.max`` 1) and on the other with two (2, one on each worker). Spark's default parallelism in
standalone mode is the executors' cores but at least 2, so both drivers plan the same key ranges
and the same tasks: only the executors running them differ. The executors' Python is this venv's
(``PYSPARK_PYTHON``, set by ``transform.run_transform``), which has mongo_cdc. The run with two
executors goes first: whatever a cluster's first application pays falls on the run the budget
wants faster, not on the one it is compared with.

Each driver writes its event log (``spark_event_log``): the executors that ran the run's tasks and
the state MERGE's (the run with two must show two), the seconds of the MERGE's job and of every job,
next to the run's wall time, say where the time went. Budget: two executors' wall time at most
``TWO_VS_ONE_MAX`` times one's. On a machine of 2 cores the driver's JVM and Python share them with
the executors.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.bench.transform import Source, TransformRun, check_run, run_transform, step
from mongo_cdc_dev.spark_cluster import StandaloneCluster
from mongo_cdc_dev.spark_event_log import SparkJob, event_log_conf, spark_jobs

if TYPE_CHECKING:
    from mongo_cdc_dev.bench.context import Bench

EXECUTORS = (2, 1)  # the runs, in order: see the module's docstring
TWO_VS_ONE_MAX = 1.0
WORKER_MEMORY, EXECUTOR_MEMORY = "2g", "1g"
MERGE_JOB = ": state MERGE of "  # in the MERGE's Spark job description (state_commit.merged_by_tasks)
NO_MERGE = "no MERGE: a state this small is written again whole (state_merge.REWRITE_MAX_ROWS)"
ONE_TASK = "the MERGE was one Spark task: the driver found one key range (merge_ranges.key_groups)"


@dataclass(frozen=True)
class ClusterRun:
    """One transform on the cluster: its figures and the Spark jobs its driver logged."""

    executors: int
    run: TransformRun
    jobs: list[SparkJob]

    @property
    def jobs_seconds(self) -> float:
        """The seconds of its Spark jobs (one after the other: the section's source has one
        collection); the rest of the wall time is the driver's own (Spark's and the executors'
        start, reading the tables, planning, commits)."""
        return sum(job.seconds or 0.0 for job in self.jobs)

    @property
    def executors_used(self) -> int:
        """How many executors ran at least one of its tasks."""
        return len({name for job in self.jobs for name in job.executors})

    @property
    def merge(self) -> SparkJob | None:
        """The state MERGE's Spark job (None: the state was written again whole)."""
        return next((job for job in self.jobs if MERGE_JOB in job.description), None)


def copied_lakes(bench: Bench, source: Source) -> dict[int, str]:
    """A copy of ``source``'s lake for each run (``EXECUTORS``), made before any transforms it."""
    lakes = {}
    for executors in EXECUTORS:
        lakes[executors] = bench.lake(f"state-scale-{executors}-executors")
        shutil.copytree(source.lake, lakes[executors])
    return lakes


def cluster_conf(executors: int, events: Path) -> dict[str, str]:
    """The job's settings on the cluster: ``executors`` of one core, the driver reachable on
    127.0.0.1 (the executors connect back to it), its event log in ``events``."""
    return {
        "spark.cores.max": str(executors),
        "spark.executor.cores": "1",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **event_log_conf(events),
    }


def cluster_runs(bench: Bench, source: Source, events: int, lakes: dict[int, str]) -> list[ClusterRun]:
    """Transform each of ``lakes`` (``copied_lakes``) on a two-worker cluster, checked against
    ``source``'s collection (``events`` applied); the runs in ``EXECUTORS``' order."""
    directory = Path(bench.tmp) / "spark-cluster"
    runs = []
    cluster = StandaloneCluster(directory / "daemons", workers=2, cores=1, memory=WORKER_MEMORY)
    try:
        with step("starting a Spark standalone cluster of 2 workers of 1 core"):
            cluster.start()
        for executors in EXECUTORS:
            logs = directory / f"events-{executors}"
            logs.mkdir()
            with step(f"the same changes on {source.namespace}, on the cluster with {executors} executor(s)"):
                conf = cluster_conf(executors, logs)
                run = run_transform(lakes[executors], source.name, master=cluster.url, conf=conf)
            check_run(run, source, events)
            (log,) = logs.iterdir()
            runs.append(ClusterRun(executors, run, spark_jobs(log.read_text().splitlines())))
            print_jobs(runs[-1])
    finally:
        cluster.stop()
    return runs


def print_jobs(run: ClusterRun) -> None:
    """Each Spark job of the run: its seconds and the tasks each executor ran."""
    for job in run.jobs:
        seconds = "unfinished" if job.seconds is None else f"{job.seconds:.1f}s"
        tasks = ", ".join(f"executor {name}: {count}" for name, count in sorted(job.executors.items()))
        described = job.description or "(no description)"
        print(f"    Spark job {described!r}: {seconds}, tasks by {tasks}", flush=True)


def cluster_rows(section: str, what: str, runs: list[ClusterRun]) -> list[Row]:
    """Each run's wall time, its Spark jobs' and its MERGE job's, the two executors' wall time and
    MERGE job as ratios to one's, and the executors that ran the two-executor run's tasks and its
    MERGE's (it must be both)."""
    by_executors = {run.executors: run for run in runs}
    one, two = by_executors[1], by_executors[2]
    rows = []
    for run in (one, two):
        name = f"{what} on a {run.executors}-executor cluster"
        merge = run.merge
        rows += [
            Row(section, f"{name}: wall", run.run.seconds, "s"),
            Row(section, f"{name}: its Spark jobs, summed", run.jobs_seconds, "s"),
            Row(section, f"{name}: the MERGE's Spark job", None if merge is None else merge.seconds, "s",
                note="" if merge is not None else NO_MERGE),
        ]  # fmt: skip
    ran = None if two.merge is None else len(two.merge.executors)
    # the rewrite itself (the MERGE's job) apart from the run's fixed costs, which a second
    # executor's start raises on 2 cores shared with the driver
    merges = [run.merge.seconds for run in (two, one) if run.merge is not None and run.merge.seconds]
    return rows + [
        Row(section, f"{what}: wall, 2 executors vs 1", None, "", two.run.seconds / one.run.seconds,
            "1 executor", max_ratio=TWO_VS_ONE_MAX),
        Row(section, f"{what}: the MERGE's Spark job, 2 executors vs 1", None, "",
            merges[0] / merges[1] if len(merges) == 2 else None, "1 executor", max_ratio=TWO_VS_ONE_MAX,
            note="" if len(merges) == 2 else NO_MERGE),
        Row(section, f"{what} on a 2-executor cluster: executors that ran tasks", two.executors_used,
            "executors", min_value=2),
        Row(section, f"{what} on a 2-executor cluster: executors that ran MERGE tasks", ran, "executors",
            min_value=2, note=executors_note(two.merge)),
    ]  # fmt: skip


def executors_note(merge: SparkJob | None) -> str:
    """Why the MERGE's tasks could not run on two executors, when they could not."""
    if merge is None:
        return NO_MERGE
    if merge.tasks == 1:  # the driver planned one key range: its files' key bounds overlap
        return ONE_TASK
    return ""


def skipped_row(section: str, what: str) -> Row:
    """The row that stands for the cluster rows under ``--no-cluster``."""
    return Row(section, f"{what} on a standalone cluster", None, "s", note="skipped (--no-cluster)")
