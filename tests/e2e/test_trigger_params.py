"""A wrong trigger fails its run at once, without retries and without Spark."""

from __future__ import annotations

import json
import os

import failure_probe
import pytest
from airflow.sdk.exceptions import AirflowFailException
from smtp_support import SmtpServer
from statsd_support import airflow_statsd

from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest
from mongo_cdc_airflow.params import resnapshot_request

DEFAULTS = {"resnapshot": False, "collections": [], "shards": []}


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"resnapshot": True, "colections": ["shop.orders"]},
            'unknown param "colections"; the params are: resnapshot, collections, filters, shards, '
            "stream_from, skip_unread, verify",
        ),
        ({"resnapshot": "yes"}, "param \"resnapshot\" must be true or false, got 'yes'"),
        ({"resnapshot": True, "collections": "shop.orders"}, 'param "collections" must be a list'),
        ({"resnapshot": True, "shards": [1]}, 'param "shards" must be a list of shard ids'),
        ({"resnapshot": True, "collections": ["orders"]}, "orders is not a <db>.<collection> name"),
        ({"collections": ["shop.orders"]}, 'set "resnapshot" to true too'),
    ],
)
def test_wrong_params_are_refused_naming_them(conf, message):
    with pytest.raises(AirflowFailException) as failure:
        resnapshot_request(conf, {**DEFAULTS, **conf}, backfill=False)
    assert message in str(failure.value)


def test_every_problem_is_reported_and_good_params_make_a_request():
    conf = {"colections": [], "shard": ["a"], "resnapshot": True}
    with pytest.raises(AirflowFailException) as failure:
        resnapshot_request(conf, {**DEFAULTS, **conf}, backfill=False)
    assert 'unknown param "colections"' in str(failure.value) and 'unknown param "shard"' in str(
        failure.value
    )
    with pytest.raises(AirflowFailException, match="a backfill only completes past intervals"):
        resnapshot_request({}, {**DEFAULTS, "resnapshot": True}, backfill=True)
    conf = {"resnapshot": True, "collections": ["shop.orders"]}
    assert resnapshot_request(conf, {**DEFAULTS, **conf}, False) == ResnapshotRequest(("shop.orders",))
    assert resnapshot_request({}, DEFAULTS, False) is None


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"resnapshot": True, "colections": ["x.customers"]}, 'unknown param "colections"'),
        ({"resnapshot": True, "collections": ["x.nope"]}, 'param "collections": unknown collection x.nope'),
    ],
)
def test_a_wrong_trigger_fails_discover_once_and_never_reaches_spark(
    cdc_source, replica_set, db_name, monkeypatch, capfd, conf, message
):
    source = cdc_source(db_name)
    conf = {
        **conf,
        **{k: [c.replace("x.", f"{db_name}.") for c in v] for k, v in conf.items() if k != "resnapshot"},
    }
    message = message.replace("x.", f"{db_name}.")
    # retries as in production: a retried discover would show as a second try (and a 30 s wait)
    monkeypatch.setenv("MONGO_CDC_TASK_RETRIES", "3")
    with replica_set.client() as client:
        client[db_name].customers.insert_one({"_id": 1})
    capfd.readouterr()
    run = source.run(conf=conf, expect="failed", skip_spark=True)
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert tis["discover"].state == "failed" and tis["discover"].try_number == 1
    assert tis["discover"].max_tries == 3  # retries were on, the failure skipped them
    assert tis["plan_transform"].state == "failed" and tis["transform"].state == "upstream_failed"
    assert message in "".join(capfd.readouterr())
    assert os.environ["MONGO_CDC_TASK_RETRIES"] == "3"


def test_the_source_files_failure_callback_runs_for_each_task_that_fails(
    cdc_source, db_name, tmp_path, monkeypatch
):
    """``dag.on.failure.callback``: a wrong trigger fails discover (and plan_transform after it), and
    the callable the source file names is called with each failed task's context."""
    record = tmp_path / "failed-tasks.txt"
    monkeypatch.setenv(failure_probe.RECORD_ENV, str(record))
    source = cdc_source(db_name, **{"dag.on.failure.callback": "failure_probe.record"})
    with airflow_statsd(monkeypatch) as statsd:
        run = source.run(conf={"resnapshot": True, "colections": []}, expect="failed", skip_spark=True)
        sent = statsd.drain()
    failed = sorted(
        f"{source.dag_id} {ti.task_id}" for ti in run.get_task_instances() if ti.state == "failed"
    )
    assert f"{source.dag_id} discover" in failed
    assert sorted(record.read_text().splitlines()) == failed
    # a failed run is no success: the stalled-source alert sees the last one age
    assert not [name for name in sent if "last_success" in name]


def test_the_source_files_mail_goes_to_its_addresses_when_a_task_fails(cdc_source, db_name, monkeypatch):
    """``dag.email``: Airflow's SMTP notifier mails each failed task to the addresses, through the
    connection ``[email] email_conn_id`` names (here a real SMTP server on loopback)."""
    with SmtpServer() as smtp:
        connection = {
            "conn_type": "smtp",
            "host": "127.0.0.1",
            "port": smtp.port,
            "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "airflow@example.com"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps(connection))
        source = cdc_source(db_name, **{"dag.email": ["oncall@example.com", "lead@example.com"]})
        run = source.run(conf={"resnapshot": True, "colections": []}, expect="failed", skip_spark=True)
    failed = sorted(ti.task_id for ti in run.get_task_instances() if ti.state == "failed")
    assert "discover" in failed and len(smtp.messages) == len(failed)
    for message in smtp.messages:
        assert message["To"] == "oncall@example.com, lead@example.com"
        assert message["From"] == "airflow@example.com"
    subjects = " ".join(message["Subject"] for message in smtp.messages)
    assert "discover" in subjects and source.dag_id in subjects
