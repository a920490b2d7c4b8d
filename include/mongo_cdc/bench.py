"""``make bench``: how fast a snapshot lands documents, next to baselines measured in the same run.

Starts its own single-member replica set in a temporary directory, loads ``--docs`` small
documents, then times, one after the other on the same data:

1. a bare ``RawBSONDocument`` cursor (no decoding: the ceiling any reader shares with mongod);
2. dict decoding + ``bson.json_util.dumps`` per document (on a sample; it is slow);
3. dict decoding + ``mongo_cdc.extjson.encode`` per document (a plain cursor);
4. the real thing: ``snapshot.run_snapshot`` into a temporary lake (raw Parquet files, offsets).

Other processes may share the machine, so only rates from one run are compared with each other.
Peak memory is the growth of this process's RSS during the snapshot (``VmHWM`` after resetting it
through ``/proc/self/clear_refs``, else the highest sampled ``VmRSS``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import bson
from bson import CodecOptions, Int64, ObjectId, json_util
from bson.raw_bson import RawBSONDocument
from pymongo.collection import Collection

from mongo_cdc import extjson
from mongo_cdc.config import SourceConfig
from mongo_cdc.landing import SourceLake
from mongo_cdc.snapshot import ROW_GROUP_BYTES, ROW_GROUP_ROWS, run_snapshot
from mongo_cdc.storage import LakeLocation, table_if_exists
from mongo_cdc.testing import ReplicaSet
from mongo_cdc.testing.lake import memory_keeper

DB, COLLECTION, RS = "bench", "docs", "benchrs"
INSERT_BATCH = 10_000
CHECKED_ROWS = 2_000  # snapshot rows compared with extjson.encode of the documents they came from


# ---------------------------------------------------------------------------------------- data


def _documents(start: int, count: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    base = dt.datetime(2024, 1, 1)
    cities = ("Berlin", "Lisbon", "Osaka", "Quito", "Accra", "Perth")
    return [
        {
            "_id": ObjectId(),
            "name": f"customer-{i}",
            "n": i,
            "big": Int64(i * 1_000_003),
            "price": round(rnd.random() * 1000, 2),
            "when": base + dt.timedelta(seconds=i),
            "tags": ["new", "vip", f"t{i % 17}"][: 1 + i % 3],
            "addr": {"city": cities[i % len(cities)], "zip": f"{i % 100_000:05d}"},
        }
        for i in range(start, start + count)
    ]


def _insert(collection: Collection, start: int, count: int) -> None:
    collection.insert_many(_documents(start, count, seed=start), ordered=False)


def load(collection: Collection, count: int) -> float:
    """Insert ``count`` documents; returns seconds. Two inserts in flight keep mongod busy while
    the next batch is built."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [
            pool.submit(_insert, collection, start, min(INSERT_BATCH, count - start))
            for start in range(0, count, INSERT_BATCH)
        ]:
            future.result()
    return time.monotonic() - started


# ---------------------------------------------------------------------------------------- memory


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakRss:
    """RSS growth of this process while the block runs: VmHWM (reset first), and sampled VmRSS."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            rss = _status_kib("VmRSS")
            if rss is not None:
                self.samples.append(rss)

    def __enter__(self) -> PeakRss:
        self.hwm_reset = _reset_hwm()
        self.before = _status_kib("VmRSS") or 0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.after = _status_kib("VmRSS") or 0
        sampled = max(self.samples, default=self.after)
        hwm = _status_kib("VmHWM") if self.hwm_reset else None
        self.peak = max(sampled, hwm or 0)

    def growth_mib(self) -> float:
        return (self.peak - self.before) / 1024

    def halves_mib(self) -> tuple[float, float]:
        """Highest sampled growth in the first and in the second half of the block."""
        half = len(self.samples) // 2
        first = max(self.samples[:half], default=self.before)
        second = max(self.samples[half:], default=self.before)
        return (first - self.before) / 1024, (second - self.before) / 1024


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------- timing


def _rate(count: int, seconds: float) -> float:
    return count / max(seconds, 1e-9)


def _timed(run: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    count = run()
    return count, time.perf_counter() - started


def bare_cursor(collection: Collection) -> int:
    raw = collection.with_options(codec_options=CodecOptions(document_class=RawBSONDocument))
    count = 0
    for _ in raw.find({}):
        count += 1
    return count


def json_util_dumps(collection: Collection, limit: int) -> int:
    dicts = collection.with_options(codec_options=extjson.DECODE_OPTIONS)
    count = 0
    for document in dicts.find({}, limit=limit):
        json_util.dumps(document)
        count += 1
    return count


def extjson_encode(collection: Collection) -> int:
    dicts = collection.with_options(codec_options=extjson.DECODE_OPTIONS)
    encode, key = extjson.encode, extjson.document_key
    count = 0
    for document in dicts.find({}):
        key(document["_id"])
        encode(document)
        count += 1
    return count


def check_lake(lake_root: str, prefix: str, collection: Collection, expected: int) -> tuple[int, int]:
    """Rows and data files of the snapshot's raw table; spot-checks rows against the documents' BSON."""
    namespace = f"{collection.database.name}.{collection.name}"
    source_lake = SourceLake(LakeLocation(lake_root), prefix)
    table = table_if_exists(source_lake.raw_uri(namespace), {})
    files = len(table.file_uris()) if table is not None else 0
    landed = source_lake.committed_raw(namespace, columns=["key", "after"])
    if landed.num_rows != expected:
        raise AssertionError(f"the snapshot landed {landed.num_rows} rows, not {expected}")
    sample = landed.slice(0, CHECKED_ROWS)
    raw = collection.with_options(codec_options=CodecOptions(document_class=RawBSONDocument))
    for key, after in zip(sample.column("key").to_pylist(), sample.column("after").to_pylist(), strict=True):
        document = raw.find_one({"_id": bson.decode(after)["_id"]})
        if after != document.raw or key != extjson.document_key(bson.decode(after)["_id"]):
            raise AssertionError(f"snapshot row differs from its document: {key}")
    return landed.num_rows, files


# ---------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mongo_cdc.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000, help="documents to load (default 1,000,000)")
    parser.add_argument(
        "--sample", type=int, default=200_000, help="documents timed with json_util (default 200,000)"
    )
    args = parser.parse_args(argv)
    if args.docs < 1 or args.sample < 1:
        parser.error("--docs and --sample must be positive")
    sample = min(args.sample, args.docs)

    with (
        tempfile.TemporaryDirectory(prefix="mongo-cdc-bench-") as tmp,
        ReplicaSet(RS, os.path.join(tmp, "mongod")) as rs,
    ):
        client = rs.client(datetime_conversion=extjson.DECODE_OPTIONS.datetime_conversion)
        try:
            collection = client[DB][COLLECTION]
            version = client.server_info()["version"]
            print(f"mongod {version} on {os.cpu_count()} cores; loading {args.docs:,} documents", flush=True)
            seconds = load(collection, args.docs)
            stats = client[DB].command("collStats", COLLECTION)
            avg = stats.get("avgObjSize", 0)
            print(
                f"loaded in {seconds:.1f}s ({_rate(args.docs, seconds):,.0f} docs/s),"
                f" {avg:.0f} B of BSON per document",
                flush=True,
            )

            bare_count, bare_s = _timed(lambda: bare_cursor(collection))
            ju_count, ju_s = _timed(lambda: json_util_dumps(collection, sample))
            ej_count, ej_s = _timed(lambda: extjson_encode(collection))

            lake = os.path.join(tmp, "lake")
            config = SourceConfig(
                name="bench",
                path="<mongo_cdc.bench>",
                topic_prefix="bench",
                lake_root=lake,
                database_include=(re.compile(re.escape(DB)),),
            )
            keeper = memory_keeper(config, RS)
            with PeakRss() as memory:
                started = time.perf_counter()
                result = run_snapshot(client, config, RS, keeper)
                snap_s = time.perf_counter() - started
            snap_count = result.total
            # a second bare pass: the baseline is the better of the two (the machine may be shared)
            bare2_count, bare2_s = _timed(lambda: bare_cursor(collection))
            rows, files = check_lake(lake, config.topic_prefix, collection, args.docs)
        finally:
            client.close()

    if not bare_count == bare2_count == ej_count == snap_count == args.docs:
        counts = (bare_count, bare2_count, ej_count, snap_count)
        raise AssertionError(f"documents read {counts} differ from the {args.docs} loaded")
    bare = max(_rate(bare_count, bare_s), _rate(bare2_count, bare2_s))
    json_util_rate = _rate(ju_count, ju_s)
    snapshot = _rate(snap_count, snap_s)
    lines = [
        ("bare RawBSONDocument cursor (best of 2)", bare),
        (f"dict decode + json_util.dumps ({ju_count:,} docs)", json_util_rate),
        ("dict decode + extjson.encode", _rate(ej_count, ej_s)),
        ("snapshot: run_snapshot -> raw Delta table", snapshot),
    ]
    width = max(len(name) for name, _ in lines)
    print()
    print(f"{'path':<{width}}  {'docs/s':>9}  {'vs bare':>7}")
    for name, rate in lines:
        print(f"{name:<{width}}  {rate:>9,.0f}  {rate / bare:>7.0%}")
    first, second = memory.halves_mib()
    print()
    print(
        f"snapshot wrote {rows:,} rows in {files} file(s), from Arrow batches"
        f" of <= {ROW_GROUP_ROWS:,} rows / {ROW_GROUP_BYTES >> 20} MiB of BSON;"
        f" {CHECKED_ROWS:,} rows checked against the documents' BSON"
    )
    print(
        f"memory during the snapshot: peak RSS +{memory.growth_mib():.0f} MiB"
        f" (sampled: +{first:.0f} MiB in the first half, +{second:.0f} MiB in the second)"
    )
    print(
        f"snapshot: {snapshot:,.0f} docs/s ({snapshot / bare:.0%} of bare cursor, "
        f"{snapshot / json_util_rate:.1f} x json_util)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
