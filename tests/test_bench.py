"""``make bench`` runs to the end on tiny sizes and prints its one table (no timing is asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mongo_cdc.bench.table import Row, render

REPO = Path(__file__).resolve().parents[1]


def test_smoke_run_prints_every_row_of_the_table() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mongo_cdc.bench",
            "--smoke",
            "--peer-venv",
            str(REPO / ".local" / "bench-venv"),
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
        r"snapshot 3,000 x \d+ B\s+bare RawBSONDocument cursor\s+[\d,]+ docs/s",
        r"mongo-cdc run_snapshot -> Delta\s+[\d,]+ docs/s\s+[\d.]+x\s+bare\s+>= 0.70x",
        r"snapshot 300 x \d,\d+ B\s+bare RawBSONDocument cursor\s+[\d,.]+ MB/s",
        r"mongo-cdc run_snapshot -> Delta\s+[\d,.]+ MB/s\s+[\d.]+x\s+bare\s+>= 0.50x",
        r"pull [\d,]+-event backlog\s+bare change stream, RawBSONDocument\s+[\d,]+ events/s",
        r"mongo-cdc pull_changes -> Delta\s+[\d,]+ events/s\s+[\d.]+x\s+bare\s+>= 0.80x",
        r"peak RSS of the process\s+run_snapshot, small documents .*MiB\s+< 500 MiB",
        r"run_snapshot, nested documents .*MiB\s+< 500 MiB",
        r"pull_changes .*MiB\s+< 500 MiB",
    ]
    for pattern in expected:
        assert re.search(pattern, table), f"no row matching {pattern!r} in:\n{table}"
    # dlt has a rate on both collections, unless its venv could not be installed (no package index)
    dlt_rows = re.findall(r"dlt \S+ arrow -> Parquet\s+(\S+)", table)
    assert len(dlt_rows) == 2, table
    if "pip install failed" not in table and "could not create" not in table:
        assert "unavailable" not in dlt_rows, table
        assert re.search(r"mongo-cdc vs dlt\s+[\d.]+x\s+dlt\s+>= 3.00x", table), table


def test_table_marks_budgets_and_explains_missing_rates() -> None:
    rows = [
        Row("pull", "bare", 100.0, "events/s"),
        Row("pull", "ours", 70.0, "events/s", 0.7, "bare", min_ratio=0.8),
        Row("pull", "peer", None, "events/s", note="failed: boom"),
        Row("memory", "task", 420.0, "MiB", max_value=500.0),
    ]
    lines = render(rows).splitlines()
    assert lines[0].split() == ["section", "path", "measured", "ratio", "vs", "budget"]
    assert lines[3].split()[-2:] == ["0.80x", "MISSED"]
    assert "unavailable" in lines[4] and lines[-1] == "peer: failed: boom"
    assert lines[5].split()[-1] == "ok"
    assert lines[2].startswith("pull ") and lines[3].startswith("  ")  # the section is named once
