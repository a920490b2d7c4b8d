"""The DAG pages are the on-call runbook: every task, param and failure they name is real."""

from __future__ import annotations

from pathlib import Path

from mongo_cdc.config import load_source
from mongo_cdc_airflow.dag_factory import build_cdc_dag, build_topology_dag
from mongo_cdc_airflow.runbook import FAILURES

INCLUDE = Path(__file__).resolve().parents[2] / "include"


def _config(tmp_path):
    (tmp_path / "shop.yaml").write_text("topic.prefix: shop\n")
    return load_source(str(tmp_path / "shop.yaml"))


def test_the_cdc_dag_page_names_every_task_param_and_where_things_are(tmp_path):
    dag = build_cdc_dag(_config(tmp_path))
    page = dag.doc_md
    assert [task.task_id for task in dag.tasks if f"`{task.task_id}`" not in page] == []
    assert [param.schema["title"] for param in dag.params.values() if param.schema["title"] not in page] == []
    for where in ("mongo_cdc.shop.<replica set>", "mongo_cdc.shop.topology", str(tmp_path / "shop.yaml")):
        assert where in page
    assert "docs/offsets.md" in page


def test_every_failure_the_page_explains_is_a_message_the_code_raises():
    code = "\n".join(path.read_text() for path in INCLUDE.rglob("*.py") if path.name != "runbook.py")
    assert [start for start, _ in FAILURES if start not in code] == []


def test_the_topology_dag_page_says_what_it_watches_and_triggers(tmp_path):
    page = build_topology_dag(_config(tmp_path)).doc_md
    assert "mongo_cdc.shop.topology" in page and "triggers\n`mongo_cdc__shop`" in page
    # one pause switch per source, and where the sensor waits
    assert "Pause and unpause `mongo_cdc__shop` only" in page and "**triggerer**" in page
