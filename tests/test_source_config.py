"""Source YAML validation: unit tests of every rule, and acceptance (f) through Airflow's DagBag."""

from __future__ import annotations

import pytest
import yaml

from mongo_cdc.config import SourceConfigError, load_source


def write(tmp_path, content: dict | str, name: str = "orders.yaml"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_defaults_follow_debezium(tmp_path, monkeypatch):
    monkeypatch.setenv("MONGO_CDC_LAKE_ROOT", str(tmp_path / "lake"))
    config = load_source(write(tmp_path, {"topic.prefix": "shop"}))
    assert (config.name, config.topic_prefix, config.lake_root) == ("orders", "shop", str(tmp_path / "lake"))
    assert config.snapshot_mode == "initial" and config.capture_mode == "change_streams_update_full"
    assert (config.max_batch_size, config.snapshot_max_threads, config.tombstones_on_delete) == (
        2048,
        1,
        True,
    )
    assert (config.connect_backoff_initial_delay_ms, config.connect_backoff_max_delay_ms) == (1000, 120_000)
    assert config.connect_max_attempts == 16
    assert (config.mongo_conn_id, config.spark_conn_id) == ("mongo_default", "spark_default")


def test_filters_match_whole_names_and_skip_system_databases(tmp_path):
    config = load_source(
        write(
            tmp_path,
            {
                "topic.prefix": "p",
                "database.include.list": "shop,inv.*",
                "collection.exclude.list": [r"shop\.tmp_.*"],
            },
        )
    )
    assert config.captures_collection("shop", "orders")
    assert not config.captures_collection("shop", "tmp_1")
    assert not config.captures_collection("shopping", "orders")  # whole-name match, not a prefix
    assert config.captures_collection("inventory", "x")
    assert not config.captures_collection("shop", "system.views")
    open_config = load_source(write(tmp_path, {"topic.prefix": "p"}, "all.yaml"))
    assert not any(open_config.captures_database(db) for db in ("admin", "local", "config"))


def test_relative_lake_root_is_resolved_next_to_the_file(tmp_path):
    config = load_source(write(tmp_path, {"topic.prefix": "p", "lake.root": "lake"}))
    assert config.lake_root == str(tmp_path / "lake")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"topic.prefix": "p", "snapshot.mdoe": "initial"}, "unknown key 'snapshot.mdoe'"),
        (
            {"topic.prefix": "p", "collection.include.list": ["shop.(orders"]},
            "key 'collection.include.list': invalid regular",
        ),
        (
            {"topic.prefix": "p", "database.include.list": ["a"], "database.exclude.list": ["b"]},
            "key 'database.exclude.list' cannot be used together with 'database.include.list'",
        ),
        ({"topic.prefix": "p", "max.batch.size": 0}, "key 'max.batch.size' must be a positive integer"),
        (
            {"topic.prefix": "p", "snapshot.max.threads": -2},
            "key 'snapshot.max.threads' must be a positive integer",
        ),
        (
            {"topic.prefix": "p", "snapshot.mode": "sometimes"},
            "key 'snapshot.mode' is 'sometimes'; allowed values: initial, when_needed, always, initial_only, "
            "no_data, never",
        ),
        (
            {"topic.prefix": "p", "capture.mode": "oplog"},
            "allowed values: change_streams_update_full, change_streams",
        ),
        (
            {"topic.prefix": "p", "tombstones.on.delete": "yes"},
            "key 'tombstones.on.delete' must be true or false",
        ),
        ({"topic.prefix": "p", "skipped.operations": ["x"]}, "key 'skipped.operations'"),
        ({"database.include.list": ["a"]}, "key 'topic.prefix' is required"),
        ({"topic.prefix": "bad prefix!"}, "key 'topic.prefix' is 'bad prefix!'"),
        (
            {
                "topic.prefix": "p",
                "connect.backoff.initial.delay.ms": 5000,
                "connect.backoff.max.delay.ms": 10,
            },
            "'connect.backoff.max.delay.ms' must be >=",
        ),
        ("topic.prefix: [unclosed", "not valid YAML"),
    ],
)
def test_invalid_values_name_the_file_the_key_and_the_fix(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(SourceConfigError) as failure:
        load_source(path)
    assert str(failure.value).startswith(f"{path}: ")
    assert message in str(failure.value)


def test_malformed_source_is_an_airflow_import_error_naming_file_and_key(airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    sources = tmp_path / "sources"
    sources.mkdir()
    good = write(sources, {"topic.prefix": "good"}, "good.yaml")
    bad = write(sources, {"topic.prefix": "p", "max.batch.size": -1}, "broken.yaml")
    monkeypatch.setenv("MONGO_CDC_SOURCES_DIR", str(sources))
    import os

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    assert len(bag.import_errors) == 1
    (error,) = bag.import_errors.values()
    assert str(bad) in error and "max.batch.size" in error and "positive integer" in error
    assert good.exists() and "mongo_cdc__good" not in bag.dag_ids  # one bad file fails the whole import

    bad.unlink()
    assert "mongo_cdc__good" in DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dag_ids
