"""What every ``make bench`` section shares (``Bench``: the options, the replica set, a scratch
directory, a measured path run in a process of its own) and what a measurement gives (``Measured``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import MongoClient

import mongo_cdc
from mongo_cdc_dev.bench import data
from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.testing import ReplicaSet

DB, RS = "bench", "benchrs"


@dataclass
class Measured:
    """A worker's result: ``count`` items in ``seconds``; memory of its process; its CPU time and
    mongod's over the same seconds."""

    count: int
    seconds: float
    peak_mib: float = 0.0
    base_mib: float = 0.0
    cpu_seconds: float = 0.0
    server_cpu_seconds: float = 0.0

    def rate(self, amount: float | None = None) -> float:
        return (self.count if amount is None else amount) / max(self.seconds, 1e-9)

    @property
    def total_cpu_seconds(self) -> float:
        """The CPU time of the run and of mongod serving it."""
        return self.cpu_seconds + self.server_cpu_seconds

    def shortest_seconds(self, cores: int) -> float:
        """The shortest wall time ``total_cpu_seconds`` allows on ``cores``: every core busy all
        along, nothing waiting."""
        return self.total_cpu_seconds / cores

    def cpu_per_100k(self) -> float:
        """Client CPU-seconds per 100 k items."""
        return self.cpu_seconds * 100_000 / max(self.count, 1)


@dataclass
class Bench:
    """What every section shares: the options, the replica set and a scratch directory."""

    args: argparse.Namespace
    rs: ReplicaSet
    client: MongoClient
    tmp: str
    peak_rows: list[Row]

    def worker(self, path: str, collection: str, core: int | None = None, **task: Any) -> Measured:
        """Run one measured path in a fresh process (``worker``), on one CPU core if ``core`` is given."""
        task = {
            "path": path, "uri": self.rs.uri, "rs": RS, "db": DB, "collection": collection,
            "server_pids": [pid for pid in self.rs.pids if pid is not None], **task,
        }  # fmt: skip
        package_root = str(Path(mongo_cdc.__file__).parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        }
        pinned = ["taskset", "-c", str(core)] if core is not None else []
        done = subprocess.run(
            [*pinned, sys.executable, "-m", "mongo_cdc_dev.bench.worker", json.dumps(task)],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench worker {path} on {collection} failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return Measured(
            result["count"],
            result["seconds"],
            result["peak_mib"],
            result["base_mib"],
            result["cpu_seconds"],
            result["server_cpu_seconds"],
        )

    def lake(self, name: str) -> str:
        return os.path.join(self.tmp, "lakes", name)

    def loaded(self, collection: str, count: int, make: Callable[[int, int], list[dict]]) -> dict:
        """``collection`` holding ``count`` documents of ``make`` (loaded once a run); its collStats."""
        if self.client[DB][collection].estimated_document_count() != count:
            self.client[DB].drop_collection(collection)
            seconds = data.load(self.client[DB][collection], count, make)
            print(f"loaded {count:,} documents into {collection} in {seconds:.0f} s", flush=True)
        return self.client[DB].command("collStats", collection)


@dataclass(frozen=True)
class Alternated:
    """A baseline and our path, each run twice, alternating (the baseline first)."""

    bares: list[Measured]
    ours: list[Measured]

    @property
    def counts(self) -> list[int]:
        """Every run's count: the baseline's two, then ours."""
        return [run.count for run in self.bares + self.ours]

    def best(self) -> tuple[Measured, Measured]:
        """(the faster baseline run, our faster run)."""
        return best(*self.bares), best(*self.ours)

    def peak(self) -> Measured:
        """Our run with the higher peak RSS."""
        return max(self.ours, key=lambda run: run.peak_mib)


def alternated(bare: Callable[[int], Measured], ours: Callable[[int], Measured]) -> Alternated:
    """``bare(i)``, ``ours(i)``, for i in 0, 1: a machine that slows down or speeds up between runs
    touches both paths alike."""
    runs = Alternated([], [])
    for index in range(2):
        runs.bares.append(bare(index))
        runs.ours.append(ours(index))
    return runs


def best(first: Measured, second: Measured) -> Measured:
    """The faster of two runs: the machine may be shared. Given to baselines (which it favours), and
    to the snapshots, the pull and the clean verification, whose one run against their baseline's
    best was noisier than their budgets' margins."""
    return first if first.rate() >= second.rate() else second
