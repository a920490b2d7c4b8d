"""The CDC DAG's trigger params as Airflow's trigger form shows them, and how a wrong one fails."""

from __future__ import annotations

import logging

import pytest
from airflow.sdk.exceptions import AirflowFailException

from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest
from mongo_cdc_airflow.params import resnapshot_params, resnapshot_request


def _marked_required(schema: dict) -> bool:
    """Airflow's trigger form marks a param required unless its schema's type admits null."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def test_no_param_is_marked_required_in_the_trigger_form():
    params = resnapshot_params()
    assert {name: _marked_required(param.schema) for name, param in params.items()} == {
        "verify": False,
        "resnapshot": False,
        "collections": False,
        "shards": False,
    }
    # the same defaults, and an emptied field (null) passes Airflow's own validation
    assert {name: param.resolve() for name, param in params.items()} == {
        "verify": False,
        "resnapshot": False,
        "collections": [],
        "shards": [],
    }
    for param in params.values():
        assert param.resolve(None) is None


def test_an_emptied_field_means_its_default_and_the_checks_are_unchanged():
    emptied = {"resnapshot": None, "collections": None, "shards": None}
    assert resnapshot_request({}, emptied, backfill=False) is None
    request = {"resnapshot": True, "collections": ["shop.orders"], "shards": None}
    assert resnapshot_request({}, request, backfill=False) == ResnapshotRequest(("shop.orders",))
    with pytest.raises(AirflowFailException, match='set "resnapshot" to true too'):
        resnapshot_request({}, {**emptied, "collections": ["shop.orders"]}, backfill=False)
    with pytest.raises(AirflowFailException, match='param "shards" must be a list of shard ids'):
        resnapshot_request({}, {**emptied, "resnapshot": True, "shards": "shard01"}, backfill=False)


def test_a_wrong_param_logs_its_one_line_message_as_the_first_error(caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(AirflowFailException) as failure:
        resnapshot_request({"colections": ["shop.orders"]}, {"resnapshot": True}, backfill=False)
    message = str(failure.value)
    assert message.startswith('unknown param "colections"') and "\n" not in message
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.getMessage() for record in errors] == [message]
    assert failure.value.__suppress_context__ and failure.value.__cause__ is None  # no chained traceback
