"""The run's summary in human units (log, XCom, Asset extras), next to the numbers programs read."""

from __future__ import annotations

import logging

import pendulum

from mongo_cdc.capture.oplog_window import OplogWindow, byte_size, duration
from mongo_cdc_airflow.assets import table_event_extra
from mongo_cdc_airflow.source_tasks import summarize

MIB = 1024 * 1024
RUN_END = pendulum.datetime(2026, 11, 21, 15, 0, 0)


def _packed(moment: pendulum.DateTime) -> int:
    return int(moment.timestamp()) << 32


def test_durations_and_sizes_read_as_people_write_them():
    assert duration(3 * 3600 + 12 * 60 + 40) == "3 h 12 min"
    assert duration(81757487.6) == "946 d 06 h"
    assert (duration(250), duration(12.9)) == ("4 min 10 s", "12 s")
    assert (byte_size(512), byte_size(12.5 * 1024), byte_size(990 * MIB), byte_size(1.5 * 1024 * MIB)) == (
        "512 B", "12.5 KiB", "990.0 MiB", "1.5 GiB"
    )  # fmt: skip


def _window() -> dict:
    newest = RUN_END.subtract(seconds=5)
    return OplogWindow(
        rs="rs0",
        oldest=_packed(newest.subtract(hours=3, minutes=12)),
        newest=_packed(newest),
        used_bytes=45 * MIB,
        max_bytes=990 * MIB,
        position=_packed(newest.subtract(seconds=2)),
    ).to_dict()


def test_a_snapshot_run_has_a_lag_and_the_summary_is_in_human_units(caplog):
    caplog.set_level(logging.INFO)
    snapshot_position = RUN_END.subtract(minutes=4, seconds=10)
    pull = {
        "rs": "rs0",
        "events": {},
        "newest_source_ts_ms": None,  # the pull read no change: only the snapshot's rows landed
        "snapshot": {"documents": {"shop.orders": 17}, "seconds": 1.2,
                     "newest_source_ts_ms": int(snapshot_position.timestamp()) * 1000},
        "oplog": _window(),
    }  # fmt: skip
    result = summarize([pull], RUN_END)
    assert (result["lag_seconds"], result["lag"]) == (250.0, "4 min 10 s")
    window = result["oplog"]["rs0"]
    assert (window["window_seconds"], window["window"]) == (3 * 3600 + 12 * 60, "3 h 12 min")
    assert (window["position_age_seconds"], window["position_age"]) == (2, "2 s")
    assert (window["used_bytes"], window["used"], window["max"]) == (45 * MIB, "45.0 MiB", "990.0 MiB")
    assert window["headroom"] == duration(window["headroom_seconds"]) and " d " in window["headroom"]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "lag from the newest event to run end: 4 min 10 s" in logged and "None" not in logged
    assert (
        "replica set rs0: oplog window 3 h 12 min (45.0 MiB of 990.0 MiB), committed position 2 s old after "
        f"the pull, headroom {window['headroom']}"
    ) in logged


def test_asset_extras_carry_the_oplog_figures_as_numbers_and_as_text():
    extra = table_event_extra(
        "shop.orders", "file:///lake/state/shop/shop/orders", 17, 17, 1, {}, 0, {"rs0": _window()}
    )
    figures = extra["oplog"]["rs0"]
    assert (figures["window_seconds"], figures["window"]) == (3 * 3600 + 12 * 60, "3 h 12 min")
    assert (figures["position_age_seconds"], figures["position_age"]) == (2, "2 s")
    assert figures["headroom"] == duration(figures["headroom_seconds"])


def test_a_views_changes_count_with_the_streamed_events_and_the_snapshots_reads():
    pull = {
        "rs": "rs0",
        "events": {"shop.orders": {"u": 2}},
        "snapshot": {"documents": {"shop.orders": 3}},
        "views": {"changes": {"shop.open_orders": {"c": 1, "d": 2}}, "batch_seq": 7, "not_read": {}},
        "oplog": _window(),
    }
    events = summarize([pull, {**pull, "snapshot": None, "views": None}], RUN_END)["events"]
    assert events == {"shop.orders": {"u": 4, "r": 3}, "shop.open_orders": {"c": 1, "d": 2}}
