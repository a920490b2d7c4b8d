"""The CDC DAG's trigger params as Airflow's trigger form shows them, and how a wrong one fails."""

from __future__ import annotations

import logging

import pytest
from airflow.sdk.exceptions import AirflowFailException
from bson import Timestamp

from mongo_cdc.capture.collection_kinds import STREAMED, TIME_SERIES, VIEW
from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest
from mongo_cdc.capture.stream_move import StreamMoveRequest
from mongo_cdc_airflow.params import check_known, resnapshot_params, resnapshot_request, stream_move_request


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
        "filters": False,
        "shards": False,
        "stream_from": False,
        "skip_unread": False,
    }
    # the same defaults, and an emptied field (null) passes Airflow's own validation
    assert {name: param.resolve() for name, param in params.items()} == {
        "verify": False,
        "resnapshot": False,
        "collections": [],
        "filters": {},
        "shards": [],
        "stream_from": None,
        "skip_unread": False,
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
    with pytest.raises(AirflowFailException, match='set "resnapshot" to true or give "stream_from" too'):
        resnapshot_request({}, {**emptied, "shards": ["shard01"]}, backfill=False)
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


def test_a_stream_move_takes_the_op_time_formats_and_its_shards():
    for written in ("1767225600", "2026-01-01T00:00:00Z", "1767225600:0"):
        params = {"stream_from": written, "shards": ["shard01"]}
        assert resnapshot_request({}, params, backfill=False) is None  # no re-snapshot asked
        assert stream_move_request(params) == StreamMoveRequest(Timestamp(1767225600, 0), False, ("shard01",))
    forward = stream_move_request({"stream_from": "1767225600:5", "skip_unread": True})
    assert forward == StreamMoveRequest(Timestamp(1767225600, 5), True, ())
    assert forward.covers("any shard")
    assert stream_move_request({"stream_from": None, "skip_unread": None}) is None


@pytest.mark.parametrize(
    ("params", "backfill", "message"),
    [
        (
            {"stream_from": "yesterday"},
            False,
            "param \"stream_from\" is 'yesterday'; allowed: epoch seconds (1767225600), ISO-8601 with a "
            "zone (2026-01-01T00:00:00Z) or <seconds>:<increment> (1767225600:3)",
        ),
        (
            {"stream_from": "2026-01-01T00:00:00"},
            False,
            "(an ISO-8601 time needs its zone, e.g. Z or +02:00)",
        ),
        (
            {"stream_from": "1767225600", "resnapshot": True},
            False,
            'params "resnapshot" and "stream_from" both say where streaming goes on; trigger one of them',
        ),
        ({"stream_from": "1767225600"}, True, "a backfill only completes past intervals and cannot move"),
        ({"skip_unread": True}, False, 'param "skip_unread" applies to a move; give "stream_from" too'),
        (
            {"stream_from": "1767225600", "skip_unread": "yes"},
            False,
            'param "skip_unread" must be true or false',
        ),
    ],
)
def test_a_wrong_stream_move_fails_before_anything_runs(params, backfill, message):
    with pytest.raises(AirflowFailException) as failure:
        resnapshot_request({}, params, backfill=backfill)
    assert message in str(failure.value)


def test_a_resnapshot_naming_a_view_or_a_time_series_collection_says_what_to_do_instead():
    """They are captured in batches and never copied by a snapshot: not "unknown", but why, and how
    to get their state equal to MongoDB now."""
    kinds = {"shop.orders": STREAMED, "shop.open_orders": VIEW, "metrics.cpu": TIME_SERIES}
    with pytest.raises(AirflowFailException) as failure:
        check_known(
            "shop", (), ["shop.open_orders", "metrics.cpu", "shop.nope"], ["rs0"], ["shop.orders"], kinds
        )
    message = str(failure.value)
    assert 'param "collections": metrics.cpu is a time-series collection' in message
    assert 'trigger with {"verify": true} to reconcile' in message
    assert 'param "collections": shop.open_orders is a view' in message
    assert (
        "unknown collection shop.nope; the captured collections of source 'shop' are: shop.orders" in message
    )
    check_known("shop", (), ["shop.orders"], ["rs0"], ["shop.orders"], kinds)  # a collection passes
