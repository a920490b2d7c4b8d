"""``make bench``'s driver-memory section (issue 25): the transform driver's peak RSS must not grow
with the run, only with its batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mongo_cdc import extjson
from mongo_cdc_dev.bench.data import load, small_documents
from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.bench.transform import Source, check_run, quiet_oplog_warnings, step

if TYPE_CHECKING:
    from mongo_cdc_dev.bench.context import Bench

DRIVER_GROWTH = 4  # the larger first build has this many times the events of the smaller one
DRIVER_RSS_GROWTH_MAX = 1.25


def driver_memory(bench: Bench) -> list[Row]:
    """``make bench``'s driver-memory section: the peak RSS of the transform's driver for first
    builds of ``--driver-events`` and DRIVER_GROWTH times as many events (each a collection of its
    own, loaded and snapshotted here): the Python driver (the process running cdc_transform.py,
    where the job's driver code runs) and the driver JVM (in local mode the executors' memory too:
    the JVM grows toward its heap limit with Spark's work, whoever asks for it). Budget: the larger
    build's Python driver at most DRIVER_RSS_GROWTH_MAX times the smaller one's."""
    events = bench.args.driver_events
    client = bench.rs.client(datetime_conversion=extjson.DECODE_OPTIONS.datetime_conversion)
    runs = {}
    with client, quiet_oplog_warnings():
        lake = bench.lake("driver-memory")
        for size in (events, events * DRIVER_GROWTH):
            source = Source(f"driver{size}", client, bench.rs.name, lake, size)
            with step(f"loading {size:,} documents into {source.namespace}"):
                load(source.collection, size, small_documents)
            with step(f"snapshot of {source.namespace}"):
                source.snapshot()
            with step(f"first build of {source.namespace}"):
                runs[size] = source.transform()
            check_run(runs[size], source, size)
            source.collection.drop()  # its lake stays: the next one's load has the memory
    small, large = runs[events], runs[events * DRIVER_GROWTH]
    section = "transform driver peak RSS"
    rows = [
        Row(section, f"first build, {size:,} events, {name}", getattr(run, attribute), "MiB")
        for size, run in runs.items()
        for name, attribute in (("Python driver", "driver_mib"), ("driver JVM", "jvm_mib"))
    ]
    rows.append(
        Row(section, f"Python driver, {events * DRIVER_GROWTH:,} events vs {events:,}", None, "",
            large.driver_mib / small.driver_mib, f"{events:,} events", max_ratio=DRIVER_RSS_GROWTH_MAX)
    )  # fmt: skip
    rows.append(
        Row(section, f"driver JVM, {events * DRIVER_GROWTH:,} events vs {events:,}", None, "",
            large.jvm_mib / small.jvm_mib, f"{events:,} events")
    )  # fmt: skip
    return rows
