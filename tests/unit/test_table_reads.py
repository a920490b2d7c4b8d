"""Keyed and filtered reads of the lake's tables work whatever Arrow types their files hold.

delta-rs MERGE and DELETE write ``string_view`` columns; appends keep what they are given
(``string``, ``large_string``). pyarrow 26 cannot filter across those types, which stopped every
run after a state table's first MERGE (issue 27). These tests build tables whose files mix the
types with the writers that produce them and read them through ``table_reads``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.table_reads import Where, plain, plain_type, read_rows

SCHEMA = pa.schema(
    [
        ("__key", pa.string()),
        ("source", pa.struct([("rs", pa.string())])),
        ("batch_seq", pa.int64()),
        ("n", pa.int64()),
    ]
)


def _rows(keys: list[str], key_type: pa.DataType | None = None) -> pa.Table:
    key_type = key_type or pa.string()
    return pa.table(
        {
            "__key": pa.array(keys, key_type),
            "source": pa.array([{"rs": "rs0"}] * len(keys), pa.struct([("rs", key_type)])),
            "batch_seq": pa.array([len(keys)] * len(keys), pa.int64()),
            "n": pa.array(range(len(keys)), pa.int64()),
        }
    )


def _file_key_types(table: DeltaTable) -> set[str]:
    return {str(pq.read_schema(uri).field("__key").type) for uri in table.file_uris()}


@pytest.fixture
def mixed_table(tmp_path) -> DeltaTable:
    """A table with files a MERGE and a DELETE rewrote and ``string`` and ``large_string`` appends."""
    uri = str(tmp_path / "table")
    write_deltalake(uri, _rows(["a", "b", "c"]))
    write_deltalake(uri, _rows(["x", "y"], pa.large_string()), mode="append")
    table = DeltaTable(uri)
    source = _rows(["b", "m"])
    (
        table.merge(source, predicate="t.__key = s.__key", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    DeltaTable(uri).delete("__key = 'x'")
    write_deltalake(uri, _rows(["p"]), mode="append")
    write_deltalake(uri, _rows(["q"], pa.large_string()), mode="append")
    table = DeltaTable(uri)
    assert _file_key_types(table) == {"string", "large_string", "string_view"}, "writers changed types"
    return table


def test_equality_and_nested_filters_work_on_rewritten_files(mixed_table):
    assert read_rows(mixed_table, ["__key"], Where.equal(__key="m")).column("__key").to_pylist() == ["m"]
    # a raw table's batch window: a nested string field and batch numbers (b and m came in a batch of 2)
    window = BatchWindow({"rs0": (2,)}).where()
    assert sorted(read_rows(mixed_table, ["__key"], window).column("__key").to_pylist()) == ["b", "m", "y"]


def test_an_unfiltered_read_and_a_user_read_come_back_in_plain_types(mixed_table):
    everything = read_rows(mixed_table)
    assert everything.schema == SCHEMA and everything.num_rows == 7
    by_tuple = read_table(mixed_table.table_uri, filters=[("__key", "in", ["b", "q"])])
    assert sorted(by_tuple.column("__key").to_pylist()) == ["b", "q"]
    by_expression = read_table(mixed_table.table_uri, columns=["n"], filters=pc.field("__key") == "m")
    assert by_expression.to_pylist() == [{"n": 1}]


def test_plain_types_replace_every_text_and_bytes_variant_nested_too():
    nested = pa.struct(
        [
            ("s", pa.string_view()),
            ("l", pa.large_list(pa.large_binary())),
            ("m", pa.map_(pa.string_view(), pa.binary_view())),
            ("d", pa.dictionary(pa.int32(), pa.large_string())),
        ]
    )
    assert plain_type(nested) == pa.struct(
        [
            ("s", pa.string()),
            ("l", pa.list_(pa.binary())),
            ("m", pa.map_(pa.string(), pa.binary())),
            ("d", pa.string()),
        ]
    )
    rows = pa.table({"k": pa.array(["a", None], pa.string_view()), "i": pa.array([1, 2])})
    assert plain(rows).schema == pa.schema([("k", pa.string()), ("i", pa.int64())])
    assert plain(rows).column("k").to_pylist() == ["a", None]
    already = pa.table({"k": ["a"]})
    assert plain(already) is already
