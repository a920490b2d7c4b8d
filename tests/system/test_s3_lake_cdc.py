"""The whole DAG against a lake on S3 (moto's server on loopback, an Airflow ``aws`` connection)."""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap

from cdc_support import assert_state_equals_collection, asset_events
from conftest import make_source
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes
from deltalake import DeltaTable
from s3_support import SECRET_LAKE_CONN_ID

from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import STORAGE_OPTIONS_ENV
from mongo_cdc_airflow.assets import table_asset_uri

SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")


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


def test_the_lake_secret_is_on_no_command_line_and_in_no_log(
    airflow_db, replica_set, tmp_path, s3_lake_with_a_unique_secret, monkeypatch, caplog, db_name
):
    location = s3_lake_with_a_unique_secret
    secret = location.storage_options["AWS_SECRET_ACCESS_KEY"]
    # a spark-submit first on PATH: records its arguments, whether its environment holds the lake's
    # options, and the real spark-submit's output (which the task logs line by line)
    fake = tmp_path / "bin"
    fake.mkdir()
    calls, output = tmp_path / "spark-submit-calls", tmp_path / "spark-submit-output"
    (fake / "spark-submit").write_text(
        textwrap.dedent(f"""\
            #!{sys.executable}
            import json, os, subprocess, sys
            with open({str(calls)!r}, "a") as record:
                record.write(json.dumps([sys.argv, {STORAGE_OPTIONS_ENV!r} in os.environ]) + "\\n")
            argv = [{SPARK_SUBMIT!r}, *sys.argv[1:]]
            spark = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            with open({str(output)!r}, "ab") as record:
                for line in spark.stdout:
                    record.write(line)
                    sys.stdout.buffer.write(line)
            sys.exit(spark.wait())
        """)
    )
    (fake / "spark-submit").chmod(0o700)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    source = make_source(
        tmp_path,
        replica_set.uri,
        db_name,
        storage_options=dict(location.storage_options),
        **{"lake.root": location.root, "lake.connection.id": SECRET_LAKE_CONN_ID, "max.batch.size": 100},
    )
    caplog.set_level(logging.INFO)
    with replica_set.client() as client:
        load(client[db_name], {"customers": 50, "orders": 80, "products": 30})
        source.run()
        for collection in COLLECTIONS:
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
    (argv, environment_has_options), *others = [json.loads(line) for line in calls.read_text().splitlines()]
    assert not others and environment_has_options
    command = " ".join(argv)
    assert "cdc_transform.py" in command and "spark.ui.enabled=false" in command
    assert secret not in command
    # Spark's log and the job's summary (the task logs them), and the Airflow side's log
    spark_log = output.read_text(errors="replace")
    assert '"collections"' in spark_log and "SparkContext" in spark_log
    assert secret not in spark_log
    assert "Spark properties" in caplog.text and secret not in caplog.text
    # the variable was the task's only while spark-submit ran
    assert STORAGE_OPTIONS_ENV not in os.environ
