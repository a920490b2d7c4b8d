"""``make bench`` runs to the end on tiny sizes and prints its one table (no timing is asserted).

The smoke run is the bench itself: its own replica set, every section (real spark-submit runs of the
transform among them; the state-scale section without its Spark cluster), each run checked by the
bench (rows landed, events applied, state rows equal to the collection's documents)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mongo_cdc_dev.bench.table import SHORTER_THAN_THE_EMPTY_JOB, Row, no_rate_note, rate_less, render

REPO = Path(__file__).resolve().parents[2]


def test_smoke_run_prints_every_row_of_the_table() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mongo_cdc_dev.bench",
            "--smoke",
            "--peer-venv",
            str(REPO / ".local" / "bench-venv"),
            # the state-scale section's cluster would add a minute of the 2 cores (its start and two
            # transforms); tests/system/test_spark_cluster.py runs the transform on a cluster
            "--no-cluster",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "include"), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("mongo-cdc bench (", 1)[1]
    expected = [
        r"snapshot 3,000 x \d+ B\s+bare RawBSONDocument cursor\s+[\d,.]+ docs/s",
        r"mongo-cdc run_snapshot -> Delta\s+[\d,.]+ docs/s\s+[\d.]+x\s+bare\s+>= 1.00x",
        r"snapshot 300 x \d,\d+ B\s+bare RawBSONDocument cursor\s+[\d,.]+ MB/s",
        r"mongo-cdc run_snapshot -> Delta\s+[\d,.]+ MB/s\s+[\d.]+x\s+bare\s+>= 1.00x",
        r"pull [\d,.]+-event backlog\s+bare change stream, RawBSONDocument\s+[\d,.]+ events/s",
        r"mongo-cdc pull_changes -> Delta\s+[\d,.]+ events/s\s+[\d.]+x\s+bare\s+>= 0.80x",
        r"bare change stream, mongod on core 0, reader on core 1\s+[\d,.]+ events/s",
        r"mongo-cdc pull_changes, mongod on core 0, reader on core 1\s+[\d,.]+ events/s\s+[\d.]+x\s+"
        r"bare pinned\s+>= 0.90x",
        r"bare change stream, client CPU\s+[\d,.]+ CPU s/100k events",
        r"mongo-cdc pull_changes, client CPU\s+[\d,.]+ CPU s/100k events\s+[\d.]+x\s+bare\s+<= 2.50x",
        r"peak RSS of the process\s+run_snapshot, small documents .*MiB\s+< 500 MiB",
        r"run_snapshot, nested documents .*MiB\s+< 500 MiB",
        r"pull_changes .*MiB\s+< 500 MiB",
        r"20 x ~64 KB documents\s+mongo-cdc pull_changes -> Delta\s+[\d,.]+ MB/s",
        r"pull_changes, 20 inserts of ~64 KB .*MiB\s+< 500 MiB",
        r"run_snapshot, 20 documents of ~64 KB .*MiB\s+< 500 MiB",
        r"snapshot 3,000 docs in chunks\s+one piece \(one chunk\)\s+[\d,.]+ docs/s",
        r"10 chunks, one thread\s+[\d,.]+ docs/s\s+[\d.]+x\s+one piece\s+>= 0.90x",
        r"10 chunks, two threads\s+[\d,.]+ docs/s\s+[\d.]+x\s+one piece",
        r"transform of 2,000 / 500 docs\s+run_snapshot rows landed \(the step before\)\s+[\d,.]+ rows/s",
        r"first build, 2,000 docs\s+[\d,.]+ events/s\s+[\d.]+x\s+landing\s+>= 100,000 events/s",
        r"first build, 500 docs\s+[\d,.]+ events/s\s+[\d.]+x\s+landing",
        r"100 changes on 500 docs\s+[\d.]+ s",
        r"100 changes on 2,000 docs\s+[\d.]+ s\s+[\d.]+x\s+500 docs\s+<= 1.50x and < 30 s",
        r"100 updates adding a field on 2,000 docs\s+[\d.]+ s",
        r"transform without Spark's start\s+empty PySpark job \(SparkContext, 2 tasks\)\s+[\d.]+ s",
        r"first build, 2,000 docs, wall\s+[\d.]+ s\s+< 14 s",
        # a tiny build can take less time than the empty job: then its own rate is not a number
        r"first build, 2,000 docs, less the empty job\s+(?:[\d,.]+ events/s|unavailable)\s+"
        r">= 150,000 events/s",
        r"run_snapshot landing, 100 nested docs\s+[\d,.]+ MB/s",
        r"first build, 100 nested docs, less the empty job\s+"
        r"(?:[\d,.]+ MB/s\s+[\d.]+x|unavailable)\s+landing\s+>= 0.25x",
        r"200 changes spread over 2,000 docs\s+[\d.]+ s\s+[\d.]+x\s+100 changes\s+<= 2.00x",
        # issue 51: the state at scale, the 8,000-document state against the 2,000 one
        r"state at scale\s+80 spread changes, 2,000 docs: wall\s+[\d.]+ s",
        r"80 spread changes, 8,000 docs: state files rewritten\s+[\d.]+ MB",
        r"80 spread changes, 8,000 docs: Python driver peak\s+[\d,.]+ MiB",
        r"80 spread changes: wall, 8,000 vs 2,000 docs\s+[\d.]+x\s+2,000 docs\s+<= 4.00x",
        r"80 spread changes: state files rewritten, 8,000 vs 2,000 docs\s+[\d.]+x",
        r"100 recent changes: wall, 8,000 vs 2,000 docs\s+[\d.]+x\s+2,000 docs\s+<= 1.20x",
        r"100 recent changes: Python driver peak, 8,000 vs 2,000 docs\s+[\d.]+x\s+2,000 docs\s+<= 1.10x",
        # left out (--no-cluster): tests/system/test_spark_cluster.py runs the cluster
        r"80 spread changes, 2,000 docs on a standalone cluster\s+unavailable",
        r"3 collections x 2 docs\s+first run, 1 collection\s+[\d.]+ s",
        r"first run, 3 collections\s+[\d.]+ s\s+[\d.]+x\s+1 x 6 docs\s+<= 2.00x",
        r"one change in every collection, 3 collections\s+[\d.]+ s\s+[\d.]+x\s+1 x 6 docs\s+<= 2.00x",
        r"idle run, 3 collections\s+[\d.]+ s\s+[\d.]+x\s+1 x 6 docs\s+<= 1.20x",
        r"idle run, overhead per collection\s+-?[\d,.]+ ms",
        r"cdc_transform, largest process \((driver JVM|Python driver|Python worker)\)"
        r"\s+[\d,.]+ MiB\s+< 2,048 MiB",
        r"verify 3,000 x \d+ B, 10 ranges\s+bare RawBSONDocument cursor\s+[\d,.]+ docs/s",
        r"mongo-cdc verify, no drift\s+[\d,.]+ docs/s\s+[\d.]+x\s+bare\s+>= 0.50x",
        r"mongo-cdc verify, 100 drifted, spread\s+[\d.]+ s\s+[\d.]+x\s+no drift\s+<= 1.20x",
        r"verify_replica_set, no drift .*MiB\s+< 500 MiB",
        r"verify_replica_set, 100 drifted .*MiB\s+< 500 MiB",
        r"lost oplog, 3,000 docs, 30 changes missed\s+full re-snapshot \+ transform, time\s+[\d.]+ s",
        r"heal \+ transform, time\s+[\d.]+ s\s+[\d.]+x\s+re-snapshot\s+<= 0.60x",
        r"full re-snapshot \+ transform, bytes to the lake\s+[\d.]+ MB",
        r"heal \+ transform, bytes to the lake\s+[\d.]+ MB\s+[\d.]+x\s+re-snapshot\s+<= 0.05x",
        r"heal \+ transform, bytes to the lake: raw [\d.]+ MB, state [\d.]+ MB, changes [\d.]+ MB",
        # issue 50 item 1: another collection's backlog beside a copy
        r"copy beside the pull, 3,000 docs copied\s+300-event backlog of another collection, no copy: lag"
        r"\s+[\d.]+ s",
        r"the same beside the copy: lag\s+[\d.]+ s\s+[\d.]+x\s+no copy\s+<= 1.20x",
        r"the copy \(before issue 50, the backlog's lag was this and the pull's\)\s+[\d.]+ s\s+[\d.]+x",
    ]
    for pattern in expected:
        assert re.search(pattern, table), f"no row matching {pattern!r} in:\n{table}"
    # a new field adds change files and removes none: old change files are never rewritten
    assert re.search(
        r"old change files removed by the new field \([1-9]\d* added\)\s+0\.0 files\s+< 1 files\s+ok", table
    ), table
    # dlt has a rate on both collections, unless its venv could not be installed (no package index)
    dlt_rows = re.findall(r"dlt \S+ arrow -> Parquet\s+(\S+)", table)
    assert len(dlt_rows) == 2, table
    if "install failed" not in table and "could not create" not in table:
        assert "unavailable" not in dlt_rows, table
        assert re.search(r"mongo-cdc vs dlt\s+[\d.]+x\s+dlt\s+>= 3.00x", table), table


def test_table_marks_budgets_and_explains_missing_rates() -> None:
    rows = [
        Row("pull", "bare", 100.0, "events/s"),
        Row("pull", "ours", 70.0, "events/s", 0.7, "bare", min_ratio=0.8),
        Row("pull", "peer", None, "events/s", note="failed: boom"),
        Row("memory", "task", 420.0, "MiB", max_value=500.0),
        Row("changes", "large", 40.0, "s", 1.2, "small", max_ratio=1.5, max_value=30.0),
    ]
    lines = render(rows).splitlines()
    assert lines[0].split() == ["section", "path", "measured", "ratio", "vs", "budget"]
    assert lines[3].split()[-2:] == ["0.80x", "MISSED"]
    assert "unavailable" in lines[4] and lines[-1] == "peer: failed: boom"
    assert lines[5].split()[-1] == "ok"
    # every budget of a row must hold: the ratio does, the time does not
    assert lines[6].endswith("<= 1.50x and < 30 s  MISSED")
    assert lines[2].startswith("pull ") and lines[3].startswith("  ")  # the section is named once


def test_a_rate_less_a_baseline_it_did_not_outlast_is_no_number() -> None:
    """A 1,000-document build shorter than the empty job once printed 4,035,336,000 MB/s, "ok"."""
    assert rate_less(100.0, 3.0, 1.0) == 50.0
    for seconds in (1.0, 0.5):
        rate = rate_less(100.0, seconds, 1.0)
        assert rate is None
        row = Row(
            "transform", "build, less the empty job", rate, "MB/s", min_value=10.0, note=no_rate_note(rate)
        )
        assert row.met is None
        table = render([row]).splitlines()
        assert "unavailable" in table[2] and not table[2].rstrip().endswith("ok")
        assert table[-1] == f"build, less the empty job: {SHORTER_THAN_THE_EMPTY_JOB}"
