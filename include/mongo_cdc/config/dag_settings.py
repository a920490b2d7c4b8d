"""The DAG's own settings in the source file (``dag.*``): schedule, owner, tags, alerting.

They are what a platform team sets on every DAG it runs; the loader parses them like every other
key (``SETTINGS`` holds them too) and hands them to ``SourceConfig.dag``. The Airflow layer turns
them into the DAG's arguments (``mongo_cdc_airflow.dag_factory``); nothing here imports Airflow.
"""

from __future__ import annotations

import datetime as dt
import importlib
import re
from dataclasses import dataclass, fields
from typing import Any

from mongo_cdc.config.setting import declared_settings, setting
from mongo_cdc.config.values import Boolean, Integer, SourceConfigError, Text, TextList

# Airflow's cron presets (airflow.utils.dates.cron_presets): each has a data interval, as the DAG needs.
# @once and @continuous have none, so they are refused.
CRON_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}
_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
# Airflow's longest tag
_MAX_TAG = 100


class Schedule:
    """A five-field cron expression or one of ``CRON_PRESETS``, kept as written."""

    allowed = f"a five-field cron expression (UTC) or {', '.join(f'`{p}`' for p in CRON_PRESETS)}"

    def parse(self, path: str, key: str, value: Any) -> str:
        # croniter is Airflow's own cron parser (a dependency of Airflow's core): the DAG's timetable
        # reads the expression with it, so an expression it takes is one the DAG runs on
        from croniter import croniter

        text = value.strip() if isinstance(value, str) else value
        expression = CRON_PRESETS.get(text, text)
        if not (
            isinstance(expression, str) and len(expression.split()) == 5 and croniter.is_valid(expression)
        ):
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; use a five-field cron expression such as '15 * * * *' "
                f"(UTC) or one of {', '.join(CRON_PRESETS)}"
            )
        return text


class DottedPath:
    """``package.module.function``: a callable the loader imports, so a typo fails when the file is
    parsed and not when a task first fails."""

    allowed = "`<module>.<callable>`, importable where Airflow parses and runs the DAG"

    def parse(self, path: str, key: str, value: Any) -> str:
        text = value.strip() if isinstance(value, str) else ""
        if not _DOTTED_PATH.fullmatch(text):
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; give the callable's dotted path, "
                "e.g. 'my_alerts.page_oncall'"
            )
        try:
            resolve_callable(text)
        except (ImportError, AttributeError, TypeError) as exc:
            raise SourceConfigError(
                f"{path}: key '{key}' is {text!r}, which cannot be used: {exc}. Install or fix the module "
                "where Airflow parses and runs the DAGs (the DAG processor and the workers)"
            ) from None
        return text


def resolve_callable(dotted_path: str) -> Any:
    """The callable named ``module.attribute``; ImportError, AttributeError or TypeError if it is not one."""
    module_name, _, attribute = dotted_path.rpartition(".")
    found = getattr(importlib.import_module(module_name), attribute)
    if not callable(found):
        raise TypeError(f"{dotted_path} is a {type(found).__name__}, not a callable")
    return found


@dataclass(frozen=True)
class DagSettings:
    """The CDC DAG's own settings (``dag.*``): each field declared with its key, like ``SourceConfig``'s."""

    schedule: str = setting(
        "dag.schedule",
        "@hourly",
        Schedule(),
        "When the CDC DAG runs, with data intervals from one run to the next (Airflow's "
        "`CronDataIntervalTimetable`, UTC). The oplog guard, `verify.interval.hours` and the "
        "stalled-source alert count in these intervals. A run whose interval is over an hour "
        "[maintains](lake-format.md#commits-versions-and-maintenance) every table due, not one hour's "
        "share of them.",
    )
    owner: str = setting(
        "dag.owner",
        "airflow",
        Text(),
        "The tasks' owner, shown in the Airflow UI",
    )
    tags: tuple[str, ...] = setting(
        "dag.tags",
        (),
        TextList("tags", rf"[^,]{{1,{_MAX_TAG}}}", f"too long: a tag has at most {_MAX_TAG} characters"),
        "More tags of both DAGs, next to `mongo-cdc` and the `topic.prefix` (at most 100 characters each)",
    )
    email: tuple[str, ...] = setting(
        "dag.email",
        (),
        TextList("e-mail addresses", r"[^@\s,]+@[^@\s,]+", "is not an e-mail address"),
        "Addresses mailed when a task of the CDC DAG fails after its last try, by Airflow's SMTP "
        "notifier through the connection `[email] email_conn_id` names (`smtp_default`), whose extra "
        "`from_email` is the sender",
    )
    email_on_failure: bool = setting(
        "dag.email.on.failure",
        True,
        Boolean(),
        "`false`: no mail when a task fails, even with `dag.email` set",
    )
    on_failure_callback: str | None = setting(
        "dag.on.failure.callback",
        None,
        DottedPath(),
        "A callable's dotted path (`my_alerts.page_oncall`), called with the task's context when a task "
        "of the CDC DAG fails after its last try (Airflow's task `on_failure_callback`). Imported when "
        "the file is loaded: it must be importable by the DAG processor and the workers.",
    )
    max_consecutive_failed_runs: int | None = setting(
        "dag.max.consecutive.failed.runs",
        None,
        Integer(0),
        "Airflow pauses the CDC DAG after this many failed runs in a row (`0`: never)",
        shown_default="Airflow's `[core] max_consecutive_failed_dag_runs_per_dag`",
    )

    @property
    def cron(self) -> str:
        """The schedule as a cron expression (a preset written out)."""
        return CRON_PRESETS.get(self.schedule, self.schedule)

    def interval_seconds(self, after: dt.datetime) -> float:
        """Seconds between the schedule's next two runs after ``after`` (UTC): what "N schedule
        intervals" means to the alerts (a month's length varies, so it is the coming one's)."""
        from croniter import croniter

        runs = croniter(self.cron, after.astimezone(dt.timezone.utc))
        first = runs.get_next(dt.datetime)
        return (runs.get_next(dt.datetime) - first).total_seconds()


DAG_SETTINGS = {declared.key: declared for declared in declared_settings(DagSettings)}
DAG_ATTRIBUTES = frozenset(field.name for field in fields(DagSettings))
