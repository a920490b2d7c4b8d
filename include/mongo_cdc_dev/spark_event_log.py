"""What a Spark driver's event log says about its jobs: which executors ran their tasks, and for how
long. The tests and the bench read it to show where a run's work went (which Spark job ran the state
MERGE, on how many executors), from the record the driver itself kept.

``event_log_conf`` asks a driver for one plain JSON file an application (Spark 4 rolls and
compresses it by default); ``spark_jobs`` reads one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


def event_log_conf(directory: Path) -> dict[str, str]:
    """The Spark settings that make a driver write its event log into ``directory`` (which must
    exist), one uncompressed JSON file an application."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(directory),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


@dataclass
class SparkJob:
    """One Spark job of an application: its description (``SparkContext.setJobDescription``), the
    tasks its stages planned, the tasks each executor finished for it, its seconds from submission to
    completion (None: the log ends before it did)."""

    description: str
    stages: frozenset[int]
    tasks: int
    executors: Counter[str] = field(default_factory=Counter)
    seconds: float | None = None


def spark_jobs(lines: Iterable[str]) -> list[SparkJob]:
    """The jobs of an event log (its lines, one JSON event each), in the order they started."""
    jobs: dict[int, SparkJob] = {}
    submitted: dict[int, int] = {}  # job id -> its submission, ms
    for event in map(json.loads, lines):
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            job_id = event["Job ID"]
            jobs[job_id] = SparkJob(
                event.get("Properties", {}).get("spark.job.description", ""),
                frozenset(event["Stage IDs"]),
                sum(stage["Number of Tasks"] for stage in event["Stage Infos"]),
            )
            submitted[job_id] = event["Submission Time"]
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            job_id = event["Job ID"]
            jobs[job_id].seconds = (event["Completion Time"] - submitted[job_id]) / 1000
        elif kind == "SparkListenerTaskEnd":
            for job in jobs.values():
                if event["Stage ID"] in job.stages:
                    job.executors[event["Task Info"]["Executor ID"]] += 1
    return list(jobs.values())
