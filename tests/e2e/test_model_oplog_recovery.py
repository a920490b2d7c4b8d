"""Model-based sequences with a lost oplog (tests/support/model_recovery.py says what each checks).

Hypothesis draws writes, runs and oplog losses, in every capture mode, on a mongod of its own whose
1 MB oplog is truncated within seconds; each run heals what a loss made the lake miss. A module of
its own, since the shared model suite's mongod keeps its oplog and its oracle expects every event.
"""

from __future__ import annotations

import os
import shutil
import uuid
from unittest import mock

import pytest
from cdc_support import spark_job
from hypothesis import given, note
from hypothesis import strategies as st
from model_draws import WRITES, derandomized, steps_with
from model_recovery import LoseOplog, RacingRun, RecoverySequence
from model_support import MODES, Delete, Insert, Run, Set

from mongo_cdc.capture import streaming
from mongo_cdc.capture.topology import make_client
from mongo_cdc_dev.testing import ReplicaSet

# Sequences per capture mode: each loss of the oplog costs a few seconds of filler writes
EXAMPLES = int(os.environ.get("MODEL_RECOVERY_EXAMPLES", "3"))

STEPS = steps_with(st.just(LoseOplog()), st.builds(RacingRun, st.lists(WRITES, min_size=1, max_size=3)))
# a loss needs a position (a run before it) and shows in a run after it
SEQUENCES = st.lists(STEPS, min_size=4, max_size=14).map(lambda steps: [Run(), *steps, LoseOplog(), Run()])


@pytest.fixture(scope="module")
def small_oplog_set(tmp_path_factory):
    with ReplicaSet(
        "rs0", tmp_path_factory.mktemp("mongod"), extra_args=("--oplogSize", "1", "--syncdelay", "1")
    ) as rs:
        yield rs


@pytest.fixture(scope="module")
def sequence(small_oplog_set, spark_context, tmp_path_factory):
    """Factory: a new RecoverySequence (its own database and lake) in a capture mode."""
    client = make_client(small_oplog_set.uri)
    poll = mock.patch.object(streaming, "POLL_INTERVAL_MS", 50)
    poll.start()

    def make(mode: str, full_update_type: str) -> RecoverySequence:
        lake_root = tmp_path_factory.mktemp("model_lake")
        database = f"model_{uuid.uuid4().hex[:12]}"
        return RecoverySequence(
            client, spark_context, spark_job().main, lake_root, database, mode, full_update_type
        )

    yield make
    poll.stop()
    client.close()


SETTINGS = derandomized(EXAMPLES)


@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_random_sequences_with_a_lost_oplog_keep_the_lake_equal_to_mongodb(sequence, mode, full_update_type):
    @SETTINGS
    @given(SEQUENCES)
    def sequences(steps: list) -> None:
        note(f"mode {mode} {full_update_type}, steps: {steps!r}")
        played = sequence(mode, full_update_type)
        played.check(steps)
        assert played.recoveries >= 1, "the sequence lost no position"
        played.client.drop_database(played.database)
        shutil.rmtree(played.lake_root)

    sequences()


def test_a_loss_of_inserts_updates_and_deletes_heals_in_the_mode_without_full_documents(sequence):
    """Updates carry only their description: a document whose missed update fell in the gap and
    which changes again after it (before the next run, or while it runs, its event landed and not
    applied when the verification compares) must still end as MongoDB has it."""
    sequence("change_streams", "lookup").check(
        [
            Insert("c0", 1, {"a": 1}),
            Insert("c0", 2, {"a": 2}),
            Insert("c0", 3, {"a": 3}),
            Run(),
            Set("c0", 1, "a", 10),
            Delete("c0", 2),
            Insert("c0", 4, {"b": "x"}),
            LoseOplog(),
            Set("c0", 1, "b", "y"),
            Run(),
            Set("c0", 3, "a", None),
            Run(),
            Set("c0", 3, "a", 30),
            LoseOplog(),
            RacingRun([Set("c0", 3, "b", "z"), Insert("c0", 5, {})]),
            Run(),
        ]
    )
