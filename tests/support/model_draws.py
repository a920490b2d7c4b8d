"""What the smaller model-based suites draw (a lost oplog, a moved stream): writes to two
collections of five documents, with few value types, and the derandomized settings they play under.
The shared suite (tests/e2e/test_model_based.py) draws every kind of write and value; a drawn
sequence that fails is printed as a test (``render_test``)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from model_support import COLLECTIONS, Delete, Inc, Insert, Maintain, Replace, Run, Set, Transaction, Unset

KEYS = st.integers(0, 4)
WRITTEN = st.sampled_from(COLLECTIONS[:2])
VALUES = st.integers(-3, 3) | st.text("xy", max_size=2) | st.none()
FIELDS = st.fixed_dictionaries({}, optional={"a": VALUES, "b": VALUES, "n": st.integers(-3, 3)})
WRITES = st.one_of(
    st.builds(Insert, WRITTEN, KEYS, FIELDS),
    st.builds(Replace, WRITTEN, KEYS, FIELDS),
    st.builds(Set, WRITTEN, KEYS, st.sampled_from(["a", "b"]), VALUES),
    st.builds(Inc, WRITTEN, KEYS, st.integers(-2, 2)),
    st.builds(Unset, WRITTEN, KEYS, st.sampled_from(["a", "b"])),
    st.builds(Delete, WRITTEN, KEYS),
)
TRANSACTIONS = st.builds(Transaction, st.lists(WRITES, min_size=2, max_size=3))


def steps_with(*own: st.SearchStrategy) -> st.SearchStrategy:
    """A smaller suite's steps: mostly writes, a run, the suite's ``own`` steps, and upkeep."""
    return st.one_of(WRITES, WRITES, WRITES, TRANSACTIONS, st.just(Run()), *own, st.just(Maintain()))


def derandomized(examples: int) -> settings:
    """``examples`` sequences per test, the same ones every run (CI's), however slow each is."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


def render_test(name: str, mode: str, full_update_type: str, steps: list[Any]) -> str:
    """``steps`` as a pytest test for tests/e2e/test_model_based.py (which has the fixture and names)."""
    body = "".join(f"            {step!r},\n" for step in steps)
    return (
        f"def {name}(sequence):\n"
        f"    sequence({mode!r}, {full_update_type!r}).check(\n"
        f"        [\n{body}        ]\n"
        f"    )\n"
    )
