"""Whether the transform has anything to do for a collection, and what: the one place that decides.

A collection's run has work when its ``state`` table has committed batches of rows to apply, or a
manifest (a copy that may have found no document) to apply; when its ``changes`` table has batches
to apply or was written with other flattening options (rebuilt); when a copy names a collection that
has no rows to give a missing table (an empty one: its tables exist, empty, from its copy on); when
the run rewrites hours of change rows (``--rebuild-hours``, a backfill); or when the run maintains
the tables (``--maintain``).
The transform's driver runs only the collections with work (``CollectionTransform.update`` decides
from the same ``CollectionWork``), and the CDC DAG's ``plan_transform`` asks the same question
before Spark starts: a run where no collection has work starts no Spark at all. A collection the
source's applied mark covers (``applied_mark``: no batch since the transform's last run names it) has
no work, and its tables are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltalake import DeltaTable

from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.landing import TABLE_READ_THREADS, SourceLake
from mongo_cdc.lake.maintenance import MaintenanceSettings, maintained
from mongo_cdc.transform.applied_mark import read_mark
from mongo_cdc.transform.flatten_options import FlatteningOptions, recorded_flattening
from mongo_cdc.transform.raw_events import applied_batches


@dataclass(frozen=True)
class CollectionWork:
    """What a run of the transform has to do for one collection, as its tables stand."""

    state_window: BatchWindow  # the batches of its rows the state table has not applied
    manifest_pending: bool  # a copy's manifest the state table has not applied (it may delete)
    changes_window: BatchWindow  # the batches the changes table is to apply (all of them if rebuilt)
    changes_rebuilt: bool  # the changes table was written with other flattening options
    # the tables ("state", "changes") a copy names the collection for that are missing with no rows to
    # apply (a collection empty since its copy): created empty, readers find tables of no rows
    tables_to_create: tuple[str, ...]
    rebuild_hours: tuple[str, ...]  # hours of change rows to rewrite (only with a changes table)
    maintain: bool  # the run compacts and vacuums the collection's tables
    # the tables as read for this answer, and the batches each has applied per replica set (the
    # changes table's even when rebuilt): the run's first try takes them rather than read them again
    state_table: DeltaTable | None = field(default=None, compare=False, repr=False)
    changes_table: DeltaTable | None = field(default=None, compare=False, repr=False)
    state_applied: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    changes_applied: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        batches: Sequence[Batch],
        namespace: str,
        state_table: DeltaTable | None,
        changes_table: DeltaTable | None,
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...] = (),
        maintain: bool = False,
    ) -> CollectionWork:
        """The work of ``namespace`` given the committed ``batches`` and its tables as read."""
        replica_sets = {batch.rs for batch in batches}
        state_applied = applied_batches(state_table, "state", replica_sets)
        # a copy that found no document (an empty collection renamed over this one) lands no rows
        # here, yet its manifest still deletes the stored documents it did not find
        manifest_pending = state_table is not None and any(
            batch.manifest is not None
            and namespace in batch.manifest.collections
            and batch.manifest.seq > state_applied.get(batch.manifest.rs, 0)
            for batch in batches
        )
        rebuilt = changes_table is not None and recorded_flattening(changes_table) != flattening.to_json()
        changes_applied = applied_batches(changes_table, "changes", replica_sets)
        state_window = BatchWindow.of(batches, namespace, state_applied)
        changes_window = BatchWindow.of(batches, namespace, {} if rebuilt else changes_applied)
        missing = tuple(
            name
            for name, table, window in (
                ("state", state_table, state_window),
                ("changes", changes_table, changes_window),
            )
            if table is None and window.is_empty
        )
        # asked only of a collection missing a table: it goes through every batch, for each collection
        copied = bool(missing) and any(
            batch.manifest is not None and namespace in batch.manifest.collections for batch in batches
        )
        return cls(
            state_window=state_window,
            manifest_pending=manifest_pending,
            changes_window=changes_window,
            changes_rebuilt=rebuilt,
            tables_to_create=missing if copied else (),
            rebuild_hours=rebuild_hours if changes_table is not None else (),
            maintain=maintain,
            state_table=state_table,
            changes_table=changes_table,
            state_applied=state_applied,
            changes_applied=changes_applied,
        )

    @property
    def updates_state(self) -> bool:
        return not self.state_window.is_empty or self.manifest_pending or "state" in self.tables_to_create

    @property
    def updates_changes(self) -> bool:
        return not self.changes_window.is_empty or "changes" in self.tables_to_create

    @property
    def applies_batches(self) -> bool:
        """Whether a table of the collection has committed batches to apply (it is behind them)."""
        return not self.state_window.is_empty or not self.changes_window.is_empty

    @property
    def reasons(self) -> list[str]:
        """Why the collection's run has work (none: it has no work)."""
        reasons = []
        if not self.state_window.is_empty:
            reasons.append("state batches to apply")
        if self.manifest_pending:
            reasons.append("a copy's manifest to apply")
        if self.changes_rebuilt:
            reasons.append("changes table written with other flattening options")
        elif not self.changes_window.is_empty:
            reasons.append("changes batches to apply")
        if self.tables_to_create:
            reasons.append(f"empty tables to create ({', '.join(self.tables_to_create)})")
        if self.rebuild_hours:
            reasons.append("hours of change rows to rewrite")
        if self.maintain:
            reasons.append("maintenance")
        return reasons


def source_work(
    source_lake: SourceLake,
    batches: Sequence[Batch],
    flattening: FlatteningOptions,
    rebuild_hours: tuple[str, ...] = (),
    maintenance: MaintenanceSettings | None = None,
) -> dict[str, CollectionWork]:
    """The work of every collection of the committed ``batches`` that has some, by namespace (an
    empty dict: the run has nothing to do). Reads the state and changes tables' logs of each collection
    the applied mark does not cover (every collection when rewriting hours), and of those the run
    maintains (``maintenance``: the ``--maintain`` settings, ``lake.maintenance.maintained``)."""
    candidates = _Candidates.of(source_lake, batches, flattening, rebuild_hours, maintenance)
    return candidates.with_work(source_lake, candidates.namespaces)


@dataclass(frozen=True)
class WorkPlan:
    """What the CDC DAG's ``plan_transform`` needs before Spark starts: whether the job has work, and
    for which collections the run may bring tables up to the committed batches."""

    first: str | None  # the first collection by name with work (None: no collection has any)
    reasons: tuple[str, ...]  # why it has work
    pending: tuple[str, ...]  # those with committed batches to apply, or that the mark does not cover
    # source_work's whole answer when no mark was trusted and every collection was read for this one
    every: Mapping[str, CollectionWork] | None = field(default=None, compare=False, repr=False)


def plan_work(
    source_lake: SourceLake,
    batches: Sequence[Batch],
    flattening: FlatteningOptions,
    rebuild_hours: tuple[str, ...] = (),
    maintenance: MaintenanceSettings | None = None,
) -> WorkPlan:
    """``source_work``'s question asked only as far as its yes or no: with a trusted applied mark,
    the collections it does not cover are the pending ones and their tables are read a few at a time
    up to the first with work (the job reads them all again: a source of thousands would pay every
    read twice). Without one, every candidate is read and the pending ones are those behind."""
    candidates = _Candidates.of(source_lake, batches, flattening, rebuild_hours, maintenance)
    if candidates.unsettled is None:
        found = candidates.with_work(source_lake, candidates.namespaces)
        first = min(found, default=None)
        pending = tuple(sorted(ns for ns, work in found.items() if work.applies_batches))
        return WorkPlan(first, tuple(found[first].reasons) if first else (), pending, found)
    pending = tuple(sorted(candidates.unsettled))
    for start in range(0, len(candidates.namespaces), TABLE_READ_THREADS):
        chunk = candidates.namespaces[start : start + TABLE_READ_THREADS]
        found = candidates.with_work(source_lake, chunk)
        if found:
            first = min(found)
            return WorkPlan(first, tuple(found[first].reasons), pending)
    return WorkPlan(None, (), pending)


@dataclass(frozen=True)
class _Candidates:
    """The collections of the committed ``batches`` whose tables are read to learn their work:
    ``namespaces``, in name order; ``maintains``: those the run maintains; ``unsettled``: those a
    trusted applied mark does not cover (None: no mark is trusted, and every collection is read)."""

    namespaces: list[str]
    maintains: frozenset[str]
    unsettled: frozenset[str] | None
    batches: Sequence[Batch]
    flattening: FlatteningOptions
    rebuild_hours: tuple[str, ...]

    @classmethod
    def of(
        cls,
        source_lake: SourceLake,
        batches: Sequence[Batch],
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...],
        maintenance: MaintenanceSettings | None,
    ) -> _Candidates:
        namespaces = sorted(
            {ns for batch in batches for ns in (*batch.namespaces, *(batch.collections or ()))}
        )
        maintains = frozenset(
            ns for ns in namespaces if maintenance is not None and maintained(maintenance, ns)
        )
        mark = None if rebuild_hours else read_mark(source_lake)
        if mark is None or not mark.written_with(flattening):
            return cls(namespaces, maintains, None, batches, flattening, rebuild_hours)
        unsettled = frozenset(mark.unsettled(batches).intersection(namespaces))
        read = [ns for ns in namespaces if ns in unsettled or ns in maintains]
        return cls(read, maintains, unsettled, batches, flattening, rebuild_hours)

    def with_work(self, source_lake: SourceLake, namespaces: list[str]) -> dict[str, CollectionWork]:
        """The work of each of ``namespaces`` that has some, their tables read TABLE_READ_THREADS at a
        time."""
        tables = source_lake.tables(namespaces, ("state", "changes"))
        found = {
            namespace: CollectionWork.of(
                self.batches,
                namespace,
                tables[namespace, "state"],
                tables[namespace, "changes"],
                self.flattening,
                self.rebuild_hours,
                namespace in self.maintains,
            )
            for namespace in namespaces
        }
        return {namespace: work for namespace, work in found.items() if work.reasons}
