"""The suite's own layout: what pytest needs of the test files' names to collect them at all."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_or_support_modules_share_a_file_name() -> None:
    # The test folders are not packages: pytest imports each test file by its bare name, as it does
    # the helpers in tests/support (pythonpath), so a second file of one name fails the collection of
    # the whole run ("import file mismatch"), and only a run of both files together shows it.
    names = Counter(path.name for path in TESTS.rglob("*.py") if path.name != "conftest.py")
    assert [name for name, count in names.items() if count > 1] == []
