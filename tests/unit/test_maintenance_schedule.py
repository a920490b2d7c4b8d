"""Which transform runs compact and vacuum which collections' tables (``lake.optimize.interval.hours``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter

import pytest
from cdc_support import spark_job

from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.maintenance import MaintenanceSettings, maintained, maintains_source
from mongo_cdc_airflow.source_tasks import maintenance_arguments, maintenance_settings

CONFIG = SourceConfig(name="s", path="s.yaml", topic_prefix="s", lake_root="/lake")
MIDNIGHT = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


def hourly_run(config: SourceConfig, start: dt.datetime | None) -> MaintenanceSettings | None:
    """The maintenance settings of an hourly run whose data interval starts at ``start``."""
    return maintenance_settings(config, start, None if start is None else start + HOUR)


def test_each_scheduled_run_maintains_its_share_and_each_collection_is_maintained_once_an_interval():
    assert maintenance_arguments(hourly_run(CONFIG, MIDNIGHT + dt.timedelta(hours=3))) == [
        "--maintain",
        json.dumps({"optimize_interval_hours": 24, "retention_hours": 168, "slot": 3}, sort_keys=True),
    ]
    namespaces = [f"db.c{index:04d}" for index in range(1_000)]
    maintained_by = {namespace: [] for namespace in namespaces}
    for hour in range(24):
        settings = MaintenanceSettings.from_text(
            maintenance_arguments(hourly_run(CONFIG, MIDNIGHT + dt.timedelta(hours=hour)))[1]
        )
        assert maintains_source(settings) == (hour == 0)  # the leftovers' listing once a day
        for namespace in namespaces:
            if maintained(settings, namespace):
                maintained_by[namespace].append(hour)
    assert all(len(hours) == 1 for hours in maintained_by.values())
    per_run = Counter(hours[0] for hours in maintained_by.values())
    assert len(per_run) == 24 and max(per_run.values()) < 3 * 1_000 / 24  # spread, not all in one run
    every_six = dataclasses.replace(CONFIG, lake_optimize_interval_hours=6)
    assert (
        json.loads(maintenance_arguments(hourly_run(every_six, MIDNIGHT + dt.timedelta(hours=7)))[1])["slot"]
        == 1
    )


def test_settings_without_a_slot_maintain_every_collection_and_the_source():
    settings = MaintenanceSettings(optimize_interval_hours=24, retention_hours=168)
    assert all(maintained(settings, f"db.c{index}") for index in range(100)) and maintains_source(settings)


def test_manual_runs_without_an_interval_and_a_zero_interval_never_maintain():
    assert maintenance_arguments(hourly_run(CONFIG, None)) == []
    assert (
        maintenance_arguments(
            hourly_run(dataclasses.replace(CONFIG, lake_optimize_interval_hours=0), MIDNIGHT)
        )
        == []
    )


def test_the_job_reads_back_the_settings_and_refuses_a_slot_outside_the_interval(tmp_path, capsys):
    base = ["--lake-root", str(tmp_path), "--topic-prefix", "s"]
    settings = hourly_run(CONFIG, MIDNIGHT + dt.timedelta(hours=5))
    assert spark_job().parse_args([*base, *maintenance_arguments(settings)]).maintain == settings
    for bad in ({"optimize_interval_hours": 24, "retention_hours": 1, "slot": 24}, {"slot": 1}):
        with pytest.raises(SystemExit):
            spark_job().parse_args([*base, "--maintain", json.dumps(bad)])
        assert '"slot": <the share of the collections this run maintains' in capsys.readouterr().err


def test_a_run_of_a_schedule_slower_than_hourly_maintains_every_collection_that_is_due():
    """A daily run's interval holds every hour's share: it has no slot, so no share is left out."""
    settings = maintenance_settings(CONFIG, MIDNIGHT, MIDNIGHT + dt.timedelta(days=1))
    assert settings == MaintenanceSettings(optimize_interval_hours=24, retention_hours=168)
    assert all(maintained(settings, f"db.c{index}") for index in range(100)) and maintains_source(settings)
