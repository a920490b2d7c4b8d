"""One measurement in a process of its own: ``python -m mongo_cdc_dev.bench.worker '<json task>'``.

A fresh process per measurement gives each path the same start (no warm caches or heap left by
another path) and makes its peak RSS (``VmHWM``) that of one task, as an Airflow worker's task
process would see it. The last line printed is the JSON result: ``count``, ``seconds`` (the timed
part only), ``cpu_seconds`` (the process's CPU time over that part, every thread of it),
``server_cpu_seconds`` (the task's ``server_pids``' CPU time over that part: mongod's), ``base_mib``
(RSS after imports, before the run) and ``peak_mib`` (``VmHWM``).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any

# imported before any clock starts, like everything else a path needs: deltalake imports it on
# first use, and a task's import time is not landing speed
import pyarrow.dataset  # noqa: F401
from bson import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.offsets import MemoryOffsetStore, Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import last_applied, pull_changes, stream_options
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc.verify.verification import REPAIR, verify_replica_set
from mongo_cdc_dev.bench.procfs import cpu_seconds
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

RAW = CodecOptions(document_class=RawBSONDocument)


def status_mib(field: str) -> float:
    """A ``/proc/self/status`` memory line (``VmRSS``, ``VmHWM``) in MiB; 0 where there is no /proc."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def bench_config(task: dict[str, Any]) -> SourceConfig:
    """The source every measured path shares: one database, the lake under the task's directory."""
    return database_source(
        "bench",
        task.get("lake", ""),
        re.escape(task["db"]),
        collection_include=(re.compile(re.escape(f"{task['db']}.{task['collection']}")),),
        snapshot_chunk_size=task.get("chunk_size", SourceConfig.snapshot_chunk_size),
        snapshot_max_threads=task.get("threads", SourceConfig.snapshot_max_threads),
    )


def bare_cursor(client: MongoClient, task: dict[str, Any]) -> int:
    """Every document through a plain ``find`` of ``RawBSONDocument``s: the ceiling of any reader."""
    collection = client[task["db"]].get_collection(task["collection"], codec_options=RAW)
    count = 0
    for _ in collection.find({}):
        count += 1
    return count


def snapshot(client: MongoClient, task: dict[str, Any]) -> int:
    config = bench_config(task)
    return run_snapshot(ReplicaSetCapture(client, config, memory_keeper(config, task["rs"]))).total


def bare_stream(client: MongoClient, task: dict[str, Any]) -> int:
    """The change stream a pull opens (same pipeline, options and batch size), iterated as
    ``RawBSONDocument``s from the offset up to the last write, doing nothing with the events."""
    config = bench_config(task)
    offset = Offset(resume_token=task["resume_token"])
    target = last_applied(client)
    count = 0
    with client.watch(**stream_options(config, offset)) as stream:
        while True:
            change = stream.try_next()
            if change is not None:
                count += 1
            elif token_cluster_time(stream.resume_token) >= target:
                return count


def pull(client: MongoClient, task: dict[str, Any]) -> int:
    """``pull_changes`` from the offset the bench committed before writing the backlog."""
    config = bench_config(task)
    store = MemoryOffsetStore()
    store.values.update(task["offsets"])
    result = pull_changes(ReplicaSetCapture(client, config, memory_keeper(config, task["rs"], store)))
    return result.events_received


def verify(client: MongoClient, task: dict[str, Any]) -> int:
    """``verify_replica_set`` (``verify.on.drift: repair``) from the offset the bench committed with
    the state; it must find ``expected_drift`` drifted documents. The documents it read."""
    config = bench_config(task)
    store = MemoryOffsetStore()
    store.values.update(task["offsets"])
    result = verify_replica_set(
        ReplicaSetCapture(client, config, memory_keeper(config, task["rs"], store)), REPAIR
    )
    if result.failed or result.skipped or result.drift != task["expected_drift"]:
        found = f"{result.drift} drifted documents, not {task['expected_drift']}"
        raise AssertionError(f"verification found {found}: {result.failed or result.skipped}")
    return sum(found["source_count"] for found in result.collections.values())


PATHS: dict[str, Callable[[MongoClient, dict[str, Any]], int]] = {
    "bare_cursor": bare_cursor,
    "snapshot": snapshot,
    "bare_stream": bare_stream,
    "pull": pull,
    "verify": verify,
}


def main(argv: list[str]) -> int:
    task = json.loads(argv[0])
    run = PATHS[task["path"]]
    # the bare paths read RawBSONDocuments; ours get the client the DAG's tasks make
    bare = task["path"].startswith("bare_")
    client = MongoClient(task["uri"], document_class=RawBSONDocument) if bare else make_client(task["uri"])
    try:
        client.admin.command("ping")
        base = status_mib("VmRSS")
        servers = task.get("server_pids", [])
        started, cpu_started, server_started = time.perf_counter(), time.process_time(), cpu_seconds(servers)
        count = run(client, task)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        server_cpu = cpu_seconds(servers) - server_started
    finally:
        client.close()
    print(
        json.dumps(
            {
                "count": count,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "server_cpu_seconds": server_cpu,
                "base_mib": base,
                "peak_mib": status_mib("VmHWM"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
