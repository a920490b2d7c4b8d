"""``capture.time_series``'s bookkeeping, on a real lake's batch log (no mongod): the windows a
time-series batch records survive the log, give the collection's landed watermark, and the run's
summary says how fresh such a table is."""

from __future__ import annotations

import logging

import pendulum
import pytest

from mongo_cdc.capture.time_series import TIME_SERIES_BATCH, landed_windows, watermark
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc_airflow.source_tasks import summarize

CPU, DISK = "metrics.cpu", "metrics.disk"


def _batch(seq: int, windows: dict, rs: str = "rs0") -> Batch:
    return Batch(rs, seq, TIME_SERIES_BATCH, None, seq << 32, time_windows=tuple(windows.items()))


def test_the_windows_survive_the_batch_log_and_give_the_watermark(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path / "lake")), "acc")
    source_lake.commit(Batch("rs0", 1, "stream", None, 1 << 32, namespaces=("metrics.other",)))
    source_lake.commit(_batch(2, {CPU: (None, 1_000), DISK: (None, 1_000)}))
    source_lake.commit(_batch(3, {CPU: (400, 2_000)}))
    source_lake.commit(_batch(1, {CPU: (None, 9_000)}, rs="rs1"))  # another replica set's
    batches = source_lake.batches()
    windows = landed_windows(batches, "rs0", CPU)
    assert [(batch.seq, window) for batch, window in windows] == [(2, (None, 1_000)), (3, (400, 2_000))]
    assert watermark(windows) == 2_000
    assert watermark(landed_windows(batches, "rs0", DISK)) == 1_000
    # a collection never read has no watermark: its first read takes every measurement
    assert watermark(landed_windows(batches, "rs0", "metrics.new")) is None
    # a batch landed before the column existed reads as one without windows
    assert batches[0].time_windows == ()


def test_the_summary_says_how_fresh_a_time_series_table_is(caplog: pytest.LogCaptureFixture):
    figures = {
        "events": {"r": 3},
        "landed_up_to": "2026-11-21T14:59:00+00:00",
        "window_start": "2026-11-21T13:58:00+00:00",
        "lateness_seconds": 3600,
        "reconciled": False,
        "reconcile_interval_hours": 24,
    }
    pulls = [{"rs": "rs0", "events": {CPU: {"r": 3}}, "time_series": {CPU: figures}}]
    with caplog.at_level(logging.INFO):
        result = summarize(pulls, pendulum.datetime(2026, 11, 21, 15, 0, 0))
    assert result["time_series"] == {CPU: figures}
    assert result["events"] == {CPU: {"r": 3}}
    line = next(record.getMessage() for record in caplog.records if "time-series" in record.getMessage())
    assert "metrics.cpu (time-series, read in batches): measurements timed up to 2026-11-21T14:59:00" in line
    assert "later than 3600 s after their time" in line and "every 24 h; this run: not reconciled" in line
