"""The whole DAG against a lake on S3 (moto's server on loopback, an Airflow ``aws`` connection)."""

from __future__ import annotations

from cdc_support import assert_state_equals_collection, asset_events
from conftest import make_source
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes
from deltalake import DeltaTable

from mongo_cdc.lake import table_uri
from mongo_cdc_airflow.assets import table_asset_uri


def test_snapshot_streaming_and_state_on_an_s3_lake(airflow_db, replica_set, tmp_path, s3_lake, db_name):
    source = make_source(
        tmp_path,
        replica_set.uri,
        db_name,
        storage_options=dict(s3_lake.storage_options),
        **{"lake.root": s3_lake.root, "lake.connection.id": "lake_s3", "max.batch.size": 100},
    )
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 300, "orders": 300, "products": 200})
        source.run()  # snapshot, pull, transform: every table written through the S3 endpoint
        writes = random_writes(db, 300, seed=5)
        run = source.run()
        events = asset_events(source.dag_id, run.run_id)
        for collection in COLLECTIONS:
            # the summary read the tables through the lake connection: their Assets are s3:// URIs
            asset = table_asset_uri(source.location, "state", source.prefix, f"{db_name}.{collection}")
            assert asset.startswith(f"{s3_lake.root}/state/")
            assert events[asset]["rows"] == db[collection].count_documents({})
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
            assert source.streamed_events(collection) == writes.of(collection)
            state = table_uri(source.location, "state", source.prefix, db_name, collection)
            assert state.startswith("s3://")
            assert DeltaTable(state, storage_options=dict(source.storage_options)).version() >= 1
    # nothing of the lake went to the local disk
    assert not (tmp_path / "lake").exists()
