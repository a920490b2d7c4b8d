"""A recovery after a lost oplog (capture.oplog_recovery): what it lands per document, and when the
lake's batch log says it is over."""

from __future__ import annotations

import pytest

from mongo_cdc.capture.oplog_recovery import HEAL_BATCH, RECOVER_BATCH, heal_op, recovery_pending
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation


@pytest.mark.parametrize(
    ("in_state", "in_mongodb", "op"),
    [
        (False, True, "c"),  # the lake missed its insert
        (True, True, "u"),  # the lake missed an update
        (True, False, "d"),  # the lake missed its delete
        (False, False, None),  # came and went while it was verified: nothing to heal
    ],
)
def test_each_difference_lands_as_the_change_it_implies(in_state, in_mongodb, op):
    assert heal_op(in_state, in_mongodb) == op


def test_a_recovery_is_pending_from_its_recover_batch_until_a_heal_batch_of_its_replica_set(tmp_path):
    lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    assert not recovery_pending(lake, "rs0")
    for seq, kind, rs in [(1, "snapshot", "rs0"), (2, RECOVER_BATCH, "rs0"), (1, RECOVER_BATCH, "rs1")]:
        lake.commit(Batch(rs, seq, kind, None, seq << 32))
    assert recovery_pending(lake, "rs0") and recovery_pending(lake, "rs1")
    # a routine verification's batch (a recovery whose collections were not all verified) ends nothing
    lake.commit(Batch("rs0", 3, "verify", None, 3 << 32))
    assert recovery_pending(lake, "rs0")
    lake.commit(Batch("rs0", 4, HEAL_BATCH, None, 4 << 32))
    assert not recovery_pending(lake, "rs0") and recovery_pending(lake, "rs1")
    # lost again later: pending again
    lake.commit(Batch("rs0", 5, RECOVER_BATCH, None, 5 << 32))
    assert recovery_pending(lake, "rs0")
