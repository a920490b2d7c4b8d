"""Every legal MongoDB name has its own table path (issue 25 item 1): the escaping of database and
collection names in ``lake.layout``, and Delta tables written and read back at escaped paths by
delta-rs, pyarrow and DuckDB, on a local lake and on S3 (moto)."""

from __future__ import annotations

import string
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyarrow.fs import FileSelector, FileType
from reader_support import duckdb_connection

from mongo_cdc import lake
from mongo_cdc.lake.errors import fix_for
from mongo_cdc.lake.storage import LakeLocation

# MongoDB's longest namespace "<db>.<collection>" is 255 bytes: a one-letter database leaves 253
AT_THE_LIMIT = "é" * 126 + "x"  # 253 bytes of UTF-8, escaped to 759 characters
NAMES = [
    "orders",
    "logs/2024",
    "q1%2023",
    "q1 23",
    "orders#old",
    "what?",
    "café ☕",
    "logs!2F2024",  # the escaped form of logs/2024, as a name of its own
    "!",
    "a*b{c}[d]",
    ".hidden",
    "..",
    "x" * 253,
    AT_THE_LIMIT,
]


def test_plain_names_keep_their_paths():
    plain = string.ascii_letters + string.digits + "_-."
    for name in ("orders", "order_items", "v1.2-final", plain):
        assert lake.name_parts(name) == (name,)
    assert lake.table_path("state", "shop", "shop", "orders") == "state/shop/shop/orders"


def test_a_source_tables_path_is_its_uri_under_the_root():
    path = lake.source_table_path("shop", lake.APPLIED_MARK)
    assert lake.source_table_uri(LakeLocation("/lake"), "shop", lake.APPLIED_MARK) == f"/lake/{path}"
    assert lake.source_table_uri(LakeLocation("s3://bucket/x"), "shop", lake.APPLIED_MARK) == (
        f"s3://bucket/x/{path}"
    )


@pytest.mark.parametrize(
    ("name", "escaped"),
    [
        ("logs/2024", "logs!2F2024"),
        ("q1%2023", "q1!252023"),
        ("orders#old", "orders!23old"),
        ("what?", "what!3F"),
        ("my coll", "my!20coll"),
        ("café ☕", "caf!C3!A9!20!E2!98!95"),
        ("logs!2F2024", "logs!212F2024"),
        (".hidden", "!2Ehidden"),
        ("..", "!2E."),
    ],
)
def test_other_characters_are_escaped_as_their_utf8_bytes(name, escaped):
    assert lake.name_parts(name) == (escaped,)


def test_every_name_round_trips_and_no_two_share_a_path():
    paths = {name: lake.name_parts(name) for name in NAMES}
    assert {name: lake.name_of_parts(parts) for name, parts in paths.items()} == {
        name: name for name in NAMES
    }
    assert len(set(paths.values())) == len(NAMES)
    for parts in paths.values():
        assert all(0 < len(part.encode()) <= lake.layout.SEGMENT_LENGTH for part in parts)
        assert all(set(part) <= lake.layout.PLAIN_CHARACTERS | {"!"} for part in parts)
        assert not parts[0].startswith(".")


def test_a_name_at_mongodbs_length_limit_continues_in_subdirectories():
    parts = lake.name_parts(AT_THE_LIMIT)
    assert len(parts) == 3 and all(part.endswith("!") for part in parts[:-1])
    path = lake.table_path("state", "shop", "d", AT_THE_LIMIT)
    assert path == "/".join(("state", "shop", "d", *parts))
    assert lake.table_names(f"/lake/{path}") == ("state", "d", AT_THE_LIMIT)
    assert lake.table_names(f"s3://bucket/x!/{lake.table_path('raw', 'p', 'a b', 'c/d')}") == (
        "raw",
        "a b",
        "c/d",
    )


def test_a_damaged_files_fix_names_the_collection_not_its_path():
    uri = f"/lake/{lake.table_path('state', 'shop', 'shop', 'logs/2024')}"
    assert '"collections": ["shop.logs/2024"]' in fix_for(uri)


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> LakeLocation:
    if request.param == "local":
        return LakeLocation(str(tmp_path / "lake"))
    return request.getfixturevalue("s3_lake")


def test_delta_rs_and_pyarrow_read_each_table_at_its_escaped_path(location):
    """delta-rs decodes %XX in a table path, which made q1%2023 and q1 23 one table before."""
    uris = {name: lake.table_uri(location, "state", "shop", "db", name) for name in NAMES}
    for index, (name, uri) in enumerate(uris.items()):
        write_deltalake(
            uri, pa.table({"name": [name], "n": [index]}), storage_options=location.storage_options
        )
    for index, (name, uri) in enumerate(uris.items()):
        table = DeltaTable(uri, storage_options=location.storage_options)
        assert table.to_pyarrow_table().to_pylist() == [{"name": name, "n": index}]
        assert lake.table_names(uri) == ("state", "db", name)
        filesystem, base = location.filesystem()  # pyarrow lists the table's files under that path
        listed = filesystem.get_file_info(FileSelector(f"{base}{uri[len(location.root) :]}", recursive=True))
        assert {info.base_name.rsplit(".", 1)[-1] for info in listed if info.type == FileType.File} == {
            "json",
            "parquet",
        }


def test_duckdb_reads_a_table_by_its_escaped_path(tmp_path):
    location, connection = LakeLocation(str(tmp_path / "lake")), duckdb_connection()
    for name in ("orders", "logs/2024", "q1%2023", "orders#old", "café ☕"):
        uri = lake.table_uri(location, "state", "shop", "db", name)
        write_deltalake(uri, pa.table({"name": [name]}))
        assert connection.sql(f"SELECT name FROM delta_scan('{uri}')").fetchall() == [(name,)]
