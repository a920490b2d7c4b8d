"""Which readers honour a Delta deletion vector, and which delta-rs writes keep a table that has one
right: the evidence docs/reading.md's "Deletion vectors" section states, one asserted cell each, so
a reader or writer that changes behaviour (a version bump) fails here and the page gets updated.

The tables are written by delta-rs, then given a deletion vector by hand (``deletion_vectors``,
following the Delta protocol), as delta-rs does not write them. A reader that returns the deleted
rows is silently wrong; one that fails names the problem.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deletion_vectors import add_deletion_vector, live_adds, z85_encode
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import DeltaProtocolError
from reader_support import duckdb_connection

from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.readers import read_table, spark_table
from mongo_cdc.lake.storage import DeletionVectorsError, LakeLocation

DELETED = (2, 5, 7)  # row indexes in the first file, whose ids are the same numbers
ALL_IDS = set(range(20))
LIVE = ALL_IDS - set(DELETED)

APPLIES = "applies the deletion vector"
REFUSALS = {
    DeltaProtocolError: "reader features: {'deletionVectors'} but these are not yet supported",
    DeletionVectorsError: "has deletion vectors enabled .* DROP FEATURE deletionVectors",
}


def _rows(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "doc": [f"d{i}" for i in ids]})


@pytest.fixture(params=["u", "i"], ids=["dv-file", "dv-inline"])
def dv_table(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """Two files of 10 rows; the first has rows ``DELETED`` deleted by a DV in a file ('u') or inline
    ('i'): the table, the first file and the DV's storage type."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(range(10)))
    first = next(iter(live_adds(uri)))
    write_deltalake(uri, _rows(range(10, 20)), mode="append")
    add_deletion_vector(uri, first, DELETED, request.param)
    return uri, first, request.param


def _query_builder(uri: str) -> list[int]:
    reader = QueryBuilder().register("t", DeltaTable(uri))
    return pa.table(reader.execute("SELECT id FROM t").read_all())["id"].to_pylist()


def _duckdb(uri: str) -> list[int]:
    return [row[0] for row in duckdb_connection().sql(f"SELECT id FROM delta_scan('{uri}')").fetchall()]


READERS: dict[str, tuple[Callable[..., list[int]], Any]] = {
    "deltalake to_pyarrow_table": (
        lambda uri: DeltaTable(uri).to_pyarrow_table()["id"].to_pylist(),
        DeltaProtocolError,
    ),
    "deltalake to_pyarrow_dataset": (
        lambda uri: DeltaTable(uri).to_pyarrow_dataset().to_table()["id"].to_pylist(),
        DeltaProtocolError,
    ),
    # ours refuse it: they read data files whole, which would bring the deleted rows back
    "ours read_table": (lambda uri: read_table(uri)["id"].to_pylist(), DeletionVectorsError),
    "deltalake QueryBuilder": (_query_builder, APPLIES),
    "duckdb delta_scan": (_duckdb, APPLIES),
    "polars read_delta": (lambda uri: pl.read_delta(uri)["id"].to_list(), APPLIES),
    "polars scan_delta": (lambda uri: pl.scan_delta(uri).collect()["id"].to_list(), APPLIES),
    "ours spark_table": (
        lambda uri, spark: [row.id for row in spark_table(spark, uri).collect()],
        DeletionVectorsError,
    ),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_reader_on_a_table_with_a_deletion_vector(dv_table, reader, request) -> None:
    uri, _, _ = dv_table
    read, expected = READERS[reader]
    arguments = (uri, request.getfixturevalue("spark")) if reader == "ours spark_table" else (uri,)
    if expected is not APPLIES:
        with pytest.raises(expected, match=REFUSALS[expected]):
            read(*arguments)
        return
    ids = read(*arguments)
    assert len(ids) == len(set(ids))
    assert set(ids) == LIVE


def test_z85_matches_the_protocol_example() -> None:
    """PROTOCOL.md's 'u' example: prefix "ab" then the z85 of d2c639aa-8816-431a-aaf6-d3fe2512ff61."""
    assert z85_encode(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"


def test_a_bitmap_of_several_containers_reads_back(tmp_path: Path) -> None:
    """Rows on both sides of 65536 make two 16-bit containers in the bitmap: the readers that apply
    DVs drop exactly those rows, so the serialization's header and offsets are right."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(range(70_000)))
    deleted = {0, 65_535, 65_536, 69_999}
    add_deletion_vector(uri, next(iter(live_adds(uri))), deleted, "u")
    for read in (_query_builder, _duckdb, lambda uri: pl.read_delta(uri)["id"].to_list()):
        ids = read(uri)
        assert len(ids) == 70_000 - len(deleted) and deleted.isdisjoint(ids)


def _docs(uri: str) -> dict[int, str]:
    rows = pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT id, doc FROM t").read_all())
    return dict(zip(rows["id"].to_pylist(), rows["doc"].to_pylist(), strict=True))


def _merge(uri: str, _: str) -> None:
    source = pa.table({"id": [1, 2, 11, 30], "doc": ["n1", "n2", "n11", "n30"]})
    merge = DeltaTable(uri).merge(source, "s.id = t.id", source_alias="s", target_alias="t")
    merge.when_matched_update_all().when_not_matched_insert_all().execute()


def _compact_then_vacuum(uri: str, _: str) -> None:
    DeltaTable(uri).optimize.compact()
    DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)


LIVE_DOCS = {i: f"d{i}" for i in LIVE}
# each write: (the write, the rows after it, whether the first file still has its DV)
WRITES: dict[str, tuple[Callable[[str, str], Any], dict[int, str], bool]] = {
    "append": (
        lambda uri, _: write_deltalake(uri, _rows(range(20, 21)), mode="append"),
        LIVE_DOCS | {20: "d20"},
        True,
    ),
    # a deleted row's id is not matched (2 is inserted anew); the first file is rewritten without its DV
    "merge": (_merge, LIVE_DOCS | {1: "n1", 2: "n2", 11: "n11", 30: "n30"}, False),
    "delete": (
        lambda uri, _: DeltaTable(uri).delete("id = 3"),
        {i: d for i, d in LIVE_DOCS.items() if i != 3},
        False,
    ),
    "compact": (lambda uri, _: DeltaTable(uri).optimize.compact(), LIVE_DOCS, False),
    "vacuum": (
        lambda uri, _: DeltaTable(uri).vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=False
        ),
        LIVE_DOCS,
        True,
    ),
    "compact then vacuum": (_compact_then_vacuum, LIVE_DOCS, False),
    "overwrite": (
        lambda uri, _: write_deltalake(uri, _rows(range(99, 100)), mode="overwrite"),
        {99: "d99"},
        False,
    ),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_delta_rs_writes_to_a_table_with_a_deletion_vector(dv_table, write) -> None:
    uri, first, storage = dv_table
    run, rows, keeps_dv = WRITES[write]
    run(uri, first)
    assert _docs(uri) == rows
    adds = live_adds(uri)
    assert (first in adds and "deletionVector" in adds[first]) is keeps_dv
    protocol = DeltaTable(uri).protocol()
    assert "deletionVectors" in (protocol.reader_features or [])  # no write downgrades the table
    if write == "compact then vacuum":
        # delta-rs' vacuum deletes the removed data files but not the DV file only they referred to
        names = os.listdir(uri)
        assert {name for name in names if name.endswith(".parquet")} == set(adds)
        orphans = [name for name in names if name.startswith("deletion_vector_")]
        assert len(orphans) == (1 if storage == "u" else 0)


def test_our_maintenance_refuses_a_table_with_deletion_vectors(dv_table) -> None:
    """Compaction lists files through delta-rs, which shows no DV, and writes each file's rows again:
    it would bring the deleted rows back, so maintenance (like every step that opens a table) refuses
    the table before reading it, and the table keeps its rows."""
    uri, first, _ = dv_table
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    with pytest.raises(DeletionVectorsError, match=REFUSALS[DeletionVectorsError]):
        maintain_table(uri, LakeLocation(os.path.dirname(uri)), 1, 0, now)
    assert _docs(uri) == LIVE_DOCS and "deletionVector" in live_adds(uri)[first]
