"""The package as a user installs it beside their Airflow: its metadata lists only direct
dependencies as ranges (which the lock, requirements.txt, satisfies), it ships every package and the
Spark entry point, it is an Airflow provider with a config section, and the DAG files a user copies
are the repository's own. tests/system/test_installed_package.py installs the built wheel for real."""

from __future__ import annotations

import json
import tomllib
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
from packaging.requirements import Requirement

from mongo_cdc_airflow import settings
from mongo_cdc_airflow.dag_file import DAG_FILES, main, write_dag_files
from mongo_cdc_airflow.provider import OPTIONS, SECTION, get_provider_info

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def locked() -> dict[str, str]:
    """The lock's pins: requirements.txt, and requirements-dev.txt (the optional OpenLineage provider)."""
    pins = {}
    lines = [
        *(ROOT / "requirements.txt").read_text().splitlines(),
        *(ROOT / "requirements-dev.txt").read_text().splitlines(),
    ]
    for line in lines:
        if line and not line.startswith(("#", "-r")):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_metadata_lists_ranges_that_the_lock_satisfies_and_no_pins():
    requirements = [Requirement(text) for text in PROJECT["project"]["dependencies"]]
    extras = PROJECT["project"]["optional-dependencies"].values()
    requirements += [Requirement(text) for group in extras for text in group]
    pins = locked()
    for requirement in requirements:
        assert not any(spec.operator == "==" for spec in requirement.specifier), requirement
        version = pins[requirement.name.lower()]
        assert requirement.specifier.contains(version), f"{requirement} refuses the lock's {version}"
    # Airflow 3.2, the previous minor release, is allowed as well as the lock's 3.3
    airflow = next(r for r in requirements if r.name == "apache-airflow")
    assert airflow.specifier.contains("3.2.0") and airflow.specifier.contains(pins["apache-airflow"])
    assert len(requirements) < 20  # direct dependencies only, not the lock's 175


def test_every_package_is_shipped_and_the_spark_entry_point_with_them():
    on_disk = sorted(
        ".".join(path.parent.relative_to(ROOT / "include").parts)
        for path in (ROOT / "include").rglob("__init__.py")
    )
    assert PROJECT["tool"]["setuptools"]["packages"] == [*on_disk, "mongo_cdc_spark"]
    assert PROJECT["tool"]["setuptools"]["package-dir"]["mongo_cdc_spark"] == "spark_apps"
    entry_point = Path(settings.spark_app())
    assert entry_point == Path(str(files("mongo_cdc_spark") / "cdc_transform.py"))
    assert entry_point.read_text() == (ROOT / "spark_apps" / "cdc_transform.py").read_text()


def test_the_provider_info_is_valid_and_declares_the_config_section_and_the_hook():
    import airflow

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == PROJECT["project"]["name"]
    assert PROJECT["project"]["entry-points"]["apache_airflow_provider"] == {
        "provider_info": "mongo_cdc_airflow.provider:get_provider_info"
    }
    options = info["config"][SECTION]["options"]
    assert set(options) == set(OPTIONS)
    for name, spec in OPTIONS.items():
        assert spec.legacy_env in options[name]["description"] and options[name]["type"] == spec.kind
    assert info["hooks"][0]["python-modules"] == ["mongo_cdc_airflow.hooks"]


def test_the_config_section_wins_then_the_old_variables_then_the_defaults(monkeypatch, tmp_path):
    for name, spec in OPTIONS.items():
        monkeypatch.delenv(f"AIRFLOW__MONGO_CDC__{name.upper()}", raising=False)
        monkeypatch.delenv(spec.legacy_env, raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(tmp_path / "dags"))
    assert settings.sources_dir() == str(tmp_path / "include" / "sources")
    assert (settings.lake_root(), settings.task_retries()) == (None, 3)
    monkeypatch.setenv("MONGO_CDC_SOURCES_DIR", "/old/sources")
    monkeypatch.setenv("MONGO_CDC_TASK_RETRIES", "0")
    assert (settings.sources_dir(), settings.task_retries()) == ("/old/sources", 0)
    monkeypatch.setenv("AIRFLOW__MONGO_CDC__SOURCES_DIR", "/new/sources")
    monkeypatch.setenv("AIRFLOW__MONGO_CDC__TASK_RETRIES", "5")
    monkeypatch.setenv("AIRFLOW__MONGO_CDC__SPARK_APP", "/opt/job.py")
    assert (settings.sources_dir(), settings.task_retries(), settings.spark_app()) == (
        "/new/sources",
        5,
        "/opt/job.py",
    )
    monkeypatch.setenv("AIRFLOW__MONGO_CDC__TASK_RETRIES", "three")
    with pytest.raises(ValueError, match=r"\[mongo_cdc\] task_retries is 'three'"):
        settings.task_retries()


def test_the_dag_files_a_user_copies_are_the_repositorys_own(tmp_path, capsys):
    assert {path.name: path.read_text() for path in (ROOT / "dags").glob("*.py")} == DAG_FILES
    assert main([str(tmp_path)]) == 0
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == DAG_FILES
    assert main([str(tmp_path)]) == 0  # the same files again: nothing to refuse
    (tmp_path / "mongo_cdc_dags.py").write_text("# mine\n")
    assert main([str(tmp_path)]) == 1
    assert "exists and differs; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "mongo_cdc_dags.py").read_text() == "# mine\n"
    write_dag_files(str(tmp_path), overwrite=True)
    assert (tmp_path / "mongo_cdc_dags.py").read_text() == DAG_FILES["mongo_cdc_dags.py"]


def test_the_deploying_page_lists_every_option_with_its_old_variable_and_default():
    page = (ROOT / "docs" / "deploying.md").read_text(encoding="utf-8")
    section = page.split("### Settings: the `[mongo_cdc]` section", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0] != "option":
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2])
    assert rows == {name: (spec.legacy_env, spec.default) for name, spec in OPTIONS.items()}
