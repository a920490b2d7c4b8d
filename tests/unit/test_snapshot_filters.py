"""Filtered re-snapshots without a server: the trigger's ``filters`` read and checked, ``_id`` range
filters recognised, and which state keys such a range holds in MongoDB's order."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from airflow.sdk.exceptions import AirflowFailException
from bson import Decimal128, Int64, ObjectId
from bson.datetime_ms import DatetimeMS

from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest
from mongo_cdc.capture.snapshot_filters import filter_text, filters_of_param, manifest_of, parse_filter
from mongo_cdc.id_ranges import IdRange, id_range_of, loads
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.transform.keys import document_key
from mongo_cdc_airflow.params import resnapshot_filters, resnapshot_request


def test_a_filter_is_extended_json_and_keeps_its_types():
    parsed = parse_filter(
        {
            "n": {"$numberLong": "5"},
            "o": {"$oid": "5f0000000000000000000001"},
            "d": {"$gte": {"$date": {"$numberLong": "0"}}},
            "i": 3,
        }
    )
    assert type(parsed["n"]) is Int64 and parsed["n"] == 5
    assert parsed["o"] == ObjectId("5f0000000000000000000001")
    assert type(parsed["d"]["$gte"]) is DatetimeMS
    assert type(parsed["i"]) is int
    # the text a plan records reads back to the same values and types
    again = loads(filter_text(parsed))
    assert again == parsed and type(again["n"]) is Int64
    assert parse_filter('{"a": {"$numberLong": "7"}}') == {"a": Int64(7)}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"shop.orders": {"_id": {"$oid": "nope"}}}, "the filter of shop.orders is not valid Extended JSON"),
        ({"shop.orders": "{not json"}, "the filter of shop.orders is not valid Extended JSON"),
        ({"shop.orders": [1, 2]}, "the filter of shop.orders must be a JSON object"),
        ({"shop.orders": {}}, "the filter of shop.orders is empty"),
        ({"orders": {"a": 1}}, "orders is not a <db>.<collection> name"),
        (["shop.orders"], 'param "filters" must be an object'),
    ],
)
def test_a_wrong_filter_is_named_with_its_collection(value, message):
    _, problems = filters_of_param(value)
    assert len(problems) == 1 and message in problems[0]
    with pytest.raises(AirflowFailException, match=message):
        resnapshot_request({}, {"resnapshot": True, "filters": value}, backfill=False)


def test_filters_alone_re_snapshot_just_their_collections():
    params = {"resnapshot": True, "filters": {"shop.orders": {"status": "open"}}}
    assert resnapshot_request({}, params, backfill=False) == ResnapshotRequest(("shop.orders",))
    assert resnapshot_filters(params) == {"shop.orders": '{"status":"open"}'}
    # with collections, the filtered ones are among them and the others are copied whole
    both = {**params, "collections": ["shop.orders", "shop.items"]}
    assert resnapshot_request({}, both, backfill=False) == ResnapshotRequest(("shop.orders", "shop.items"))
    assert resnapshot_filters({"filters": params["filters"]}) is None


def test_filters_need_a_re_snapshot_of_their_collections():
    filters = {"shop.orders": {"status": "open"}}
    with pytest.raises(AirflowFailException, match='param "filters" narrows a re-snapshot; set "resnapshot"'):
        resnapshot_request({}, {"filters": filters}, backfill=False)
    with pytest.raises(AirflowFailException, match='names shop.orders, which "collections" does not'):
        resnapshot_request({}, {"resnapshot": True, "collections": ["shop.items"], "filters": filters}, False)


@pytest.mark.parametrize(
    "query",
    [
        {"_id": {"$gte": 5}},
        {"_id": {"$lt": "m"}},
        {"_id": {"$gt": ObjectId("5f0000000000000000000001"), "$lte": ObjectId("5f0000000000000000000009")}},
        {"_id": {"$gte": DatetimeMS(0), "$lt": DatetimeMS(1000)}},
    ],
)
def test_an_id_range_is_recognised_and_survives_its_text(query):
    found = id_range_of(query)
    assert found is not None
    assert IdRange.of_text(found.text) == found


@pytest.mark.parametrize(
    "query",
    [
        {"status": "open"},
        {"_id": 5},
        {"_id": {"$in": [1, 2]}},
        {"_id": {"$gte": 1, "$gt": 2}},
        {"_id": {"$gte": 1}, "status": "open"},
        {"_id": {"$gte": None}},
        {"_id": {"$gte": float("nan")}},
        {"_id": {}},
    ],
)
def test_any_other_filter_is_no_range(query):
    assert id_range_of(query) is None


def _holds(query: dict, value: object) -> bool:
    found = id_range_of(query)
    assert found is not None
    return found.holds(document_key(value))


def test_a_range_holds_ids_by_mongodb_comparison_and_type_bracketing():
    numbers = {"_id": {"$gte": 5, "$lt": 10}}
    assert _holds(numbers, 5) and _holds(numbers, Int64(9)) and _holds(numbers, 9.5)
    assert _holds(numbers, Decimal128("7.25"))
    assert not _holds(numbers, 10) and not _holds(numbers, 4.999) and not _holds(numbers, float("nan"))
    # a string, a date or an ObjectId is never in a range of numbers, whatever its place in the order
    assert not _holds({"_id": {"$gte": 5}}, "6") and not _holds({"_id": {"$lt": 5}}, None)
    assert not _holds({"_id": {"$gte": 5}}, ObjectId())
    strings = {"_id": {"$gt": "b"}}
    assert _holds(strings, "c") and not _holds(strings, "b") and not _holds(strings, 100)
    assert _holds({"_id": {"$lte": "b"}}, "b") and _holds({"_id": {"$lte": "b"}}, "")
    dates = {"_id": {"$gte": DatetimeMS(0)}}
    assert _holds(dates, DatetimeMS(5)) and not _holds(dates, 5)
    assert _holds(dates, DatetimeMS(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)))
    # the column form gives the same answers
    found = id_range_of(numbers)
    assert found is not None
    keys = [document_key(value) for value in (1, 5, "7", 9)]
    assert found.holds_keys(pa.array(keys)).to_pylist() == [False, True, False, True]


def test_the_manifest_reconciles_whole_copies_and_id_ranges_only():
    filters = {
        "shop.orders": filter_text({"status": "open"}),
        "shop.items": filter_text({"_id": {"$gte": 5}}),
    }
    reconciled, ranges = manifest_of(("shop.items", "shop.orders", "shop.users"), filters)
    assert reconciled == ("shop.items", "shop.users")
    assert ranges == (("shop.items", IdRange({"$gte": 5}).text),)
    batch = Batch("rs0", 3, "snapshot", None, 1, snapshot_cluster_time=1, collections=reconciled,
                  snapshot_id_ranges=ranges)  # fmt: skip
    again = Batch.from_row(batch.to_row())
    assert again.manifest_of("shop.items").id_range == IdRange({"$gte": 5}).text  # type: ignore[union-attr]
    assert again.manifest_of("shop.users").id_range is None  # type: ignore[union-attr]
    assert again.manifest_of("shop.orders") is None
