"""Per-replica-set offsets: where streaming resumes, which raw batches are committed, what is in flight.

An offset is JSON held in one key (an Airflow Variable ``mongo_cdc.<source>.<replica set>``
in production; the store is pluggable so this module stays free of Airflow)::

    {
      "format": 2,
      "resume_after": {"_data": "8264..."},    # change stream resumes after this event (Extended JSON:
                                                # tokens may carry binary "_typeBits")
      "cluster_time": "7441212415188369409",    # (t << 32) | i of that position, as a decimal string
      "batch_seq": 42,                          # raw files with seq <= this are committed
      "snapshot": {"status": "complete", "seq": 1, "cluster_time": "...", "completed_at": "..."},
      "retired_at": "",                         # set once a removed shard's stream is drained
      "open_transaction": null,                 # a transaction the last batch ended inside of (its
                                                # counters, see transactions.OpenTransaction, with
                                                # data_collections as [[namespace, count], ...])
      "writer": {"dag_id": ..., "run_id": ..., "task_id": ..., "map_index": 0, "since": "..."},
      "updated_at": "2026-11-21T15:00:00+00:00"
    }

Format 2 survives Airflow's UI and REST API unchanged: no key holds a word Airflow masks in
Variables (``token``, ``secret``, ...: ``resume_after`` was ``resume_token``, and namespaces are
values, never keys), and no number is past 2**53, where JavaScript rounds (packed cluster times
are strings). Format 1 (the same with ``resume_token``, integer cluster times and
``data_collections`` as an object) is still read; every save writes format 2.

The lake owns what is committed (``landing``): every position an offset holds is a batch in the
lake's batch log, written before the offset. So the offset is checked against the log before a
snapshot or pull uses it (``reconcile_with_lake``): an offset behind the log (a crash between the
two writes, a lowered ``batch_seq``, a Variable restored from an old backup) is healed from the
log; one that disagrees with it (another replica set's token, an edited position) or is ahead of
it is refused with both positions and the fix, an offset built from the lake alone.

One writer per offset: a task claims the offset (``writer``) before it snapshots or pulls and
releases it when done. A second task finding the claim held by another task that is still
running is refused with a clear message; a claim left by a task that is no longer running (it
crashed) is taken over.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from bson import json_util

from mongo_cdc import extjson
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake

log = logging.getLogger(__name__)

FORMAT = 2
READABLE_FORMATS = (1, 2)


class OffsetStore(Protocol):
    """Key-value storage for offsets (Airflow Variables in production)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


class OffsetError(ValueError):
    """A stored offset cannot be used; the message names the key and how to reset it."""


class WriterConflict(RuntimeError):
    """Another task, still running, is writing this offset."""


def offset_key(source: str, rs: str) -> str:
    return f"mongo_cdc.{source}.{rs}"


@dataclass(frozen=True)
class Offset:
    resume_token: dict | None = None
    cluster_time: int | None = None
    batch_seq: int = 0
    snapshot: dict = field(default_factory=dict)
    retired_at: str = ""
    open_transaction: dict | None = None
    writer: dict | None = None
    updated_at: str = ""

    @property
    def snapshot_complete(self) -> bool:
        return self.snapshot.get("status") == "complete"

    @property
    def next_seq(self) -> int:
        """The number of the next batch this replica set commits: after the last committed one and
        after the number a running snapshot reserved for its chunks' rows, so a batch committed while
        that copy runs (a pull beside it) never carries the copy's number."""
        running = self.snapshot.get("seq", 0) if self.snapshot.get("status") == "running" else 0
        return max(self.batch_seq, running) + 1

    def to_json(self) -> str:
        """Format 2 (see the module doc)."""
        data = asdict(self)
        del data["resume_token"]
        data["resume_after"] = None
        if self.resume_token is not None:
            data["resume_after"] = json.loads(extjson.encode(self.resume_token))
        data["cluster_time"] = _time_text(self.cluster_time)
        if "cluster_time" in self.snapshot:
            data["snapshot"]["cluster_time"] = _time_text(self.snapshot["cluster_time"])
        if self.open_transaction is not None:
            data["open_transaction"] = {
                **self.open_transaction,
                "cluster_time": _time_text(self.open_transaction["cluster_time"]),
                "data_collections": sorted(map(list, self.open_transaction["data_collections"].items())),
            }
        data["format"] = FORMAT
        data["updated_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return json.dumps(data, sort_keys=True)


def _time_text(cluster_time: int | None) -> str | None:
    return None if cluster_time is None else str(cluster_time)


def _stored_time(value: Any, version: int) -> int:
    """A packed cluster time as ``version`` stores it: digits in a string (2) or an integer (1)."""
    if version == 1 and _is_integer(value):
        return value
    if version > 1 and isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ValueError(value)


def _reset_hint(key: str) -> str:
    return (
        f"Fix or delete the Variable '{key}' (e.g. `airflow variables delete {key}`); "
        "without an offset the next run takes a new snapshot of that replica set."
    )


def parse_offset(key: str, text: str) -> Offset:
    """Validate stored JSON strictly: a hand-edited offset must never be half-trusted."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetError(f"offset '{key}' is not valid JSON ({exc}). {_reset_hint(key)}") from None
    if not isinstance(data, dict):
        raise OffsetError(f"offset '{key}' must be a JSON object. {_reset_hint(key)}")
    version = data.get("format")
    if version not in READABLE_FORMATS:
        raise OffsetError(
            f"offset '{key}' is corrupted: 'format' must be {FORMAT} (or 1, written by earlier "
            f"versions). {_reset_hint(key)}"
        )
    problems: list[str] = []
    time_type = "an integer" if version == 1 else 'a string of digits ("7441212415188369409")'
    token_field = "resume_token" if version == 1 else "resume_after"
    token = data.get(token_field)
    if token is not None and not (isinstance(token, dict) and isinstance(token.get("_data"), str)):
        problems.append(f'\'{token_field}\' must be null or {{"_data": "<hex>"}}')
    elif token is not None:
        try:  # binary _typeBits are Extended JSON
            token = json_util.loads(json.dumps(token))
        except (TypeError, ValueError) as exc:
            problems.append(f"'{token_field}' is not a resume token in Extended JSON ({exc})")
    cluster_time = _read_time(data.get("cluster_time"), version, "cluster_time", time_type, problems)
    if (token is None) != (cluster_time is None):
        problems.append(f"'{token_field}' and 'cluster_time' must be set together")
    seq = data.get("batch_seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        problems.append("'batch_seq' must be a non-negative integer")
    snapshot = data.get("snapshot", {})
    if not isinstance(snapshot, dict):
        problems.append("'snapshot' must be an object")
    elif snapshot.get("cluster_time") is not None:
        position = _read_time(snapshot["cluster_time"], version, "snapshot.cluster_time", time_type, problems)
        snapshot = {**snapshot, "cluster_time": position}
    if data.get("pending"):
        problems.append(
            "'pending' lists files of the old lake layout (plain Parquet); this mongo-cdc keeps Delta tables"
        )
    if not isinstance(data.get("retired_at", ""), str):
        problems.append("'retired_at' must be a string")
    open_transaction = data.get("open_transaction")
    if open_transaction is not None:
        open_transaction = _read_open_transaction(open_transaction, version)
        if open_transaction is None:
            problems.append(
                f"'open_transaction' must be null or an object with id (string), cluster_time ({time_type}), "
                "ts_ms and total_order (integers) and data_collections ("
                + ("an object of integers)" if version == 1 else "a list of [namespace, count] pairs)")
            )
    writer = data.get("writer")
    if writer is not None and not (
        isinstance(writer, dict) and {"dag_id", "run_id", "task_id"} <= set(writer)
    ):
        problems.append("'writer' must be null or an object with dag_id, run_id and task_id")
    if problems:
        raise OffsetError(f"offset '{key}' is corrupted: {'; '.join(problems)}. {_reset_hint(key)}")
    return Offset(
        resume_token=token,
        cluster_time=cluster_time,
        batch_seq=seq,
        snapshot=snapshot,
        retired_at=data.get("retired_at", ""),
        open_transaction=open_transaction,
        writer=writer,
        updated_at=data.get("updated_at", ""),
    )


def _read_time(value: Any, version: int, name: str, time_type: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    try:
        return _stored_time(value, version)
    except ValueError:
        problems.append(f"'{name}' must be null or {time_type}")
        return None


def _read_open_transaction(value: Any, version: int) -> dict | None:
    """The in-memory form (``transactions.OpenTransaction.to_dict``), None if ``value`` is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        return None
    if not all(_is_integer(value.get(name)) for name in ("ts_ms", "total_order")):
        return None
    try:
        cluster_time = _stored_time(value.get("cluster_time"), version)
    except ValueError:
        return None
    counts = value.get("data_collections")
    if version > 1:
        pairs = counts if isinstance(counts, list) else None
        if pairs is None or not all(
            isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in pairs
        ):
            return None
        counts = dict(pairs)
    if not isinstance(counts, dict) or not all(_is_integer(count) for count in counts.values()):
        return None
    return {**value, "cluster_time": cluster_time, "data_collections": counts}


def _describe(cluster_time: int | None) -> str:
    if cluster_time is None:
        return "no position"
    moment = dt.datetime.fromtimestamp(cluster_time >> 32, tz=dt.timezone.utc).isoformat(timespec="seconds")
    return f"cluster time {cluster_time >> 32}.{cluster_time & 0xFFFFFFFF}, {moment}"


def _offset_at(offset: Offset, last: Batch) -> Offset:
    return replace(
        offset,
        resume_token=last.resume_token,
        cluster_time=last.cluster_time,
        batch_seq=last.seq,
        open_transaction=last.open_transaction,
        writer=None,
    )


def _healed_snapshot(offset: Offset, last: Batch) -> dict:
    """A snapshot the offset still calls running is complete once the lake committed its batch."""
    running = offset.snapshot.get("status") == "running"
    if running and offset.snapshot.get("seq") == last.raw_seq and last.kind == "snapshot":
        return {**offset.snapshot, "status": "complete"}
    return offset.snapshot


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same_task(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("dag_id", "run_id", "task_id", "map_index"))


class OffsetKeeper:
    """Reads and commits one replica set's offset, and checks it against the lake before it is used."""

    def __init__(self, store: OffsetStore, source: str, rs: str, lake: SourceLake) -> None:
        self.store = store
        self.key = offset_key(source, rs)
        self.rs = rs
        self.lake = lake

    def claim(self, writer: dict, still_running: Callable[[dict], bool]) -> None:
        """Become the offset's only writer, unless another task that is still running holds it."""
        offset = self.load()
        holder = offset.writer if offset else None
        if holder and not _same_task(holder, writer) and still_running(holder):
            raise WriterConflict(
                f"offset '{self.key}' is being written by task {holder['task_id']} "
                f"(map index {holder.get('map_index')}) of run {holder['run_id']} "
                f"since {holder.get('since')}; "
                "a second writer is refused so no batch is committed twice. Let that run finish; "
                "if it is gone, mark that task failed and run again."
            )
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        if offset is not None:
            self.save(replace(offset, writer={**writer, "since": since}))
        # with no offset yet the snapshot creates it; the claim is made once it exists

    def release(self, writer: dict) -> None:
        offset = self.load()
        if offset is not None and offset.writer and _same_task(offset.writer, writer):
            self.save(replace(offset, writer=None))

    def load(self) -> Offset | None:
        """The stored offset; one that cannot be read is refused with, when the lake has batches of the
        replica set, the command that rebuilds it from the lake (``lake_offset``)."""
        text = self.store.get(self.key)
        if text is None:
            return None
        try:
            return parse_offset(self.key, text)
        except OffsetError as exc:
            last = self.lake.last_batch(self.rs)
            if last is None:
                raise
            raise OffsetError(
                f"{exc} Or rebuild it from the lake's position, which keeps streaming where the lake "
                f"stops: `{self.fix_command(self.lake_offset(last), last)}`"
            ) from None

    def lake_offset(self, last: Batch) -> Offset:
        """An offset from the lake alone, at its ``last`` batch of the replica set, with the last snapshot
        (or start without one) the lake committed as complete: so the next run streams on. A snapshot
        the lost offset had running is not in it: trigger that re-snapshot again."""
        started = [
            batch
            for batch in self.lake.batches()
            if batch.rs == self.rs and batch.kind in ("snapshot", "start")
        ]
        snapshot: dict = {}
        if started and started[-1].kind == "start":
            snapshot = {"status": "complete", "skipped": True}
        elif started:
            snapshot = {
                "status": "complete",
                "seq": started[-1].raw_seq,  # the snapshot's own number: its plan's
                "cluster_time": started[-1].snapshot_cluster_time,
            }
        return replace(_offset_at(Offset(), last), snapshot=snapshot)

    def load_checked(self) -> Offset | None:
        """The offset, healed from or checked against the lake (``reconcile_with_lake``)."""
        return self.reconcile_with_lake(self.load(), self.lake.last_batch(self.rs))

    def next_offset(self) -> Offset:
        """A new offset (none stored): at the lake's last batch of the replica set, if any, so batches
        are numbered after every one it holds and the offset passes ``reconcile_with_lake`` (a
        snapshot's later tasks check it). It has no snapshot: the next run takes one."""
        last = self.lake.last_batch(self.rs)
        return Offset() if last is None else _offset_at(Offset(), last)

    def commit_batch(self, offset: Offset, batch: Batch, **changes: Any) -> Offset:
        """Commit ``batch`` in the lake, then move the offset to it (the lake first: see ``landing``)."""
        self.lake.commit(batch)
        return self.commit(
            offset,
            resume_token=batch.resume_token,
            cluster_time=batch.cluster_time,
            batch_seq=batch.seq,
            open_transaction=batch.open_transaction,
            **changes,
        )

    def save(self, offset: Offset) -> None:
        self.store.set(self.key, offset.to_json())

    def commit(self, offset: Offset, **changes: Any) -> Offset:
        committed = replace(offset, **changes)
        self.save(committed)
        return committed

    def reconcile_with_lake(self, offset: Offset | None, last: Batch | None) -> Offset | None:
        """``offset`` checked against the lake's last committed batch of its replica set.

        Healed from the lake when it is behind it; refused (``OffsetError``) when it disagrees with
        it or is ahead of it. No offset is a reset: the next batch is numbered after the lake's.
        """
        if offset is None:
            return None
        if last is None:
            if offset.batch_seq == 0 and offset.resume_token is None:
                return offset
            raise OffsetError(
                f"offset '{self.key}' is at batch {offset.batch_seq} ({_describe(offset.cluster_time)}) but "
                "the lake has no batch of this replica set: the lake was moved, emptied or is another one. "
                f"{_reset_hint(self.key)}"
            )
        if offset.batch_seq < last.seq:
            healed = replace(
                offset,
                resume_token=last.resume_token,
                cluster_time=last.cluster_time,
                batch_seq=last.seq,
                open_transaction=last.open_transaction,
                snapshot=_healed_snapshot(offset, last),
            )
            log.warning(
                "offset '%s' was at batch %d (%s) but the lake committed batch %d (%s): healed from the lake",
                self.key, offset.batch_seq, _describe(offset.cluster_time), last.seq,
                _describe(last.cluster_time),
            )  # fmt: skip
            self.save(healed)
            return healed
        if offset.batch_seq > last.seq:
            raise OffsetError(
                f"offset '{self.key}' is at batch {offset.batch_seq} ({_describe(offset.cluster_time)}) but "
                f"the lake's last committed batch of this replica set is {last.seq} "
                f"({_describe(last.cluster_time)}): the Variable was edited or the lake lost batches. Set it "
                f"back to the lake's position (`{self.fix_command(offset, last)}`), or delete it to take a "
                "new snapshot."
            )
        if offset.cluster_time != last.cluster_time or offset.resume_token != last.resume_token:
            raise OffsetError(
                f"offset '{self.key}' names batch {offset.batch_seq} at {_describe(offset.cluster_time)}, "
                f"but the lake committed that batch at {_describe(last.cluster_time)}: the resume token "
                "was edited or "
                f"belongs to another replica set. Set it back to the lake's position "
                f"(`{self.fix_command(offset, last)}`), or delete it to take a new snapshot."
            )
        return offset

    def fix_command(self, offset: Offset, last: Batch) -> str:
        """The shell command that sets the offset back to the lake's ``last`` batch. Every position in it
        is the lake's (the batch log's, the snapshot log's), never the stored offset's, which may be
        the edited or UI-rounded one."""
        fixed = replace(_offset_at(offset, last), snapshot=self._lake_snapshot(offset.snapshot))
        return f"airflow variables set {shlex.quote(self.key)} {shlex.quote(fixed.to_json())}"

    def _lake_snapshot(self, snapshot: dict) -> dict:
        """``snapshot`` with the position of its plan in the lake's snapshot log (none without a plan)."""
        if "cluster_time" not in snapshot:
            return snapshot
        kept = {name: value for name, value in snapshot.items() if name != "cluster_time"}
        seq = snapshot.get("seq")
        plan = self.lake.snapshot_plan(self.rs, seq) if _is_integer(seq) else None
        return kept if plan is None else {**kept, "cluster_time": plan.cluster_time}


class MemoryOffsetStore:
    """A dict-backed store for core-level tests and the benchmark."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
