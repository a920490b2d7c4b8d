"""DuckDB as docs/reading.md's readers use it: with its delta extension, loaded offline."""

from __future__ import annotations

import os

import duckdb
import duckdb_extension_delta

# DuckDB's delta extension from PyPI (duckdb_extension_delta), loaded from its file: no download
DELTA_EXTENSION = os.path.join(
    os.path.dirname(duckdb_extension_delta.__file__),
    "extensions",
    f"v{duckdb.__version__}",
    "delta.duckdb_extension",
)


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute(f"LOAD '{DELTA_EXTENSION}'")
    return connection
