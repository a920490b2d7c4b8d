"""System test: the CDC DAG under Airflow's real scheduler, DAG processor and API server.

Everything else runs DAGs with ``dag.test()``; here the DAG goes the production way: the DAG
processor parses ``dags/`` into the metadata DB, a REST call unpauses it, the scheduler queues its
tasks and the LocalExecutor runs them in task processes that talk to the API server's execution API.
SQLite is the metadata DB: Airflow 3.3 accepts LocalExecutor on SQLite (one writer at a time, so it
is slow, which is fine here). The runs after the scheduled snapshot are triggered as an on-call
engineer does, from the UI in a real browser (headless Chromium), or through the REST API.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from browser import chromium_page
from bson import Int64
from cdc_support import CdcSource, assert_state_equals_collection, documented_downstream_dag
from conftest import make_source
from playwright.sync_api import Page

from mongo_cdc.capture.offsets import offset_key
from mongo_cdc_airflow import local_env
from mongo_cdc_airflow.assets import table_asset_uri
from mongo_cdc_airflow.demo import inventory_documents, load_inventory
from mongo_cdc_airflow.params import resnapshot_params
from mongo_cdc_dev.testing import ReplicaSet

pytestmark = pytest.mark.slow

DATABASE = "scheduler_system"
COMPONENTS = {
    "api-server": ["api-server", "--workers", "1"],
    # Task logs are read from AIRFLOW_HOME/logs by the API server on this host: no log server
    # (its fixed port 8793 would collide with other Airflows on the machine).
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    # the topology DAG's deferred sensor waits here; without it the home page shows the Triggerer red
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
STARTUP_TIMEOUT_S = 240
# One run (Spark included) on a shared 2-core machine takes 2-3 minutes.
RUN_TIMEOUT_S = 15 * 60
TERMINAL = {"success", "failed"}
# the example downstream DAG of docs/reading.md, scheduled on the state Asset of this collection
DOWNSTREAM_DAG_ID = "orders_report"
DOWNSTREAM_COLLECTION = "orders"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: str | Path, lines: int = 40) -> str:
    try:
        return "".join(Path(path).read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)\n"


@dataclass
class Airflow:
    """Airflow's components as child processes, each in its own process group, and a REST client."""

    home: Path
    env: dict[str, str]
    port: int
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    client: httpx.Client | None = None

    def start(self) -> None:
        airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
        for name, args in COMPONENTS.items():
            out = open(self.home / f"{name}.out", "wb")  # noqa: SIM115 - kept open for the child's life
            self.processes[name] = subprocess.Popen(
                [airflow, *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            out.close()  # the child has its own descriptor

    def stop(self) -> None:
        """SIGTERM every process this test started (task processes and spark-submit JVMs included),
        then SIGKILL what is left after 30 s."""
        if self.client is not None:
            self.client.close()
        tree: list[psutil.Process] = []
        for process in self.processes.values():
            try:
                parent = psutil.Process(process.pid)
                tree.extend([parent, *parent.children(recursive=True)])
            except psutil.NoSuchProcess:
                pass
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in tree:  # children that left the group (a new session) get the signal too
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(tree, timeout=30)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        for process in self.processes.values():
            process.wait(timeout=10)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                output = tail(self.home / f"{name}.out")
                raise AssertionError(f"airflow {name} exited with code {process.returncode}:\n{output}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            self.check_alive()
            try:
                if httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (
                f"the API server did not answer within {STARTUP_TIMEOUT_S} s:\n"
                + tail(self.home / "api-server.out")
            )
            time.sleep(2)

    @property
    def admin_password(self) -> str:
        """The simple auth manager's generated password of user ``admin``."""
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        return passwords["admin"]

    def log_in(self) -> None:
        """A JWT from the simple auth manager: POST /auth/token with the password it generated."""
        response = httpx.post(
            f"{self.base_url}/auth/token",
            json={"username": "admin", "password": self.admin_password},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        token = response.json()["access_token"]
        self.client = httpx.Client(
            base_url=f"{self.base_url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        assert response.is_success, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def wait_for_dag(self, dag_id: str) -> None:
        """Until the DAG processor has parsed the DAG file; its import errors fail at once."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.client.get(f"/dags/{dag_id}").status_code != 200:
            self.check_alive()
            errors = self.api("GET", "/importErrors")["import_errors"]
            assert not errors, [e["stack_trace"] for e in errors]
            assert time.monotonic() < deadline, (
                f"DAG {dag_id} was not parsed within {STARTUP_TIMEOUT_S} s:\n"
                + tail(self.home / "dag-processor.out")
            )
            time.sleep(2)

    def trigger(self, dag_id: str, conf: dict) -> str:
        run = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def wait_for_run(self, dag_id: str, run_id: str) -> dict:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            self.check_alive()
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"run {run_id} still {run['state']} after {RUN_TIMEOUT_S} s\n"
                    + self.describe(dag_id, run_id)
                )
            time.sleep(5)

    def wait_for_scheduled_run(self, dag_id: str, run_type: str = "scheduled") -> dict:
        """The first run of ``run_type`` the scheduler created (``asset_triggered``: for asset events),
        once it has ended."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (
            runs := self.api("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": run_type})["dag_runs"]
        ):
            self.check_alive()
            assert time.monotonic() < deadline, f"no {run_type} run of {dag_id} within {STARTUP_TIMEOUT_S} s"
            time.sleep(2)
        return self.wait_for_run(dag_id, runs[0]["dag_run_id"])

    def run_ids(self, dag_id: str) -> set[str]:
        return {run["dag_run_id"] for run in self.api("GET", f"/dags/{dag_id}/dagRuns")["dag_runs"]}

    def snapshot_documents(self, dag_id: str, run_id: str) -> dict[str, int]:
        """The documents the run's snapshot copied, per collection (the first shard's snapshot task)."""
        snapshot = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/shard_sync.snapshot/xcomEntries/return_value",
            params={"map_index": 0},
        )["value"]
        if isinstance(snapshot, str):  # the API returns XCom values as stored: JSON text or a JSON value
            snapshot = json.loads(snapshot)
        return snapshot["snapshot"]["documents"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def describe(self, dag_id: str, run_id: str) -> str:
        """Task states, the log tail of every failed task and the scheduler's output tail."""
        lines = []
        for ti in self.task_instances(dag_id, run_id):
            lines.append(f"  {ti['task_id']}[{ti['map_index']}] {ti['state']} try {ti['try_number']}")
            if ti["state"] in ("failed", "up_for_retry"):
                pattern = (
                    self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={ti['task_id']}"
                )
                for log in sorted(glob.glob(f"{pattern}/**/*.log", recursive=True)):
                    lines.append(f"--- {log}\n{tail(log)}")
        lines.append(f"--- scheduler\n{tail(self.home / 'scheduler.out')}")
        return "\n".join(lines)


@pytest.fixture(scope="module")
def airflow(
    replica_set: ReplicaSet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Airflow, CdcSource]]:
    """A private Airflow (SQLite, LocalExecutor, Spark local[2]) whose DAGs are one source's, capturing a
    database loaded with the demo's inventory data, and the documented DAG scheduled on a state Asset."""
    work = tmp_path_factory.mktemp("scheduler")
    source = make_source(work, replica_set.uri, DATABASE)
    dags = work / "dags"
    dags.mkdir()
    for dag_file in glob.glob(os.path.join(local_env.REPO_ROOT, "dags", "*.py")):
        (dags / os.path.basename(dag_file)).write_text(Path(dag_file).read_text())
    state = table_asset_uri(source.location, "state", source.prefix, f"{DATABASE}.{DOWNSTREAM_COLLECTION}")
    (dags / "orders_report.py").write_text(documented_downstream_dag(state))
    home = work / "airflow"
    port = free_port()
    env = {
        **os.environ,
        **local_env.airflow_env(str(home), source.lake_root, replica_set.uri, str(work / "sources")),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        # the worktree's packages, not whatever an editable install points at
        "PYTHONPATH": os.pathsep.join(
            [os.path.join(local_env.REPO_ROOT, "include"), os.environ.get("PYTHONPATH", "")]
        ),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # every component signs or checks the same JWTs
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # A task process's calls to the execution API wait on SQLite's one writer: on this shared
        # 2-core machine the default 5 s timed out and failed a task before it started.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        # Retries stay on (unlike the dag.test() suites) so the bad trigger shows whether it is retried.
        "MONGO_CDC_TASK_RETRIES": "1",
    }
    local_env.migrate(env)
    stack = Airflow(home, env, port)
    with replica_set.client() as client:
        load_inventory(client[DATABASE])
    try:
        stack.start()
        stack.wait_until_serving()
        stack.log_in()
        for dag_id in (DOWNSTREAM_DAG_ID, source.dag_id):  # the downstream first: it misses no event
            stack.wait_for_dag(dag_id)
            stack.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        yield stack, source
    finally:
        stack.stop()
        with replica_set.client() as client:
            client.drop_database(DATABASE)


HEALTH = ("MetaDatabase", "Scheduler", "Triggerer", "Dag Processor")
# the trigger form's fields, in the order the DAG declares its params
PARAM_TITLES = [param.schema["title"] for param in resnapshot_params().values()]
BROWSER_FAILURES = Path(local_env.REPO_ROOT) / ".local" / "browser-test"


def log_in_with_the_form(page: Page, stack: Airflow) -> None:
    page.goto(f"{stack.base_url}/")
    page.fill('input[name="username"]', "admin")
    page.fill('input[name="password"]', stack.admin_password)
    page.click('button[type="submit"]')
    page.wait_for_url(f"{stack.base_url}/")


def unhealthy_components(page: Page, stack: Airflow) -> list[str]:
    """The home page's health badges that are not green (a reload until they are, for a minute:
    a component's heartbeat may be late on a loaded machine)."""
    deadline = time.monotonic() + 60
    while True:
        page.goto(f"{stack.base_url}/")
        colors = {}
        for name in HEALTH:
            badge = page.locator('[data-testid="state-badge"]', has_text=name)
            rgb = badge.evaluate("badge => getComputedStyle(badge).backgroundColor")
            colors[name] = [int(c) for c in re.findall(r"\d+", rgb)[:3]]
        red = [f"{name} (rgb {r}, {g}, {b})" for name, (r, g, b) in colors.items() if not g > r]
        if not red or time.monotonic() > deadline:
            return red
        time.sleep(5)


def trigger_from_the_dag_page(page: Page, stack: Airflow, dag_id: str, collection: str | None) -> str:
    """Trigger the DAG with its page's Trigger form (``collection``: re-snapshot that one); the run id."""
    before = stack.run_ids(dag_id)
    page.goto(f"{stack.base_url}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    # the accordion's content (its aria-labelledby holds a space, so it has no accessible name)
    params = dialog.locator('[data-part="item-content"][id$=":content:Run Parameters"]')
    # every param, none marked required (a required field's label has data-required and a "*")
    labels = params.locator('[data-part="label"]')
    labels.filter(has_text=PARAM_TITLES[-1]).wait_for()  # the form is drawn after the DAG's params load
    assert [text.strip() for text in labels.all_inner_texts()] == PARAM_TITLES
    assert params.locator("[data-required]").count() == 0
    if collection is not None:
        params.locator('[id="switch:element_resnapshot:control"]').click()
        assert params.locator('input[name="element_resnapshot"]').is_checked()
        params.locator('textarea[name="element_collections"]').fill(collection)
    dialog.get_by_role("button", name="Trigger").click()
    deadline = time.monotonic() + 60
    while not (new := stack.run_ids(dag_id) - before):
        assert time.monotonic() < deadline, "the Trigger form made no run"
        time.sleep(1)
    [run_id] = new
    return run_id


def save_unchanged_in_the_variables_page(page: Page, stack: Airflow, key: str) -> None:
    page.goto(f"{stack.base_url}/variables")
    row = page.get_by_role("row").filter(has_text=key)
    # the description says what the Variable is and how to move it
    assert "mongo-cdc offset" in row.locator('[data-testid="table-cell-description"]').inner_text()
    row.get_by_role("button", name="Edit Variable").click()
    dialog = page.get_by_role("dialog")
    assert "***" not in dialog.locator('textarea[name="value"]').input_value()
    dialog.get_by_role("button", name="Save").click()
    dialog.wait_for(state="hidden")


def test_an_on_call_round_trip_in_a_real_browser(
    airflow: tuple[Airflow, CdcSource], replica_set: ReplicaSet
) -> None:
    """Log in, check the home page and the trigger form, re-snapshot one collection from the form,
    open the offset Variable in the Variables page and save it unchanged: the next run succeeds.

    The trigger form posts to the REST API, so its re-snapshot run is also the test of a triggered
    run's conf reaching its tasks."""
    stack, source = airflow
    scheduled = stack.wait_for_scheduled_run(source.dag_id)  # it stores the offset
    assert scheduled["state"] == "success", stack.describe(source.dag_id, scheduled["dag_run_id"])
    key = offset_key(source.name, replica_set.name)
    collection = f"{DATABASE}.{DOWNSTREAM_COLLECTION}"
    with chromium_page(BROWSER_FAILURES) as page:
        log_in_with_the_form(page, stack)
        assert unhealthy_components(page, stack) == []

        run_id = trigger_from_the_dag_page(page, stack, source.dag_id, collection)
        run = stack.wait_for_run(source.dag_id, run_id)
        assert run["state"] == "success", stack.describe(source.dag_id, run_id)
        # the form's params reached the run: it copied that one collection again
        assert run["conf"]["resnapshot"] is True and run["conf"]["collections"] == [collection], run["conf"]
        with replica_set.client() as client:
            expected = {collection: client[DATABASE][DOWNSTREAM_COLLECTION].count_documents({})}
        assert stack.snapshot_documents(source.dag_id, run_id) == expected

        offset = stack.api("GET", f"/variables/{key}")["value"]
        save_unchanged_in_the_variables_page(page, stack, key)
        saved = stack.api("GET", f"/variables/{key}")["value"]
        assert json.loads(saved) == json.loads(offset)

        with replica_set.client() as client:  # streamed by the next run from the saved offset
            client[DATABASE].customers.insert_one(
                {"_id": Int64(1901), "first_name": "Saved", "last_name": "Offset"}
            )
        run_id = trigger_from_the_dag_page(page, stack, source.dag_id, None)
        run = stack.wait_for_run(source.dag_id, run_id)
        assert run["state"] == "success", stack.describe(source.dag_id, run_id)
    with replica_set.client() as client:
        for name in inventory_documents():
            assert_state_equals_collection(source, client, name)


def test_a_dag_scheduled_on_a_state_asset_is_triggered_by_the_run(
    airflow: tuple[Airflow, CdcSource], replica_set: ReplicaSet
) -> None:
    stack, source = airflow
    scheduled = stack.wait_for_scheduled_run(source.dag_id)
    run = stack.wait_for_scheduled_run(DOWNSTREAM_DAG_ID, "asset_triggered")
    assert run["state"] == "success", stack.describe(DOWNSTREAM_DAG_ID, run["dag_run_id"])
    path = f"/dags/{DOWNSTREAM_DAG_ID}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents"
    events = stack.api("GET", path)["asset_events"]
    # the first CDC run (the snapshot) triggered it; a later one may be in the same run
    first = next(e for e in events if e["source_run_id"] == scheduled["dag_run_id"])
    assert (first["source_dag_id"], first["source_task_id"]) == (source.dag_id, "summary")
    with replica_set.client() as client:
        documents = client[DATABASE][DOWNSTREAM_COLLECTION].count_documents({})
    assert first["extra"]["rows"] == first["extra"]["new_events"] == documents
    logs = stack.home / "logs" / f"dag_id={DOWNSTREAM_DAG_ID}" / f"run_id={run['dag_run_id']}"
    # the documented example's task read the events' extras
    printed = f"{first['uri']}: {documents} rows at version {first['extra']['table_version']}"
    assert any(printed in log.read_text() for log in logs.glob("**/*.log")), stack.describe(
        DOWNSTREAM_DAG_ID, run["dag_run_id"]
    )


@pytest.fixture(scope="module")
def bad_run(airflow: tuple[Airflow, CdcSource]) -> tuple[dict, list[dict]]:
    """A re-snapshot trigger naming a collection the source lacks, run to its end: the run and its
    task instances."""
    stack, source = airflow
    run_id = stack.trigger(source.dag_id, {"resnapshot": True, "collections": ["nope.nope"]})
    return stack.wait_for_run(source.dag_id, run_id), stack.task_instances(source.dag_id, run_id)


def test_a_trigger_naming_an_unknown_collection_fails(
    airflow: tuple[Airflow, CdcSource], bad_run: tuple[dict, list[dict]]
) -> None:
    stack, source = airflow
    run, tis = bad_run
    assert run["state"] == "failed", stack.describe(source.dag_id, run["dag_run_id"])
    failed = [ti["task_id"] for ti in tis if ti["state"] == "failed"]
    logs = stack.home / "logs" / f"dag_id={source.dag_id}" / f"run_id={run['dag_run_id']}"
    # whichever task checks the params, its log names the bad value
    assert any(
        "nope.nope" in log.read_text()
        for task in failed
        for log in (logs / f"task_id={task}").glob("**/*.log")
    ), stack.describe(source.dag_id, run["dag_run_id"])


def test_a_bad_trigger_fails_at_once_without_retry_or_spark(bad_run: tuple[dict, list[dict]]) -> None:
    run, tis = bad_run
    took = dt.datetime.fromisoformat(run["end_date"]) - dt.datetime.fromisoformat(run["start_date"])
    # MONGO_CDC_TASK_RETRIES=1 above: a retried task would show try 2
    retried = [ti["task_id"] for ti in tis if ti["try_number"] > 1]
    assert not retried, f"retried: {retried}; the run took {took}"
    transform = next(ti for ti in tis if ti["task_id"] == "transform")
    # not run: the scheduler set it so from its upstream (a run task ends success or failed)
    assert transform["state"] in ("upstream_failed", "skipped"), f"Spark ran; the run took {took}"


def test_a_bad_trigger_logs_its_message_as_the_first_error_of_the_task_log(
    airflow: tuple[Airflow, CdcSource], bad_run: tuple[dict, list[dict]]
) -> None:
    stack, source = airflow
    run, _ = bad_run
    logs = stack.home / "logs" / f"dag_id={source.dag_id}" / f"run_id={run['dag_run_id']}"
    [log] = (logs / "task_id=discover").glob("**/*.log")
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    first = next(record for record in records if record.get("level") == "error")
    # the one-line message, above Airflow's "Task failed with exception" and its traceback
    assert first["event"].startswith('param "collections": unknown collection nope.nope'), records
