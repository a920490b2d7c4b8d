"""The modules Spark's executors run import only what an executor's Python has.

docs/deploying.md asks the executors' Python for pyarrow, orjson and bson (with pyspark's worker);
tests/system/test_spark_cluster.py runs the transform on executors with exactly those. This test
catches the same mistake in seconds: each executor-side module (the architecture page's "(executor
side)" rows, and the modules whose docstring says "Executor side") is imported in a fresh Python
that refuses every other third-party package the driver has (a module that imports the
verification's numpy, or deltalake, fails every task on a cluster).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what the driver's Python has and an executor's need not
REFUSED = ("numpy", "deltalake", "pymongo", "airflow", "mongo_cdc_airflow", "polars", "duckdb")
PROBE = """
import importlib, importlib.abc, sys
refused = set(sys.argv[1].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in refused:
            raise ImportError(f"{name} is not on an executor")
        return None

sys.meta_path.insert(0, Refuse())
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def executor_side_modules() -> list[str]:
    """The architecture page's "(executor side)" modules, and those whose docstring says "Executor side"."""
    rows = (REPO / "docs" / "architecture.md").read_text().splitlines()
    named = {
        match.group(1)
        for row in rows
        if "executor side" in row and (match := re.match(r"\| `(mongo_cdc\.[\w.]+)` \|", row))
    }
    package = REPO / "include"
    said = {
        ".".join(path.relative_to(package).with_suffix("").parts)
        for path in (package / "mongo_cdc").rglob("*.py")
        if "Executor side" in path.read_text()
    }
    return sorted(named | said)


def test_executor_side_modules_import_without_the_drivers_packages() -> None:
    modules = executor_side_modules()
    assert "mongo_cdc.transform.state_merge" in modules and "mongo_cdc.transform.merge_ranges" in modules
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(REFUSED), *modules],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "include"), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
