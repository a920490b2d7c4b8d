"""A shard's pull goes on while its copies run (issue 50 item 1), end to end through Airflow's dag.test.

A re-snapshot of one collection, slowed by many chunks, while the shard's other collection is
written: that collection's events land in the same run, without waiting for the copy, and the copied
collection's state is exact once the copy's batch commits, numbered after the pull's batches.
"""

from __future__ import annotations

import pytest
from cdc_support import assert_state_equals_collection
from datagen import FALLBACK_FIELDS, load

from mongo_cdc import extjson
from mongo_cdc.capture import snapshot

# 3,000 customers in chunks of 100: 30 chunks to copy
COUNTS = {"customers": 3000, "orders": 300}
CHUNK_SIZE = 100


@pytest.fixture
def source_and_client(cdc_source, replica_set, db_name):
    source = cdc_source(db_name, **{"snapshot.chunk.size": CHUNK_SIZE})
    with replica_set.client() as client:
        load(client[db_name], COUNTS)
        source.run()  # the initial snapshot
        yield source, client


def _task_instances(run, task_id: str) -> list:
    return [ti for ti in run.get_task_instances() if ti.task_id == task_id]


def test_the_pull_lands_the_other_collections_writes_while_a_re_snapshot_copies(
    source_and_client, monkeypatch
):
    source, client = source_and_client
    db = client[source.database]
    start_snapshot = snapshot.start_snapshot
    some = [doc["_id"] for doc in db.customers.find({}, {"_id": 1}).sort("_id", 1).limit(26)]
    gone, renamed = some[:25], some[25]

    def writes_after_the_position(*args, **kwargs):
        """Writes made in the run once the re-snapshot has its position, before its copy."""
        plan = start_snapshot(*args, **kwargs)
        db.orders.insert_one({"_id": 10**6, "status": "during the copy", "mixed": 1})
        db.orders.update_one({"_id": 1}, {"$set": {"status": "updated during the copy"}})
        db.customers.delete_many({"_id": {"$in": gone}})
        db.customers.update_one({"_id": renamed}, {"$set": {"name": "renamed during the copy"}})
        return plan

    monkeypatch.setattr(snapshot, "start_snapshot", writes_after_the_position)
    batches_before = len(source.lake.batches())

    run = source.run(conf={"resnapshot": True, "collections": [f"{source.database}.customers"]})

    # the pull did not wait for the copy: it ended before the last chunk was copied and before the
    # commit began
    (pull,) = _task_instances(run, "shard_sync.pull")
    (commit,) = _task_instances(run, "shard_sync.snapshot")
    copies = _task_instances(run, "snapshot_copy")
    assert pull.end_date < max(copy.end_date for copy in copies)
    assert pull.end_date <= commit.start_date
    # the other collection's writes landed in this very run
    orders = {row["__id"]: row for row in source.state_rows("orders")}
    assert extjson.encode_str(10**6) in orders
    assert orders[extjson.encode_str(1)]["status"] == "updated during the copy"
    assert_state_equals_collection(source, client, "orders", FALLBACK_FIELDS["orders"])
    # the copied collection is exact: no deleted document came back, none is missing or doubled
    assert_state_equals_collection(source, client, "customers")
    # the copy's batch is numbered after the pull's, and its rows keep the number it reserved
    landed = source.lake.batches()[batches_before:]
    (copied,) = [batch for batch in landed if batch.kind == "snapshot"]
    streamed = [batch for batch in landed if batch.kind == "stream"]
    assert streamed and all(batch.seq < copied.seq for batch in streamed)
    assert copied.raw_seq < streamed[0].seq
    assert copied.raw_seq in {row["batch_seq"] for row in source.raw_rows("customers") if row["op"] == "r"}
