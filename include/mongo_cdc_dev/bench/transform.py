"""``make bench``'s transform section: what the Spark transform costs, next to the same run's snapshot.

In the bench's replica set, loads its small documents into two databases: ``--state`` documents
(large) and ``--small-state`` documents (small), each captured by a source of its own, landing in
a lake of their own. Then, one step after the other:

1. ``snapshot.run_snapshot`` of each: the large one's rows landed per second is the baseline (the
   previous step of the pipeline, measured in the same run);
2. the first build of each state and changes table by the real job (``spark_apps/cdc_transform.py``
   through ``spark-submit --master local[*]``, as ``tests/support/cdc_support.py`` runs it), in events/s;
3. ``--changes`` changes per source (updates, deletes and inserts among its ``HOT_DOCS`` most recent
   documents, landed by a real ``streaming.pull_changes``), applied to each state; the ratio of the
   large state's cost to the small one's;
4. the same number of updates that add a new field to the large source: how many of the changes
   table's files Delta removed (old change files are never rewritten: 0);
5. ``--spread-changes`` changes spread over the whole key range of the large source (updates,
   deletes and inserts), against the ``--changes`` of step 3 on the same state (issue 21);
6. the large state compacted (``lookups``): after its first build and after compaction, the files
   a point lookup by ``_id`` opens against the files of the table (issue 47);
7. ``--nested-state`` ~4 KB nested documents in a third source: their snapshot's landing MB/s and
   their first build's, in MB of BSON per second after subtracting the empty job (issue 21).

An empty PySpark job (``empty_spark_job.py``: a ``SparkContext`` and two tasks, submitted the same
way) is timed first: the first builds' rates are also given with its time subtracted, the transform's
own work.

Each run is checked (events applied, state rows equal to the collection's documents). Every
transform time includes Spark's start. The memory figure is the peak RSS (``VmHWM``) of the largest
process of each ``spark-submit`` tree (driver JVM, Python driver, Python workers), sampled from
``/proc``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pymongo import DeleteOne, MongoClient, UpdateOne
from pymongo.collection import Collection

import mongo_cdc
from mongo_cdc import extjson
from mongo_cdc.capture.offsets import OffsetKeeper
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc_dev.bench.data import load, nested_documents, small_documents
from mongo_cdc_dev.bench.lookups import compact, files_opened, lookup_rows, middle_id
from mongo_cdc_dev.bench.procfs import cpu_ticks
from mongo_cdc_dev.bench.table import Row, no_rate_note, rate_less
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

if TYPE_CHECKING:
    from mongo_cdc_dev.bench.context import Bench

COLLECTION = "docs"
HOT_DOCS = 10_000  # the changes touch the most recent documents, as an application's writes mostly do
APP = Path(mongo_cdc.__file__).resolve().parents[2] / "spark_apps" / "cdc_transform.py"
EMPTY_JOB = Path(__file__).with_name("empty_spark_job.py")
RSS_INTERVAL_S = 0.2
# budgets (issue 9)
FIRST_BUILD_MIN_EVENTS_S = 100_000
CHANGES_MAX_SECONDS = 30
CHANGES_LARGE_VS_SMALL_MAX = 1.5
TRANSFORM_RSS_MAX_MIB = 2_048
# issue 21: the transform's own work, Spark's start (the empty job) subtracted
FIRST_BUILD_MIN_OWN_EVENTS_S = 150_000
FIRST_BUILD_MAX_SECONDS = 14
NESTED_VS_LANDING_MIN = 0.25
SPREAD_VS_CHANGES_MAX = 2.0


# ---------------------------------------------------------------------------------------- memory


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _tree(root: int) -> list[int]:
    children, pids, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, ()))
    return pids


def _peak_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    text = " ".join(args)
    if "java" in os.path.basename(args[0]):
        return "driver JVM"
    if "pyspark.daemon" in text or "pyspark/daemon" in text or "pyspark.worker" in text:
        return "Python worker"
    if APP.name in text:
        return "Python driver"
    return os.path.basename(args[0]) or "?"


class TreePeakRss:
    """The highest peak RSS (VmHWM) of any single process in a process tree, sampled from /proc."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peaks: dict[int, tuple[int, str]] = {}
        self.cpu_ticks: dict[int, int] = {}  # user + system time of each process, as last sampled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            for pid in _tree(self.root):
                ticks = cpu_ticks(pid)
                if ticks is not None:
                    self.cpu_ticks[pid] = max(ticks, self.cpu_ticks.get(pid, 0))
                peak = _peak_kib(pid)
                if peak is not None:  # the role as it is now: spark-class's shell execs the JVM
                    self.peaks[pid] = (max(peak, self.peaks.get(pid, (0, ""))[0]), _role(pid))
            if self._stop.wait(RSS_INTERVAL_S):
                return

    def __enter__(self) -> TreePeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_seconds(self) -> float:
        """CPU time of the tree's processes, as last sampled (a process's last interval is missed)."""
        return sum(self.cpu_ticks.values()) / os.sysconf("SC_CLK_TCK")

    def largest(self) -> tuple[float, str]:
        """(MiB, role) of the process with the highest peak."""
        kib, role = max(self.peaks.values(), default=(0, "?"))
        return kib / 1024, role

    def peak_of(self, role: str) -> float:
        """MiB: the highest peak of the tree's processes in ``role`` (``_role``)."""
        return max((kib for kib, named in self.peaks.values() if named == role), default=0) / 1024


# ---------------------------------------------------------------------------------------- runs


@dataclass
class TransformRun:
    seconds: float
    cpu_seconds: float  # user + system of spark-submit's process tree (sampled)
    summary: dict[str, Any]
    peak_mib: float
    peak_role: str
    driver_mib: float  # the Python driver's peak (VmHWM): the process running cdc_transform.py
    jvm_mib: float  # the driver JVM's (in local mode the executors' too: Spark's shuffle and tasks)


@dataclass
class Source:
    """One captured database: its config, offset keeper and collection."""

    name: str
    client: MongoClient
    rs: str
    lake: str
    documents: int
    config: SourceConfig = field(init=False)
    keeper: OffsetKeeper = field(init=False)

    def __post_init__(self) -> None:
        self.config = database_source(self.name, self.lake, re.escape(self.name))
        self.keeper = memory_keeper(self.config, self.rs)

    @property
    def collection(self) -> Collection:
        return self.client[self.name][COLLECTION]

    @property
    def namespace(self) -> str:
        return f"{self.name}.{COLLECTION}"

    def snapshot(self) -> float:
        started = time.perf_counter()
        result = run_snapshot(ReplicaSetCapture(self.client, self.config, self.keeper))
        seconds = time.perf_counter() - started
        if result.total != self.documents:
            raise AssertionError(
                f"{self.name}: the snapshot landed {result.total} rows, not {self.documents}"
            )
        return seconds

    def pull(self, expected: dict[str, int]) -> int:
        """Land the changes since the last pull; the raw rows they make (a delete's tombstone too)."""
        result = pull_changes(ReplicaSetCapture(self.client, self.config, self.keeper))
        pulled = {op: count for op, count in result.events.get(self.namespace, {}).items() if count}
        if pulled != expected:
            raise AssertionError(f"{self.namespace}: the pull landed {pulled}, not {expected}")
        return sum(expected.values()) + (expected.get("d", 0) if self.config.tombstones_on_delete else 0)

    def transform(self) -> TransformRun:
        return run_transform(self.lake, self.name)

    @property
    def state_uri(self) -> str:
        return table_uri(LakeLocation(self.lake), "state", self.name, self.name, COLLECTION)

    def change_files(self) -> set[str]:
        uri = table_uri(LakeLocation(self.lake), "changes", self.name, self.name, COLLECTION)
        table = table_if_exists(uri, {})
        return set() if table is None else set(table.file_uris())


def spark_submit() -> str:
    """The spark-submit next to this Python (a venv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    found = beside if os.access(beside, os.X_OK) else shutil.which("spark-submit")
    if found is None:
        raise RuntimeError("spark-submit not found next to this Python nor on PATH: run `make .venv` first")
    return found


def _spark_env() -> dict[str, str]:
    include = str(Path(mongo_cdc.__file__).resolve().parents[1])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (include, os.environ.get("PYTHONPATH")) if p),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def run_empty_job() -> float:
    """Seconds of the empty PySpark job, from spark-submit's start to its exit."""
    started = time.perf_counter()
    done = subprocess.run(
        [spark_submit(), "--master", "local[*]", str(EMPTY_JOB)],
        capture_output=True,
        text=True,
        env=_spark_env(),
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the empty PySpark job exited with {done.returncode}:\n{done.stderr[-3000:]}")
    print(f"  empty PySpark job: {seconds:.1f}s", flush=True)
    return seconds


def run_transform(
    lake: str,
    prefix: str,
    echo_log: bool = True,
    run_id: str = "",
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
) -> TransformRun:
    """One run of the Spark job over a lake, timed from spark-submit's start to its exit
    (``echo_log``: print its log lines, not only the figures; ``run_id``: its ``--run-id``; ``master``
    and ``conf``: spark-submit's ``--master`` and ``--conf`` settings). On a cluster's master, the
    CPU time and memory are the driver's only: the executors are not in spark-submit's process tree."""
    if not APP.is_file():
        raise RuntimeError(f"{APP} not found: run the benchmark from a checkout of mongo-cdc")
    env = _spark_env()
    command = [
        spark_submit(),
        "--master",
        master,
        *(arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")),
        str(APP),
        "--lake-root",
        lake,
        "--topic-prefix",
        prefix,
        *(["--run-id", run_id] if run_id else []),
    ]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, text=True)
        with TreePeakRss(process.pid) as memory:
            code = process.wait()
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code != 0:
        raise RuntimeError(f"the transform exited with {code}:\n{stdout[-3000:]}{stderr[-5000:]}")
    peak_mib, role = memory.largest()
    cpu = memory.cpu_seconds()
    summary = json.loads(stdout.strip().splitlines()[-1])
    run = TransformRun(
        seconds, cpu, summary, peak_mib, role, memory.peak_of("Python driver"), memory.peak_of("driver JVM")
    )
    for line in (stdout + stderr).splitlines() if echo_log else ():  # spark-submit may pass it to stdout
        if " cdc_transform " in line:
            print("   ", line.partition(" cdc_transform ")[2][:300], flush=True)
    print(
        f"  transform: {seconds:.1f}s, {cpu:.1f} CPU-s, largest process {peak_mib:,.0f} MiB ({role}), "
        f"Python driver {run.driver_mib:,.0f} MiB, driver JVM {run.jvm_mib:,.0f} MiB",
        flush=True,
    )
    return run


# ---------------------------------------------------------------------------------------- changes


def recent_ids(collection: Collection, count: int) -> list:
    """The ``_id``s of the ``count`` most recently inserted documents (ObjectIds grow with time)."""
    return [doc["_id"] for doc in collection.find({}, {"_id": 1}).sort("_id", -1).limit(count)]


def apply_changes(collection: Collection, count: int, first_new: int, seed: int) -> dict[str, int]:
    """``count`` writes among the ``HOT_DOCS`` most recent documents: 70% updates, 10% deletes,
    20% inserts of new documents (numbered from ``first_new``)."""
    rnd = random.Random(seed)
    inserts, deletes = count // 5, count // 10
    updates = count - inserts - deletes
    chosen = rnd.sample(recent_ids(collection, HOT_DOCS), updates + deletes)
    for _id in chosen[:updates]:
        collection.update_one(
            {"_id": _id}, {"$set": {"price": round(rnd.random() * 1000, 2)}, "$inc": {"n": 1}}
        )
    collection.delete_many({"_id": {"$in": chosen[updates:]}})
    collection.insert_many(small_documents(first_new, inserts))
    return {"u": updates, "d": deletes, "c": inserts}


def spread_changes(collection: Collection, count: int, first_new: int, seed: int) -> dict[str, int]:
    """``count`` writes spread over the whole key range, in bulk: 70% updates, 10% deletes, 20%
    inserts of new documents (numbered from ``first_new``)."""
    rnd = random.Random(seed)
    inserts, deletes = count // 5, count // 10
    updates = count - inserts - deletes
    ids = [doc["_id"] for doc in collection.find({}, {"_id": 1})]
    chosen = rnd.sample(ids, updates + deletes)
    writes: list[UpdateOne | DeleteOne] = [
        UpdateOne({"_id": _id}, {"$set": {"price": round(rnd.random() * 1000, 2)}, "$inc": {"n": 1}})
        for _id in chosen[:updates]
    ]
    writes += [DeleteOne({"_id": _id}) for _id in chosen[updates:]]
    for start in range(0, len(writes), 5_000):
        collection.bulk_write(writes[start : start + 5_000], ordered=False)
    load(collection, inserts, lambda start, size: small_documents(first_new + start, size))
    return {"u": updates, "d": deletes, "c": inserts}


def add_a_field(collection: Collection, count: int, seed: int) -> dict[str, int]:
    """``count`` updates that each give a recent document a field no document had."""
    rnd = random.Random(seed)
    for _id in rnd.sample(recent_ids(collection, HOT_DOCS), count):
        collection.update_one(
            {"_id": _id}, {"$set": {"loyalty": {"tier": "gold", "points": rnd.randint(1, 99)}}}
        )
    return {"u": count}


# ---------------------------------------------------------------------------------------- report


@dataclass
class Results:
    docs: int
    small_docs: int
    changes: int
    spread: int
    nested_docs: int
    empty_job_seconds: float = 0.0
    landed_rate: float = 0.0
    nested_mb: float = 0.0  # the nested documents' BSON
    nested_landed_mb_s: float = 0.0
    runs: dict[str, TransformRun] = field(default_factory=dict)
    removed_change_files: int = 0
    added_change_files: int = 0
    lookups: dict[str, tuple[int, int]] = field(default_factory=dict)  # after what: (opened, files)

    def rows(self) -> list[Row]:
        landed = self.landed_rate
        large, small = self.runs["first large"], self.runs["first small"]
        big_changes, small_changes = self.runs["changes large"], self.runs["changes small"]
        new_field = self.runs["new field large"]
        large_rate, small_rate = self.docs / large.seconds, self.small_docs / small.seconds
        section = f"transform of {self.docs:,} / {self.small_docs:,} docs"
        return [
            Row(section, "run_snapshot rows landed (the step before)", landed, "rows/s"),
            Row(section, f"first build, {self.docs:,} docs", large_rate, "events/s", large_rate / landed,
                "landing", min_value=FIRST_BUILD_MIN_EVENTS_S),
            Row(section, f"first build, {self.small_docs:,} docs", small_rate, "events/s",
                small_rate / landed, "landing"),
            Row(section, f"{self.changes:,} changes on {self.small_docs:,} docs", small_changes.seconds, "s"),
            Row(section, f"{self.changes:,} changes on {self.docs:,} docs", big_changes.seconds, "s",
                big_changes.seconds / small_changes.seconds, f"{self.small_docs:,} docs",
                max_ratio=CHANGES_LARGE_VS_SMALL_MAX, max_value=CHANGES_MAX_SECONDS),
            Row(section, f"{self.changes:,} updates adding a field on {self.docs:,} docs", new_field.seconds,
                "s"),
            Row(section, f"old change files removed by the new field ({self.added_change_files} added)",
                self.removed_change_files, "files", max_value=1),
        ] + self._own_work_rows() + lookup_rows(section, self.docs, self.lookups)  # fmt: skip

    def _own_work_rows(self) -> list[Row]:
        """Issue 21's rows: the empty job, the first builds without it, spread changes, nested documents."""
        empty = self.empty_job_seconds
        large, nested = self.runs["first large"], self.runs["first nested"]
        spread, changes = self.runs["spread large"], self.runs["changes large"]
        section = "transform without Spark's start"
        large_rate = rate_less(self.docs, large.seconds, empty)
        nested_rate = rate_less(self.nested_mb, nested.seconds, empty)
        return [
            Row(section, "empty PySpark job (SparkContext, 2 tasks)", empty, "s"),
            Row(section, f"first build, {self.docs:,} docs, wall", large.seconds, "s",
                max_value=FIRST_BUILD_MAX_SECONDS),
            Row(section, f"first build, {self.docs:,} docs, less the empty job", large_rate, "events/s",
                min_value=FIRST_BUILD_MIN_OWN_EVENTS_S, note=no_rate_note(large_rate)),
            Row(section, f"run_snapshot landing, {self.nested_docs:,} nested docs", self.nested_landed_mb_s,
                "MB/s"),
            Row(section, f"first build, {self.nested_docs:,} nested docs, less the empty job", nested_rate,
                "MB/s", None if nested_rate is None else nested_rate / self.nested_landed_mb_s, "landing",
                min_ratio=NESTED_VS_LANDING_MIN, note=no_rate_note(nested_rate)),
            Row(section, f"{self.spread:,} changes spread over {self.docs:,} docs", spread.seconds, "s",
                spread.seconds / changes.seconds, f"{self.changes:,} changes",
                max_ratio=SPREAD_VS_CHANGES_MAX),
        ]  # fmt: skip

    def peak_row(self) -> Row:
        peak = max(self.runs.values(), key=lambda run: run.peak_mib)
        return Row(
            "peak RSS of the process",
            f"cdc_transform, largest process ({peak.peak_role})",
            peak.peak_mib,
            "MiB",
            max_value=TRANSFORM_RSS_MAX_MIB,
        )


@contextmanager
def step(name: str) -> Iterator[None]:
    """Print a step's name, then its seconds."""
    print(name, flush=True)
    started = time.perf_counter()
    yield
    print(f"  {time.perf_counter() - started:.1f}s", flush=True)


@contextmanager
def quiet_oplog_warnings() -> Iterator[None]:
    """The bench's mongod has a small oplog: its headroom warnings say nothing about the transform."""
    oplog_log = logging.getLogger("mongo_cdc.capture.oplog_window")
    level = oplog_log.level
    oplog_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        oplog_log.setLevel(level)


def transform(bench: Bench) -> list[Row]:
    """Every step of the module docstring; the section's rows (its peak RSS row goes with the others)."""
    args = bench.args
    results = Results(args.state, args.small_state, args.changes, args.spread_changes, args.nested_state)
    with step("empty PySpark job"):
        results.empty_job_seconds = run_empty_job()
    client = bench.rs.client(datetime_conversion=extjson.DECODE_OPTIONS.datetime_conversion)
    with client, quiet_oplog_warnings():
        lake = bench.lake("transform")
        large = Source("large", client, bench.rs.name, lake, args.state)
        small = Source("small", client, bench.rs.name, lake, args.small_state)
        for source in (large, small):
            with step(f"loading {source.documents:,} documents into {source.namespace}"):
                load(source.collection, source.documents, small_documents)
        with step(f"snapshot of {large.namespace}"):
            results.landed_rate = args.state / large.snapshot()
        with step(f"snapshot of {small.namespace}"):
            small.snapshot()
        for source in (large, small):
            with step(f"first build of {source.namespace}"):
                run = results.runs[f"first {source.name}"] = source.transform()
            check_run(run, source, source.documents)
        state, wanted = large.state_uri, middle_id(large.state_uri)
        results.lookups["the first build"] = files_opened(state, "_id", wanted)
        for seed, source in enumerate((large, small), start=1):
            rows = source.pull(apply_changes(source.collection, args.changes, source.documents, seed))
            with step(f"{args.changes:,} changes on {source.namespace}"):
                run = results.runs[f"changes {source.name}"] = source.transform()
            check_run(run, source, rows)
        rows = large.pull(add_a_field(large.collection, args.changes, seed=3))
        before = large.change_files()
        with step(f"{args.changes:,} updates adding a field on {large.namespace}"):
            run = results.runs["new field large"] = large.transform()
        check_run(run, large, rows)
        after = large.change_files()
        results.removed_change_files = len(before - after)
        results.added_change_files = len(after - before)
        first_new = large.documents + args.changes // 5
        rows = large.pull(spread_changes(large.collection, args.spread_changes, first_new, seed=4))
        with step(f"{args.spread_changes:,} changes spread over {large.namespace}"):
            run = results.runs["spread large"] = large.transform()
        check_run(run, large, rows)
        with step(f"compaction of {large.namespace}'s state"):
            compact(LakeLocation(large.lake), state)
        results.lookups["compaction"] = files_opened(state, "_id", wanted)
        nested = Source("nested", client, bench.rs.name, lake, args.nested_state)
        with step(f"loading {nested.documents:,} nested documents into {nested.namespace}"):
            load(nested.collection, nested.documents, nested_documents)
        results.nested_mb = nested.collection.database.command("collStats", COLLECTION)["size"] / 1e6
        with step(f"snapshot of {nested.namespace}"):
            results.nested_landed_mb_s = results.nested_mb / nested.snapshot()
        with step(f"first build of {nested.namespace}"):
            run = results.runs["first nested"] = nested.transform()
        check_run(run, nested, nested.documents)
    bench.peak_rows.append(results.peak_row())
    return results.rows()


def check_run(run: TransformRun, source: Source, events: int) -> None:
    summary = run.summary["collections"][source.namespace]
    if summary["new_events"] != events:
        raise AssertionError(
            f"{source.namespace}: the transform applied {summary['new_events']} events, not {events}"
        )
    live = source.collection.estimated_document_count()
    if summary["state_rows"] != live:
        raise AssertionError(f"{source.namespace}: the state holds {summary['state_rows']} rows, not {live}")
