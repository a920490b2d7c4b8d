"""Loading source YAML files: every problem of a file reported at once, unique names and topic prefixes.

Each key is parsed by the value type its ``SourceConfig`` field declares (``SETTINGS``); this
module adds what spans keys: unknown and duplicate keys, required keys, keys that exclude each
other, the reconnection delays' order, the lake root's resolution, a file name that can be a DAG
id, and one source per name and per lake and topic prefix.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Hashable
from typing import Any

import yaml

from mongo_cdc.config.dag_ids import cdc_dag_id
from mongo_cdc.config.dag_settings import DAG_ATTRIBUTES, DagSettings
from mongo_cdc.config.snapshot_mode_table import START_POSITION_KEYS
from mongo_cdc.config.source import SETTINGS, SourceConfig
from mongo_cdc.config.values import SourceConfigError
from mongo_cdc.lake.storage import LakeRootError, resolve_root

LAKE_ROOT_ENV = "MONGO_CDC_LAKE_ROOT"

_MUTUALLY_EXCLUSIVE = (
    ("database.include.list", "database.exclude.list"),
    ("collection.include.list", "collection.exclude.list"),
    START_POSITION_KEYS,
)
# The source name (the file stem) is part of the DAG ids ``mongo_cdc__<name>`` and
# ``mongo_cdc_topology__<name>``: Airflow allows ASCII letters, digits, '_', '-' and '.' in them, at
# most 250 characters, so the longer prefix leaves 230.
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,230}")
_BACKOFF_INITIAL = SETTINGS["connect.backoff.initial.delay.ms"]
_BACKOFF_MAX = SETTINGS["connect.backoff.max.delay.ms"]


class _SourceLoader(yaml.SafeLoader):
    """YAML 1.2 booleans (``true``/``false`` only), no base-60 integers, and duplicate keys recorded
    instead of overwritten.

    PyYAML's safe loader follows YAML 1.1, where ``yes``/``no``/``on``/``off`` are booleans: a
    ``topic.prefix: on`` or a mistyped flag would silently become True/False. Here they stay
    strings, so the key's own check names them. A duplicate key is kept in ``duplicates`` (line
    numbers included) so every one is reported, not just the first.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | bool) and key in seen:
                self.duplicates.append(
                    f"key '{key}' appears twice (lines {seen[key]} and {line}); keep one of them"
                )
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_INT_TAG = "tag:yaml.org,2002:int"
_SourceLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _INT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SourceLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# YAML 1.1's integers without its base-60 ones: an unquoted `capture.start.op.time: 1767225600:3`
# (seconds:increment) would otherwise be read as the number 1767225600 × 60 + 3.
_SourceLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def default_lake_root() -> str:
    airflow_home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return os.environ.get(LAKE_ROOT_ENV) or os.path.join(airflow_home, "mongo-cdc-lake")


def source_name(path: str) -> str:
    """The source name of a YAML file: its name without the extension."""
    return os.path.splitext(os.path.basename(path))[0]


def _source_name_problems(path: str) -> list[str]:
    name = source_name(path)
    if _SOURCE_NAME.fullmatch(name):
        return []
    fixed = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:230]
    return [
        f"{path}: the file name {name!r} is the source name, part of its DAG id mongo_cdc__<name>, and "
        f"may hold only ASCII letters, digits, '_', '-' and '.' (at most 230); rename the file, "
        f"e.g. to {fixed}{os.path.splitext(path)[1]}"
    ]


def load_source(path: str, lake_root: str | None = None) -> SourceConfig:
    """Parse and validate one source YAML file; the error lists every problem the file has.

    ``lake_root``: the lake of a file without ``lake.root`` (the deployment's setting; None:
    ``default_lake_root()``)."""
    name_problems = _source_name_problems(path)
    try:
        with open(path, encoding="utf-8") as handle:
            loader = _SourceLoader(handle)
            try:
                raw = loader.get_single_data()
            finally:
                loader.dispose()
    except yaml.YAMLError as exc:
        raise SourceConfigError(*name_problems, f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise SourceConfigError(
            *name_problems,
            f"{path}: expected a mapping of Debezium-style keys, e.g. 'topic.prefix: inventory'",
        )
    problems = [*name_problems, *(f"{path}: {duplicate}" for duplicate in loader.duplicates)]
    problems += [
        _unknown_key(path, str(key)) for key in sorted(str(key) for key in raw if key not in SETTINGS)
    ]
    problems += [
        f"{path}: key '{second}' cannot be used together with '{first}'; keep one of them"
        for first, second in _MUTUALLY_EXCLUSIVE
        if first in raw and second in raw
    ]
    problems += [
        f"{path}: key '{declared.key}' is required ({declared.required_because})"
        for declared in SETTINGS.values()
        if declared.required and declared.key not in raw
    ]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SETTINGS:
            declared = SETTINGS[key]
            try:
                values[declared.attribute] = declared.value_type.parse(path, key, value)
            except SourceConfigError as exc:
                problems.extend(exc.problems)
    initial = values.get(_BACKOFF_INITIAL.attribute, _BACKOFF_INITIAL.default)
    maximum = values.get(_BACKOFF_MAX.attribute, _BACKOFF_MAX.default)
    if maximum < initial:
        problems.append(
            f"{path}: key '{_BACKOFF_MAX.key}' is {maximum}; "
            f"it must be >= '{_BACKOFF_INITIAL.key}' ({initial})"
        )
    try:  # a relative local path is taken from the YAML's folder; a URI is kept as it is
        values["lake_root"] = resolve_root(
            values.get("lake_root") or lake_root or default_lake_root(),
            os.path.dirname(os.path.abspath(path)),
        )
    except LakeRootError as exc:
        problems.append(f"{path}: key 'lake.root': {exc}")
    if problems:
        raise SourceConfigError(*problems)
    dag = DagSettings(**{name: values.pop(name) for name in DAG_ATTRIBUTES & values.keys()})
    try:
        return SourceConfig(name=source_name(path), path=os.path.abspath(path), dag=dag, **values)
    except ValueError as exc:  # the flattening or capture options do not fit together
        raise SourceConfigError(f"{path}: {exc}") from None


def _unknown_key(path: str, key: str) -> str:
    close = difflib.get_close_matches(key, SETTINGS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{path}: unknown key '{key}'; {hint}allowed keys: {', '.join(sorted(SETTINGS))}"


def load_sources(
    directory: str, lake_root: str | None = None
) -> tuple[list[SourceConfig], list[SourceConfigError]]:
    """Every valid ``*.yaml``/``*.yml`` source in a folder, sorted by name, plus the errors of the others.

    Each file stands alone, except where two sources would share what must be one source's: two
    files with one source name (``shop.yaml`` and ``shop.yml``) would have one DAG id, and two
    sources writing the same lake with the same ``topic.prefix`` would write the same tables. Both
    are refused, each naming the other. ``lake_root``: as for ``load_source``.
    """
    configs, errors = [], []
    if not os.path.isdir(directory):
        return configs, [
            SourceConfigError(
                f"{directory}: sources folder does not exist; create it, or set the sources folder "
                "(Airflow: [mongo_cdc] sources_dir, AIRFLOW__MONGO_CDC__SOURCES_DIR)"
            )
        ]
    for entry in sorted(os.listdir(directory)):
        if entry.endswith((".yaml", ".yml")):
            try:
                configs.append(load_source(os.path.join(directory, entry), lake_root))
            except SourceConfigError as exc:
                errors.append(exc)
    clashing = _clashes(
        configs,
        lambda config: config.name,
        lambda config, others: (
            f"{config.path}: the source name {config.name!r} (the file name without its extension, "
            f"the DAG id {cdc_dag_id(config.name)}) is also that of {', '.join(others)}; rename one of "
            "the files"
        ),
    )
    clashing += _clashes(
        configs,
        lambda config: (config.lake_root, config.topic_prefix),
        lambda config, others: (
            f"{config.path}: key 'topic.prefix' is {config.topic_prefix!r}, the same as in "
            f"{', '.join(others)} with the same lake root {config.lake_root}; each source of a "
            "lake needs its own topic.prefix"
        ),
    )
    errors += [SourceConfigError(problem) for _, problem in clashing]
    refused = {id(config) for config, _ in clashing}
    return [config for config in configs if id(config) not in refused], errors


def _clashes(
    configs: list[SourceConfig],
    key: Callable[[SourceConfig], Hashable],
    problem: Callable[[SourceConfig, list[str]], str],
) -> list[tuple[SourceConfig, str]]:
    """Each source that shares ``key`` with another, and its problem naming the others' files."""
    sharing: dict[Hashable, list[SourceConfig]] = {}
    for config in configs:
        sharing.setdefault(key(config), []).append(config)
    return [
        (config, problem(config, [other.path for other in group if other is not config]))
        for group in sharing.values()
        if len(group) > 1
        for config in group
    ]
