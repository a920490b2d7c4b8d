"""``python -m mongo_cdc.bench_transform --smoke`` end to end: its own replica set, snapshots, six real
spark-submit runs of the transform, and the table it prints. No timing is asserted."""

from __future__ import annotations

import os
import re
import sys

import pytest

from mongo_cdc import bench_transform

SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")

pytestmark = pytest.mark.skipif(not os.path.exists(SPARK_SUBMIT), reason="spark-submit not installed")

ROWS = [
    "snapshot: rows landed (2,000 docs), baseline",
    "transform: first build, 2,000 docs",
    "transform: first build, 500 docs",
    "transform: 100 changes on 500 docs",
    "transform: 100 changes on 2,000 docs",
    "transform: 100 changes, 2,000 / 500 docs cost",
    "transform: 100 updates adding a field on 2,000 docs",
    "transform: old change files Delta removed for the new field",
    "transform: largest process, peak RSS",
]


def test_smoke_mode_prints_every_row_and_keeps_old_change_files(capsys):
    # the bench itself checks each run: events applied, state rows equal to the collection's documents
    assert bench_transform.main(["--smoke"]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("\nstep ") + 1 :].splitlines()
    assert [line[: len(label)] for line, label in zip(table[1:], ROWS, strict=True)] == ROWS
    removed = next(line for line in table if line.startswith(ROWS[7]))
    assert re.search(r"\s0\.00 files\s+\d+ added", removed), removed  # a new field rewrites no old file
    rss = next(line for line in table if line.startswith(ROWS[8]))
    assert re.search(r"\d MiB\s+(driver JVM|Python driver|Python worker);", rss), rss
