"""Spark's Python zips carry bytecode, which zipimport takes instead of compiling the sources."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from mongo_cdc_dev import pyspark_bytecode


def import_from(zip_path: Path, statement: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", statement],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(zip_path)},
        check=False,
    )
    return done.stdout + done.stderr


def test_modules_of_a_rewritten_zip_load_from_their_bytecode_keep_their_source_and_lose_their_tests(
    tmp_path: Path,
) -> None:
    zip_path = tmp_path / "lib.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("pkg/__init__.py", "ANSWER = 42\n")
        archive.writestr("pkg/broken.py", "def (:\n")  # no bytecode: zipimport reports its error
        archive.writestr("pkg/data.txt", "not python")
        archive.writestr("pkg/tests/__init__.py", "")
        archive.writestr("pkg/tests/test_pkg.py", "def test_answer(): pass\n")
    assert not pyspark_bytecode.holds_bytecode(zip_path)

    assert pyspark_bytecode.add_bytecode(zip_path) == 1

    with zipfile.ZipFile(zip_path) as archive:
        names = set(archive.namelist())
        assert names == {"pkg/__init__.py", "pkg/__init__.pyc", "pkg/broken.py", "pkg/data.txt"}
        assert archive.read("pkg/data.txt") == b"not python"
    assert pyspark_bytecode.holds_bytecode(zip_path)
    shown = import_from(zip_path, "import pkg; print(pkg.__file__, pkg.ANSWER)")
    assert shown.split() == [f"{zip_path}/pkg/__init__.pyc", "42"]
    assert "SyntaxError" in import_from(zip_path, "import pkg.broken")


def test_the_venv_spark_zips_hold_bytecode() -> None:
    zips = pyspark_bytecode.spark_python_zips(Path(pyspark_bytecode.pyspark_home()))
    assert {path.name.split("-")[0] for path in zips} == {"pyspark.zip", "py4j"}
    assert all(pyspark_bytecode.holds_bytecode(path) for path in zips), "make's venv step did not run"
