"""The DAG's own settings in the source file (``dag.*``): what they make of the DAGs, and how bad
values are refused naming the key."""

from __future__ import annotations

import datetime as dt

import failure_probe
import pytest
import yaml
from airflow.providers.smtp.notifications.smtp import SmtpNotifier
from airflow.sdk import CronDataIntervalTimetable
from airflow.serialization.encoders import coerce_to_core_timetable

from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc_airflow.dag_factory import build_cdc_dag, build_topology_dag

UTC = dt.timezone.utc


def source(tmp_path, **settings) -> str:
    path = tmp_path / "shop.yaml"
    path.write_text(yaml.safe_dump({"topic.prefix": "shop", **settings}))
    return str(path)


def failure_callbacks(task) -> list:
    """A task's failure callbacks: a list on an operator, the one callable on a mapped one."""
    callbacks = task.on_failure_callback
    return list(callbacks) if isinstance(callbacks, list) else [callbacks] if callbacks else []


def test_the_source_file_sets_schedule_owner_tags_mail_callback_and_the_failed_runs_limit(tmp_path):
    config = load_source(
        source(
            tmp_path,
            **{
                "dag.schedule": "30 2 * * *",
                "dag.owner": "data-platform",
                "dag.tags": ["team:orders", "tier-1"],
                "dag.email": "oncall@example.com, lead@example.com",
                "dag.on.failure.callback": "failure_probe.record",
                "dag.max.consecutive.failed.runs": 5,
            },
        )
    )
    dag = build_cdc_dag(config)
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable.expression == "30 2 * * *"
    # a data interval from one run to the next, as the hourly default has: a whole day here (the
    # scheduler's own timetable, the one the DAG's serializes to)
    run_after = dt.datetime(2026, 3, 4, 12, tzinfo=UTC)
    interval = coerce_to_core_timetable(dag.timetable).infer_manual_data_interval(run_after=run_after)
    assert (interval.start, interval.end) == (
        dt.datetime(2026, 3, 3, 2, 30, tzinfo=UTC),
        dt.datetime(2026, 3, 4, 2, 30, tzinfo=UTC),
    )
    assert dag.tags == {"mongo-cdc", "shop", "team:orders", "tier-1"}
    assert dag.max_consecutive_failed_dag_runs == 5
    for task in dag.tasks:
        assert task.owner == "data-platform"
        callback, mail = failure_callbacks(task)
        assert callback is failure_probe.record
        assert isinstance(mail, SmtpNotifier) and mail.to == ["oncall@example.com", "lead@example.com"]
    topology = build_topology_dag(config)
    assert topology.tags == dag.tags and topology.get_task("trigger_cdc").owner == "data-platform"


def test_without_dag_keys_the_dag_is_hourly_owned_by_airflow_and_sends_no_mail(tmp_path):
    dag = build_cdc_dag(load_source(source(tmp_path)))
    assert dag.timetable.expression == "0 * * * *"
    assert dag.tags == {"mongo-cdc", "shop"}
    pull = dag.get_task("shard_sync.pull")
    assert (pull.owner, pull.email, failure_callbacks(pull)) == ("airflow", None, [])


def test_mail_can_be_turned_off_keeping_the_addresses(tmp_path):
    settings = {"dag.email": ["oncall@example.com"], "dag.email.on.failure": False}
    dag = build_cdc_dag(load_source(source(tmp_path, **settings)))
    assert failure_callbacks(dag.get_task("summary")) == []


@pytest.mark.parametrize("preset", ["@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"])
def test_cron_presets_are_accepted_and_written_out(tmp_path, preset):
    dag = build_cdc_dag(load_source(source(tmp_path, **{"dag.schedule": preset})))
    assert isinstance(dag.timetable, CronDataIntervalTimetable) and not dag.timetable.expression.startswith(
        "@"
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("dag.schedule", "@once", "use a five-field cron expression"),  # no data interval
        ("dag.schedule", "61 * * * *", "use a five-field cron expression"),
        ("dag.schedule", "0 * * * * *", "use a five-field cron expression"),  # seconds: not Airflow's
        ("dag.schedule", 3600, "use a five-field cron expression"),
        ("dag.owner", "  ", "must be a non-empty string"),
        ("dag.tags", [1], "must be a list of tags"),
        ("dag.tags", ["x" * 101], "too long: a tag has at most 100 characters"),
        ("dag.email", "oncall", "'oncall' is not an e-mail address"),
        ("dag.email.on.failure", "yes", "must be true or false"),
        ("dag.on.failure.callback", "page_oncall", "give the callable's dotted path"),
        ("dag.on.failure.callback", "no_such_module_here.page", "No module named 'no_such_module_here'"),
        ("dag.on.failure.callback", "failure_probe.missing", "has no attribute 'missing'"),
        ("dag.on.failure.callback", "failure_probe.NOT_CALLABLE", "is a int, not a callable"),
        ("dag.max.consecutive.failed.runs", -1, "must be an integer from 0"),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path, key, value, message):
    with pytest.raises(SourceConfigError) as refused:
        load_source(source(tmp_path, **{key: value}))
    assert f"key '{key}'" in str(refused.value) and message in str(refused.value)


def test_a_mistyped_dag_key_is_named_with_the_closest_one(tmp_path):
    with pytest.raises(SourceConfigError, match="unknown key 'dag.schedul'; did you mean 'dag.schedule'"):
        load_source(source(tmp_path, **{"dag.schedul": "@daily"}))
