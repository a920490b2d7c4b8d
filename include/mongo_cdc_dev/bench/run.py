"""``make bench``: mongo-cdc's landing paths next to their baselines, measured in one run, one table.

Starts its own single-member replica set in a temporary directory and, section by section:

* snapshot of ``--small`` ~170-byte documents and of ``--nested`` ~4 KB nested documents: a bare
  ``RawBSONDocument`` cursor (before and after, the better one counts), ``run_snapshot`` into a
  temporary lake (its rows checked byte for byte against the documents), and dlt's MongoDB
  pipeline with arrow items into Parquet (``peers``);
* pull of a ``--events`` backlog (inserts, updates with ``updateLookup``, deletes): the same
  change stream iterated bare as ``RawBSONDocument``s, and ``pull_changes`` landing it; then both
  again with mongod pinned to one core and the reader to another (``taskset``), as a deployment has
  mongod on a machine of its own; and the client CPU time each spends per 100 k events;
* a backlog of ``--large`` ~64 KB inserts pulled, and the collection snapshotted: their MB/s and
  peak RSS;
* the ``--small`` collection snapshotted in one piece, then in ``CHUNKS`` chunks by one thread and
  by two: chunking's overhead on one worker;
* the Spark transform (``bench.transform``): first build, incremental runs, a new field, changes
  spread over the key range, nested documents, and each first build less an empty PySpark job;
* ``verify_replica_set`` over the ``--small`` collection against a matching state and one with
  ``DRIFTED`` documents spread over its key range, next to a bare cursor read (``bench.verification``
  writes the states);
* the state table at scale (``bench.state_scale``): spread and recent changes on a ``--state`` and a
  ``--scaled-state`` state, their time, CPU, state files rewritten and driver peak; the ``--state``
  one's spread changes again on a Spark standalone cluster by one executor and by two
  (``bench.cluster_executors``);
* a lost oplog's healing recovery of a ``--small``-document collection whose lake missed 1% of its
  documents' changes, against its full re-snapshot, each with its transform: time and bytes to the
  lake (``bench.oplog_recovery``);
* an ``--copy-events`` backlog of one collection pulled alone, and beside a copy of a second
  ``--copy-state``-document collection in another process, as a DAG run does: the backlog's lag
  (``bench.copy_beside``);
* the transform driver's peak RSS for first builds of ``--driver-events`` and 4 times as many events
  (``bench.driver_memory``): it must not grow with the run;
* many small collections against one of as many documents (``bench.many``): first run, a change in
  every collection, an idle run;
* peak RSS of the snapshot, pull and transform processes.

Each path runs in a process of its own (``worker``). Other processes may share the machine, so
only rates from one run are compared; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bson
from pymongo import MongoClient

from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc_dev.bench import data, peers
from mongo_cdc_dev.bench.context import DB, RS, Bench, Measured, alternated, best
from mongo_cdc_dev.bench.copy_beside import copy_beside
from mongo_cdc_dev.bench.driver_memory import driver_memory
from mongo_cdc_dev.bench.many import many_collections
from mongo_cdc_dev.bench.oplog_recovery import oplog_recovery
from mongo_cdc_dev.bench.state_scale import state_scale
from mongo_cdc_dev.bench.table import Row, render
from mongo_cdc_dev.bench.transform import HOT_DOCS, transform
from mongo_cdc_dev.bench.verification import write_state
from mongo_cdc_dev.bench.worker import RAW, bench_config
from mongo_cdc_dev.testing import ReplicaSet, exit_on_sigterm
from mongo_cdc_dev.testing.lake import memory_keeper

CHECKED_ROWS = 2_000  # landed rows compared byte for byte with the documents they came from
# budgets (issue 11)
SNAPSHOT_SMALL_MIN = 1.0  # issue 19: the snapshot lands at its bare cursor's rate
SNAPSHOT_NESTED_MIN = 1.0  # issue 19
SNAPSHOT_VS_DLT_MIN = 3.0
PULL_MIN = 0.8
PULL_PINNED_MIN = 0.9  # issue 19
PULL_CPU_MAX = 2.5  # the pull's client CPU per event against the bare iteration's (issue 19)
# cores of the pinned runs: mongod's and the measured process's
MONGOD_CORE, READER_CORE = 0, 1
CHUNKED_MIN = 0.9  # chunking overhead < 10%
PEAK_RSS_MAX_MIB = 500.0
# issue 20: a clean verification within twice a bare cursor read, one with DRIFTED documents spread
# over the key range within 1.2 times the clean one
VERIFY_CLEAN_MIN = 0.5
VERIFY_DRIFTED_MAX = 1.2
VERIFY_RANGES = 10
DRIFTED = 1_000
LARGE_INSERT_BATCH = 200  # documents of ~64 KB per insert: 13 MB, under a message's 48 MB
CHUNKS = 10  # the chunks section splits the small collection into this many chunks
SIZES = {
    "small": 1_000_000,
    "nested": 100_000,
    "events": 300_000,
    "large": 8_000,
    "state": 1_000_000,
    "scaled_state": 4_000_000,
    "copy_state": 1_000_000,
    "copy_events": 20_000,
    "small_state": 100_000,
    "changes": 1_000,
    "spread_changes": 100_000,
    "nested_state": 100_000,
    "driver_events": 1_000_000,
    "collections": 300,
    "collection_docs": 10,
    "collection_repeats": 3,
}
SMOKE_SIZES = {
    "small": 3_000,
    "nested": 300,
    "events": 2_000,
    "large": 20,
    "state": 2_000,
    "scaled_state": 8_000,
    "copy_state": 3_000,
    "copy_events": 300,
    "small_state": 500,
    "changes": 100,
    "spread_changes": 200,
    "nested_state": 100,
    "driver_events": 2_000,
    "collections": 3,
    "collection_docs": 2,
    "collection_repeats": 1,
}


def check_snapshot_lake(bench: Bench, lake: str, collection: str, expected: int) -> None:
    """The snapshot landed every document once, its BSON byte for byte (on a sample)."""
    landed = SourceLake(LakeLocation(lake), bench_config({"db": DB, "collection": collection}).topic_prefix)
    rows = landed.committed_raw(f"{DB}.{collection}", columns=["after"])
    if rows.num_rows != expected:
        raise AssertionError(f"the snapshot of {collection} landed {rows.num_rows} rows, not {expected}")
    raw = bench.client[DB].get_collection(collection, codec_options=RAW)
    for after in rows.column("after").slice(0, CHECKED_ROWS).to_pylist():
        document = raw.find_one({"_id": bson.decode(after)["_id"]})
        if document is None or after != document.raw:
            raise AssertionError(f"a snapshot row of {collection} differs from its document")


def snapshot_section(
    bench: Bench, collection: str, count: int, make: Callable[[int, int], list[dict]], by_bytes: bool
) -> list[Row]:
    """Bare cursor, ``run_snapshot`` and dlt over one collection; rates in docs/s or MB/s."""
    stats = bench.loaded(collection, count, make)
    megabytes = stats["size"] / 1e6
    unit, amount = ("MB/s", megabytes) if by_bytes else ("docs/s", None)
    section = f"snapshot {count:,} x {stats['avgObjSize']:,.0f} B"
    # each twice, alternating, the faster run counting on both sides: the bare cursor's rate alone
    # moves by half between runs here, and its first run after mongod's start is its slowest
    lakes = [bench.lake(collection), bench.lake(f"{collection}-again")]
    runs = alternated(
        lambda _: bench.worker("bare_cursor", collection),
        lambda index: bench.worker("snapshot", collection, lake=lakes[index]),
    )
    if set(runs.counts) != {count}:
        raise AssertionError(f"{collection}: read {runs.counts} (bare, bare, ours, ours), loaded {count}")
    for lake in lakes:
        check_snapshot_lake(bench, lake, collection, count)
    bare, ours = runs.best()
    bare_rate, our_rate = bare.rate(amount), ours.rate(amount)
    cores = os.cpu_count() or 1
    shortest = ours.shortest_seconds(cores)
    rows = [
        Row(section, "bare RawBSONDocument cursor", bare_rate, unit),
        Row(
            section,
            "mongo-cdc run_snapshot -> Delta",
            our_rate,
            unit,
            our_rate / bare_rate,
            "bare",
            SNAPSHOT_NESTED_MIN if by_bytes else SNAPSHOT_SMALL_MIN,
        ),
        # what the machine allows: run_snapshot does more than the bare cursor (it writes files) on
        # the cores mongod shares; its CPU time spread over every core bounds its wall time from
        # below, a bound no run reaches (docs/development.md says why)
        Row(section, "CPU time: bare cursor + mongod", _ms(bare.total_cpu_seconds), "CPU-ms"),
        Row(section, "CPU time: run_snapshot + mongod", _ms(ours.total_cpu_seconds), "CPU-ms"),
        Row(section, f"run_snapshot's CPU time on {cores} cores: its ceiling", _ms(shortest), "ms",
            bare.seconds / shortest if shortest else None, "bare"),
    ]  # fmt: skip
    if bench.args.no_dlt:
        rows.append(Row(section, "dlt", None, unit, note="skipped (--no-dlt)"))
    else:
        peer = peers.run_dlt(
            bench.args.peer_venv, bench.rs.uri, DB, collection, os.path.join(bench.tmp, "dlt", collection)
        )
        name = f"dlt {peers.DLT_VERSION} arrow -> Parquet"
        if peer.error or peer.count != count:
            reason = peer.error or f"loaded {peer.count} of {count} documents"
            rows.append(Row(section, name, None, unit, note=reason))
        else:
            dlt_rate = Measured(peer.count, peer.seconds).rate(amount)
            rows.append(Row(section, name, dlt_rate, unit, dlt_rate / bare_rate, "bare"))
            if not by_bytes:
                rows.append(
                    Row(
                        section, "mongo-cdc vs dlt", None, "", our_rate / dlt_rate, "dlt", SNAPSHOT_VS_DLT_MIN
                    )
                )
    bench.peak_rows.append(_peak_row(f"run_snapshot, {collection} documents", runs.peak()))
    return rows


def _ms(seconds: float) -> float:
    return seconds * 1000


def snapshot_small(bench: Bench) -> list[Row]:
    return snapshot_section(bench, "small", bench.args.small, data.small_documents, by_bytes=False)


def snapshot_nested(bench: Bench) -> list[Row]:
    return snapshot_section(bench, "nested", bench.args.nested, data.nested_documents, by_bytes=True)


def pull(bench: Bench) -> list[Row]:
    """A bare change stream and ``pull_changes`` over the same backlog, from the same position: each
    twice, alternating, the faster run counting (runs over one backlog vary by about a fifth); then
    the same with mongod on one core and the reader on another; and each one's client CPU per event."""
    collection = "events"
    lake = bench.lake(collection)
    config = bench_config({"db": DB, "collection": collection, "lake": lake})
    keeper = memory_keeper(config, RS)
    offset = start_without_snapshot(bench.client, RS, keeper)
    written = data.change_backlog(bench.client[DB][collection], bench.args.events)
    print(f"wrote a backlog of {written:,} change events", flush=True)
    token = offset.resume_token
    offsets = keeper.store.values  # type: ignore[attr-defined]
    # every pull starts from the same lake and offset: a copy of both as they are now
    lakes = [lake]
    for again in range(1, 4):
        lakes.append(bench.lake(f"{collection}-{again}"))
        shutil.copytree(lake, lakes[-1])

    def both(lakes: list[str], core: int | None) -> tuple[Measured, Measured, Measured]:
        """(the faster bare run, the faster pull, the pull with the higher peak RSS)."""
        runs = alternated(
            lambda _: bench.worker("bare_stream", collection, core, lake=lake, resume_token=token),
            lambda index: bench.worker("pull", collection, core, lake=lakes[index], offsets=offsets),
        )
        if len(set(runs.counts)) != 1 or runs.counts[0] < written:
            raise AssertionError(f"events read: {runs.counts} (bare, bare, pull, pull); written {written}")
        return *runs.best(), runs.peak()

    bare, ours, peak = both(lakes[:2], None)
    bench.peak_rows.append(_peak_row("pull_changes", peak))
    with _pinned(bench.rs, MONGOD_CORE):
        pinned_bare, pinned_ours, _ = both(lakes[2:], READER_CORE)
    section = f"pull {written:,}-event backlog"
    pinned = f"mongod on core {MONGOD_CORE}, reader on core {READER_CORE}"
    cpu_bare = min(run.cpu_per_100k() for run in (bare, pinned_bare))
    cpu_ours = min(run.cpu_per_100k() for run in (ours, pinned_ours))
    return [
        Row(section, "bare change stream, RawBSONDocument", bare.rate(), "events/s"),
        Row(section, "mongo-cdc pull_changes -> Delta", ours.rate(), "events/s", ours.rate() / bare.rate(),
            "bare", PULL_MIN),
        Row(section, f"bare change stream, {pinned}", pinned_bare.rate(), "events/s"),
        Row(section, f"mongo-cdc pull_changes, {pinned}", pinned_ours.rate(), "events/s",
            pinned_ours.rate() / pinned_bare.rate(), "bare pinned", PULL_PINNED_MIN),
        Row(section, "bare change stream, client CPU", cpu_bare, "CPU s/100k events"),
        Row(section, "mongo-cdc pull_changes, client CPU", cpu_ours, "CPU s/100k events", cpu_ours / cpu_bare,
            "bare", max_ratio=PULL_CPU_MAX),
    ]  # fmt: skip


@contextlib.contextmanager
def _pinned(rs: ReplicaSet, core: int) -> Iterator[None]:
    """Every thread of the replica set's mongod processes on ``core`` (``taskset``), then on every
    core again."""
    pids = [str(pid) for pid in rs.pids if pid is not None]
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), pid], check=True, capture_output=True)
    try:
        yield
    finally:
        every_core = f"0-{(os.cpu_count() or 1) - 1}"
        for pid in pids:
            subprocess.run(["taskset", "-a", "-p", "-c", every_core, pid], check=True, capture_output=True)


def large_documents(bench: Bench) -> list[Row]:
    """A backlog of ~64 KB inserts pulled, then the same collection snapshotted: the peak RSS budget
    holds whatever the documents' size, and ``max.batch.size`` of them would be 64 MB a batch."""
    collection, count = "large", bench.args.large
    lake = bench.lake(collection)
    keeper = memory_keeper(bench_config({"db": DB, "collection": collection, "lake": lake}), RS)
    start_without_snapshot(bench.client, RS, keeper)
    seconds = data.load(bench.client[DB][collection], count, data.large_documents, LARGE_INSERT_BATCH)
    print(f"wrote {count:,} documents of ~64 KB in {seconds:.0f} s", flush=True)
    megabytes = bench.client[DB].command("collStats", collection)["size"] / 1e6
    pulled = bench.worker("pull", collection, lake=lake, offsets=keeper.store.values)  # type: ignore[attr-defined]
    copied = bench.worker("snapshot", collection, lake=bench.lake(f"{collection}-snapshot"))
    if not pulled.count == copied.count == count:
        raise AssertionError(f"{collection}: pulled {pulled.count}, snapshotted {copied.count} of {count}")
    bench.peak_rows.append(_peak_row(f"pull_changes, {count:,} inserts of ~64 KB", pulled))
    bench.peak_rows.append(_peak_row(f"run_snapshot, {count:,} documents of ~64 KB", copied))
    section = f"{count:,} x ~64 KB documents"
    return [
        Row(section, "mongo-cdc pull_changes -> Delta", pulled.rate(megabytes), "MB/s"),
        Row(section, "mongo-cdc run_snapshot -> Delta", copied.rate(megabytes), "MB/s"),
    ]


def chunks(bench: Bench) -> list[Row]:
    """The small collection snapshotted in one piece and in ``CHUNKS`` chunks, on one worker."""
    collection, count = "small", bench.args.small
    bench.loaded(collection, count, data.small_documents)
    chunk_size = -(-count // CHUNKS)

    def snapshot(name: str, size: int, threads: int) -> Measured:
        lake = bench.lake(f"chunks-{name}")
        measured = bench.worker("snapshot", collection, lake=lake, chunk_size=size, threads=threads)
        if measured.count != count:
            raise AssertionError(f"{collection} in {name}: copied {measured.count} of {count} documents")
        return measured

    one_piece = snapshot("one-piece", count, 1)
    one_thread = snapshot("one-thread", chunk_size, 1)
    two_threads = snapshot("two-threads", chunk_size, 2)
    one_piece = best(one_piece, snapshot("one-piece-again", count, 1))
    section = f"snapshot {count:,} docs in chunks"
    return [
        Row(section, "one piece (one chunk)", one_piece.rate(), "docs/s"),
        Row(
            section,
            f"{CHUNKS} chunks, one thread",
            one_thread.rate(),
            "docs/s",
            one_thread.rate() / one_piece.rate(),
            "one piece",
            CHUNKED_MIN,
        ),
        Row(
            section,
            f"{CHUNKS} chunks, two threads",
            two_threads.rate(),
            "docs/s",
            two_threads.rate() / one_piece.rate(),
            "one piece",
        ),
    ]


def verification(bench: Bench) -> list[Row]:
    """A bare cursor read of the small collection, then ``verify_replica_set`` against a state that
    matches it and one where ``DRIFTED`` documents spread over its key range differ."""
    collection, count = "small", bench.args.small
    stats = bench.loaded(collection, count, data.small_documents)
    every = count // min(DRIFTED, max(count // 30, 1))
    drifted = len(range(0, count, every))
    runs = {}
    for name, changed in (("no drift", None), (f"{drifted:,} drifted, spread", every)):
        lake = bench.lake("verify-clean" if changed is None else "verify-drifted")
        offsets = write_state(bench.client, DB, RS, collection, lake, changed)
        runs[name] = dict(lake=lake, offsets=offsets, expected_drift=0 if changed is None else drifted)
    first = bench.worker("bare_cursor", collection)
    chunk_size = -(-count // VERIFY_RANGES)
    clean, drift = (bench.worker("verify", collection, chunk_size=chunk_size, **run) for run in runs.values())
    bare = best(first, bench.worker("bare_cursor", collection))
    # the clean one twice, like the bare read: one run took 1.3 times the drifted one when other
    # processes woke (a verification against a matching state changes nothing but its report)
    cleans = (clean, bench.worker("verify", collection, chunk_size=chunk_size, **runs["no drift"]))
    clean = best(*cleans)
    if not clean.count == drift.count == bare.count == count:
        raise AssertionError(f"verify read {clean.count} and {drift.count} of {count} documents")
    bench.peak_rows.append(
        _peak_row("verify_replica_set, no drift", max(cleans, key=lambda run: run.peak_mib))
    )
    bench.peak_rows.append(_peak_row(f"verify_replica_set, {drifted:,} drifted", drift))
    section = f"verify {count:,} x {stats['avgObjSize']:,.0f} B, {VERIFY_RANGES} ranges"
    return [
        Row(section, "bare RawBSONDocument cursor", bare.rate(), "docs/s"),
        Row(section, "mongo-cdc verify, no drift", clean.rate(), "docs/s", clean.rate() / bare.rate(), "bare",
            VERIFY_CLEAN_MIN),
        Row(section, f"mongo-cdc verify, {drifted:,} drifted, spread", drift.seconds, "s",
            drift.seconds / clean.seconds, "no drift", max_ratio=VERIFY_DRIFTED_MAX),
    ]  # fmt: skip


def _peak_row(path: str, measured: Measured) -> Row:
    path = f"{path} ({measured.base_mib:.0f} MiB after imports)"
    return Row("peak RSS of the process", path, measured.peak_mib, "MiB", max_value=PEAK_RSS_MAX_MIB)


# The sections, in order; each returns its rows of the table.
SECTIONS: dict[str, Callable[[Bench], list[Row]]] = {
    "snapshot-small": snapshot_small,
    "snapshot-nested": snapshot_nested,
    "pull": pull,
    "large-docs": large_documents,
    "chunks": chunks,
    "transform": transform,
    "driver-memory": driver_memory,
    "state-scale": state_scale,
    "verify": verification,
    "oplog-recovery": oplog_recovery,
    "copy-beside": copy_beside,
    "many-collections": many_collections,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mongo_cdc_dev.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, a check that the bench runs: {SMOKE_SIZES}"
    )
    for name, default in SIZES.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=int, help=f"size of the {name} data (default {default:,})")
    parser.add_argument("--only", help=f"comma-separated sections to run, of {', '.join(SECTIONS)}")
    parser.add_argument("--no-dlt", action="store_true", help="leave dlt out")
    parser.add_argument(
        "--no-cluster",
        action="store_true",
        help="leave out the state-scale section's runs on a Spark standalone cluster",
    )
    parser.add_argument(
        "--peer-venv",
        type=Path,
        default=peers.DEFAULT_VENV,
        help=f"dlt's venv (default {peers.DEFAULT_VENV})",
    )
    args = parser.parse_args(argv)
    for name, default in (SMOKE_SIZES if args.smoke else SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.changes > min(HOT_DOCS, args.small_state):
        parser.error(f"--changes must be at most --small-state and {HOT_DOCS:,}")
    if args.spread_changes > args.state:
        parser.error("--spread-changes must be at most --state")
    if args.scaled_state <= args.state:
        parser.error("--scaled-state must be larger than --state: the state-scale section compares the two")
    args.sections = args.only.split(",") if args.only else list(SECTIONS)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="mongo-cdc-bench-") as tmp,
        ReplicaSet(RS, os.path.join(tmp, "mongod")) as rs,
    ):
        client: MongoClient = rs.client()
        try:
            version = client.server_info()["version"]
            print(f"mongod {version} on {os.cpu_count()} cores", flush=True)
            bench = Bench(args, rs, client, tmp, [])
            rows: list[Row] = []
            for name in args.sections:
                started = time.monotonic()
                rows += SECTIONS[name](bench)
                print(f"{name}: done in {time.monotonic() - started:.0f} s", flush=True)
            rows += bench.peak_rows
        finally:
            client.close()
    print()
    print(
        f"mongo-cdc bench (mongod {version}, {os.cpu_count()} cores, load average {load_before:.1f} "
        f"at the start, {os.getloadavg()[0]:.1f} at the end)"
    )
    print(render(rows))
    return 0
