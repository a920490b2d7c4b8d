"""A view dropped since its last read waits, as the captured views do, for the replica set's
complete snapshot and position before its state's documents land as deletes (``capture_views``)."""

from __future__ import annotations

from mongo_cdc.capture.collection_kinds import VIEW_BATCH
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.topology import make_client
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.verify.view_capture import capture_views
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def test_a_dropped_view_is_not_read_before_the_replica_set_has_a_position(replica_set, db_name, tmp_path):
    config = database_source("views", tmp_path / "lake", db_name)
    keeper = memory_keeper(config, replica_set.name)  # no offset: a new snapshot is to come
    dropped = f"{db_name}.gone"  # an earlier run read it; MongoDB has no such namespace now
    keeper.lake.commit(Batch(replica_set.name, 1, VIEW_BATCH, None, 1 << 32, namespaces=(dropped,)))
    with make_client(replica_set.uri) as client:
        found = capture_views(ReplicaSetCapture(client, config, keeper), [])
    assert found.not_read == {dropped: "the replica set has no complete snapshot and position yet"}
    assert found.batch_seq is None and [batch.seq for batch in keeper.lake.batches()] == [1]
