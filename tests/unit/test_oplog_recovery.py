"""What a recovery after a lost oplog lands per document (capture.oplog_recovery.heal_op)."""

from __future__ import annotations

import pytest

from mongo_cdc.capture.oplog_recovery import heal_op


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
