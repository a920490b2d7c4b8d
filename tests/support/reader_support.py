"""DuckDB as docs/reading.md's readers use it: with its delta extension, loaded offline by the LOAD
statement the page's one-liner prints (so the page's line is what every DuckDB read here runs)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import duckdb

READING_PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "reading.md")
# the one-liner in the page's DuckDB block: python -c '<code>'
_ONE_LINER = re.compile(r"^-- +python -c '(?P<code>[^']+)'$", re.MULTILINE)


@functools.cache
def documented_delta_load() -> str:
    """The LOAD statement of DuckDB's delta extension that docs/reading.md's one-liner prints, run
    by this interpreter (the environment the page's reader installed duckdb into)."""
    with open(READING_PAGE, encoding="utf-8") as page:
        block = page.read().split("```sql\n-- DuckDB", 1)[1].split("```", 1)[0]
    found = _ONE_LINER.search(block)
    assert found is not None, "docs/reading.md's DuckDB block lost its python -c one-liner"
    printed = subprocess.run(
        [sys.executable, "-c", found["code"]], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return printed.strip()


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute(documented_delta_load())
    return connection
