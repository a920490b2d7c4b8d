"""``lake.file_statistics`` and ``lake.file_rewrites``: the files mongo-cdc writes carry the Delta
statistics every reader prunes by, and no predicate prunes a file holding a matching row (issue 47).

Adversarial values at the files' boundaries: nulls, NaN and infinities, strings longer than the
statistics' prefix (and a prefix that cannot be rounded up), timestamps between milliseconds,
nested fields, lists. Each filtered read (deltalake's two APIs, ``read_table``, Polars, DuckDB) is
compared with the same reader's full read filtered afterwards. A table written the old way (files
without statistics, files a delta-rs MERGE wrote in ``string_view``) is healed and then reads right.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.transaction import AddAction, create_table_with_add_actions
from reader_support import OPERATORS, Predicate, check_every_reader

from mongo_cdc.lake import file_rewrites
from mongo_cdc.lake.file_rewrites import compact, files_to_heal, heal
from mongo_cdc.lake.file_statistics import (
    STRING_PREFIX_LENGTH,
    FileStatistics,
    indexed_columns,
    indexed_columns_property,
    table_indexed_columns,
    truncated_max,
)
from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.storage import LakeLocation, table_filesystem
from mongo_cdc.transform.data_files import add_actions, write_data_file

START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
LONG = "m" * 50
TOP = "\U0010ffff" * (STRING_PREFIX_LENGTH + 3)
NESTED = pa.struct([("x", pa.int64()), ("y", pa.string())])
SCHEMA = pa.schema(
    [
        ("__key", pa.string()),
        ("_id", pa.int64()),
        ("s", pa.string()),
        ("d", pa.float64()),
        ("b", pa.bool_()),
        ("t", pa.timestamp("us", tz="UTC")),
        ("nested", NESTED),
        ("tags", pa.list_(pa.string())),
        ("doc", pa.binary()),
    ]
)
# each file: its rows' (s, d, t) values; _id runs on across the files
FILES = [
    [("a", 1.0, 0), (LONG, math.nan, 1), (None, -math.inf, 999)],
    [(LONG + "z", math.inf, 1_001), ("b", None, 2_000_000), (TOP, -0.0, 5)],
    [(TOP + "a", math.nan, 7), (None, None, None)],
    [("é" * 40, 1e308, 3_000_001)],
]


def file_rows(index: int, first_id: int) -> pa.Table:
    values = FILES[index]
    ids = list(range(first_id, first_id + len(values)))
    return pa.Table.from_pydict(
        {
            "__key": [f'["n","{i:04d}"]' for i in ids],
            "_id": ids,
            "s": [s for s, _, _ in values],
            "d": [d for _, d, _ in values],
            "b": [i % 2 == 0 if i % 3 else None for i in ids],
            "t": [None if t is None else START + dt.timedelta(microseconds=t) for _, _, t in values],
            "nested": [None if i % 4 == 3 else {"x": i * 10, "y": f"y{i}"} for i in ids],
            "tags": [[f"t{i}"] for i in ids],
            "doc": [b"\x00" * i for i in ids],
        },
        schema=SCHEMA,
    )


def our_table(tmp_path: Path) -> tuple[LakeLocation, str]:
    """The table as the transform writes one: each file by ``write_data_file``, one commit."""
    location = LakeLocation(str(tmp_path))
    written, first = [], 0
    for index in range(len(FILES)):
        rows = file_rows(index, first)
        written.append(write_data_file(location, "state/p/db/c", rows))
        first += rows.num_rows
    uri = location.table_uri("state", "p", "db", "c")
    actions = add_actions(written, indexed_columns(SCHEMA, {}))
    create_table_with_add_actions(uri, Schema.from_arrow(SCHEMA), actions)
    return location, uri


def predicates() -> list[Predicate]:
    probes = [
        ("_id", 3, pa.int64()),
        ("_id", 8, pa.int64()),
        ("s", "a", pa.string()),
        ("s", LONG, pa.string()),
        ("s", LONG + "z", pa.string()),
        ("s", TOP, pa.string()),
        ("s", TOP + "a", pa.string()),
        ("s", "é" * 40, pa.string()),
        ("d", 1.0, pa.float64()),
        ("d", 5.0, pa.float64()),
        ("d", math.inf, pa.float64()),  # "> inf" left out: DuckDB matches NaN (file_statistics)
        ("d", -math.inf, pa.float64()),
        ("d", 0.0, pa.float64()),
        ("b", False, pa.bool_()),
        ("t", START + dt.timedelta(microseconds=999), pa.timestamp("us", tz="UTC")),
        ("t", START + dt.timedelta(microseconds=1_001), pa.timestamp("us", tz="UTC")),
        ("nested.x", 40, pa.int64()),
        ("nested.y", "y5", pa.string()),
    ]
    return [
        (column, op, value, kind)
        for column, value, kind in probes
        for op in OPERATORS
        if (column, op, value) != ("d", ">", math.inf)
    ]


def test_every_reader_filters_our_files_right(tmp_path: Path) -> None:
    _, uri = our_table(tmp_path)
    assert check_every_reader(uri, predicates()) > 20


def test_statistics_bound_what_the_files_hold(tmp_path: Path) -> None:
    _, uri = our_table(tmp_path)
    with open(sorted((Path(uri) / "_delta_log").glob("*.json"))[0]) as log:
        stats = [json.loads(json.loads(line)["add"]["stats"]) for line in log if line.startswith('{"add"')]
    first, second, third, fourth = sorted(stats, key=lambda s: s["minValues"]["__key"])
    # NaN: the widest bounds (no narrower ones are true of it); infinities as text
    assert (first["minValues"]["d"], first["maxValues"]["d"]) == ("-Infinity", "Infinity")
    assert (third["minValues"]["d"], third["maxValues"]["d"]) == ("-Infinity", "Infinity")
    assert (second["minValues"]["d"], second["maxValues"]["d"]) == (-0.0, "Infinity")
    # a long string: a prefix below, a prefix rounded up above; a prefix of the last code point whole
    assert first["maxValues"]["s"] == "m" * (STRING_PREFIX_LENGTH - 1) + "n"
    assert second["maxValues"]["s"] == TOP and second["minValues"]["s"] == "b"
    assert len(fourth["minValues"]["s"]) == STRING_PREFIX_LENGTH
    # timestamps in milliseconds, rounded outwards
    assert (first["minValues"]["t"], first["maxValues"]["t"]) == (
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:00:00.001Z",
    )
    assert second["nullCount"]["nested"] == {"x": 1, "y": 1} and third["nullCount"]["t"] == 1
    assert "doc" not in first["minValues"] and first["nullCount"]["doc"] == 0  # bytes: no bounds


def test_a_column_a_file_lacks_counts_as_all_null(tmp_path: Path) -> None:
    statistics = FileStatistics(3, frozenset({("a",)}), {("a",): 0}, {("a",): (1, 2)})
    stats = json.loads(statistics.to_json([("a",), ("later",)]))
    assert stats["nullCount"] == {"a": 0, "later": 3} and "later" not in stats["minValues"]


def test_a_point_lookup_opens_one_file_after_the_build_and_after_compaction(tmp_path, monkeypatch):
    location = LakeLocation(str(tmp_path))
    uri = location.table_uri("state", "p", "db", "c")
    written = []
    for part in range(8):  # a build's files: one per slice, each sorted, disjoint key ranges
        ids = list(range(part * 100, part * 100 + 100))
        rows = pa.table({"__key": [f"{i:05d}" for i in ids], "_id": [f"{i:024x}" for i in ids], "v": ids})
        written.append(write_data_file(location, "state/p/db/c", rows))
    schema = pa.schema([("__key", pa.string()), ("_id", pa.string()), ("v", pa.int64())])
    create_table_with_add_actions(
        uri, Schema.from_arrow(schema), add_actions(written, indexed_columns(schema, {}))
    )

    def opened(value: str) -> int:
        table = DeltaTable(uri)
        dataset = table.to_pyarrow_dataset(filesystem=table_filesystem(table))
        return sum(1 for _ in dataset.get_fragments(filter=pc.field("_id") == value))

    assert [opened(f"{i:024x}") for i in (0, 450, 799)] == [1, 1, 1]
    monkeypatch.setattr(file_rewrites, "COMPACT_TARGET_BYTES", 4 * max(file.size for file in written) + 1)
    assert compact(DeltaTable(uri), location, "__key") == (8, 2)
    assert len(DeltaTable(uri).file_uris()) == 2
    assert [opened(f"{i:024x}") for i in (0, 450, 799)] == [1, 1, 1]
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("v").to_pylist()) == list(range(800))


def old_table(tmp_path: Path) -> tuple[LakeLocation, str]:
    """A table as mongo-cdc wrote it before: statistics of ``__key`` only, then a delta-rs MERGE."""
    location, uri = LakeLocation(str(tmp_path)), str(tmp_path / "state" / "p" / "db" / "c")
    first = 0
    actions = []
    for index in range(len(FILES)):
        rows = file_rows(index, first)
        first += rows.num_rows
        name = f"part-old-{index}.snappy.parquet"
        Path(uri).mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, f"{uri}/{name}")
        keys = rows.column("__key").to_pylist()
        stats = {
            "numRecords": rows.num_rows,
            "minValues": {"__key": min(keys)},
            "maxValues": {"__key": max(keys)},
        }
        actions.append(AddAction(name, Path(uri, name).stat().st_size, {}, 0, True, json.dumps(stats)))
    create_table_with_add_actions(uri, Schema.from_arrow(SCHEMA), actions)
    source = file_rows(0, 100).slice(0, 1)
    DeltaTable(uri).merge(
        source, "t.__key = s.__key", source_alias="s", target_alias="t"
    ).when_not_matched_insert_all().execute()
    return location, uri


def test_a_table_written_the_old_way_is_healed_and_then_reads_right(tmp_path: Path) -> None:
    location, uri = old_table(tmp_path)
    table = DeltaTable(uri)
    assert table.to_pyarrow_table(filters=[("s", "=", "b")]).num_rows == 0  # the trap: pruned
    before = sorted(table.to_pyarrow_table().column("_id").to_pylist())
    assert len(files_to_heal(table, location)) == len(FILES) + 1  # the MERGE's file: string_view
    now = dt.datetime.now(dt.timezone.utc)
    assert maintain_table(uri, location, 0, 168, now)["files_healed"] == len(FILES) + 1  # the step
    healed = DeltaTable(uri)
    assert files_to_heal(healed, location) == []
    assert sorted(healed.to_pyarrow_table().column("_id").to_pylist()) == before  # nothing lost or doubled
    for path in healed.file_uris():
        assert pq.read_schema(path).field("s").type == pa.string()
    assert check_every_reader(uri, predicates()) > 20
    assert heal(healed, location) == 0  # healed once: nothing to do the next time
    assert healed.history(1)[0]["operation"] == "SET TBLPROPERTIES"


@pytest.mark.parametrize("value", ["", "a", "z" * 32, "z" * 33, "ab\U0010ffff" + "c" * 40, "\ud7ff" * 40])
def test_a_truncated_maximum_is_still_an_upper_bound(value: str) -> None:
    bound = truncated_max(value)
    assert bound >= value and len(bound) <= max(STRING_PREFIX_LENGTH, len(value))


def test_deltalake_writes_are_healed_too(tmp_path: Path) -> None:
    """delta-rs' own writer bounds an infinite double with null, which its readers prune by."""
    location, uri = LakeLocation(str(tmp_path)), str(tmp_path / "changes" / "p" / "db" / "c")
    write_deltalake(uri, pa.table({"d": [1.0, math.inf]}))
    assert DeltaTable(uri).to_pyarrow_table(filters=[("d", ">", 5.0)]).num_rows == 0  # the trap
    assert file_rewrites.normalize_last_commit(DeltaTable(uri), location) == 1
    assert DeltaTable(uri).to_pyarrow_table(filters=[("d", ">", 5.0)]).num_rows == 1


def test_the_heal_command_heals_every_table_of_a_lake(tmp_path: Path) -> None:
    location, uri = old_table(tmp_path / "lake")
    command = [
        sys.executable,
        "-m",
        "mongo_cdc.lake.file_rewrites",
        "--lake-root",
        "lake",
        "--topic-prefix",
        "p",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"state/p/db/c: {len(FILES) + 1} files written again",
        "1 of 1 tables healed",
    ]
    assert files_to_heal(DeltaTable(uri), location) == []
    Path(uri, "_delta_log", f"{DeltaTable(uri).version():020d}.json").write_text("not json")
    damaged = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert damaged.returncode == 1 and "state/p/db/c: not healed" in damaged.stderr


def test_a_column_the_table_gains_later_is_not_indexed_and_reads_right(tmp_path: Path) -> None:
    """Its older files have no statistics of it: were it indexed, deltalake would prune them on
    ``later IS NULL``, and healing would write every old file again at each new field."""
    location = LakeLocation(str(tmp_path))
    uri = location.table_uri("changes", "p", "db", "c")
    first = pa.table({"__key": ["a", "b"], "n": [1, 2]})
    configuration = indexed_columns_property(first.schema)
    old = write_data_file(location, "changes/p/db/c", first)
    actions = add_actions([old], indexed_columns(first.schema, configuration))
    create_table_with_add_actions(uri, Schema.from_arrow(first.schema), actions, configuration=configuration)
    wider = pa.table({"__key": ["c"], "n": [3], "later": ["x"]})
    write_deltalake(
        uri, wider.schema.empty_table(), mode="append", schema_mode="merge"
    )  # as the transform does
    table = DeltaTable(uri)
    new = write_data_file(location, "changes/p/db/c", wider)
    table.create_write_transaction(add_actions([new], table_indexed_columns(table)), "append", table.schema())
    table = DeltaTable(uri)
    assert table_indexed_columns(table) == [("__key",), ("n",)]
    assert files_to_heal(table, location) == []
    probes = [("later", "x", pa.string()), ("n", 2, pa.int64())]
    assert check_every_reader(uri, [(c, op, v, k) for c, v, k in probes for op in OPERATORS]) >= 4
    assert table.to_pyarrow_table(filters=[("later", "=", "x")]).num_rows == 1
    assert table.to_pyarrow_dataset().to_table(filter=pc.field("later").is_null()).num_rows == 2
