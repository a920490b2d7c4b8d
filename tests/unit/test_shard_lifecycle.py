"""The shard lifecycle decisions (capture.shard_lifecycle): snapshot or not, retiring, retired, back."""

from __future__ import annotations

import pytest

from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest, ShardPlan, plan_shard, still_draining

STREAMING = Offset(resume_token={"_data": "82"}, cluster_time=1, batch_seq=1, snapshot={"status": "complete"})
RETIRED = Offset(
    resume_token={"_data": "82"},
    batch_seq=4,
    snapshot={"status": "complete"},
    retired_at="2024-01-01T00:00:00",
)


def plan(
    offset=None,
    mode="initial",
    retiring=False,
    resnapshot=None,
    lost=False,
    shard_id="rs0",
    new=(),
    recovery="resnapshot",
    pending=False,
) -> ShardPlan:
    def position_lost(_: Offset) -> bool:
        assert mode == "when_needed", "the server is asked only when the answer matters"
        return lost

    def recovery_pending() -> bool:
        assert mode == "when_needed" and recovery == "heal", "the lake is asked only when it matters"
        return pending

    def newly_captured(asked: Offset) -> tuple[str, ...]:
        assert asked.resume_token is not None and mode in ("initial", "when_needed")
        return new

    return plan_shard(
        shard_id=shard_id,
        retiring=retiring,
        offset=offset,
        snapshot_mode=mode,
        resnapshot=resnapshot,
        position_lost=position_lost,
        oplog_lost_recovery=recovery,
        recovery_pending=recovery_pending,
        newly_captured=newly_captured,
    )


@pytest.mark.parametrize(
    ("mode", "without_offset", "after_a_snapshot"),
    [
        ("initial", (), None),
        ("when_needed", (), None),  # plus a lost oplog position, below
        ("always", (), ()),
        ("initial_only", (), None),
        ("no_data", None, None),
        ("never", None, None),
    ],
)
def test_snapshot_modes_decide_when_to_copy(mode, without_offset, after_a_snapshot):
    first = plan(None, mode)
    assert first.snapshot == without_offset
    assert first.start_without_copy is (without_offset is None)
    assert plan(STREAMING, mode).snapshot == after_a_snapshot
    assert not plan(STREAMING, mode).start_without_copy
    assert plan(STREAMING, mode).stream is (mode != "initial_only")


def test_an_unfinished_snapshot_is_taken_again():
    running = Offset(batch_seq=3, snapshot={"status": "running", "seq": 3})
    assert plan(running).snapshot == ()
    # one of some collections (a re-snapshot, or collections added later) goes on with those
    some = Offset(STREAMING.resume_token, 1, 3, {"status": "running", "seq": 4, "collections": ["db.b"]})
    assert plan(some).snapshot == ("db.b",) and "resuming" in plan(some).reason


def test_collections_the_filters_newly_match_are_copied_while_the_rest_streams():
    assert plan(STREAMING, new=("db.b",)).snapshot == ("db.b",)
    assert plan(STREAMING, "when_needed", new=("db.b",)).snapshot == ("db.b",)
    request = ResnapshotRequest(collections=("db.a",))
    assert plan(STREAMING, resnapshot=request, new=("db.b",)).snapshot == ("db.a", "db.b")
    for mode in ("always", "initial_only", "no_data", "never"):  # copy everything, or never copy
        assert plan(STREAMING, mode, new=("db.b",)).snapshot in ((), None)


def test_when_needed_resnapshots_a_lost_position_only():
    assert plan(STREAMING, "when_needed", lost=True).snapshot == ()
    assert "no longer in the oplog" in plan(STREAMING, "when_needed", lost=True).reason
    assert plan(STREAMING, "when_needed", lost=False).snapshot is None


def test_when_needed_heals_a_lost_position_with_the_heal_recovery():
    healed = plan(STREAMING, "when_needed", lost=True, recovery="heal")
    assert (healed.snapshot, healed.start_without_copy, healed.stream, healed.recover) == (
        None,
        False,
        True,
        True,
    )
    assert "streaming from now and healing" in healed.reason
    # the full copy stays the resnapshot recovery's, and never marks a recovery
    copied = plan(STREAMING, "when_needed", lost=True, recovery="resnapshot")
    assert (copied.snapshot, copied.recover) == ((), False)
    assert not plan(STREAMING, "when_needed", lost=False, recovery="heal").recover


def test_an_unfinished_recovery_heals_again_until_the_lake_says_it_is_over():
    again = plan(STREAMING, "when_needed", recovery="heal", pending=True)
    assert (again.snapshot, again.recover) == (None, True) and "unfinished" in again.reason
    assert not plan(STREAMING, "when_needed", recovery="heal", pending=False).recover
    # a requested re-snapshot copies everything: it goes first
    requested = plan(STREAMING, "when_needed", recovery="heal", pending=True, resnapshot=ResnapshotRequest())
    assert (requested.snapshot, requested.recover) == ((), False)
    # other modes never recover (plan's position_lost and recovery_pending refuse to be asked)
    assert not plan(STREAMING, "initial", recovery="heal").recover


def test_a_trigger_resnapshots_the_shards_it_names():
    request = ResnapshotRequest(collections=("shop.orders",), shards=("shard01",))
    assert plan(STREAMING, resnapshot=request, shard_id="shard01").snapshot == ("shop.orders",)
    assert plan(STREAMING, resnapshot=request, shard_id="shard02").snapshot is None
    assert plan(STREAMING, resnapshot=ResnapshotRequest(), shard_id="shard02").snapshot == ()


def test_a_retiring_shard_is_drained_then_retired_and_never_copied():
    draining = plan(STREAMING, "always", retiring=True)
    assert (draining.snapshot, draining.stream, draining.retire) == (None, True, True)
    # initial_only never streams, so there is nothing to drain: retired at once
    assert (plan(STREAMING, "initial_only", retiring=True).stream, plan(STREAMING, retiring=True).retire) == (
        False,
        True,
    )
    assert still_draining(STREAMING) and not still_draining(RETIRED) and not still_draining(None)


@pytest.mark.parametrize(("mode", "copies"), [("initial", ()), ("never", None)])
def test_a_shard_back_from_retirement_starts_afresh(mode, copies):
    back = plan(RETIRED, mode)
    assert back.fresh and back.snapshot == copies and back.start_without_copy is (copies is None)


def test_the_plan_survives_its_xcom_round_trip():
    request = ResnapshotRequest(collections=("shop.orders",))
    healing = plan(STREAMING, "when_needed", lost=True, recovery="heal")
    for shard_plan in (plan(), plan(STREAMING), plan(STREAMING, resnapshot=request), healing):
        assert ShardPlan.from_dict(shard_plan.to_dict()) == shard_plan
