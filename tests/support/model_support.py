"""Model-based tests of the data path: random writes to MongoDB, mirrored in a model of each
collection (a dict of documents by ``_id``), with pipeline runs and table upkeep between them.

A sequence is a list of steps (the dataclasses below, each printed as the code that builds it).
``Sequence.check`` plays it against a real mongod, the pull and snapshot functions and the Spark
job's ``main`` on a caller's SparkContext, and after every ``Run`` asserts:

* the run succeeded (``main`` returned 0; a failure raises);
* MongoDB holds the model's documents, and each state table holds exactly the live documents, each
  row's ``__doc_bson`` byte for byte the BSON MongoDB returns (as a subclass's source rewrites it:
  ``_expected_state``);
* each changes table holds exactly the events of a change stream the test opened itself on the
  database before the first write (the independent oracle): op, ``_id``, cluster time and event
  order of every row but the snapshot reads, in order; the snapshot reads of each (re-)snapshot are
  the documents the model held then. Deletes are rows (``delete.tombstone.handling.mode`` rewrite,
  the default); drops and renames have none.

A sequence made with ``merge_by_ranges`` updates even its small state tables by the large tables'
MERGE on Spark's tasks (``StateRun.merged_by_tasks``), never written again whole, and checks each
such MERGE against the reference: from the same stored rows (the table as the run read it) and
source rows (the run's staged files), delta-rs' MERGE (``state_merge.merge_into``) gives the rows the
tasks' files give.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bson
import pyarrow as pa
from bson import Int64
from bson.raw_bson import RawBSONDocument
from merge_cases import merges_by_ranges_checked
from pymongo import MongoClient
from pymongo.client_session import ClientSession

from mongo_cdc import extjson
from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import commit_snapshot, copy_chunks, run_snapshot, start_snapshot
from mongo_cdc.capture.snapshot_filters import filter_text
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.lake import RENAMED_COPY_ORDER, deletions_uri, pack_cluster_time, table_uri
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.storage import LakeLocation, row_count, table_if_exists
from mongo_cdc.transform.applied_mark import read_mark
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

PREFIX = "model"
RS = "rs0"
COLLECTIONS = ("c0", "c1", "c2")
IMAGES_ON = {"changeStreamPreAndPostImages": {"enabled": True}}
# every capture.mode with each capture.mode.full.update.type it allows
MODES = (
    ("change_streams", "lookup"),
    ("change_streams_update_full", "lookup"),
    ("change_streams_update_full", "post_image"),
    ("change_streams_with_pre_image", "lookup"),
    ("change_streams_update_full_with_pre_image", "lookup"),
    ("change_streams_update_full_with_pre_image", "post_image"),
)
RAW_BSON = bson.CodecOptions(document_class=RawBSONDocument)
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


# -- steps ------------------------------------------------------------------------------------
# A write names a collection and a document _id; one that cannot apply (an insert of a present
# _id, an update of an absent one) is skipped, so every list of steps is a valid sequence.


@dataclass
class Insert:
    coll: str
    key: int
    fields: dict[str, Any]


@dataclass
class Replace:
    coll: str
    key: int
    fields: dict[str, Any]


@dataclass
class Set:
    coll: str
    key: int
    name: str
    value: Any


@dataclass
class Inc:
    """``$inc`` of ``n``, the one field that only ever holds numbers."""

    coll: str
    key: int
    amount: int | float


@dataclass
class Unset:
    coll: str
    key: int
    name: str


@dataclass
class Push:
    """``$push`` onto ``tags``, the one field that only ever holds an array."""

    coll: str
    key: int
    value: Any


@dataclass
class RenameField:
    coll: str
    key: int
    old: str
    new: str


@dataclass
class Delete:
    coll: str
    key: int


@dataclass
class Transaction:
    """Several writes committed together (one cluster time, one event each)."""

    writes: list[Any]


@dataclass
class DropCollection:
    coll: str


@dataclass
class RenameCollection:
    coll: str
    to: str


@dataclass
class Run:
    """A pipeline run: the snapshot (the first run) or a pull, then the Spark job; then the checks."""


@dataclass
class Maintain:
    """Compaction and vacuum (no retention) of every table of the lake, as upkeep would."""


@dataclass
class Resnapshot:
    """A re-snapshot of one collection (its stream position kept)."""

    coll: str


@dataclass
class FilteredResnapshot:
    """A re-snapshot of the documents of one collection a filter matches (its stream position
    kept): those holding ``n`` (a field filter: nothing deleted), or with ``low``, those whose _id
    is in [low, high) (an _id range, which also deletes the state's documents of that range the
    copy did not read)."""

    coll: str
    low: int | None = None
    high: int | None = None

    def query(self) -> dict:
        if self.low is None:
            return {"n": {"$exists": True}}
        return {"_id": {"$gte": self.low, "$lt": self.high}}

    def matches(self, key: int, document: dict) -> bool:
        if self.low is None:
            return "n" in document
        return self.low <= key < (self.high if self.high is not None else key + 1)


@dataclass
class CopyBeside:
    """A re-snapshot of one collection (None: of every collection, a whole one) copied at once, its
    batch committed by the second Run after: the first Run's pull and transform go on beside the
    copy, as a shard's pull does beside a long copy. One at a time: a step that would start another
    snapshot, or drop or rename a collection, commits it first."""

    coll: str | None


WRITES = (Insert, Replace, Set, Inc, Unset, Push, RenameField, Delete)


# -- the model --------------------------------------------------------------------------------


def _applied(doc: dict | None, write: Any) -> dict | None:
    """The document after ``write`` as MongoDB applies it (field order included), or ``doc`` when
    the write does not apply (then MongoDB writes nothing and the stream has no event)."""
    if isinstance(write, Insert):
        return {"_id": write.key, **write.fields} if doc is None else doc
    if doc is None:
        return None
    if isinstance(write, Delete):
        return None
    if isinstance(write, Replace):
        return {"_id": write.key, **write.fields}
    new = dict(doc)
    if isinstance(write, Set):
        new[write.name] = write.value
    elif isinstance(write, Inc):
        current = new.get("n", 0)
        total = current + write.amount
        # int32 + int32 overflowing is a long, as a Python int past 32 bits encodes; a long stays one
        new["n"] = Int64(total) if isinstance(current, Int64) and isinstance(total, int) else total
    elif isinstance(write, Unset):
        new.pop(write.name, None)
    elif isinstance(write, Push):
        new["tags"] = [*new.get("tags", []), write.value]
    elif isinstance(write, RenameField):
        if write.old in new:
            new[write.new] = new.pop(write.old)  # a present new name keeps its place
    return new


def _mongo_write(collection: Any, write: Any, session: ClientSession | None) -> None:
    match = {"_id": write.key}
    if isinstance(write, Insert):
        collection.insert_one({"_id": write.key, **write.fields}, session=session)
    elif isinstance(write, Replace):
        collection.replace_one(match, {"_id": write.key, **write.fields}, session=session)
    elif isinstance(write, Delete):
        collection.delete_one(match, session=session)
    else:
        update = {
            Set: lambda w: {"$set": {w.name: w.value}},
            Inc: lambda w: {"$inc": {"n": w.amount}},
            Unset: lambda w: {"$unset": {w.name: ""}},
            Push: lambda w: {"$push": {"tags": w.value}},
            RenameField: lambda w: {"$rename": {w.old: w.new}},
        }[type(write)](write)
        collection.update_one(match, update, session=session)


@dataclass
class SnapshotRead:
    """What a (re-)snapshot copied: the collection's documents at its position."""

    coll: str
    cluster_time: int
    ids: list[int]


@dataclass
class StreamEvent:
    coll: str
    op: str  # c/u/d, or drop/rename
    key: int | None
    cluster_time: int
    event_order: str
    to: str | None = None  # a rename's new collection name


@dataclass
class Sequence:
    """One database, one lake, one model: ``check`` plays ``steps`` and asserts after each run."""

    client: MongoClient
    context: Any  # the SparkContext main runs on
    transform_main: Any  # spark_apps/cdc_transform.py's main
    lake_root: Path
    database: str
    mode: str
    full_update_type: str
    prefix: str = PREFIX
    model: dict[str, dict[int, dict]] = field(default_factory=dict)
    snapshot_reads: list[SnapshotRead] = field(default_factory=list)
    events: list[StreamEvent] = field(default_factory=list)
    snapshotted_at: int | None = None
    runs: int = 0
    maintenance_hours: int = 0
    versions_before_job: dict[tuple[str, str], int | None] = field(default_factory=dict)
    run_id: str = ""  # the last run's, which its job records in the applied mark
    merge_by_ranges: bool = False  # every state update by the MERGE on Spark's tasks, checked
    # what makes a raw row the same landing: a sequence that replays nothing it landed leaves out
    # batch_seq (a replay lands an event in a later batch)
    landed_once_by: tuple[str, ...] = ("key", "op", "cluster_time", "event_order", "batch_seq")
    # a CopyBeside's plan, the documents it read and the Runs left before its batch commits
    copy_beside: tuple[Any, list[SnapshotRead], int] | None = None

    def __post_init__(self) -> None:
        self.config = database_source(
            self.prefix,
            self.lake_root,
            re.escape(self.database),
            capture_mode=self.mode,
            capture_mode_full_update_type=self.full_update_type,
        )
        self.keeper = memory_keeper(self.config, RS)
        self.db = self.client[self.database]
        self.location = LakeLocation(str(self.lake_root))

    def check(self, steps: list[Any]) -> None:
        for name in COLLECTIONS[:2]:
            self._create(name)
        merges = merges_by_ranges_checked() if self.merge_by_ranges else nullcontext()
        with merges, self.db.watch(max_await_time_ms=20) as stream:
            self.stream = stream
            for step in [*steps, *([] if steps and isinstance(steps[-1], Run) else [Run()])]:
                self.apply(step)

    # -- steps ---------------------------------------------------------------------------

    def apply(self, step: Any) -> None:
        if isinstance(step, WRITES):
            self._create(step.coll)
            self._write(step, None)
        elif isinstance(step, Transaction):
            for write in step.writes:
                self._create(write.coll)  # outside the transaction: with pre- and post-images
            with self.client.start_session() as session, session.start_transaction():
                for write in step.writes:
                    self._write(write, session)
        elif isinstance(step, DropCollection):
            self._commit_copy_beside()
            if self.model.pop(step.coll, None) is not None:
                self.db.drop_collection(step.coll)
        elif isinstance(step, RenameCollection):
            self._commit_copy_beside()
            if step.coll in self.model and step.coll != step.to:
                self.db[step.coll].rename(step.to, dropTarget=True)
                self.model[step.to] = self.model.pop(step.coll)
        elif isinstance(step, (Resnapshot, FilteredResnapshot)):
            self._commit_copy_beside()
            if self.snapshotted_at is not None and step.coll in self.model:
                self._resnapshot(step.coll, step if isinstance(step, FilteredResnapshot) else None)
        elif isinstance(step, CopyBeside):
            self._commit_copy_beside()
            if self.snapshotted_at is not None and (step.coll is None or step.coll in self.model):
                self._copy_beside(step.coll)
        elif isinstance(step, Maintain):
            self._maintain()
        elif isinstance(step, Run):
            self._run()
        else:
            raise TypeError(f"not a step: {step!r}")

    def _create(self, name: str) -> None:
        if name not in self.model:
            self.db.create_collection(name, **IMAGES_ON)
            self.model[name] = {}

    def _write(self, write: Any, session: ClientSession | None) -> None:
        documents = self.model[write.coll]
        before = documents.get(write.key)
        after = _applied(before, write)
        if isinstance(write, Insert) and before is not None:
            return  # a duplicate _id: nothing to write
        _mongo_write(self.db[write.coll], write, session)
        if after is None:
            documents.pop(write.key, None)
        else:
            documents[write.key] = after

    def _resnapshot(self, name: str, filtered: FilteredResnapshot | None) -> None:
        self._snapshot(only=(f"{self.database}.{name}",), filtered=filtered)

    def _snapshot(self, only: tuple[str, ...] = (), filtered: FilteredResnapshot | None = None) -> None:
        filters = {only[0]: filter_text(filtered.query())} if filtered is not None else None
        result = run_snapshot(
            ReplicaSetCapture(self.client, self.config, self.keeper), only=only, filters=filters
        )
        for name in [n.partition(".")[2] for n in only] or sorted(self.model):
            ids = self._matching(name, filtered)
            self.snapshot_reads.append(SnapshotRead(name, result.cluster_time, ids))
        if self.snapshotted_at is None:
            self.snapshotted_at = result.cluster_time

    def _matching(self, name: str, filtered: FilteredResnapshot | None) -> list[int]:
        """The _ids of the model's documents of ``name`` a copy reads (``filtered``: through its filter)."""
        documents = self.model.get(name, {})
        return sorted(key for key, doc in documents.items() if filtered is None or filtered.matches(key, doc))

    def _copy_beside(self, name: str | None) -> None:
        capture = ReplicaSetCapture(self.client, self.config, self.keeper)
        plan = start_snapshot(capture, only=() if name is None else (f"{self.database}.{name}",))
        copy_chunks(self.client, self.config, capture.lake, plan)
        names = sorted(self.model) if name is None else [name]
        reads = [SnapshotRead(n, plan.cluster_time, sorted(self.model[n])) for n in names]
        self.copy_beside = (plan, reads, 2)

    def _commit_copy_beside(self, at_run: bool = False) -> None:
        """Commit the CopyBeside's batch: now, or at its second Run (``at_run``: a Run's pull is done)."""
        if self.copy_beside is None:
            return
        plan, reads, left = self.copy_beside
        if at_run and left > 1:
            self.copy_beside = (plan, reads, left - 1)
            return
        commit_snapshot(self.keeper, plan)
        self.snapshot_reads.extend(reads)
        self.copy_beside = None

    def _run(self) -> None:
        self.runs += 1
        self.versions_before_job = self._versions()
        self._pipeline_run()
        self._read_stream()
        self._check_mongodb_is_the_model()
        for name in COLLECTIONS:
            self._check_raw(name)
            self._check_state(name)
            self._check_changes(name)
        self._check_figures()

    def _pipeline_run(self) -> None:
        """The snapshot (the first time) or a pull, then the Spark job on the shared context."""
        if self.snapshotted_at is None:
            self._snapshot()
        else:
            pull_changes(ReplicaSetCapture(self.client, self.config, self.keeper))
            self._commit_copy_beside(at_run=True)
        self._transform()

    def _transform(self) -> None:
        """The Spark job's ``main`` on the shared context, over everything committed."""
        self.run_id = f"model-run-{self.runs}"
        code = self.transform_main(
            ["--lake-root", str(self.lake_root), "--topic-prefix", self.prefix, "--run-id", self.run_id],
            context=self.context,
        )
        assert code == 0, f"run {self.runs}: the transform exited {code}"

    def _maintain(self) -> None:
        # each upkeep an hour after the last, so every one compacts (optimize.interval.hours 1)
        self.maintenance_hours += 1
        now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=self.maintenance_hours)
        source_lake = SourceLake(self.location, self.prefix)
        for name in COLLECTIONS:
            for uri in (
                source_lake.raw_uri(f"{self.database}.{name}"),
                table_uri(self.location, "state", self.prefix, self.database, name),
                table_uri(self.location, "changes", self.prefix, self.database, name),
                deletions_uri(self.location, self.prefix, self.database, name),
            ):
                if table_if_exists(uri, None) is not None:
                    maintain_table(uri, self.location, 1, 0, now)

    # -- the oracle and the checks -------------------------------------------------------

    def _read_stream(self) -> None:
        """The oracle's events up to the last write."""
        last_write = self.client.admin.command("hello")["lastWrite"]["opTime"]["ts"]
        target = pack_cluster_time(last_write.time, last_write.inc)
        while True:
            change = self.stream.try_next()
            if change is not None:
                self._record(change)
            elif token_cluster_time(self.stream.resume_token) >= target:
                return

    def _record(self, change: dict) -> None:
        kind = change["operationType"]
        op = DATA_OPERATIONS.get(kind, kind)
        if op not in ("c", "u", "d", "drop", "rename"):
            return
        time = change["clusterTime"]
        self.events.append(
            StreamEvent(
                coll=change["ns"]["coll"],
                op=op,
                key=change["documentKey"]["_id"] if "documentKey" in change else None,
                cluster_time=pack_cluster_time(time.time, time.inc),
                event_order=change["_id"]["_data"],
                to=change["to"]["coll"] if op == "rename" else None,
            )
        )

    def _check_mongodb_is_the_model(self) -> None:
        for name, documents in self.model.items():
            expected = {key: bson.encode(doc) for key, doc in documents.items()}
            assert self._stored(name) == expected, (
                f"the model of {name} is not MongoDB's (a bug of the model)"
            )

    def _stored(self, name: str) -> dict[Any, bytes]:
        """MongoDB's documents of ``name`` by _id, the bytes it returns."""
        return {doc["_id"]: doc.raw for doc in self.db.get_collection(name, codec_options=RAW_BSON).find()}

    def _expected_state(self, name: str) -> dict[Any, bytes]:
        """The documents by _id ``name``'s state must hold: MongoDB's, unless the source rewrites them."""
        return self._stored(name)

    def _rows(self, zone: str, name: str, columns: list[str] | None = None) -> list[dict]:
        table = table_if_exists(table_uri(self.location, zone, self.prefix, self.database, name), None)
        if table is None:
            return []
        return pa.table(table.to_pyarrow_dataset().to_table(columns=columns)).to_pylist()

    def _check_figures(self) -> None:
        """The version and rows the job left in the applied mark for the summary's asset events are
        each table's own, whichever commits made it (created, merged, rewritten, appended)."""
        source_lake = SourceLake(self.location, self.prefix)
        mark = read_mark(source_lake)  # none yet, or another run's, when no collection had work
        figures = {} if mark is None else mark.figures(self.run_id)
        assert mark is None or mark.figures(f"{self.run_id}-other") == {}
        for namespace, zones in figures.items():
            for zone, figure in zones.items():
                table = table_if_exists(table_uri(self.location, zone, self.prefix, *namespace.split(".", 1)))
                assert table is not None and figure == (table.version(), row_count(table)), (
                    f"run {self.runs}: {namespace} {zone}: the mark says {figure}"
                )
        # every table the job committed to is there
        moved = {
            key for key, version in self._versions().items() if version != self.versions_before_job.get(key)
        }
        missing = sorted(key for key in moved if key[1] not in figures.get(f"{self.database}.{key[0]}", {}))
        assert not missing, f"run {self.runs}: the job committed to {missing}, which the mark leaves out"

    def _versions(self) -> dict[tuple[str, str], int | None]:
        """Each collection's state and changes table's version (None: none yet)."""
        versions = {}
        for name in COLLECTIONS:
            for zone in ("state", "changes"):
                table = table_if_exists(table_uri(self.location, zone, self.prefix, self.database, name))
                versions[name, zone] = None if table is None else table.version()
        return versions

    def _check_raw(self, name: str) -> None:
        """Every committed raw row landed once (``landed_once_by``: none twice in one batch), and no two
        batches share a number (a pull beside a copy takes none of the copy's)."""
        source_lake = SourceLake(self.location, self.prefix)
        columns = list(self.landed_once_by)
        rows = source_lake.committed_raw(f"{self.database}.{name}", columns).to_pylist()
        landed = [tuple(row[column] for column in columns) for row in rows]
        twice = sorted({row for row in landed if landed.count(row) > 1})
        assert not twice, f"run {self.runs}: {name}: raw rows landed twice: {twice[:3]}"
        seqs = [(batch.rs, batch.raw_seq) for batch in source_lake.batches() if batch.kind != "position"]
        assert len(seqs) == len(set(seqs)), f"run {self.runs}: two batches carry rows of one number: {seqs}"

    def _check_state(self, name: str) -> None:
        rows = self._rows("state", name, ["__id", "__doc_bson"])
        state = {row["__id"]: row["__doc_bson"] for row in rows}
        assert len(state) == len(rows), f"run {self.runs}: {name}: a document has two state rows"
        expected = {extjson.encode_str(key): raw for key, raw in self._expected_state(name).items()}
        assert sorted(state) == sorted(expected), f"run {self.runs}: {name}: the state's _ids differ"
        wrong = sorted(key for key in expected if state[key] != expected[key])
        assert not wrong, f"run {self.runs}: {name}: state documents differ from the expected: {wrong}"

    def _check_changes(self, name: str) -> None:
        # (a table whose events were all drops or renames has no _id column yet)
        rows = sorted(self._rows("changes", name), key=lambda r: (r["__cluster_time"], r["__event_order"]))
        # (a rename's copy into this collection, reads of what was there, sits after them: left out)
        reads: dict[int, list[int]] = defaultdict(list)
        for row in rows:
            if row["__op"] == "r" and row["__event_order"] != RENAMED_COPY_ORDER:
                reads[row["__cluster_time"]].append(row.get("_id"))
        expected_reads: dict[int, list[int]] = defaultdict(list)
        for read in self.snapshot_reads:
            # (a re-snapshot with no write since the last one shares its position)
            if read.coll == name and read.ids:
                expected_reads[read.cluster_time].extend(read.ids)
        actual = {t: sorted(ids) for t, ids in reads.items()}
        assert actual == {t: sorted(ids) for t, ids in expected_reads.items()}, (
            f"run {self.runs}: {name}: snapshot reads differ from the documents snapshotted"
        )
        found = [
            (row["__op"], row.get("_id"), row["__cluster_time"], row["__event_order"])
            for row in rows
            if row["__op"] != "r"
        ]
        streamed = [
            (e.op, e.key, e.cluster_time, e.event_order)
            for e in self.events
            if e.coll == name and e.op in ("c", "u", "d") and e.cluster_time >= (self.snapshotted_at or 0)
        ]
        assert found == streamed, f"run {self.runs}: {name}: change rows differ from the stream's events"
