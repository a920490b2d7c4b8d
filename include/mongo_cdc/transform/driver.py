"""The Spark job's driver: every collection's committed raw events -> its ``state`` and ``changes`` tables.

The lake says what is committed (the batch log, ``landing.SourceLake``); each derived table records per
replica set the last batch it applied (Delta app transactions, ``raw_events.applied_app_id``) in
the same commit as its data, so a run applies exactly the batches committed since the last one,
whatever crashed before; a collection's run that loses a commit race to another writer of its
tables (two transforms at once) is made again from a fresh read (``CollectionTransform.converged``).
Spark parallelises the Python work; delta-rs commits, so no Spark jar is needed. Each try of a
collection's run works within a ``collection_run.CollectionRun`` (where its tables are, the batches
it applies and how each commit records them, how its slices go to Spark), which the table runs
(``StateRun``, ``ChangesRun``) share; this module orchestrates. How a run goes, per collection
(``CollectionTransform.update``):

1. the raw files that may hold new rows are cut into slices of about ``raw_slices.SLICE_ROWS``
   rows (``raw_slices.raw_slices``), read as Arrow tables (``raw_slices.read_slice``) one at a time
   by a few Spark tasks per core (``CollectionRun.task_count``);
2. plan (``slice_tasks.plan_slice``, ``folded_keys``, column-wise, without reading the documents):
   each piece's range of document keys; where they overlap, each state event's document key summed
   per slice and then per bucket of keys; documents with more than one new event, or an update
   without ``after``, are *folded apart* (step 4), the others have one; each slice's task gets its
   share of them (``StateRun.slice_inputs``): the driver holds no per-document data of the run;
3. each slice's task (``slice_tasks.transform_slice``) decodes each document once (one
   ``bson.decode_all``) for both tables and writes, under the tables' directories, its state rows
   (the documents with one event, sorted by ``__key``) and its change rows (a file per hour), each in
   the stored layout evolved by what its own rows need; it hands the driver only file names and
   those needs (``task_contract``: what each side hands the other);
4. the documents folded apart: their events grouped by document (Spark's shuffle), folded with the
   stored version or deletion marker (``fold_events``; each task reads those of its documents,
   ``stored_rows``), written like step 3;
5. the driver settles each table's layout from every task's needs (a task whose rows took other
   types for a new field writes them again in it), then commits: a new state table in one commit
   of the written files, an existing one by MERGE of the (staged) rows (``state_commit``); change
   files appended in one commit (new columns first, in a commit of their own; ``changes_commit``).

Small collections share a job (``transform_collections``): a collection whose new raw rows are one
slice is run whole by one task (``whole_collection.whole_collection``: steps 2 to 4 in one task, every
event of a document being in that slice), one Spark job for all of them; the driver then settles and
commits each one's tables as in step 5, side by side. A shared run that loses a commit race, or whose
rows must be written again in a settled layout, runs again with jobs of its own.

Collections fail alone (``transform_collections``): a collection whose transform raises is logged
(its namespace, the committed batches its tables are behind, ``backlog.collection_backlog``, and the
traceback) and the job carries on with the others; the ``JobSummary`` says which failed. Collections
run side by side (``COLLECTION_THREADS``): each one's Spark jobs and commits are its own, and the
SparkContext takes jobs from many threads.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.errors import LakeFileError, damage_in
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.maintenance import (
    MaintenanceSettings,
    maintain_table,
    maintained,
    maintains_source,
    remove_uncommitted_leftovers,
)
from mongo_cdc.lake.storage import row_count, table_if_exists
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.applied_mark import AppliedMark, withdraw_figures, write_mark
from mongo_cdc.transform.backlog import behind_text, collection_backlog
from mongo_cdc.transform.changes_commit import ChangesRun
from mongo_cdc.transform.collection_run import CollectionRun
from mongo_cdc.transform.data_files import delete_directory
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_slices import RawSlice
from mongo_cdc.transform.slice_tasks import transform_slice
from mongo_cdc.transform.state_commit import SharedRunMisfit, StateRun
from mongo_cdc.transform.table_commits import LostCommitRace, committed_version, log, version_of
from mongo_cdc.transform.task_contract import SliceOutput, WholeCollectionOutput
from mongo_cdc.transform.whole_collection import whole_collection
from mongo_cdc.transform.work import CollectionWork

if TYPE_CHECKING:
    from pyspark import SparkContext

# How many times in all a collection's run is made (``CollectionTransform.converged``) while it keeps
# losing commit races to other writers of its tables, before the job fails.
COMMIT_RACE_ATTEMPTS = 4
# How many collections are transformed at once (``transform_collections``). A small collection's
# reads and commits hold the GIL for much of their time: 4 threads took 7% less CPU and wall than 8
# for 300 small collections on 2 cores (farm-bench, 5 pairs), and still overlap delta-rs' waits.
COLLECTION_THREADS = 4
# How many Spark tasks per core the job shared by small collections has (``_shared_job``): each takes
# its share of the collections in turn, and the tasks take the cores in turn as they finish.
SHARED_TASKS_PER_CORE = 4


class CollectionTransform:
    """Brings one collection's state and changes tables up to the committed raw batches."""

    def __init__(self, collection_run: CollectionRun, work: CollectionWork | None = None) -> None:
        """``work``: the collection's ``work.source_work`` answer from the run's batches, which the
        first ``prepared`` takes with the tables it read rather than read them again (two table reads
        and their app transactions a collection: a cost of many small collections)."""
        self.collection_run = collection_run
        self._given_work = work

    def run(
        self,
        maintenance: MaintenanceSettings | None,
        shared: tuple[PreparedRun, WholeCollectionOutput] | None = None,
    ) -> dict[str, Any]:
        """The run (``shared``: its task of a shared job ran it), then the tables' maintenance."""
        summary = self.converged() if shared is None else self.converged_shared(*shared)
        if maintenance is not None and maintained(maintenance, self.collection_run.namespace):
            summary["maintenance"] = self.maintain(maintenance)
            for name in ("state", "changes"):  # its commits moved the tables on
                if name in summary["maintenance"]:
                    summary[f"{name}_version"] = summary["maintenance"][name]["version"]
        return summary

    def converged(self) -> dict[str, Any]:
        """``update``, made again from a fresh read of the batch log and the tables each time it lost a
        commit race to another writer of the collection's tables (a backfill run's transform beside a
        live run's, say), at most COMMIT_RACE_ATTEMPTS times in all.

        Every commit of a run carries the tables' app transactions (``CollectionRun.commit_properties``),
        so of two runs committing to one table from the same read, Delta's conflict check fails the
        later one; and a table read is refused when a run with a newer batch log already applied more
        (``CollectionRun.read``).
        The fresh read then shows what the winner applied, and the run applies the rest: no batch is
        applied twice, none is skipped."""
        transform = self
        for attempt in range(1, COMMIT_RACE_ATTEMPTS + 1):
            try:
                return transform.update()
            except (CommitFailedError, LostCommitRace) as race:
                lost = race
            finally:
                delete_directory(transform.collection_run.location, transform.collection_run.staging)
            if attempt < COMMIT_RACE_ATTEMPTS:
                log.warning(
                    "%s: lost a commit race to another writer of its tables (%s); running it again from a "
                    "fresh read of the batch log and the tables (attempt %d of %d)",
                    self.collection_run.namespace, lost, attempt + 1, COMMIT_RACE_ATTEMPTS,
                )  # fmt: skip
                transform = transform.again()
        raise LostCommitRace(
            f"{self.collection_run.namespace}: lost {COMMIT_RACE_ATTEMPTS} commit races in a row to other "
            f"writers of its tables (is more than one transform of this source running?); the last: {lost}"
        ) from lost

    def converged_shared(self, run: PreparedRun, output: WholeCollectionOutput) -> dict[str, Any]:
        """``finished_shared``; made again with jobs of its own (``converged``, from a fresh read) when
        it lost a commit race, or its rows must be written again in a settled layout."""
        try:
            return self.finished_shared(run, output)
        except (CommitFailedError, LostCommitRace) as race:
            log.warning(
                "%s: lost a commit race to another writer of its tables (%s); running it again with Spark "
                "jobs of its own from a fresh read of the batch log and the tables",
                self.collection_run.namespace, race,
            )  # fmt: skip
        except SharedRunMisfit as misfit:
            log.info("%s", misfit)
        finally:
            delete_directory(self.collection_run.location, self.collection_run.staging)
        return self.again().converged()

    def again(self) -> CollectionTransform:
        """This collection's transform from a fresh read of the batch log, raw files and tables."""
        return CollectionTransform(self.collection_run.again())

    def maintain(self, settings: MaintenanceSettings) -> dict[str, Any]:
        """Compact small files and vacuum versions past the retention, table by table."""
        now = dt.datetime.now(dt.timezone.utc)
        interval, retention = settings.optimize_interval_hours, settings.retention_hours
        done = {}
        for name, uri, cluster_by in (
            ("raw", self.collection_run.raw_uri, None),
            ("changes", self.collection_run.changes_uri, None),
            ("state", self.collection_run.state_uri, "__key"),
            ("deletions", self.collection_run.deletions_uri, "__key"),
        ):
            if table_if_exists(uri, self.collection_run.options) is not None:
                done[name] = maintain_table(
                    uri, self.collection_run.location, interval, retention, now, cluster_by
                )
        return done

    # -- both tables ---------------------------------------------------------------------

    def prepared(self) -> PreparedRun:
        """The run's tables read, its work (``CollectionWork``) and the slices of its new raw rows."""
        work, self._given_work = self._given_work, None  # source_work's, for the first try only
        if work is None:
            work = CollectionWork.of(
                self.collection_run.batches,
                self.collection_run.namespace,
                self.collection_run.read("state"),
                self.collection_run.read("changes"),
                self.collection_run.flattening,
                self.collection_run.rebuild_hours,
            )
        else:
            self.collection_run.refuse_ahead("state", work.state_applied)
            self.collection_run.refuse_ahead("changes", work.changes_applied)
        state_table, changes_table = work.state_table, work.changes_table
        if work.changes_rebuilt:
            log.warning(
                "%s: other flattening options than the changes table's: rebuilding it",
                self.collection_run.namespace,
            )
        state = (
            StateRun(self.collection_run, state_table, work.state_window, work.state_applied)
            if work.updates_state
            else None
        )
        changes = (
            ChangesRun(
                self.collection_run,
                None if work.changes_rebuilt else changes_table,
                work.changes_rebuilt,
                work.changes_window,
            )
            if work.updates_changes
            else None
        )
        windows = [run.window for run in (state, changes) if run is not None]
        return PreparedRun(
            state_table,
            changes_table,
            work,
            state,
            changes,
            self.collection_run.slices(windows) if windows else [],
        )

    def shares_a_job(self, run: PreparedRun) -> bool:
        """Whether the run fits one task of a Spark job shared with other small collections: its new
        raw rows are one slice, and no hours of change rows are rewritten (a job of their own)."""
        return len(run.slices) == 1 and not self.collection_run.rebuild_hours

    def shared_task(self, run: PreparedRun) -> Callable[[], WholeCollectionOutput]:
        """The run as one Spark task (``whole_collection.whole_collection``) of a shared job."""
        location, (raw_slice,) = self.collection_run.location, run.slices
        state_spec = run.state.spec() if run.state is not None else None
        changes_spec = run.changes.spec() if run.changes is not None else None
        state_files = run.state.state_files if run.state is not None else ()
        target = run.state.rewrite_target() if run.state is not None else None
        return lambda: whole_collection(location, raw_slice, state_spec, changes_spec, state_files, target)

    def update(self) -> dict[str, Any]:
        """The run with Spark jobs of its own."""
        run = self.prepared()
        state, changes, slices = run.state, run.changes, run.slices
        if state is not None:
            state.plan(slices)
        changes_spec = changes.spec() if changes is not None else None
        location = self.collection_run.location
        started = time.monotonic()
        if state is not None:
            outputs = state.transformed(slices, state.spec(), changes_spec)
        else:
            outputs = self.collection_run.run_tasks(
                slices,
                lambda raw_slice: transform_slice(location, raw_slice, None, changes_spec, frozenset()),
            )
        log.info(
            "%s: %d slices transformed in %.1fs",
            self.collection_run.namespace,
            len(slices),
            time.monotonic() - started,
        )
        return self.finished(run, outputs)

    def finished_shared(self, run: PreparedRun, output: WholeCollectionOutput) -> dict[str, Any]:
        """The run whose one slice a task of a shared job transformed (``output``), committed."""
        if output.error is not None:
            # first the exception the task raised (the summary's error line), then its traceback
            raised = output.error.strip().splitlines()[-1]
            raise SharedTaskFailed(
                f"{raised} (in its task of the job shared by small collections)\n{output.error}"
            )
        assert output.transformed is not None
        if run.state is not None:
            assert output.plan is not None
            run.state.take_whole_collection_output(
                output.plan, output.folded_documents, output.folded, output.rewritten
            )
        return self.finished(run, [output.transformed])

    def finished(self, run: PreparedRun, outputs: list[SliceOutput]) -> dict[str, Any]:
        """Each table's layout settled from the tasks' ``outputs`` and committed; hours rewritten."""
        state, changes, slices, changes_table = run.state, run.changes, run.slices, run.changes_table
        summary: dict[str, Any] = {}
        if state is not None:
            summary.update(state.finish(slices, [output.state for output in outputs]))
        else:
            summary.update(new_events=0, state_rows=row_count(run.state_table))
        if changes is not None:
            written, change_rows = changes.finish(slices, [output.changes for output in outputs])
        else:
            written, change_rows = 0, row_count(changes_table)
        if self.collection_run.rebuild_hours:
            # the table as committed: one this run created too, whose hours' history rows are only in
            # the rebuild
            if changes is not None:
                changes_table = self.collection_run.read("changes")
            if changes_table is not None:
                every = BatchWindow.of(
                    self.collection_run.batches, self.collection_run.namespace, include_history=True
                )
                written += ChangesRun(self.collection_run, changes_table, False, every).rebuild(
                    set(self.collection_run.rebuild_hours)
                )
                change_rows = row_count(
                    table_if_exists(self.collection_run.changes_uri, self.collection_run.options)
                )
        if self.collection_run.rebuild_hours or run.work.changes_rebuilt:  # committed by URI: read again
            changes_version = version_of(
                table_if_exists(self.collection_run.changes_uri, self.collection_run.options)
            )
        else:
            changes_version = (
                version_of(changes_table) if changes is None else committed_version(changes.table)
            )
        summary.update(
            change_rows=change_rows,
            change_rows_written=written,
            changes_rebuilt=run.work.changes_rebuilt,
            # the summary's asset events take them instead of opening every table again
            state_version=version_of(run.state_table) if state is None else committed_version(state.table),
            changes_version=changes_version,
        )
        return summary


@dataclass
class PreparedRun:
    """A collection's run before its Spark work: its tables as read, its work, a run of each table
    that has some, and the slices of the raw rows they read."""

    state_table: DeltaTable | None
    changes_table: DeltaTable | None
    work: CollectionWork
    state: StateRun | None
    changes: ChangesRun | None
    slices: list[RawSlice]


class SharedTaskFailed(RuntimeError):
    """A collection's task of a shared job failed: its traceback, from the executor."""


@dataclass
class JobSummary:
    """What a run of the job did: under ``collections`` per ``<db>.<collection>`` that landed,
    ``new_events``, ``state_rows``, ``change_rows``, ``change_rows_written``, ``changes_rebuilt``,
    ``state_version`` and ``changes_version`` (None: no such table) (and ``maintenance``); under
    ``failed`` per collection that failed, ``error`` (its first line) and
    ``batches_behind``."""

    collections: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def failure_line(self) -> str:
        """The stderr line naming each failed collection and its batches behind."""
        stuck = behind_text(
            {namespace: failure["batches_behind"] for namespace, failure in self.failed.items()}
        )
        return (
            f"cdc_transform: the transform failed for {stuck}; the other collections landed. Each one's "
            "error and traceback are in the log above (search for 'FAILED'): fix its cause and the next "
            "run catches it up\n"
        )

    def figures(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Each landed collection's tables' version and rows (``applied_mark.TableFigures``)."""
        return {
            namespace: {
                zone: (landed[f"{zone}_version"], landed[rows])
                for zone, rows in (("state", "state_rows"), ("changes", "change_rows"))
                if landed[f"{zone}_version"] is not None
            }
            for namespace, landed in self.collections.items()
        }

    def to_json(self) -> str:
        return json.dumps({"collections": self.collections, "failed": self.failed}, sort_keys=True)


def transform_collections(
    context: SparkContext,
    source_lake: SourceLake,
    batches: list[Batch],
    work: Mapping[str, CollectionWork],
    flattening: FlatteningOptions,
    rebuild_hours: tuple[str, ...],
    maintenance: MaintenanceSettings | None,
    run_id: str = "",
) -> JobSummary:
    """The collections of ``work`` (every one with work, ``work.source_work``'s answer) brought up to
    the committed ``batches``, COLLECTION_THREADS at a time; a collection that fails is logged and
    holds back no other. Then the source's applied mark says so: every other collection needed
    nothing (and ``run_id``, the run that started the job, finds its tables' figures there)."""
    namespaces = sorted(work)
    withdraw_figures(source_lake)
    transforms = {
        namespace: CollectionTransform(
            CollectionRun(context, source_lake, namespace, batches, flattening, rebuild_hours),
            work[namespace],
        )
        for namespace in namespaces
    }
    summary = JobSummary()
    failures: dict[str, Future] = {}
    # A small collection's run is mostly waiting (Spark's job round trips, delta-rs reading and
    # committing logs): the collections whose new rows are one slice each share one Spark job, a task
    # each (``whole_collection.whole_collection``); the others run their own jobs. Reads and commits run
    # side by side, each collection the only writer of its own tables, so a source of many small
    # collections costs about what their data does.
    with ThreadPoolExecutor(COLLECTION_THREADS, thread_name_prefix="collection") as pool:
        prepared = {namespace: pool.submit(transform.prepared) for namespace, transform in transforms.items()}
        shared: dict[str, PreparedRun] = {}
        for namespace, future in prepared.items():
            if future.exception() is None and transforms[namespace].shares_a_job(future.result()):
                shared[namespace] = future.result()
            elif future.exception() is not None and not isinstance(
                future.exception(), (CommitFailedError, LostCommitRace)
            ):
                failures[namespace] = future
        outputs = _shared_job(
            context, {namespace: transforms[namespace].shared_task(run) for namespace, run in shared.items()}
        )
        runs = {
            namespace: pool.submit(
                transform.run,
                maintenance,
                (shared[namespace], outputs[namespace]) if namespace in outputs else None,
            )
            for namespace, transform in transforms.items()
            if namespace not in failures
        }
        for namespace in namespaces:
            try:
                summary.collections[namespace] = (failures.get(namespace) or runs[namespace]).result()
            except Exception as failure:  # one collection's failure holds back no other collection
                # a damaged data file is named with its fix, whatever the reader's own message says
                error = _named_damage(source_lake, namespace) or failure
                behind = collection_backlog(source_lake, namespace, batches).batches
                log.exception("FAILED: %s; the other collections carry on", behind_text({namespace: behind}))
                summary.failed[namespace] = {"error": _error_line(error), "batches_behind": behind}
    write_mark(source_lake, AppliedMark.of(batches, flattening, summary.failed, run_id, summary.figures()))
    if maintenance is not None and maintains_source(maintenance):  # a source-wide listing: any table's
        removed = remove_uncommitted_leftovers(
            source_lake.location,
            source_lake.prefix,
            maintenance.retention_hours,
            dt.datetime.now(dt.timezone.utc),
        )
        log.info(
            "removed %d files no table's log names (commits that never happened): %s", len(removed), removed
        )
        # one version per run: the replaced marks' files go as a table's do
        maintain_table(
            source_lake.source_uri(lake.APPLIED_MARK),
            source_lake.location,
            maintenance.optimize_interval_hours,
            maintenance.retention_hours,
            dt.datetime.now(dt.timezone.utc),
        )
    return summary


def _shared_job(
    context: SparkContext, tasks: dict[str, Callable[[], WholeCollectionOutput]]
) -> dict[str, WholeCollectionOutput]:
    """Each collection's task (``CollectionTransform.shared_task``) in one Spark job, by namespace. A
    task returns its collection's failure rather than fail the job; should the job fail anyway (an
    executor lost, say), no collection has an output and each runs with jobs of its own."""
    if not tasks:
        return {}
    started = time.monotonic()
    try:
        # a few collections per Spark task: a task's own round trip costs more than a small collection
        partitions = min(len(tasks), context.defaultParallelism * SHARED_TASKS_PER_CORE)
        done = (
            context.parallelize(list(tasks.items()), partitions)
            .map(lambda item: (item[0], item[1]()))
            .collect()
        )
    except Exception:
        log.exception(
            "the job shared by %d small collections failed: each runs with jobs of its own", len(tasks)
        )
        return {}
    log.info(
        "%d small collections transformed in one Spark job in %.1fs", len(tasks), time.monotonic() - started
    )
    return dict(done)


def _named_damage(source_lake: SourceLake, namespace: str) -> LakeFileError | None:
    db, collection = Namespace.parse(namespace)
    uris = [
        lake.table_uri(source_lake.location, zone, source_lake.prefix, db, collection) for zone in lake.ZONES
    ]
    found = damage_in(uris, source_lake.options)
    if found is not None:
        log.error("%s: %s", namespace, found)
    return found


def _error_line(error: Exception) -> str:
    """The error's type and the first line of its message (Spark's run to whole Java stack traces)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:500]}" if lines else type(error).__name__
