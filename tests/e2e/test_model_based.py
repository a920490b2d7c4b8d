"""Model-based tests of the data path (tests/support/model_support.py says what each sequence checks,
tests/support/model_kinds.py what its hashed fields and time-series collection add).

Hypothesis draws sequences of writes, runs and upkeep, in every capture mode, and shrinks a failing
one to a minimal sequence, printed as a ready test. CI draws a fixed, derandomized budget;
``make soak`` draws fresh ones for as long as asked (``MODEL_SOAK_MINUTES``). The sequences run in
process: the snapshot and pull functions, and the Spark job's ``main`` on one SparkContext that
this module shares; a few go through real DAG runs (marked slow).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from unittest import mock

import pytest
from bson import Int64
from cdc_support import spark_job
from hypothesis import given, note, settings
from hypothesis import strategies as st
from model_dag_runs import DagSequence
from model_draws import derandomized, render_test
from model_kinds import KindsSequence
from model_support import (
    COLLECTIONS,
    MODES,
    CopyBeside,
    Delete,
    DropCollection,
    FilteredResnapshot,
    Inc,
    Insert,
    Maintain,
    Push,
    RenameCollection,
    RenameField,
    Replace,
    Resnapshot,
    Run,
    Sequence,
    Set,
    Transaction,
    Unset,
)
from model_time_series import LATE_SECONDS, DeleteMeta, Measure, Reconcile, UpdateMeta

from mongo_cdc.capture import streaming
from mongo_cdc.capture.topology import make_client

# Sequences per capture mode in CI (6 modes), and how many Hypothesis draws per round of the soak.
CI_EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "24"))
SOAK_MINUTES = float(os.environ.get("MODEL_SOAK_MINUTES", "0"))
SOAK_ROUND = 10
# The modes whose sequences update every state table by the MERGE on Spark's tasks, each MERGE
# checked against delta-rs' (model_support.merges_by_ranges_checked); the others write small state
# tables again whole, as a run does.
MERGED_BY_RANGES = MODES[1::2]


@pytest.fixture(scope="module")
def sequence(replica_set, spark_context, tmp_path_factory):
    """Factory: a new Sequence (its own database and lake) in a capture mode; both removed after
    the module, the lake of a passing sequence at once by ``played``.

    A pull ends on a getMore that waits up to POLL_INTERVAL_MS (1 s) for events that never come
    here: at 50 ms a run costs a third of what it did, so three times the sequences fit the budget.
    """
    databases = []
    client = make_client(replica_set.uri)
    poll = mock.patch.object(streaming, "POLL_INTERVAL_MS", 50)
    poll.start()

    def make(mode: str, full_update_type: str) -> KindsSequence:
        database = f"model_{uuid.uuid4().hex[:12]}"
        databases.append(database)
        lake_root = tmp_path_factory.mktemp("model_lake")
        return KindsSequence(
            client,
            spark_context,
            spark_job().main,
            lake_root,
            database,
            mode,
            full_update_type,
            merge_by_ranges=(mode, full_update_type) in MERGED_BY_RANGES,
        )

    yield make
    poll.stop()
    for database in databases:
        client.drop_database(database)
    client.close()


def played(sequence: Sequence, steps: list) -> None:
    sequence.check(steps)
    sequence.client.drop_database(sequence.database)
    shutil.rmtree(sequence.lake_root)


# -- what Hypothesis draws ----------------------------------------------------------------------

KEYS = st.integers(0, 4)
WRITTEN = st.sampled_from(COLLECTIONS[:2]) | st.just(COLLECTIONS[2])
NUMBERS = (
    st.integers(-3, 3) | st.sampled_from([2**31 - 1, 2**40, 0.5, -2.0]) | st.builds(Int64, st.integers(-3, 3))
)
SCALARS = NUMBERS | st.text("xyz", max_size=3) | st.booleans() | st.none()
VALUES = SCALARS | st.lists(SCALARS, max_size=2) | st.fixed_dictionaries({"x": SCALARS})
# a, b, v take any value (a field's type changes between writes); n is numeric ($inc), tags an array ($push)
FREE = st.sampled_from(["a", "b", "v"])
FIELDS = st.fixed_dictionaries(
    {}, optional={"a": VALUES, "b": VALUES, "v": VALUES, "n": NUMBERS, "tags": st.lists(SCALARS, max_size=2)}
)
WRITES = st.one_of(
    st.builds(Insert, WRITTEN, KEYS, FIELDS),
    st.builds(Replace, WRITTEN, KEYS, FIELDS),
    st.builds(Set, WRITTEN, KEYS, FREE, VALUES),
    st.builds(Inc, WRITTEN, KEYS, st.integers(-2, 2) | st.just(0.25)),
    st.builds(Unset, WRITTEN, KEYS, FREE | st.just("n")),
    st.builds(Push, WRITTEN, KEYS, SCALARS),
    st.builds(RenameField, WRITTEN, KEYS, FREE, FREE).filter(lambda w: w.old != w.new),
    st.builds(Delete, WRITTEN, KEYS),
)
# the time-series collection's writes, as one draw beside the others: a sequence pays for the
# collection (its reads, its tables) only if it draws one
METAS = st.sampled_from(["m0", "m1"])
MEASUREMENTS = st.one_of(
    st.builds(Measure, METAS, st.sampled_from(list(LATE_SECONDS))),
    st.builds(Measure, METAS, st.sampled_from(list(LATE_SECONDS))),
    st.builds(UpdateMeta, METAS, METAS).filter(lambda w: w.meta != w.to),
    st.builds(DeleteMeta, METAS),
)
STEPS = st.one_of(
    WRITES,
    WRITES,
    WRITES,
    WRITES,
    st.builds(Transaction, st.lists(WRITES, min_size=2, max_size=4)),
    st.just(Run()),
    st.just(Run()) | st.just(Reconcile()),  # as many runs as before the time-series collection
    st.builds(DropCollection, WRITTEN),
    st.builds(RenameCollection, WRITTEN, st.sampled_from(COLLECTIONS)),
    st.just(Maintain()),
    st.builds(Resnapshot, WRITTEN),
    st.builds(FilteredResnapshot, WRITTEN) | st.builds(FilteredResnapshot, WRITTEN, KEYS, KEYS),
    st.builds(CopyBeside, WRITTEN | st.none()),
    MEASUREMENTS,
)
SEQUENCES = st.lists(STEPS, min_size=8, max_size=30)


def drawn_sequences(make, mode: str, full_update_type: str, chosen: settings):
    """A Hypothesis test playing drawn sequences in one capture mode, under ``chosen`` settings."""

    @chosen
    @given(SEQUENCES)
    def sequences(steps: list) -> None:
        # printed for the minimal failing sequence only
        note(
            "A failing sequence, as a test for tests/e2e/test_model_based.py:\n\n"
            + render_test("test_found_by_soak", mode, full_update_type, steps)
        )
        played(make(mode, full_update_type), steps)

    return sequences


CI_SETTINGS = derandomized(CI_EXAMPLES)
SOAK_SETTINGS = settings(CI_SETTINGS, max_examples=SOAK_ROUND, derandomize=False)


@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_random_sequences_keep_the_lake_equal_to_mongodb(sequence, mode, full_update_type):
    drawn_sequences(sequence, mode, full_update_type, CI_SETTINGS)()


@pytest.mark.skipif(not SOAK_MINUTES, reason="the soak runs under make soak (MODEL_SOAK_MINUTES)")
def test_soak(sequence):
    """Fresh random sequences in every mode, round after round, until MODEL_SOAK_MINUTES are up."""
    deadline = time.monotonic() + SOAK_MINUTES * 60
    rounds = 0
    while time.monotonic() < deadline:
        for mode, full_update_type in MODES:
            drawn_sequences(sequence, mode, full_update_type, SOAK_SETTINGS)()
        rounds += 1
    print(f"soak: {rounds} rounds of {SOAK_ROUND} sequences in each of {len(MODES)} modes passed")


# -- sequences found before, kept as tests --------------------------------------------------------


@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_an_update_then_a_delete_between_runs_after_a_merge(sequence, mode, full_update_type):
    """Issue 27's three runs: a MERGE-written state table, then an update the pull finds no
    document for (deleted before the pull, or no full document in this mode)."""
    steps = [
        *(Insert("c0", key, {"n": key}) for key in range(4)),
        Run(),
        Insert("c0", 4, {"n": 4}),
        Set("c0", 1, "a", "x"),
        Run(),
        Inc("c0", 2, 1),
        Delete("c0", 2),
        Run(),
    ]
    played(sequence(mode, full_update_type), steps)


@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_filtered_resnapshots_by_a_field_and_by_an_id_range(sequence, mode, full_update_type):
    """Issue 50: a re-snapshot by a field reads only the documents holding it and deletes nothing;
    one of an _id range reads the range, and deletes the state's documents of it the copy did not
    read (here 2, deleted after the last pull) and none outside it (4, also deleted: the stream's
    delete removes it), whatever the run applies first."""
    steps = [
        *(Insert("c0", key, {"n": key} if key % 2 else {"a": key}) for key in range(5)),
        Insert("c1", 0, {"n": 0}),
        Run(),
        Set("c0", 0, "n", 1),
        FilteredResnapshot("c0"),
        Run(),
        Delete("c0", 2),
        Delete("c0", 4),
        FilteredResnapshot("c0", 1, 4),
        Set("c0", 3, "v", "after"),
        Run(),
        FilteredResnapshot("c1", 5, 9),  # an empty range: reads nothing, deletes nothing
        FilteredResnapshot("c0"),
        Run(),
    ]
    played(sequence(mode, full_update_type), steps)


def test_hashed_fields_and_a_time_series_collection_through_a_reconcile(sequence):
    """Issue 52: hashed values of every shape, landed by inserts and by updates that carry no
    document in this mode (a parent document set, a field renamed to a hashed name); measurements on
    time, late inside and beyond the lateness window, before and after the collection's first read,
    and an updateMany and a deleteMany on the metaField, which the reconcile lands."""
    steps = [
        Insert("c0", 0, {"a": "clear", "b": {"x": 1}}),
        Insert("c1", 0, {"b": [{"x": "clear"}, 2]}),
        Measure("m0", "beyond"),  # before the first read, which copies the collection
        Measure("m1", "now"),
        Run(),
        Set("c0", 0, "a", [1, {"x": None}]),
        Insert("c0", 1, {"v": "moved"}),
        RenameField("c0", 1, "v", "a"),
        Set("c1", 0, "b", {"x": 2.5}),
        Measure("m0", "now"),
        Measure("m1", "inside"),
        Measure("m1", "beyond"),  # the reconcile's
        Run(),
        UpdateMeta("m1", "m2"),
        DeleteMeta("m0"),
        Measure("m2", "now"),
        Reconcile(),
        Measure("m2", "inside"),
        Run(),
    ]
    played(sequence("change_streams", "lookup"), steps)


@pytest.mark.parametrize("copied", ["c0", None])
@pytest.mark.parametrize(("mode", "full_update_type"), MODES)
def test_a_copy_committed_runs_after_it_read_leaves_the_state_exact(sequence, mode, full_update_type, copied):
    """A re-snapshot of c0 (or a whole one) copied before a deletion, an update and an insert that the
    next Run's pull lands and its transform applies (c1 too); the copy's batch commits in the Run
    after that, numbered after the pulls' batches: the document it read and the stream deleted stays
    deleted. Writes between the last pull and the copy are streamed too, even beside a whole copy."""
    steps = [
        *(Insert("c0", key, {"n": key}) for key in range(4)),
        Insert("c1", 0, {}),
        Run(),
        Set("c1", 0, "a", "before the copy"),
        CopyBeside(copied),
        Delete("c0", 1),
        Set("c0", 2, "a", "x"),
        Insert("c0", 4, {}),
        Insert("c1", 1, {}),
        Run(),
        Delete("c0", 3),
        Insert("c1", 2, {}),
        Run(),
        Set("c0", 0, "a", "y"),
        Run(),
    ]
    played(sequence(mode, full_update_type), steps)


def test_an_empty_collection_renamed_over_another_empties_its_state(sequence):
    """Found by this suite: the rename's copy of an empty collection lands no rows for the new
    name, so its manifest never reached the state, which kept the replaced collection's documents.

    The insert into c1 puts the rename past the snapshot's position (the next test has a rename at
    that very cluster time)."""
    played(
        sequence("change_streams", "lookup"),
        [Insert("c2", 0, {}), Run(), Insert("c1", 0, {}), RenameCollection("c0", "c2"), Run()],
    )


def test_a_rename_at_the_snapshots_cluster_time_replaces_the_target(sequence):
    """Found by this suite: with no write between the snapshot and the rename, the rename's event has
    the snapshot position's cluster time. Its copy's reads sat at the same position as the
    snapshot's reads of the replaced collection, so they were not newer, and its manifest (deleting
    rows before its cluster time only) kept the replaced documents. A rename's copy now sits after a
    snapshot read at the same cluster time (``lake.RENAMED_COPY_ORDER``)."""
    played(
        sequence("change_streams", "lookup"),
        [Replace("c2", 0, {}), Insert("c0", 0, {}), Run(), RenameCollection("c2", "c0"), Run()],
    )


@pytest.mark.slow
def test_a_sequence_of_every_step_through_real_dag_runs(cdc_source, replica_set, db_name):
    """Every kind of step, each run a real DAG run (its transform a spark-submit), in the mode whose
    updates carry no document (a DAG run costs ~20 s: the other modes run in process above)."""
    mode, full_update_type = "change_streams", "lookup"
    source = cdc_source(db_name, **{"capture.mode": mode})
    with make_client(replica_set.uri) as client:
        sequence = DagSequence(
            client,
            None,
            None,
            source.lake_root,
            db_name,
            mode,
            full_update_type,
            source.prefix,
            source=source,
        )
        sequence.check(
            [
                Insert("c0", 1, {"n": 1, "a": "x", "tags": [1]}),
                Insert("c0", 2, {"n": 2}),
                Insert("c1", 1, {"v": 1}),
                Run(),
                Set("c0", 1, "v", 1.5),
                Inc("c0", 2, 1),
                Push("c0", 1, 2),
                Insert("c0", 3, {"v": "text"}),
                Run(),
                Inc("c0", 1, 1),
                Delete("c0", 1),
                Unset("c0", 2, "n"),
                RenameField("c0", 3, "v", "a"),
                Replace("c1", 1, {"b": Int64(5)}),
                Transaction([Insert("c0", 4, {"n": 2**40}), Delete("c0", 2), Set("c1", 1, "b", "text")]),
                Maintain(),
                Run(),
                Resnapshot("c1"),
                FilteredResnapshot("c0", 3, 5),
                Insert("c0", 1, {"again": True}),
                RenameCollection("c1", "c2"),
                Run(),
                DropCollection("c0"),
                Insert("c0", 5, {}),
                Set("c2", 1, "v", [1, "x"]),
                FilteredResnapshot("c2"),
                Run(),
            ]
        )
