"""With the OpenLineage provider installed and configured (a file transport here), a DAG run's
events, on a local lake and on S3, name the MongoDB collections as the pull's and snapshot's inputs,
the raw Delta tables as their outputs, and the transform's raw inputs and changes and state outputs,
the state with its columns.

The run is ``airflow dags test`` in its own process: the provider's listener is set up when Airflow
loads its plugins, from the configuration of that moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import make_source
from s3_support import LAKE_CONN_ID

from mongo_cdc_airflow.assets import table_asset_uri


def lineage_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def datasets(events: list[dict], task: str, direction: str) -> set[tuple[str, str]]:
    """(namespace, name) of the ``inputs`` or ``outputs`` of the COMPLETE events of ``task``."""
    return {
        (dataset["namespace"], dataset["name"])
        for event in events
        if event["eventType"] == "COMPLETE" and event["job"]["name"].endswith(f".{task}")
        for dataset in event[direction]
    }


def openlineage_name(uri: str) -> tuple[str, str]:
    """(namespace, name) of a table's Asset URI under OpenLineage's naming: ``file`` and the path
    for a local lake, ``s3://<bucket>`` and the key for S3."""
    if uri.startswith("file://"):
        return "file", uri.removeprefix("file://")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return f"s3://{bucket}", key


def test_a_run_reports_collections_in_and_delta_tables_out(
    airflow_db, replica_set, db_name, tmp_path, local_or_s3_lake
):
    lake_settings = (
        {"lake.root": local_or_s3_lake.root, "lake.connection.id": LAKE_CONN_ID}
        if local_or_s3_lake.storage_options
        else {}
    )
    source = make_source(
        tmp_path,
        replica_set.uri,
        db_name,
        storage_options=dict(local_or_s3_lake.storage_options),
        **lake_settings,
    )
    with replica_set.client() as client:
        client[db_name].items.insert_many([{"_id": i, "v": i} for i in range(5)])
        host = client.address
    log_file = tmp_path / "lineage.jsonl"
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(log_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "mongo-cdc-test",
        # the provider sends each event from a forked process it gives 10 s by default; this loaded
        # 2-core test machine can need more
        "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "60",
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "dags", "test", source.dag_id],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (tmp_path / "dags-test.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = lineage_events(log_file)

    collection = (f"mongodb://{host[0]}:{host[1]}", f"{db_name}.items")
    raw, changes, state = (
        openlineage_name(table_asset_uri(source.location, zone, source.prefix, f"{db_name}.items"))
        for zone in ("raw", "changes", "state")
    )
    assert raw[0] == ("file" if source.location.is_local else f"s3://{source.lake_root[5:].split('/')[0]}")
    assert datasets(events, "snapshot", "inputs") == {collection}
    assert datasets(events, "snapshot", "outputs") == {raw}
    assert datasets(events, "transform", "inputs") == {raw}
    assert datasets(events, "transform", "outputs") == {changes, state}
    [state_schema] = [
        dataset["facets"]["schema"]["fields"]
        for event in events
        if event["eventType"] == "COMPLETE" and event["job"]["name"].endswith(".transform")
        for dataset in event["outputs"]
        if dataset["name"] == state[1]
    ]
    assert {"_id", "v", "__key", "__doc_bson"} <= {field["name"] for field in state_schema}


def test_object_store_tables_and_odd_collection_names_follow_the_openlineage_naming():
    """The provider's own converters make the names: ``s3://bucket`` with the key as the name, and a
    MongoDB collection whose name holds what a URI path cannot (percent-encoded in the URI)."""
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset
    from airflow.sdk import Asset

    from mongo_cdc.lake.storage import LakeLocation
    from mongo_cdc_airflow.lineage import collection_uri

    table = table_asset_uri(LakeLocation("s3://bucket/lake"), "state", "acc", "db.orders")
    state = translate_airflow_asset(Asset(table), None)
    assert (state.namespace, state.name) == ("s3://bucket", "lake/state/acc/db/orders")
    collection = translate_airflow_asset(Asset(collection_uri("mongo-0.internal", "shop.logs/2024")), None)
    assert (collection.namespace, collection.name) == ("mongodb://mongo-0.internal:27017", "shop.logs%2F2024")
