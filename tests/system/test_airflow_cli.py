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
    home = tmp_path_factory.mktemp("airflow-cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MONGO_CDC"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        MONGO_CDC_SOURCES_DIR=str(INCLUDE / "sources"),
    )
    airflow(env, "db", "migrate")
    return env


def last_line(output: str) -> str:
    """The CLI's result: Airflow logs to stdout too, before it."""
    return output.strip().splitlines()[-1]


def airflow(env: dict[str, str], *args: str, editable: bool = True) -> str:
    if editable:
        command = [os.path.join(os.path.dirname(sys.executable), "airflow"), *args]
    else:
        env = {**env, "PYTHONPATH": str(INCLUDE)}
        command = [sys.executable, "-S", "-c", WITHOUT_EDITABLE_INSTALL, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
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
