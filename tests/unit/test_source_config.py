"""Source YAML validation: every rule, every problem of a file at once, unique topic prefixes."""

from __future__ import annotations

import pytest
import yaml

from mongo_cdc.config import SourceConfigError, load_source, load_sources


def write(tmp_path, content: dict | str, name: str = "orders.yaml"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def test_defaults_follow_debezium(tmp_path, monkeypatch):
    monkeypatch.setenv("MONGO_CDC_LAKE_ROOT", str(tmp_path / "lake"))
    config = load_source(write(tmp_path, {"topic.prefix": "shop"}))
    assert (config.name, config.topic_prefix, config.lake_root) == ("orders", "shop", str(tmp_path / "lake"))
    assert config.snapshot_mode == "initial" and config.capture_mode == "change_streams_update_full"
    # max.batch.size is not Debezium's 2048: each micro-batch is a file and two Delta commits here
    assert (config.max_batch_size, config.snapshot_max_threads, config.tombstones_on_delete) == (
        16384,
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
        (
            {"topic.prefix": "p", "max.batch.size": 0},
            "key 'max.batch.size' must be an integer from 1 to 1000000",
        ),
        (
            {"topic.prefix": "p", "snapshot.max.threads": -2},
            "key 'snapshot.max.threads' must be an integer from 1 to 64, got -2",
        ),
        (
            {"topic.prefix": "p", "max.batch.size": 5_000_000},
            "key 'max.batch.size' must be an integer from 1 to 1000000, got 5000000",
        ),
        (
            {"topic.prefix": "p", "connect.backoff.max.delay.ms": 10**12},
            "key 'connect.backoff.max.delay.ms' must be an integer from 1 to 3600000",
        ),
        (
            "topic.prefix: p\ntombstones.on.delete: yes\n",
            "key 'tombstones.on.delete' must be true or false, got 'yes'",
        ),
        ("topic.prefix: p\nflatten.struct: off\n", "key 'flatten.struct' must be true or false, got 'off'"),
        (
            "topic.prefix: p\nmax.batch.size: 10\nmax.batch.size: 20\n",
            "key 'max.batch.size' appears twice (lines 2 and 3)",
        ),
        ({"topic.prefix": "p", "colection.include.list": ["a"]}, "did you mean 'collection.include.list'?"),
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
            "key 'connect.backoff.max.delay.ms' is 10; it must be >= "
            "'connect.backoff.initial.delay.ms' (5000)",
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


def test_true_and_false_are_the_only_booleans_and_yes_stays_text(tmp_path):
    config = load_source(
        write(tmp_path, "topic.prefix: 'on'\ntombstones.on.delete: false\nflatten.struct: True\n")
    )
    assert (config.topic_prefix, config.tombstones_on_delete, config.flatten_struct) == ("on", False, True)
    assert load_source(write(tmp_path, "topic.prefix: yes\n", "yes.yaml")).topic_prefix == "yes"


def test_every_problem_of_a_file_is_reported_each_with_key_value_and_what_is_allowed(tmp_path):
    path = write(
        tmp_path,
        "topic.prefix: p\n"
        "tombstones.on.delete: yes\n"
        "snapshot.max.threads: 1000\n"
        "snapshot.mode: sometimes\n"
        "colections: [a]\n"
        "max.batch.size: 10\n"
        "max.batch.size: 20\n",
    )
    with pytest.raises(SourceConfigError) as failure:
        load_source(path)
    problems = failure.value.problems
    assert len(problems) == 5 and all(problem.startswith(f"{path}: ") for problem in problems)
    text = str(failure.value)
    assert "key 'max.batch.size' appears twice (lines 6 and 7)" in text
    assert "unknown key 'colections'" in text and "allowed keys:" in text
    assert "key 'tombstones.on.delete' must be true or false, got 'yes'" in text
    assert "key 'snapshot.max.threads' must be an integer from 1 to 64, got 1000" in text
    assert "key 'snapshot.mode' is 'sometimes'; allowed values: initial" in text


def test_two_sources_with_the_same_topic_prefix_and_lake_are_both_refused_naming_each_other(tmp_path):
    lake = str(tmp_path / "lake")
    first = write(tmp_path, {"topic.prefix": "shop", "lake.root": lake}, "a.yaml")
    second = write(tmp_path, {"topic.prefix": "shop", "lake.root": lake}, "b.yaml")
    write(tmp_path, {"topic.prefix": "shop", "lake.root": str(tmp_path / "other")}, "c.yaml")
    write(tmp_path, {"topic.prefix": "inventory", "lake.root": lake}, "d.yaml")
    configs, errors = load_sources(str(tmp_path))
    assert sorted(config.name for config in configs) == ["c", "d"]
    messages = sorted(str(error) for error in errors)
    assert messages[0].startswith(f"{first}: key 'topic.prefix' is 'shop', the same as in {second}")
    assert messages[1].startswith(f"{second}: key 'topic.prefix' is 'shop', the same as in {first}")


def test_a_file_name_that_cannot_be_a_dag_id_is_refused_naming_the_file_and_a_name_that_can(tmp_path):
    bad = write(tmp_path, {"topic.prefix": "orders"}, "orders v2.yaml")
    with pytest.raises(SourceConfigError) as refused:
        load_source(str(bad))
    assert refused.value.problems == (
        f"{bad}: the file name 'orders v2' is the source name, part of its DAG id mongo_cdc__<name>, "
        "and may hold only ASCII letters, digits, '_', '-' and '.' (at most 230); rename the file, "
        "e.g. to orders_v2.yaml",
    )
    unreadable = write(tmp_path, "topic.prefix: [unclosed", "café.yml")
    with pytest.raises(SourceConfigError) as both:
        load_source(str(unreadable))
    name_problem, yaml_problem = both.value.problems  # every problem of the file at once
    assert name_problem.startswith(f"{unreadable}: the file name 'café' is the source name")
    assert name_problem.endswith("rename the file, e.g. to caf_.yml")
    assert yaml_problem.startswith(f"{unreadable}: not valid YAML")
    assert load_source(str(write(tmp_path, {"topic.prefix": "p"}, f"{'a' * 230}.yaml"))).name == "a" * 230
    with pytest.raises(SourceConfigError, match="at most 230"):
        load_source(str(write(tmp_path, {"topic.prefix": "p"}, f"{'a' * 231}.yaml")))


def test_a_topic_prefix_longer_than_an_airflow_tag_is_refused(tmp_path):
    assert load_source(str(write(tmp_path, {"topic.prefix": "p" * 100}))).topic_prefix == "p" * 100
    with pytest.raises(SourceConfigError, match="use at most 100 letters"):
        load_source(str(write(tmp_path, {"topic.prefix": "p" * 101})))


def test_each_broken_source_file_is_refused_alone_and_the_good_ones_load(tmp_path):
    lake = str(tmp_path / "lake")
    write(tmp_path, {"topic.prefix": "shop", "lake.root": lake}, "shop.yaml")
    write(tmp_path, {"topic.prefix": "orders", "lake.root": lake}, "orders v2.yaml")
    write(tmp_path, "topic.prefix: [unclosed", "broken.yaml")
    write(tmp_path, {"topic.prefix": "x", "max.batch.size": 0}, "invalid.yml")
    configs, errors = load_sources(str(tmp_path))
    assert [config.name for config in configs] == ["shop"]
    refused = sorted(error.problems[0].split(": ")[0] for error in errors)
    bad_files = ("orders v2.yaml", "broken.yaml", "invalid.yml")
    assert refused == sorted(str(tmp_path / name) for name in bad_files)


def test_two_files_with_one_source_name_are_both_refused_naming_each_other(tmp_path):
    lake = str(tmp_path / "lake")
    yaml_file = write(tmp_path, {"topic.prefix": "shop", "lake.root": lake}, "shop.yaml")
    yml_file = write(tmp_path, {"topic.prefix": "shop2", "lake.root": lake}, "shop.yml")
    write(tmp_path, {"topic.prefix": "inventory", "lake.root": lake}, "inventory.yaml")
    configs, errors = load_sources(str(tmp_path))
    assert [config.name for config in configs] == ["inventory"]
    assert sorted(str(error) for error in errors) == [
        f"{yaml_file}: the source name 'shop' (the file name without its extension, the DAG id "
        f"mongo_cdc__shop) is also that of {yml_file}; rename one of the files",
        f"{yml_file}: the source name 'shop' (the file name without its extension, the DAG id "
        f"mongo_cdc__shop) is also that of {yaml_file}; rename one of the files",
    ]
