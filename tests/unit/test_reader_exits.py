"""A process that reads the lake's tables exits 0 (issue 47).

deltalake's default filesystem is a pyarrow ``PyFileSystem`` over delta-rs' object store: a scan's
C++ thread lets go of it after the read returned, and when that happens while the interpreter shuts
down, CPython ends the thread inside a C++ destructor and the process aborts (exit 134). Given a
native pyarrow filesystem (``storage.table_filesystem``, which ``read_table`` and every read of
ours pass) there is no Python object to let go of. Twenty fresh processes read a state-like and a
changes-like table written by our writers (one file of the state by a delta-rs MERGE, as an old
lake has), filtered and not, through ``read_table`` and through deltalake given the filesystem.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.transaction import create_table_with_add_actions

from mongo_cdc.lake.file_statistics import indexed_columns
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.data_files import add_actions, write_data_file

PROCESSES = 20
READS = """
import sys
import pyarrow.compute as pc
from deltalake import DeltaTable
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.storage import table_filesystem

for uri, rows in zip(sys.argv[1::2], map(int, sys.argv[2::2])):
    table = DeltaTable(uri)
    filesystem = table_filesystem(table)
    assert table.to_pyarrow_table(filesystem=filesystem).num_rows == rows
    assert table.to_pyarrow_table(filesystem=filesystem, filters=[("n", "<", 5)]).num_rows == 5
    dataset = table.to_pyarrow_dataset(filesystem=filesystem)
    assert dataset.to_table(filter=pc.field("n") >= 5).num_rows == rows - 5
    assert read_table(uri).num_rows == rows
    assert read_table(uri, filters=[("n", "in", [1, 2])]).num_rows == 2
print("read")
"""


def table(location: LakeLocation, zone: str, rows: int, partition: tuple[tuple[str, str], ...]) -> str:
    data = pa.table({"__key": [f"k{n:03d}" for n in range(rows)], "n": list(range(rows))})
    files = [
        write_data_file(location, f"{zone}/p/db/c", data.slice(start, 10), partition)
        for start in range(0, rows, 10)
    ]
    schema = data.schema.append(pa.field("hour", pa.string())) if partition else data.schema
    partitions = ["hour"] if partition else []
    uri = location.table_uri(zone, "p", "db", "c")
    actions = add_actions(files, indexed_columns(schema, {}, partitions))
    create_table_with_add_actions(uri, Schema.from_arrow(schema), actions, partition_by=partitions or None)
    return uri


def test_twenty_processes_reading_a_state_and_a_changes_table_all_exit_0(tmp_path: Path) -> None:
    location = LakeLocation(str(tmp_path))
    state = table(location, "state", 40, ())
    DeltaTable(state).merge(
        pa.table({"__key": ["k999"], "n": [999]}), "t.__key = s.__key", source_alias="s", target_alias="t"
    ).when_not_matched_insert_all().execute()  # a file in string_view, as a MERGE writes
    changes = table(location, "changes", 30, (("hour", "2026-01-01T00"),))
    command = [sys.executable, "-c", READS, state, "41", changes, "30"]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(PROCESSES)
    ]
    outcomes = [(process.wait(timeout=300), *process.communicate()) for process in processes]
    failed = [(code, err.decode()[-2000:]) for code, out, err in outcomes if code != 0 or out != b"read\n"]
    assert failed == []
