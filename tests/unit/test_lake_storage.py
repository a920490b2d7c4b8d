"""Lake locations (local and s3:// on moto's server): roots, credentials, files, Delta commits."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from s3_support import MOTO_KEY, moto_options

from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc.lake.storage import (
    STORAGE_OPTIONS_ENV,
    LakeLocation,
    LakeRootError,
    _object_store_filesystem,
    file_actions,
    file_stats,
    resolve_root,
    row_count,
)
from mongo_cdc_airflow.lake_storage import lake_location


@pytest.fixture(params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> LakeLocation:
    """The same test on a local lake and on s3://<bucket>/lake (moto)."""
    if request.param == "local":
        return LakeLocation(str(tmp_path / "lake"))
    return request.getfixturevalue("s3_lake")


def test_resolve_root_keeps_uris_and_resolves_relative_paths(tmp_path: Path) -> None:
    assert resolve_root("lake", "/srv/sources") == "/srv/sources/lake"
    assert resolve_root("../lake/", "/srv/sources") == "/srv/lake"
    assert resolve_root("/data/lake", "/srv/sources") == "/data/lake"
    assert resolve_root("s3://bucket/lake/", "/srv") == "s3://bucket/lake"
    assert resolve_root("S3://bucket", "/srv") == "s3://bucket"
    assert resolve_root("abfss://c@acct.dfs.core.windows.net/lake", "/srv").startswith("abfss://c@acct")
    with pytest.raises(LakeRootError, match=r"unsupported scheme 'file://'.*s3://<bucket>.*abfss://"):
        resolve_root("file:///data/lake", "/srv")
    with pytest.raises(LakeRootError, match="names no bucket"):
        resolve_root("gs:///lake", "/srv")


def test_source_config_lake_root_and_connection(tmp_path: Path) -> None:
    def load(**settings: object):
        path = tmp_path / "src.yaml"
        path.write_text(yaml.safe_dump({"topic.prefix": "p", **settings}))
        return load_source(str(path))

    config = load(**{"lake.root": "s3://bucket/lake/", "lake.connection.id": "lake_s3"})
    assert (config.lake_root, config.lake_conn_id) == ("s3://bucket/lake", "lake_s3")
    relative = load(**{"lake.root": "lake"})
    assert (relative.lake_root, relative.lake_conn_id) == (str(tmp_path / "lake"), None)
    with pytest.raises(SourceConfigError, match=r"src.yaml: key 'lake.root': .*unsupported scheme 'hdfs://'"):
        load(**{"lake.root": "hdfs://namenode/lake"})
    with pytest.raises(SourceConfigError, match="'lake.connection.id' must be a non-empty string"):
        load(**{"lake.connection.id": ""})


def test_location_hides_secrets_and_travels_through_env_and_pickle() -> None:
    location = LakeLocation(
        "s3://bucket/lake/",
        {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_REGION": "eu-west-1"},
    )
    assert location.root == "s3://bucket/lake"
    assert "s3cr3t" not in repr(location) and "AKIA1" not in repr(location)
    assert "eu-west-1" in repr(location)
    env = location.to_env()
    assert list(env) == [STORAGE_OPTIONS_ENV]
    assert LakeLocation.from_env(location.root, env) == location
    assert LakeLocation.from_env(location.root, {}) == LakeLocation(location.root)
    assert pickle.loads(pickle.dumps(location)) == location
    with pytest.raises(ValueError, match=STORAGE_OPTIONS_ENV) as error:
        LakeLocation.from_env(location.root, {STORAGE_OPTIONS_ENV: '{"AWS_SECRET_ACCESS_KEY": "s3cr3t"'})
    assert "s3cr3t" not in str(error.value)
    with pytest.raises(LakeRootError, match="relative"):
        LakeLocation("lake")
    assert location.table_uri("state", "p", "db", "c") == "s3://bucket/lake/state/p/db/c"
    assert LakeLocation("/lake").table_uri("raw", "p") == "/lake/raw/p"
    with pytest.raises(ValueError, match="without '/'"):
        location.table_uri("state", "a/b")


def test_lake_location_from_airflow_connections(s3_bucket: str, lake_s3_connection: str, moto_endpoint: str):
    location = lake_location(f"s3://{s3_bucket}/lake", lake_s3_connection)
    assert location.storage_options == moto_options(moto_endpoint)
    assert lake_location(f"s3://{s3_bucket}/lake", None).storage_options == {}
    with pytest.raises(
        ValueError, match="lake.connection.id 'lake_s3' is set but lake.root '/lake' is a local"
    ):
        lake_location("/lake", lake_s3_connection)


def test_filesystem_reads_writes_lists_and_deletes_files(lake: LakeLocation) -> None:
    fs, base = lake.filesystem()
    table = pa.table({"x": list(range(1000))})
    with lake.open_output("raw", "p", "db", "c", "part-0.parquet") as out:
        pq.write_table(table, out)
    with lake.open_output("raw", "p", "_snapshots", "m.json") as out:
        out.write(b'{"seq": 1}')
    assert pq.read_table(f"{base}/raw/p/db/c/part-0.parquet", filesystem=fs).equals(table)
    with fs.open_input_stream(f"{base}/raw/p/_snapshots/m.json") as stream:
        assert stream.read() == b'{"seq": 1}'
    listed = fs.get_file_info(pafs.FileSelector(f"{base}/raw", recursive=True))
    files = ["/raw/p/_snapshots/m.json", "/raw/p/db/c/part-0.parquet"]
    assert sorted(i.path[len(base) :] for i in listed if i.type == pafs.FileType.File) == files
    if not lake.is_local:  # no directory marker objects
        bucket, prefix = base.split("/", 1)
        keys = [o["Key"] for o in _s3_client(lake).list_objects_v2(Bucket=bucket)["Contents"]]
        assert sorted(keys) == [f"{prefix}{file}" for file in files]
    fs.delete_file(f"{base}/raw/p/_snapshots/m.json")
    assert fs.get_file_info(f"{base}/raw/p/_snapshots/m.json").type == pafs.FileType.NotFound
    # the file is where a Delta reader of the same root, with the same options, looks for it
    assert lake.table_uri("raw", "p", "db", "c").endswith(f"{base.rsplit('/', 1)[-1]}/raw/p/db/c")


def test_object_store_filesystem_writes_bytes(s3_bucket: str, moto_endpoint: str) -> None:
    """The delta-rs handler used for gs:// and abfs(s):// roots, exercised here on S3."""
    fs = _object_store_filesystem(f"s3://{s3_bucket}", moto_options(moto_endpoint))
    with fs.open_output_stream("lake/a.json") as out:
        out.write(b"{}")
    pq.write_table(pa.table({"x": [1, 2]}), "lake/b.parquet", filesystem=fs)
    with fs.open_input_stream("lake/a.json") as stream:
        assert stream.read() == b"{}"
    assert pq.read_table("lake/b.parquet", filesystem=fs).column("x").to_pylist() == [1, 2]


def test_s3_filesystem_refuses_options_it_cannot_honour(s3_bucket: str) -> None:
    location = LakeLocation(f"s3://{s3_bucket}/lake", {"AWS_S3_ADDRESSING_STYLE": "virtual"})
    with pytest.raises(ValueError, match="'AWS_S3_ADDRESSING_STYLE' has no pyarrow S3FileSystem equivalent"):
        location.filesystem()


def test_delta_commits_app_transactions_and_conflicts(lake: LakeLocation) -> None:
    """What the lake relies on: app transactions, and a racing commit never overwriting another."""
    uri, options = lake.table_uri("raw", "p", "db", "c"), lake.storage_options
    started = time.monotonic()
    batch = pa.table({"seq": [1, 1], "hour": ["2026-01-01T00", "2026-01-01T01"]})
    write_deltalake(
        uri,
        batch,
        partition_by=["hour"],
        storage_options=options,
        commit_properties=CommitProperties(app_transactions=[Transaction("mongo_cdc:p:rs0", 1)]),
    )
    stale = DeltaTable(uri, storage_options=options)  # both writers read version 0
    other = DeltaTable(uri, storage_options=options)
    second = pa.table({"seq": [2], "hour": ["2026-01-01T01"]})
    write_deltalake(
        other,
        second,
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("mongo_cdc:p:rs0", 2)]),
    )
    # a retry of batch 2 by a writer that has not seen it: refused, not committed twice
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        write_deltalake(
            stale,
            second,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction("mongo_cdc:p:rs0", 2)]),
        )
    # a stale writer without a conflict lands on the next version (the commit is a conditional put)
    write_deltalake(DeltaTable(uri, storage_options=options, version=0), batch.slice(0, 1), mode="append")
    table = DeltaTable(uri, storage_options=options)
    print(f"{lake.root}: 4 commits and 3 table loads in {time.monotonic() - started:.2f}s")
    assert table.version() == 2
    assert table.transaction_version("mongo_cdc:p:rs0") == 2
    assert sorted(table.to_pyarrow_table().column("seq").to_pylist()) == [1, 1, 1, 2]
    assert [entry["operation"] for entry in table.history()] == ["WRITE", "WRITE", "WRITE"]


def test_moto_refuses_to_overwrite_on_conditional_put(s3_lake: LakeLocation) -> None:
    """The store side of delta-rs' commit: ``If-None-Match: *`` on an existing key fails."""
    with s3_lake.open_output("k") as out:
        out.write(b"1")
    client = _s3_client(s3_lake)
    bucket, key = s3_lake.filesystem()[1].split("/", 1)
    with pytest.raises(client.exceptions.ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key=f"{key}/k", Body=b"2", IfNoneMatch="*")


def _s3_client(lake: LakeLocation):
    return boto3.client(
        "s3",
        endpoint_url=lake.storage_options["AWS_ENDPOINT_URL"],
        aws_access_key_id=MOTO_KEY,
        aws_secret_access_key=MOTO_KEY,
        region_name=lake.storage_options["AWS_REGION"],
    )


def test_file_actions_give_each_files_rows_statistics_and_partition_values(tmp_path: Path) -> None:
    rows = pa.table({"hour": ["h1", "h1", "h2"], "k": ["b", "a", "c"], "n": [1, 2, 3]})
    write_deltalake(tmp_path / "t", rows, partition_by=["hour"])
    table = DeltaTable(tmp_path / "t")
    actions = file_actions(table).sort_by("num_records")
    assert actions.column("num_records").to_pylist() == [1, 2] and row_count(table) == 3
    assert file_stats(actions, "partition", "hour") == ["h2", "h1"]
    assert file_stats(actions, "min", "k") == ["c", "a"] and file_stats(actions, "max", "k") == ["c", "b"]
    assert file_stats(actions, "max", "no such column") is None
    assert file_stats(actions, "no such statistic", "k") is None
