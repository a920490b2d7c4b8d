"""The transform's driver holds no per-document data of a run (issue 25 item 7).

Spark finds the documents whose events are folded apart, and each task reads the deletion markers
and stored versions of its own documents: what the driver collects from Spark is files, layouts and
counts, whatever the number of documents. The runs here cover every path that needed per-document
data on the driver before: a first build, documents with several events, updates without the full
document (capture.mode change_streams: their stored version), deletes (markers) and documents that
live again after their delete (their markers dropped).
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from cdc_support import assert_state_equals_collection
from deltalake import DeltaTable
from pyspark import RDD

from mongo_cdc import lake
from mongo_cdc.transform.collection_run import CollectionRun
from mongo_cdc.transform.driver import CollectionTransform
from mongo_cdc.transform.flatten_options import FlatteningOptions

DOCUMENTS = 3_000
# What one Spark task may hand the driver: its files' names and statistics and its rows' layout
# needs. The keys of a slice's DOCUMENTS documents alone take several times this.
MAX_TASK_RESULT_BYTES = 16 * 1024


@pytest.fixture
def collected(monkeypatch) -> list[int]:
    """The pickled size of every item the driver collects from Spark during the test."""
    sizes: list[int] = []
    original = RDD.collect

    def measured(self: RDD) -> list[Any]:
        items = original(self)
        sizes.extend(len(pickle.dumps(item)) for item in items)
        return items

    monkeypatch.setattr(RDD, "collect", measured)
    return sizes


def transform(context, source) -> dict[str, Any]:
    run = CollectionRun(
        context, source.lake, f"{source.database}.items", source.lake.batches(), FlatteningOptions(), ()
    )
    return CollectionTransform(run).run(None)


def test_the_driver_collects_no_per_document_data(cdc_source, replica_set, db_name, spark, collected):
    source = cdc_source(db_name, **{"capture.mode": "change_streams"})
    context = spark.sparkContext
    with replica_set.client() as client:
        items = client[db_name].items
        items.insert_many([{"_id": i, "v": 0, "name": f"n{i}"} for i in range(DOCUMENTS)])
        source.run(skip_spark=True)
        first = transform(context, source)
        assert first["new_events"] == DOCUMENTS

        for i in range(0, 1_000):  # two updates each, without the full document: folded apart
            items.update_one({"_id": i}, {"$inc": {"v": 1}})
            items.update_one({"_id": i}, {"$set": {"name": f"m{i}"}})
        items.update_many({"_id": {"$gte": 1_000, "$lt": 1_500}}, {"$set": {"v": 2}})  # one each
        items.delete_many({"_id": {"$gte": 2_000, "$lt": 2_400}})
        items.insert_many([{"_id": i, "v": 3} for i in range(DOCUMENTS, DOCUMENTS + 200)])
        source.run(skip_spark=True)
        transform(context, source)
        assert_state_equals_collection(source, client, "items")

        # documents that live again after their delete: their markers go
        items.insert_many([{"_id": i, "v": 4} for i in range(2_000, 2_100)])
        items.update_one({"_id": 2_000}, {"$set": {"v": 5}})
        source.run(skip_spark=True)
        transform(context, source)
        assert_state_equals_collection(source, client, "items")

    markers = DeltaTable(lake.deletions_uri(source.location, source.prefix, source.database, "items"))
    keys = sorted(markers.to_pyarrow_table().column("__key").to_pylist())
    assert keys == sorted(f'["n","{i}"]' for i in range(2_100, 2_400))
    assert collected, "the transform ran no Spark job"
    assert max(collected) <= MAX_TASK_RESULT_BYTES, sorted(collected)[-5:]
