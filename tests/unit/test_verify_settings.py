"""When a run verifies (``verify.interval.hours``, the trigger param ``verify``) and how wrong
values of both, and of ``verify.on.drift``, are refused."""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.sdk.exceptions import AirflowFailException

from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc_airflow.params import resnapshot_request, verify_requested
from mongo_cdc_airflow.shard_sync import on_interval_hour

MIDNIGHT = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)


def test_the_run_starting_on_an_interval_boundary_verifies_and_the_param_asks_in_any_run(tmp_path):
    path = tmp_path / "source.yaml"
    path.write_text("topic.prefix: p\n")
    config = load_source(path)
    assert (config.verify_interval_hours, config.verify_on_drift) == (24, "repair")
    assert on_interval_hour(config.verify_interval_hours, MIDNIGHT)
    assert not on_interval_hour(config.verify_interval_hours, MIDNIGHT + dt.timedelta(hours=1))
    assert on_interval_hour(6, MIDNIGHT + dt.timedelta(hours=6))
    assert not on_interval_hour(0, MIDNIGHT) and not on_interval_hour(24, None)
    assert verify_requested({"verify": True}) and not verify_requested({"verify": None})


def test_wrong_values_are_refused_with_what_is_allowed(tmp_path):
    path = tmp_path / "source.yaml"
    path.write_text("topic.prefix: p\nverify.on.drift: heal\n")
    refused = "key 'verify.on.drift' is 'heal'; allowed values: repair, fail, report"
    with pytest.raises(SourceConfigError, match=refused):
        load_source(path)
    with pytest.raises(AirflowFailException, match="param \"verify\" must be true or false, got 'yes'"):
        resnapshot_request({"verify": "yes"}, {"verify": "yes"}, backfill=False)
