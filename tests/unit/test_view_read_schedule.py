"""Which runs read the views (``view.read.interval.runs``, ``view_capture.read_due``)."""

from __future__ import annotations

import datetime as dt

from mongo_cdc.verify.view_capture import read_due

HOUR = dt.timedelta(hours=1)
EPOCH_HOUR = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # a multiple of any few hours since the epoch


def test_every_run_reads_them_by_default_and_manual_runs_always_do():
    assert read_due(1, EPOCH_HOUR + 5 * HOUR, EPOCH_HOUR + 6 * HOUR)
    assert read_due(4, None, None)


def test_every_nth_interval_reads_them():
    due = [read_due(4, EPOCH_HOUR + n * HOUR, EPOCH_HOUR + (n + 1) * HOUR) for n in range(8)]
    assert due == [True, False, False, False, True, False, False, False]
    # daily runs: every third day
    day = dt.timedelta(days=1)
    assert [read_due(3, EPOCH_HOUR + n * day, EPOCH_HOUR + (n + 1) * day) for n in range(6)].count(True) == 2
