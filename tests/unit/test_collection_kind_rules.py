"""Which view pipelines keep a unique ``_id`` without reading the view (``collection_kinds``)."""

from __future__ import annotations

import pytest

from mongo_cdc.capture.collection_kinds import NOT_CAPTURED, CollectionKind, _unique_by_pipeline, not_captured

BASE = {"orders": {"name": "orders", "type": "collection", "options": {}}}


def _view(pipeline: list[dict], on: str = "orders") -> dict[str, dict]:
    return {**BASE, "v": {"name": "v", "type": "view", "options": {"viewOn": on, "pipeline": pipeline}}}


@pytest.mark.parametrize(
    "pipeline",
    [
        [],
        [{"$match": {"status": "open"}}, {"$project": {"total": 1}}],
        [{"$project": {"_id": 1, "total": 1}}, {"$sort": {"total": -1}}, {"$limit": 5}],
        [{"$addFields": {"n": 1}}, {"$unset": ["secret"]}, {"$lookup": {"from": "x", "as": "y"}}],
        [{"$unwind": "$items"}, {"$group": {"_id": "$items.sku", "n": {"$sum": 1}}}, {"$match": {"n": 2}}],
    ],
)
def test_pipelines_that_keep_the_id_need_no_read(pipeline):
    assert _unique_by_pipeline("v", _view(pipeline))


@pytest.mark.parametrize(
    "pipeline",
    [
        [{"$unwind": "$items"}],
        [{"$project": {"_id": 0, "total": 1}}],
        [{"$set": {"_id": "$customer"}}],
        [{"$unset": "_id"}],
        [{"$replaceRoot": {"newRoot": "$customer"}}],
        [{"$group": {"_id": "$c"}}, {"$unwind": "$x"}],
    ],
)
def test_pipelines_that_may_repeat_or_drop_the_id_are_read(pipeline):
    assert not _unique_by_pipeline("v", _view(pipeline))


def test_a_view_of_a_view_is_checked_down_to_its_collection():
    infos = {
        **_view([{"$match": {"a": 1}}]),
        "w": {"name": "w", "type": "view", "options": {"viewOn": "v", "pipeline": [{"$limit": 3}]}},
    }
    assert _unique_by_pipeline("w", infos)
    infos["v"]["options"]["pipeline"] = [{"$unwind": "$items"}]
    assert not _unique_by_pipeline("w", infos)


def test_a_view_of_a_time_series_collection_or_a_missing_one_is_read():
    assert not _unique_by_pipeline("v", {**_view([], on="metrics"), "metrics": {"type": "timeseries"}})
    assert not _unique_by_pipeline("v", _view([], on="gone"))


def test_only_the_collections_not_captured_are_reported():
    kinds = [CollectionKind("a.b", "streamed"), CollectionKind("a.system.views", NOT_CAPTURED, "internal")]
    assert not_captured(kinds) == {"a.system.views": "internal"}
