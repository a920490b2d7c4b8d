"""Which transform runs compact and vacuum the tables (``lake.optimize.interval.hours``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow.source_tasks import maintenance_arguments

CONFIG = SourceConfig(name="s", path="s.yaml", topic_prefix="s", lake_root="/lake")
MIDNIGHT = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)


def test_the_run_starting_on_an_interval_boundary_maintains_the_tables():
    assert maintenance_arguments(CONFIG, MIDNIGHT) == [
        "--maintain",
        json.dumps({"optimize_interval_hours": 24, "retention_hours": 168}, sort_keys=True),
    ]
    assert maintenance_arguments(CONFIG, MIDNIGHT + dt.timedelta(hours=1)) == []
    every_six = dataclasses.replace(CONFIG, lake_optimize_interval_hours=6)
    assert maintenance_arguments(every_six, MIDNIGHT + dt.timedelta(hours=6)) != []


def test_manual_runs_without_an_interval_and_a_zero_interval_never_maintain():
    assert maintenance_arguments(CONFIG, None) == []
    assert maintenance_arguments(dataclasses.replace(CONFIG, lake_optimize_interval_hours=0), MIDNIGHT) == []
