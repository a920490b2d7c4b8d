"""A ``dag.on.failure.callback`` for the tests: records each failed task it is called for."""

from __future__ import annotations

import os

# the file each call appends "<dag_id> <task_id>" to
RECORD_ENV = "MONGO_CDC_TEST_FAILURE_RECORD"


def record(context: dict) -> None:
    ti = context["ti"]
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
        out.write(f"{ti.dag_id} {ti.task_id}\n")


NOT_CALLABLE = 42
