"""Model-based sequences of a source started at an op-time, with its stream moved back
(tests/support/model_positions.py says what each checks).

Hypothesis draws writes, transactions, runs, upkeep and moves of the stream back to where an earlier
run started, in every capture mode, on the shared replica set; the source copies nothing, so each
state table equals MongoDB only if every event from the start op-time landed, and each changes table
equals the oracle's events only if no replayed event landed twice.
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
from model_draws import derandomized, steps_with
from model_positions import MoveBack, StartedSequence
from model_support import (
    MODES,
    Delete,
    Insert,
    Replace,
    Run,
    Set,
    Transaction,
    Unset,
)

from mongo_cdc.capture import streaming
from mongo_cdc.capture.topology import make_client

# Sequences per capture mode
EXAMPLES = int(os.environ.get("MODEL_POSITION_EXAMPLES", "4"))

STEPS = steps_with(st.just(Run()), st.builds(MoveBack, st.integers(1, 3)))
# a move needs a run before it, and shows in a run after it
SEQUENCES = st.lists(STEPS, min_size=6, max_size=16).map(lambda steps: [Run(), *steps, MoveBack(2), Run()])


@pytest.fixture(scope="module")
def started_sequence(replica_set, spark_context, tmp_path_factory):
    """Factory: a new StartedSequence (its own database and lake) in a capture mode."""
    databases = []
    client = make_client(replica_set.uri)
    poll = mock.patch.object(streaming, "POLL_INTERVAL_MS", 50)  # as the model suite does
    poll.start()

    def make(mode: str, full_update_type: str) -> StartedSequence:
        database = f"started_{uuid.uuid4().hex[:12]}"
        databases.append(database)
        lake_root = tmp_path_factory.mktemp("started_lake")
        return StartedSequence(
            client, spark_context, spark_job().main, lake_root, database, mode, full_update_type
        )

    yield make
    poll.stop()
    for database in databases:
        client.drop_database(database)
    client.close()


@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_a_source_started_at_an_op_time_with_its_stream_moved_back_equals_mongodb(
    started_sequence, mode, full_update_type
):
    moved = []

    @derandomized(EXAMPLES)
    @given(SEQUENCES)
    def sequences(steps: list) -> None:
        note(f"steps: {steps!r}")
        played = started_sequence(mode, full_update_type)
        played.check(steps)
        moved.append(played.moves)
        played.client.drop_database(played.database)
        shutil.rmtree(played.lake_root)

    sequences()
    # every sequence ends with a move back after a run: the replays were exercised
    assert moved and all(moves >= 1 for moves in moved)


def test_a_move_back_over_every_kind_of_write_lands_nothing_twice(started_sequence):
    steps = [
        Insert("c0", 1, {"a": 1}),
        Insert("c1", 2, {"b": "x"}),
        Run(),
        Set("c0", 1, "a", 2),
        Transaction([Delete("c1", 2), Insert("c1", 3, {"a": None})]),
        Run(),
        Replace("c0", 1, {"b": 1}),
        MoveBack(2),  # to where the first run started: every event read again
        Run(),
        Unset("c0", 1, "b"),
        MoveBack(1),
        Run(),
    ]
    played = started_sequence("change_streams", "lookup")
    played.check(steps)
    assert played.moves == 2
    batches = [batch.kind for batch in played.keeper.lake.batches()]
    assert batches.count("start") == 1 and batches.count("rewind") == 2
