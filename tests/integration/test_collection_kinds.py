"""Discovery classifies every collection a source's filters match, on a real mongod (``collection_kinds``)."""

from __future__ import annotations

import re

from mongo_cdc.capture.collection_kinds import (
    DUPLICATE_ID,
    NO_ID,
    NOT_CAPTURED,
    SHARDED_TIME_SERIES,
    SHARDED_VIEW,
    STREAMED,
    SYSTEM_COLLECTION,
    TIME_SERIES,
    VIEW,
    classify_collections,
)
from mongo_cdc.capture.topology import make_client
from mongo_cdc_dev.testing.lake import database_source


def test_each_kind_is_named_and_each_one_left_out_says_why(replica_set, db_name, tmp_path):
    with make_client(replica_set.uri) as client:
        db = client[db_name]
        # only order 2 has two items: the $unwind repeats its _id alone
        db.orders.insert_many(
            [{"_id": i, "items": [1, 2][: 1 + (i == 2)], "open": i % 2 == 0} for i in range(4)]
        )
        db.create_collection("metrics", timeseries={"timeField": "ts", "metaField": "host"})
        db.create_collection("open_orders", viewOn="orders", pipeline=[{"$match": {"open": True}}])
        db.create_collection("items", viewOn="orders", pipeline=[{"$unwind": "$items"}])
        db.create_collection("unwound_once", viewOn="orders", pipeline=[{"$unwind": "$items"}, {"$limit": 1}])
        db.create_collection("anonymous", viewOn="orders", pipeline=[{"$project": {"_id": 0}}])
        config = database_source("kinds", tmp_path, db_name)
        kinds = {kind.namespace: kind for kind in classify_collections(client, config, sharded=False)}
        sharded = {kind.namespace: kind for kind in classify_collections(client, config, sharded=True)}

    def of(name: str) -> tuple[str, str | None]:
        return kinds[f"{db_name}.{name}"].kind, kinds[f"{db_name}.{name}"].reason

    assert of("orders") == (STREAMED, None)
    assert of("open_orders") == (VIEW, None)
    # a pipeline that may repeat _id is read, and passes when it does not
    assert of("unwound_once") == (VIEW, None)
    assert of("items") == (NOT_CAPTURED, DUPLICATE_ID.format(value=2))
    assert of("anonymous") == (NOT_CAPTURED, NO_ID)
    assert of("metrics") == (TIME_SERIES, None)
    # the time-series collection's buckets and the views' definitions are MongoDB's internals
    assert of("system.buckets.metrics") == (NOT_CAPTURED, SYSTEM_COLLECTION)
    assert of("system.views") == (NOT_CAPTURED, SYSTEM_COLLECTION)
    assert sharded[f"{db_name}.open_orders"].reason == SHARDED_VIEW
    assert sharded[f"{db_name}.metrics"].reason == SHARDED_TIME_SERIES


def test_a_collection_the_filters_do_not_match_is_not_listed(replica_set, db_name, tmp_path):
    with make_client(replica_set.uri) as client:
        client[db_name].kept.insert_one({})
        client[db_name].other.insert_one({})
        client[db_name].create_collection("v", viewOn="other", pipeline=[])
        config = database_source(
            "kinds", tmp_path, db_name, collection_include=(re.compile(rf"{db_name}\.kept"),)
        )
        kinds = classify_collections(client, config, sharded=False)
    assert [(kind.namespace, kind.kind) for kind in kinds] == [(f"{db_name}.kept", STREAMED)]
