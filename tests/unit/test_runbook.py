"""The DAG pages are the on-call runbook: every task, param, failure and command they name is real,
and they agree with docs/semantics.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mongo_cdc.config import load_source
from mongo_cdc_airflow.dag_factory import build_cdc_dag, build_topology_dag
from mongo_cdc_airflow.params import PARAM_NAMES, resnapshot_params, resnapshot_request
from mongo_cdc_airflow.runbook import FAILURES

INCLUDE = Path(__file__).resolve().parents[2] / "include"
DOCS = Path(__file__).resolve().parents[2] / "docs"


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


TRIGGER = re.compile(r"airflow dags trigger (\S+) --conf '([^']*)'")


def assert_valid_triggers(text: str, dag_id: str) -> list[dict]:
    """Every ``airflow dags trigger`` command in ``text`` names ``dag_id`` and params the DAG's checks
    accept (``resnapshot_request``: no unknown key, right types, ``collections`` with ``resnapshot``)."""
    confs = []
    for named, conf_text in TRIGGER.findall(text):
        assert named == dag_id, named
        conf = json.loads(conf_text)
        assert set(conf) <= set(PARAM_NAMES), conf
        defaults = {name: param.value for name, param in resnapshot_params().items()}
        resnapshot_request(conf, {**defaults, **conf}, backfill=False)  # fails the test if refused
        confs.append(conf)
    return confs


def test_every_command_the_runbook_quotes_triggers_the_dag_with_valid_params(tmp_path):
    dag = build_cdc_dag(_config(tmp_path))
    confs = assert_valid_triggers(dag.doc_md, dag.dag_id)
    # a whole re-snapshot (the only way past a lost position), a re-snapshot of some, a stream moved
    # back, a verification
    assert confs == [
        {"resnapshot": True},
        {"resnapshot": True, "collections": ["<db>.<collection>"]},
        {"stream_from": "2026-01-01T00:00:00Z"},
        {"verify": True},
    ]
    # the page no longer sends a lost position to a one-shard re-snapshot (docs/semantics.md,
    # "Sharded clusters": it can drop documents a chunk migration moved)
    lost = dict(FAILURES)["is no longer in the oplog"]
    assert "every collection of every shard" in lost and '"shards"' not in dag.doc_md


def test_the_commands_of_the_semantics_page_trigger_the_demo_dag_with_valid_params():
    page = (DOCS / "semantics.md").read_text(encoding="utf-8")
    confs = assert_valid_triggers(page, "mongo_cdc__inventory")
    assert {"verify": True} in confs and any(conf.get("resnapshot") for conf in confs)


def test_the_runbook_and_the_semantics_page_agree_on_where_streaming_goes_on(tmp_path):
    """A whole re-snapshot moves the position, one of some collections keeps it (docs/semantics.md,
    "Positions and batch numbers"); the runbook says the same."""
    page = build_cdc_dag(_config(tmp_path)).doc_md
    semantics = (DOCS / "semantics.md").read_text(encoding="utf-8")
    assert "streaming continues from the\n  re-snapshot's position" in semantics
    assert "streaming keeps its stored position" in semantics
    assert "streaming goes on from the re-snapshot's position" in page
    assert "streaming keeps its stored position" in page
