"""docs/monitoring.md as written works: its metric table is what the code sends, and the alert rules
it shows are the shipped file's (which tests/system/test_alert_rules.py runs through promtool)."""

from __future__ import annotations

import re
from pathlib import Path

from mongo_cdc_airflow.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "monitoring.md"


def metric_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The page's table of metrics: name to (type, what it is per, after the source)."""
    section = PAGE.read_text(encoding="utf-8").split("## The metrics", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name = re.fullmatch(r"`([a-z_]+)`", cells[0]) if len(cells) == 5 else None
        if name:
            per = tuple(part.strip() for part in cells[2].split(","))
            assert per[0] == "source", line
            rows[name[1]] = (cells[1], per[1:])
    return rows


def test_the_metric_table_lists_every_metric_the_code_sends_with_its_type_and_tags():
    declared = {metric: (spec.kind, spec.per) for metric, spec in METRICS.items()}
    assert metric_table() == declared


def test_the_page_shows_the_shipped_alert_rules_and_names_the_mapping():
    page = PAGE.read_text(encoding="utf-8")
    rules = (ROOT / "monitoring" / "prometheus-rules.yaml").read_text(encoding="utf-8")
    assert f"```yaml\n{rules}```" in page, (
        "docs/monitoring.md must show monitoring/prometheus-rules.yaml whole"
    )
    assert "`monitoring/statsd-mapping.yaml`" in page
