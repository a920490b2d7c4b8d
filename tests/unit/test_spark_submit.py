"""The transform task's own pieces: the shipped package zip and the Spark properties it passes."""

from __future__ import annotations

import json
import os
import sys
import zipfile

import pytest

import mongo_cdc
from mongo_cdc.config import load_source
from mongo_cdc.lake.storage import STORAGE_OPTIONS_ENV
from mongo_cdc_airflow.spark_submit import (
    CdcTransformOperator,
    environment,
    package_zip,
    spark_conf,
    submit_settings,
)


def test_the_package_zip_holds_the_importable_package_and_is_built_once(tmp_path):
    path = package_zip(str(tmp_path))
    package_dir = os.path.dirname(mongo_cdc.__file__)
    expected = sorted(
        "mongo_cdc/" + os.path.relpath(os.path.join(d, f), package_dir)
        for d, _, files in os.walk(package_dir)
        for f in files
        if f.endswith(".py")
    )
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == expected
        assert (
            archive.read("mongo_cdc/transform/flatten.py")
            == open(os.path.join(package_dir, "transform", "flatten.py"), "rb").read()
        )
    built = os.stat(path).st_mtime_ns
    assert package_zip(str(tmp_path)) == path
    assert os.stat(path).st_mtime_ns == built
    assert os.listdir(tmp_path) == [os.path.basename(path)]


def test_spark_properties_default_to_this_python_and_the_connection_overrides_them():
    assert spark_conf("spark_default", {"deploy-mode": "client"}) == {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
    }
    extra = {
        "conf": {
            "spark.pyspark.python": "/opt/py/bin/python3",
            "spark.executor.cores": 2,
            "spark.eventLog.enabled": True,
        }
    }
    assert spark_conf("spark_default", extra, {"spark.executor.cores": "1", "spark.ui.enabled": "true"}) == {
        "spark.pyspark.python": "/opt/py/bin/python3",
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "true",
        "spark.executor.cores": "2",
        "spark.eventLog.enabled": "true",
    }


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ("spark.executor.memory=2g", "extra 'conf' must be a JSON object of Spark properties"),
        ({"executor.memory": "2g"}, "key 'executor.memory' is not a Spark property"),
        ({"spark.executor.memory": ["2g"]}, "property 'spark.executor.memory' must be a string"),
    ],
)
def test_a_bad_conf_extra_names_the_connection_and_the_fix(conf, message):
    with pytest.raises(ValueError, match="Spark connection 'etl_spark': ") as error:
        spark_conf("etl_spark", {"conf": conf})
    assert message in str(error.value)


def test_python_files_named_in_the_connection_are_shipped_with_the_package():
    extra = {"conf": {"spark.submit.pyFiles": "/opt/libs/extra.zip", "spark.executor.cores": "2"}}
    conf, py_files = submit_settings("spark_default", extra, None, None)
    assert py_files == f"/opt/libs/extra.zip,{package_zip()}"
    assert "spark.submit.pyFiles" not in conf and conf["spark.executor.cores"] == "2"


def test_the_environment_holds_the_variables_only_inside_the_block(monkeypatch):
    monkeypatch.setenv("MONGO_CDC_TEST_KEPT", "before")
    monkeypatch.delenv("MONGO_CDC_TEST_NEW", raising=False)
    with environment({"MONGO_CDC_TEST_KEPT": "during", "MONGO_CDC_TEST_NEW": "during"}):
        assert os.environ["MONGO_CDC_TEST_KEPT"] == os.environ["MONGO_CDC_TEST_NEW"] == "during"
    assert os.environ["MONGO_CDC_TEST_KEPT"] == "before" and "MONGO_CDC_TEST_NEW" not in os.environ
    with pytest.raises(RuntimeError), environment({"MONGO_CDC_TEST_NEW": "during"}):
        raise RuntimeError
    assert "MONGO_CDC_TEST_NEW" not in os.environ


def test_a_cluster_mode_driver_is_refused_the_lake_connection_and_told_the_fixes(monkeypatch, tmp_path):
    secret = "s3cr3t-of-the-lake"
    lake = {"conn_type": "aws", "login": "key-id", "password": secret, "extra": {"region_name": "us-east-1"}}
    spark = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_UNIT", json.dumps(lake))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_UNIT", json.dumps(spark))
    source = tmp_path / "unit.yaml"
    source.write_text("topic.prefix: unit\nlake.root: s3://b/lake\nlake.connection.id: lake_unit\n")
    config = load_source(str(source))
    operator = CdcTransformOperator(
        task_id="transform", application="job.py", conn_id="spark_unit", config=config
    )
    with pytest.raises(ValueError, match="cluster deploy mode") as error:
        operator.execute({})
    assert "client deploy mode" in str(error.value) and STORAGE_OPTIONS_ENV in str(error.value)
    assert secret not in str(error.value) and STORAGE_OPTIONS_ENV not in os.environ
