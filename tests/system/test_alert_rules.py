"""The shipped monitoring files (monitoring/): the alert rules pass Prometheus's own checks and unit
tests (tests/system/alert_rules_test.yaml: each alert fires on its bad series, none on a healthy one),
and the statsd-exporter mapping turns every metric the code declares into the series the rules read.

promtool comes from Debian's prometheus package, which `make test` unpacks under .local (see the
Makefile's PROMTOOL target).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from mongo_cdc_airflow.metrics import METRICS, PREFIX

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "prometheus-rules.yaml"
MAPPING = ROOT / "monitoring" / "statsd-mapping.yaml"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
# The exporter's series name for each kind of StatsD metric: Prometheus's conventions.
SUFFIX = {"gauge": "", "counter": "_total", "timer": "_seconds"}


def promtool(*arguments: str) -> subprocess.CompletedProcess:
    unpacked = ROOT / ".local" / "prometheus" / "usr" / "bin" / "promtool"
    binary = str(unpacked) if unpacked.exists() else shutil.which("promtool")
    assert binary, "promtool is missing: `make test` fetches it (make .local/prometheus/usr/bin/promtool)"
    return subprocess.run([binary, *arguments], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_rules_pass_promtool_check():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout


def test_each_alert_fires_on_its_bad_series_and_none_on_a_healthy_one():
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert of the rules file has a test where it fires
    alerts = {
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    }
    firing = {
        check["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert firing == alerts


def mapped(statsd_name: str) -> tuple[str, dict[str, str]] | None:
    """The series the exporter makes of a StatsD name with the shipped mapping: its glob matches
    (``*`` is one dot-separated part, the first match wins), ``$n`` is the n-th ``*``'s part."""
    parts = statsd_name.split(".")
    for mapping in yaml.safe_load(MAPPING.read_text())["mappings"]:
        pattern = mapping["match"].split(".")
        if len(pattern) == len(parts) and all(
            p in ("*", part) for p, part in zip(pattern, parts, strict=True)
        ):
            stars = [part for p, part in zip(pattern, parts, strict=True) if p == "*"]
            labels = {key: substitute(value, stars) for key, value in mapping["labels"].items()}
            return mapping["name"], labels
    return None


def substitute(template: str, stars: list[str]) -> str:
    return re.sub(r"\$(\d+)", lambda match: stars[int(match[1]) - 1], template)


def test_the_mapping_gives_every_declared_metric_its_series_and_labels():
    """Plain StatsD names (``airflow.mongo_cdc.<metric>.<source>[.<rs>...]``, the code's own order of
    parts) come out as ``mongo_cdc_<metric>`` with one label per part; `state_rows` has no replica set."""
    for metric, declared in METRICS.items():
        names = ["source", *declared.per]
        values = {name: f"{name}-value" for name in names}
        statsd_name = ".".join(("airflow", PREFIX, metric, *values.values()))
        assert mapped(statsd_name) == (f"mongo_cdc_{metric}{SUFFIX[declared.kind]}", values), metric
    assert len(yaml.safe_load(MAPPING.read_text())["mappings"]) == len(METRICS)


def test_the_rules_read_only_series_the_mapping_makes():
    series = {f"mongo_cdc_{metric}{SUFFIX[declared.kind]}" for metric, declared in METRICS.items()}
    expressions = [
        rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]
    read = set(re.findall(r"\bmongo_cdc_[a-z_]+\b", "\n".join(expressions)))
    assert read and read <= series, read - series
