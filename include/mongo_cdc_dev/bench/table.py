"""The one table ``make bench`` prints: a row per measured path, its ratio to its baseline, its budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One measured path. ``value`` None: not measured, ``note`` (printed under the table) says why.

    ``ratio`` compares the path with the baseline measured in the same run (``against`` names
    it); ``min_ratio``, ``max_ratio``, ``min_value`` and ``max_value`` are the performance budget
    (every one given must hold).
    """

    section: str
    path: str
    value: float | None
    unit: str
    ratio: float | None = None
    against: str = ""
    min_ratio: float | None = None
    max_ratio: float | None = None
    min_value: float | None = None
    max_value: float | None = None
    note: str = ""

    def _limits(self) -> list[tuple[str, float | None, bool]]:
        """Each budget given: its text, the measured figure it limits, whether that figure holds."""
        limits = []
        if self.min_ratio is not None:
            held = self.ratio is not None and self.ratio >= self.min_ratio
            limits.append((f">= {self.min_ratio:.2f}x", self.ratio, held))
        if self.max_ratio is not None:
            held = self.ratio is not None and self.ratio <= self.max_ratio
            limits.append((f"<= {self.max_ratio:.2f}x", self.ratio, held))
        if self.min_value is not None:
            held = self.value is not None and self.value >= self.min_value
            limits.append((f">= {self.min_value:,.0f} {self.unit}", self.value, held))
        if self.max_value is not None:
            held = self.value is not None and self.value < self.max_value
            limits.append((f"< {self.max_value:,.0f} {self.unit}", self.value, held))
        return limits

    @property
    def budget(self) -> str:
        return " and ".join(text for text, _, _ in self._limits())

    @property
    def met(self) -> bool | None:
        """Whether the budget is met (None: no budget, or nothing measured)."""
        limits = self._limits()
        if not limits or any(figure is None for _, figure, _ in limits):
            return None
        return all(held for _, _, held in limits)


SHORTER_THAN_THE_EMPTY_JOB = "the run took less time than the empty job it is measured without: no rate"


def rate_less(amount: float, seconds: float, baseline_seconds: float) -> float | None:
    """``amount`` per second of ``seconds`` less ``baseline_seconds`` (a run's own work, Spark's start
    taken off); None when the run was not longer than the baseline: a rate over a difference at or
    below zero would print a figure that means nothing (a 1,000-document build read 4,035,336,000
    MB/s)."""
    own = seconds - baseline_seconds
    return amount / own if own > 0 else None


def no_rate_note(rate: float | None) -> str:
    """A row's note for a ``rate_less`` that gave no rate."""
    return SHORTER_THAN_THE_EMPTY_JOB if rate is None else ""


def _measured(row: Row) -> str:
    if row.value is None:
        return "unavailable" if row.unit else ""  # no unit: a ratio of two other rows
    digits = 1 if row.value < 100 else 0
    return f"{row.value:,.{digits}f} {row.unit}"


def render(rows: Sequence[Row]) -> str:
    """The table as text; a section's name is printed on its first row only."""
    header = ("section", "path", "measured", "ratio", "vs", "budget", "")
    lines = []
    previous = None
    for row in rows:
        met = {True: "ok", False: "MISSED", None: ""}[row.met]
        lines.append(
            (
                row.section if row.section != previous else "",
                row.path,
                _measured(row),
                f"{row.ratio:.2f}x" if row.ratio is not None else "",
                row.against,
                row.budget,
                met,
            )
        )
        previous = row.section
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    right = {2, 3}  # numbers align right
    out = []
    for line in [header, *lines]:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(line)
        ]
        out.append("  ".join(cells).rstrip())
    out.insert(1, "  ".join("-" * width for width in widths))
    notes = [f"{row.path}: {row.note}" for row in rows if row.note]
    return "\n".join(out + notes)
