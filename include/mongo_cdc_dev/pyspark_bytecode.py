"""Bytecode beside the sources in Spark's Python zips, written once by ``make`` when it builds the venv.

``spark-submit`` and Spark's Python workers put ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's
zip first on ``PYTHONPATH``, so every driver and every worker daemon imports pyspark from them, not
from the installed package. Python caches no bytecode for a zip: each of those processes compiled
pyspark's sources again, ~1.5 s of CPU a process on the 2-core machine (about a third of a tiny
job's start). ``zipimport`` takes a ``.pyc`` stored next to its ``.py`` in the zip, so each zip is
written again with one per module. The pycs are unchecked-hash ones: a zip's entries have no
timestamps precise enough for timestamp pycs, and nothing edits the zips after this.

pyspark's own test modules (its ``tests`` packages, 70% of the zip's entries) are left out: a Python
worker's first task calls ``importlib.invalidate_caches``, which makes every zipimporter on the path
(one per package imported from the zip, ~16) read the zip's whole directory again: 139 ms a worker
with the original zip, 256 ms with the bytecode, 87 ms without the tests.

Usage: ``python pyspark_bytecode.py`` with the venv's Python (Spark's home is the installed pyspark
package); a zip that already holds bytecode is left as is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
import zipfile

# importlib's writer of hash-based pycs (what py_compile uses), for a source that is not a file
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path


def spark_python_zips(spark_home: Path) -> list[Path]:
    """The zips Spark puts on its Pythons' path (pyspark's and py4j's)."""
    return sorted((spark_home / "python" / "lib").glob("*.zip"))


def holds_bytecode(zip_path: Path) -> bool:
    with zipfile.ZipFile(zip_path) as archive:
        return any(name.endswith(".pyc") for name in archive.namelist())


def is_test_module(name: str) -> bool:
    """Whether the zip entry ``name`` is in one of pyspark's test packages (``pyspark/sql/tests/...``)."""
    return "tests" in name.split("/")[:-1]


def add_bytecode(zip_path: Path) -> int:
    """Write ``zip_path`` again with a ``.pyc`` after each ``.py`` it holds, and without the test
    modules (``is_test_module``); the pycs written.

    A module that does not compile (none in Spark's zips) keeps its source alone, which zipimport
    compiles as before. The code's file names are those zipimport gives modules it compiles itself
    (``<zip>/<path in the zip>``), so tracebacks still show the source lines."""
    written = 0
    partial = zip_path.with_name(zip_path.name + ".partial")
    with zipfile.ZipFile(zip_path) as source, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
        for entry in source.infolist():
            if is_test_module(entry.filename):
                continue
            data = source.read(entry)
            target.writestr(entry, data)
            if not entry.filename.endswith(".py"):
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SyntaxWarning)  # in some of pyspark's tests
                    code = compile(data, os.path.join(zip_path, entry.filename), "exec", dont_inherit=True)
            except SyntaxError:
                continue
            bytecode = _code_to_hash_pyc(code, importlib.util.source_hash(data), checked=False)
            compiled = zipfile.ZipInfo(entry.filename + "c", entry.date_time)
            compiled.compress_type = zipfile.ZIP_DEFLATED
            target.writestr(compiled, bytes(bytecode))
            written += 1
    partial.replace(zip_path)
    return written


def pyspark_home() -> Path:
    """Spark's home: the installed pyspark package (not imported: it may come from the zips)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        sys.exit("ERROR: pyspark is not installed in this Python: run this with the venv's python")
    return Path(spec.origin).resolve().parent


def main() -> None:
    spark_home = pyspark_home()
    zips = spark_python_zips(spark_home)
    if not zips:
        sys.exit(f"ERROR: no zip under {spark_home}/python/lib; rebuild the venv: rm -rf .venv && make .venv")
    for zip_path in zips:
        if holds_bytecode(zip_path):
            continue
        print(f"{zip_path.name}: bytecode of {add_bytecode(zip_path)} modules added")


if __name__ == "__main__":
    main()
