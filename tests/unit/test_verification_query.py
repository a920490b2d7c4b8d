"""docs/semantics.md's query for the drift of the last verification, run as written (DuckDB) on a
verification log of a sharded source: each shard verifies at its own time, so the last verification
is each replica set's, not the log's latest row (which is one shard's)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from reader_support import duckdb_connection

from mongo_cdc.lake.verification_log import VERIFICATION_LOG_SCHEMA, RangeReport

PAGE = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
LOG_PLACEHOLDER = "<lake.root>/raw/<topic.prefix>/_verifications"


def page_query() -> str:
    section = PAGE.read_text(encoding="utf-8").split("## Verification", 1)[1]
    return re.search(r"```sql\n(.*?)```", section, re.S)[1]


def test_the_pages_query_finds_the_drift_of_each_shards_last_verification(tmp_path):
    def at(minute: int) -> dt.datetime:
        return dt.datetime(2026, 1, 2, 0, minute, tzinfo=dt.timezone.utc)

    def rows(verification: str, rs: str, minute: int, missing: int) -> list[dict]:
        report = RangeReport("shop.orders", 0, 1, "[MinKey, MaxKey)", 10, 10 - missing, missing=missing)
        return [report.to_row(verification, rs, 1, 1, None, at(minute))]

    log = [
        *rows("v1", "shard-a", 0, 5),  # an older verification of shard-a: drift healed since
        *rows("v2", "shard-a", 30, 2),  # shard-a's last one: drift
        *rows("v3", "shard-b", 40, 0),  # shard-b's last one, the log's latest row: clean
    ]
    path = tmp_path / "_verifications"
    write_deltalake(str(path), pa.Table.from_pylist(log, schema=VERIFICATION_LOG_SCHEMA))
    query = page_query()
    assert LOG_PLACEHOLDER in query
    found = duckdb_connection().sql(query.replace(LOG_PLACEHOLDER, str(path))).fetchall()
    assert [(row[0], row[1], row[2]) for row in found] == [("shard-a", "shop.orders", "[MinKey, MaxKey)")]
    assert found[0][3] == 2  # missing, as shard-a's last verification found it
