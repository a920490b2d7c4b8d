"""One collection's run of the transform as its commits see it (``CollectionRun``): where the
collection's tables are, which batches the run applies and how each commit records them, and how the
run's raw slices go to Spark.

``StateRun`` (``state_commit``) and ``ChangesRun`` (``changes_commit``) update the tables within it;
the driver (``driver.CollectionTransform``) makes one for each try of a collection's run (a try that
lost a commit race is made again from a fresh read, with a new one) and orchestrates the steps.
Driver only: imports deltalake, and is given the SparkContext.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from deltalake import CommitProperties, DeltaTable, Transaction

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.landing import COMMIT_RETRIES, SourceLake
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import applied_app_id, applied_batches
from mongo_cdc.transform.raw_slices import RawFile, RawSlice, raw_files, raw_slices
from mongo_cdc.transform.table_commits import LostCommitRace

if TYPE_CHECKING:
    from pyspark import SparkContext

# How many Spark tasks per core run a collection's slices or MERGE ranges (``CollectionRun.task_count``):
# more than one, so that a core whose tasks finish early takes another.
TASKS_PER_CORE = 2

Item = TypeVar("Item")
Result = TypeVar("Result")


class CollectionRun:
    """One try of a collection's run: its tables' places, the committed batches it applies, its
    Spark context."""

    def __init__(
        self,
        context: SparkContext,
        source_lake: SourceLake,
        namespace: str,
        batches: list[Batch],
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...],
    ) -> None:
        self.context = context
        self.source_lake = source_lake
        self.location = source_lake.location
        self.options = source_lake.options
        self.namespace = namespace
        db, collection = Namespace.parse(namespace)
        self.batches = batches
        self.committed: dict[str, int] = {}
        for batch in batches:
            self.committed[batch.rs] = max(batch.seq, self.committed.get(batch.rs, 0))
        manifests = [batch.manifest_of(namespace) for batch in batches]
        self.manifests = [m for m in manifests if m is not None]
        self.flattening = flattening
        self.rebuild_hours = rebuild_hours
        self.raw_path = lake.table_path("raw", source_lake.prefix, db, collection)
        self.state_path = lake.table_path("state", source_lake.prefix, db, collection)
        self.changes_path = lake.table_path("changes", source_lake.prefix, db, collection)
        self.raw_uri = lake.table_uri(self.location, "raw", source_lake.prefix, db, collection)
        self.state_uri = lake.table_uri(self.location, "state", source_lake.prefix, db, collection)
        self.deletions_uri = lake.deletions_uri(self.location, source_lake.prefix, db, collection)
        self.deletions_path = lake.deletions_path(source_lake.prefix, db, collection)
        self.changes_uri = lake.table_uri(self.location, "changes", source_lake.prefix, db, collection)
        # under the state table: MERGE sources and rebuilt change rows are written here first, before
        # their commit (never read as the tables' data)
        self.staging = f"{self.state_path}/{lake.STAGING_DIR}/{uuid.uuid4()}"
        self._files: list[RawFile] | None = None

    def again(self) -> CollectionRun:
        """The next try: this collection's run from a fresh read of the batch log (and then of its
        raw files and tables)."""
        return CollectionRun(
            self.context,
            self.source_lake,
            self.namespace,
            self.source_lake.batches(),
            self.flattening,
            self.rebuild_hours,
        )

    @property
    def files(self) -> list[RawFile]:
        """The raw table's files, read only when the collection has batches to apply or hours to
        rebuild: an idle collection's run reads no raw table. Kept by hand, not by a
        ``cached_property``, whose lock (one for every instance, in Python 3.11) made the collection
        threads read their raw tables one at a time."""
        if self._files is None:
            raw = table_if_exists(self.raw_uri, self.options)
            self._files = raw_files(raw, self.raw_path) if raw is not None else []
        return self._files

    def applied(self, table: DeltaTable | None, name: str) -> dict[str, int]:
        return applied_batches(table, name, self.committed)

    def read(self, name: str) -> DeltaTable | None:
        """The ``state`` or ``changes`` table as it is now. LostCommitRace if it has applied batches past
        this run's batch log: a run that read a newer log committed first, and a commit of this run's
        view would record older batches as applied (applied again, their change rows would double)."""
        table = table_if_exists(self.state_uri if name == "state" else self.changes_uri, self.options)
        self.refuse_ahead(name, self.applied(table, name))
        return table

    def refuse_ahead(self, name: str, applied: dict[str, int]) -> None:
        """LostCommitRace if the table ``name`` has ``applied`` batches past this run's batch log."""
        ahead = {rs: seq for rs, seq in applied.items() if seq > self.committed[rs]}
        if ahead:
            raise LostCommitRace(
                f"its {name} table has applied batches {ahead}, past this run's batch log {self.committed}"
            )

    def commit_properties(self, name: str, versions: dict[str, int] | None = None) -> CommitProperties:
        """The commit's app transactions: this table has applied every committed batch (``versions``:
        the batches it had applied when read, for a commit that applies none). ``name``'s app ids are
        in every commit of a run to that table, so Delta fails the later of two made from one read."""
        return CommitProperties(
            app_transactions=[
                Transaction(applied_app_id(name, rs), seq)
                for rs, seq in (self.committed if versions is None else versions).items()
            ],
            max_commit_retries=COMMIT_RETRIES,
        )

    def slices(self, windows: list[BatchWindow], files: list[RawFile] | None = None) -> list[RawSlice]:
        chosen = [
            file
            for file in (self.files if files is None else files)
            if any(window.may_hold(file.min_seq, file.max_seq) for window in windows)
        ]
        return raw_slices(self.location, chosen, self.context.defaultParallelism)

    def task_count(self, items: Sequence[Any]) -> int:
        """How many Spark tasks run ``items`` (slices, a MERGE's key ranges), each taking its share in
        turn: a task's round trip costs a tenth of a second or more, as much as planning a slice."""
        return max(1, min(len(items), self.context.defaultParallelism * TASKS_PER_CORE))

    def run_tasks(self, items: Sequence[Item], task: Callable[[Item], Result]) -> list[Result]:
        """``task`` of each of ``items`` (``task_count`` Spark tasks); the results in their order."""
        if not items:
            return []
        return self.context.parallelize(items, self.task_count(items)).map(task).collect()
