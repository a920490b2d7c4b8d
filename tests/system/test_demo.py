"""`make demo` replicates the sample database, its counts match, and it prints no warning."""

from __future__ import annotations

import os
import re
import subprocess

from mongo_cdc_airflow.local_env import REPO_ROOT


def test_make_demo_prints_matching_counts_and_exits_zero():
    # a clean environment, as a user's shell would have: none of the test session's Airflow settings
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MONGO_CDC"))}
    done = subprocess.run(
        ["make", "demo"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = re.findall(r"^inventory\.(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(.*)$", done.stdout, re.MULTILINE)
    assert len(rows) == 6, done.stdout  # three collections after the snapshot run, three after streaming
    final = {name: (int(live), int(state), ops) for name, live, state, _, ops in rows[3:]}
    assert {name: (live, state) for name, (live, state, _) in final.items()} == {
        "customers": (4, 4),
        "orders": (5, 5),
        "products": (8, 8),
    }
    assert "c=1, d=1, r=4, tombstone=1, u=2" in final["customers"][2]
    assert "MISMATCH" not in done.stdout
    # quiet: its steps and tables only (Airflow's output is in its log file)
    output = done.stdout + done.stderr
    assert not [line for line in output.splitlines() if "warning" in line.lower()], output
    assert "dag-runs.log" in done.stdout
