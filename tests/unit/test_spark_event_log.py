"""Reading a Spark driver's event log (``mongo_cdc_dev.spark_event_log``): each job's description,
planned tasks, the executors that ran them and its seconds. The system test and the bench read real
logs; these lines keep the events' shape and fields as Spark 4 writes them."""

from __future__ import annotations

import json

from mongo_cdc_dev.spark_event_log import spark_jobs


def _job_start(job: int, stages: dict[int, int], at: int, description: str | None) -> str:
    properties = {} if description is None else {"spark.job.description": description}
    return json.dumps(
        {
            "Event": "SparkListenerJobStart",
            "Job ID": job,
            "Submission Time": at,
            "Stage Infos": [{"Stage ID": stage, "Number of Tasks": tasks} for stage, tasks in stages.items()],
            "Stage IDs": list(stages),
            "Properties": properties,
        }
    )


def _task_end(stage: int, executor: str) -> str:
    info = {"Task ID": 0, "Executor ID": executor, "Launch Time": 1, "Finish Time": 2}
    return json.dumps({"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Info": info})


def _job_end(job: int, at: int) -> str:
    return json.dumps({"Event": "SparkListenerJobEnd", "Job ID": job, "Completion Time": at})


def test_each_job_counts_its_own_stages_tasks_by_executor_and_its_seconds() -> None:
    lines = [
        json.dumps({"Event": "SparkListenerApplicationStart", "Timestamp": 0}),
        _job_start(0, {0: 2}, 1_000, None),
        _task_end(0, "0"),
        _task_end(0, "0"),
        _job_end(0, 1_500),
        _job_start(1, {1: 1, 2: 3}, 2_000, "shop.items: state MERGE of 3 key ranges"),
        _task_end(1, "0"),
        _task_end(2, "1"),
        _task_end(2, "0"),
        _task_end(2, "1"),
        _job_end(1, 4_250),
        _job_start(2, {3: 2}, 5_000, "left running"),
        _task_end(3, "1"),
    ]
    first, merge, unfinished = spark_jobs(lines)
    assert (first.description, first.tasks, dict(first.executors), first.seconds) == ("", 2, {"0": 2}, 0.5)
    assert merge.description == "shop.items: state MERGE of 3 key ranges"
    assert (merge.tasks, dict(merge.executors), merge.seconds) == (4, {"0": 2, "1": 2}, 2.25)
    assert (dict(unfinished.executors), unfinished.seconds) == ({"1": 1}, None)
