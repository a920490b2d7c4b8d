"""The local Airflow's environment (demo and tests) starts its spark-submit runs cheaply."""

from __future__ import annotations

from pathlib import Path

from mongo_cdc_airflow import local_env


def test_local_spark_runs_map_the_class_archive_once_make_has_built_it(tmp_path: Path, monkeypatch) -> None:
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(local_env, "SPARK_CLASS_ARCHIVE", str(archive))
    without = local_env.airflow_env(str(tmp_path / "home"), str(tmp_path / "lake"), "mongodb://h/")
    assert without["SPARK_SUBMIT_OPTS"].split() == ["-XX:TieredStopAtLevel=1"]
    archive.write_bytes(b"made by make")
    with_archive = local_env.airflow_env(str(tmp_path / "home"), str(tmp_path / "lake"), "mongodb://h/")
    assert with_archive["SPARK_SUBMIT_OPTS"].split() == [
        "-XX:TieredStopAtLevel=1",
        f"-XX:SharedArchiveFile={archive}",
    ]
