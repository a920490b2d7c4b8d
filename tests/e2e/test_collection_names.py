"""Every collection name MongoDB accepts lands in its own tables (issue 25 item 1): ``/``, ``%XX``,
``#``, spaces, non-ASCII, a name equal to another's escaped form and one at MongoDB's namespace
limit, next to a plain ``orders``, through snapshot and stream; each table read back by its escaped
path with delta-rs, DuckDB and Spark."""

from __future__ import annotations

import os

from cdc_support import assert_state_equals_collection
from reader_support import duckdb_connection

from mongo_cdc import lake
from mongo_cdc.lake.readers import read_table, spark_table

ODD_NAMES = ["logs/2024", "q1%2023", "orders#old", "café ☕", "logs!2F2024", "q1 23?"]
NAMESPACE_LIMIT = 255  # bytes of "<db>.<collection>"


def longest_collection(db: str) -> str:
    """A non-ASCII collection name whose namespace has exactly MongoDB's longest length."""
    length = NAMESPACE_LIMIT - len(db.encode()) - 1
    return "é" * (length // 2) + "x" * (length % 2)


def test_every_legal_collection_name_lands_in_its_own_table(cdc_source, replica_set, db_name, spark):
    source = cdc_source(db_name)
    names = ["orders", *ODD_NAMES, longest_collection(db_name)]
    assert len(f"{db_name}.{names[-1]}".encode()) == NAMESPACE_LIMIT
    with replica_set.client() as client:
        database = client[db_name]
        for index, name in enumerate(names):
            database[name].insert_many([{"_id": n, "name": name, "n": n} for n in range(index + 2)])
        source.run()  # the snapshot
        for name in names:
            database[name].insert_one({"_id": "streamed", "name": name})
            database[name].update_one({"_id": 0}, {"$set": {"n": -1}})
            database[name].delete_one({"_id": 1})
        source.run()  # the stream
        for name in names:
            assert_state_equals_collection(source, client, name)

    connection = duckdb_connection()
    for name in names:
        state = lake.table_uri(source.location, "state", source.prefix, db_name, name)
        parts = lake.name_parts(name)
        assert state == os.path.join(source.lake_root, "state", source.prefix, db_name, *parts)
        assert os.path.isdir(os.path.join(state, "_delta_log"))
        live = names.index(name) + 2  # inserted index + 2, one streamed in, one deleted
        assert read_table(state, columns=["name"]).column("name").to_pylist() == [name] * live
        counted = connection.execute(f"SELECT count(*) FROM delta_scan('{state}') WHERE name = ?", [name])
        assert counted.fetchall() == [(live,)]
        assert spark_table(spark, state).where("__id = '\"streamed\"'").count() == 1
        changes = lake.table_uri(source.location, "changes", source.prefix, db_name, name)
        ops = sorted(read_table(changes, columns=["__op"]).column("__op").to_pylist())
        assert ops == sorted(["r"] * live + ["c", "u", "d"])
