"""The DAGs load the way Airflow itself loads them, through the real ``airflow`` CLI: no import
error, no deprecation warning in the parse, both DAGs listed from the repo's dags folder.

One fresh AIRFLOW_HOME (SQLite) for the module: ``airflow db migrate`` once, then in two Python
environments ``airflow dags reserialize`` (parses the dags folder in-process, as the dag-processor
does, with the dags folder on ``sys.path``), ``airflow dags list-import-errors`` and ``airflow dags
list`` (both read what the parse stored).

* **the venv as is**: the venv's ``airflow`` script (``make test`` runs it with the editable install;
  a helper worktree sets PYTHONPATH=<worktree>/include, which precedes it on ``sys.path``).
* **PYTHONPATH only**: the editable install hidden. It is a ``.pth`` file in site-packages that
  installs a meta-path finder, so the CLI runs as ``python -S`` (no ``.pth`` processing) with the
  venv's site-packages appended to ``sys.path`` by hand and PYTHONPATH=<repo>/include; the wrapper
  first asserts that no editable finder is installed and that both packages come from
  ``<repo>/include``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "include"
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
WITHOUT_EDITABLE_INSTALL = f"""
import sys
sys.path.append({SITE_PACKAGES!r})
assert not any("editable" in type(finder).__module__ for finder in sys.meta_path), sys.meta_path
import mongo_cdc, mongo_cdc_airflow
for package in (mongo_cdc, mongo_cdc_airflow):
    assert package.__file__.startswith({str(INCLUDE)!r}), package.__file__
from airflow.__main__ import main
sys.argv[0] = "airflow"
sys.exit(main())
"""


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return fresh_airflow_home(tmp_path_factory.mktemp("airflow-cli"), INCLUDE / "sources")


def fresh_airflow_home(home: Path, sources: Path) -> dict[str, str]:
    """The environment of a new, migrated AIRFLOW_HOME that parses the repo's dags for ``sources``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MONGO_CDC"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        MONGO_CDC_SOURCES_DIR=str(sources),
    )
    airflow(env, "db", "migrate")
    return env


def last_line(output: str) -> str:
    """The CLI's result: Airflow logs to stdout too, before it."""
    return output.strip().splitlines()[-1]


def airflow(env: dict[str, str], *args: str, editable: bool = True, returncode: int = 0) -> str:
    if editable:
        command = [os.path.join(os.path.dirname(sys.executable), "airflow"), *args]
    else:
        env = {**env, "PYTHONPATH": str(INCLUDE)}
        command = [sys.executable, "-S", "-c", WITHOUT_EDITABLE_INSTALL, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == returncode, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("editable", [True, False], ids=["venv", "pythonpath-only"])
def test_the_dags_load_with_no_import_error(airflow_home, editable):
    parse_log = airflow(airflow_home, "dags", "reserialize", editable=editable)
    assert "deprecated" not in parse_log.lower(), parse_log  # issue 10 item 8: no warnings we cause
    errors = airflow(airflow_home, "dags", "list-import-errors", "-o", "json", editable=editable)
    assert json.loads(last_line(errors)) == [], errors
    dags = json.loads(last_line(airflow(airflow_home, "dags", "list", "-o", "json", editable=editable)))
    assert {"mongo_cdc__inventory", "mongo_cdc_topology__inventory"} <= {dag["dag_id"] for dag in dags}
    assert {dag["fileloc"] for dag in dags if "inventory" in dag["dag_id"]} == {
        str(REPO / "dags/mongo_cdc_dags.py")
    }


def test_a_badly_named_source_is_an_import_error_naming_it_and_the_good_sources_dags_load(tmp_path):
    """Issue 25 item 2: a file name that cannot be a DAG id hid every source's DAGs (the whole DAG
    file failed to import); now only that source is refused, in mongo_cdc_source_config.py's error,
    like invalid YAML and two sources that would write the same tables."""
    sources = tmp_path / "sources"
    sources.mkdir()
    lake = tmp_path / "lake"
    (sources / "shop.yaml").write_text(f"topic.prefix: shop\nlake.root: {lake}\n")
    (sources / "orders v2.yaml").write_text(f"topic.prefix: orders\nlake.root: {lake}\n")
    (sources / "broken.yaml").write_text("topic.prefix: [unclosed\n")
    for twin in ("billing.yaml", "invoices.yaml"):  # would write the same tables
        (sources / twin).write_text(f"topic.prefix: billing\nlake.root: {lake}\n")
    env = fresh_airflow_home(tmp_path / "home", sources)
    airflow(env, "dags", "reserialize")
    # the CLI exits 1 when there are import errors
    errors = json.loads(last_line(airflow(env, "dags", "list-import-errors", "-o", "json", returncode=1)))
    assert [error["filepath"].rsplit("/", 1)[-1] for error in errors] == ["mongo_cdc_source_config.py"]
    assert f"{sources / 'orders v2.yaml'}: the file name 'orders v2' is the source name" in errors[0]["error"]
    assert "rename the file, e.g. to orders_v2.yaml" in errors[0]["error"]
    assert f"{sources / 'broken.yaml'}: not valid YAML" in errors[0]["error"]
    assert (
        f"{sources / 'billing.yaml'}: key 'topic.prefix' is 'billing', the same as in "
        f"{sources / 'invoices.yaml'} with the same lake root {lake}"
    ) in errors[0]["error"]
    dags = json.loads(last_line(airflow(env, "dags", "list", "-o", "json")))
    assert {dag["dag_id"] for dag in dags if dag["dag_id"].startswith("mongo_cdc")} == {
        "mongo_cdc__shop",
        "mongo_cdc_topology__shop",
    }
