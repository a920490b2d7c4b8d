"""Source configuration: one YAML file per MongoDB source, validated when the DAG file is parsed.

Property names follow the Debezium MongoDB connector where one exists; the rest are ours.
Every problem is reported as a ``SourceConfigError`` naming the file, the key and what is allowed.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

import yaml

from mongo_cdc.capture_modes import CAPTURE_MODES, FULL_UPDATE_TYPES, check_full_update_type
from mongo_cdc.field_filters import FieldFilters, FieldRule, parse_rules
from mongo_cdc.oversized_events import OVERSIZE_MODES
from mongo_cdc.storage import LakeRootError, resolve_root
from mongo_cdc.transform.flatten_options import (
    ARRAY_ENCODINGS,
    DELETE_TOMBSTONE_HANDLING_MODES,
    FlatteningOptions,
    added_field,
)

SOURCES_DIR_ENV = "MONGO_CDC_SOURCES_DIR"
LAKE_ROOT_ENV = "MONGO_CDC_LAKE_ROOT"

# Debezium's snapshot.mode values (see shard_lifecycle.plan_shard); no_data and never mean the same.
SNAPSHOT_MODES = ("initial", "when_needed", "always", "initial_only", "no_data", "never")
SKIPPABLE_OPERATIONS = ("c", "u", "d", "none")
# Databases MongoDB uses for itself; Debezium never captures them either.
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
_FLATTENING_DEFAULTS = FlatteningOptions()


class SourceConfigError(ValueError):
    """A source YAML file is invalid: one line per problem, each naming the file, the key and the fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _SourceLoader(yaml.SafeLoader):
    """YAML 1.2 booleans (``true``/``false`` only) and duplicate keys recorded instead of overwritten.

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
_SourceLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SourceLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


@dataclass(frozen=True)
class SourceConfig:
    """One validated source: everything a DAG, a pull or the Spark transform needs to know."""

    name: str
    path: str
    topic_prefix: str
    mongo_conn_id: str = "mongo_default"
    spark_conn_id: str = "spark_default"
    lake_root: str = ""
    lake_conn_id: str | None = None  # Airflow connection with the lake's credentials (object stores)
    lake_optimize_interval_hours: int = 24  # 0: never compact (see maintenance.maintain_table)
    lake_retention_hours: int = 168
    database_include: tuple[re.Pattern, ...] = ()
    database_exclude: tuple[re.Pattern, ...] = ()
    collection_include: tuple[re.Pattern, ...] = ()
    collection_exclude: tuple[re.Pattern, ...] = ()
    snapshot_include: tuple[re.Pattern, ...] = ()
    field_exclude: tuple[FieldRule, ...] = ()
    field_renames: tuple[FieldRule, ...] = ()
    snapshot_mode: str = "initial"
    capture_mode: str = "change_streams_update_full"
    capture_mode_full_update_type: str = "lookup"
    snapshot_max_threads: int = 1
    snapshot_max_tasks: int = 4
    snapshot_chunk_size: int = 100_000
    snapshot_fetch_size: int = 0
    max_batch_size: int = 2048
    max_queue_size_in_bytes: int = 16 * 1024 * 1024
    tombstones_on_delete: bool = True
    skipped_operations: frozenset[str] = field(default_factory=frozenset)
    connect_backoff_initial_delay_ms: int = 1000
    connect_backoff_max_delay_ms: int = 120_000
    connect_max_attempts: int = 16
    cursor_oversize_handling_mode: str = "fail"
    cursor_oversize_skip_threshold: int = 0
    provide_transaction_metadata: bool = False
    heartbeat_interval_ms: int = 0  # 0: no heartbeats
    # the oplog-window guard (see oplog_window): warn below this many schedule intervals of headroom
    oplog_headroom_warn_intervals: int = 3  # 0: never warn
    oplog_headroom_fail: bool = False
    # The changes table's event flattening (ExtractNewDocumentState's options): see `flattening`.
    array_encoding: str = _FLATTENING_DEFAULTS.array_encoding
    flatten_struct: bool = _FLATTENING_DEFAULTS.flatten_struct
    flatten_struct_delimiter: str = _FLATTENING_DEFAULTS.flatten_struct_delimiter
    delete_tombstone_handling_mode: str = _FLATTENING_DEFAULTS.delete_tombstone_handling_mode
    add_fields: tuple[str, ...] = _FLATTENING_DEFAULTS.add_fields
    add_fields_prefix: str = _FLATTENING_DEFAULTS.add_fields_prefix
    sanitize_field_names: bool = _FLATTENING_DEFAULTS.sanitize_field_names

    def __post_init__(self) -> None:
        self.flattening  # noqa: B018 - builds the options, so clashing ones are refused here
        check_full_update_type(self.capture_mode, self.capture_mode_full_update_type)

    @property
    def flattening(self) -> FlatteningOptions:
        return FlatteningOptions(
            array_encoding=self.array_encoding,
            flatten_struct=self.flatten_struct,
            flatten_struct_delimiter=self.flatten_struct_delimiter,
            delete_tombstone_handling_mode=self.delete_tombstone_handling_mode,
            add_fields=self.add_fields,
            add_fields_prefix=self.add_fields_prefix,
            sanitize_field_names=self.sanitize_field_names,
        )

    @property
    def field_filters(self) -> FieldFilters:
        return _field_filters(self.field_exclude + self.field_renames)

    def captures_database(self, db: str) -> bool:
        if db in SYSTEM_DATABASES:
            return False
        if self.database_include:
            return any(p.fullmatch(db) for p in self.database_include)
        return not any(p.fullmatch(db) for p in self.database_exclude)

    def captures_collection(self, db: str, collection: str) -> bool:
        captured = self._captured_namespaces.get((db, collection))
        if captured is None:
            captured = self._captured_namespaces[(db, collection)] = self._matches_collection(db, collection)
        return captured

    @cached_property
    def _captured_namespaces(self) -> dict[tuple[str, str], bool]:
        """``captures_collection``'s answers so far: a pull asks for every event it reads."""
        return {}

    def _matches_collection(self, db: str, collection: str) -> bool:
        if not self.captures_database(db) or collection.startswith("system."):
            return False
        namespace = f"{db}.{collection}"
        if self.collection_include:
            return any(p.fullmatch(namespace) for p in self.collection_include)
        return not any(p.fullmatch(namespace) for p in self.collection_exclude)

    @property
    def capture_filter(self) -> dict[str, list[str]]:
        """The namespace filters as their patterns: what an offset records its stream captured with."""
        return {key: [p.pattern for p in getattr(self, name)] for key, name in _CAPTURE_FILTER.items()}

    def with_capture_filter(self, recorded: dict[str, list[str]]) -> SourceConfig:
        """This source with the namespace filters ``recorded`` (a ``capture_filter``)."""
        patterns = {
            name: tuple(re.compile(p) for p in recorded.get(key, ())) for key, name in _CAPTURE_FILTER.items()
        }
        return replace(self, **patterns)

    def snapshots_collection(self, db: str, collection: str) -> bool:
        """Captured and copied by snapshots (``snapshot.include.collection.list``), not only streamed."""
        if not self.captures_collection(db, collection):
            return False
        namespace = f"{db}.{collection}"
        return not self.snapshot_include or any(p.fullmatch(namespace) for p in self.snapshot_include)


# The keys deciding which namespaces are captured (captures_collection), and their fields.
_CAPTURE_FILTER = {
    "database.include.list": "database_include",
    "database.exclude.list": "database_exclude",
    "collection.include.list": "collection_include",
    "collection.exclude.list": "collection_exclude",
}


@lru_cache(maxsize=64)
def _field_filters(rules: tuple[FieldRule, ...]) -> FieldFilters:
    """One ``FieldFilters`` per rule set, so its per-collection lookups are kept across calls."""
    return FieldFilters(rules)


def _regex_list(path: str, key: str, value: Any) -> tuple[re.Pattern, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",") if item.strip()]
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        items = value
    else:
        raise SourceConfigError(
            f"{path}: key '{key}' must be a list of regular expressions or a comma-separated string, "
            f"got {value!r}"
        )
    patterns = []
    for item in items:
        try:
            patterns.append(re.compile(item))
        except re.error as exc:
            raise SourceConfigError(
                f"{path}: key '{key}': invalid regular expression {item!r} ({exc})"
            ) from None
    return tuple(patterns)


def _field_rules(path: str, key: str, value: Any) -> tuple[FieldRule, ...]:
    try:
        return parse_rules(key, value)
    except ValueError as exc:
        raise SourceConfigError(f"{path}: {exc}") from None


# Upper bound of an integer setting without a tighter one of its own: the largest 32-bit integer,
# as for Debezium's int settings (and BSON's int32 batch sizes).
MAX_INT = 2**31 - 1


def _positive_int(path: str, key: str, value: Any, allow_zero: bool = False, maximum: int = MAX_INT) -> int:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= maximum:
        raise SourceConfigError(
            f"{path}: key '{key}' must be an integer from {low} to {maximum}, got {value!r}"
        )
    return value


def _bounded(maximum: int, allow_zero: bool = False) -> Any:
    """A ``_positive_int`` parser with the upper bound its use allows (see _KEYS)."""
    return lambda path, key, value: _positive_int(path, key, value, allow_zero=allow_zero, maximum=maximum)


def _choice(path: str, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise SourceConfigError(f"{path}: key '{key}' is {value!r}; allowed values: {', '.join(allowed)}")
    return value


def _boolean(path: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SourceConfigError(f"{path}: key '{key}' must be true or false, got {value!r}")
    return value


def _text(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SourceConfigError(f"{path}: key '{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def _topic_prefix(path: str, key: str, value: Any) -> str:
    text = _text(path, key, value)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", text):
        raise SourceConfigError(
            f"{path}: key '{key}' is {text!r}; "
            "use letters, digits, '_', '-' or '.', starting with a letter or '_'"
        )
    return text


def _skipped_operations(path: str, key: str, value: Any) -> frozenset[str]:
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list) or any(item not in SKIPPABLE_OPERATIONS for item in items):
        raise SourceConfigError(
            f"{path}: key '{key}' is {value!r}; allowed: a list of {', '.join(SKIPPABLE_OPERATIONS)}"
        )
    return frozenset(item for item in items if item != "none")


def _string(path: str, key: str, value: Any, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or not (value or allow_empty):
        bound = "a string" if allow_empty else "a non-empty string"
        raise SourceConfigError(f"{path}: key '{key}' must be {bound}, got {value!r}")
    return value


def _add_fields(path: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = tuple(item.strip() for item in value.split(",") if item.strip())
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        items = tuple(item.strip() for item in value)
    else:
        raise SourceConfigError(
            f"{path}: key '{key}' must be a list of field names or a comma-separated string, got {value!r}"
        )
    for item in items:
        try:
            added_field(item, prefix="")
        except ValueError as exc:
            raise SourceConfigError(f"{path}: {exc}") from None
    return items


# Upper bounds of integer settings, from what each one drives (README: source configuration).
_MAX_SNAPSHOT_THREADS = 64  # one cursor and one writer thread per chunk copied in parallel
_MAX_SNAPSHOT_TASKS = 1024  # Airflow's default [core] max_map_length: mapped instances of one task
_MAX_CHUNK_SIZE = 100_000_000  # documents per chunk; larger ones would make retries re-read hours
_MAX_FETCH_SIZE = 1_000_000  # documents per cursor batch; the server caps a batch at 16 MB anyway
_MAX_BATCH_SIZE = 1_000_000  # change events held in memory for one landed file
_MAX_QUEUE_BYTES = 1024**4  # a bound on memory: any real one is far below
_MAX_DELAY_MS = 3_600_000  # one hour between reconnection attempts
_MAX_ATTEMPTS = 1000
_MAX_OVERSIZE_THRESHOLD = 16 * 1024 * 1024  # MongoDB's document size limit: a larger threshold never applies
_MAX_HEARTBEAT_MS = 86_400_000  # one day

# key -> (dataclass field, parser)
_KEYS = {
    "topic.prefix": ("topic_prefix", _topic_prefix),
    "mongodb.connection.id": ("mongo_conn_id", _text),
    "spark.connection.id": ("spark_conn_id", _text),
    "lake.root": ("lake_root", _text),
    "lake.connection.id": ("lake_conn_id", _text),
    "lake.optimize.interval.hours": (
        "lake_optimize_interval_hours",
        lambda p, k, v: _positive_int(p, k, v, allow_zero=True),
    ),
    # 0: vacuum at once (no time travel), for readers that glob Parquet files
    "lake.retention.hours": (
        "lake_retention_hours",
        lambda p, k, v: _positive_int(p, k, v, allow_zero=True),
    ),
    "database.include.list": ("database_include", _regex_list),
    "database.exclude.list": ("database_exclude", _regex_list),
    "collection.include.list": ("collection_include", _regex_list),
    "collection.exclude.list": ("collection_exclude", _regex_list),
    "snapshot.include.collection.list": ("snapshot_include", _regex_list),
    "field.exclude.list": ("field_exclude", _field_rules),
    "field.renames": ("field_renames", _field_rules),
    "sanitize.field.names": ("sanitize_field_names", _boolean),
    "snapshot.mode": ("snapshot_mode", lambda p, k, v: _choice(p, k, v, SNAPSHOT_MODES)),
    "capture.mode": ("capture_mode", lambda p, k, v: _choice(p, k, v, tuple(CAPTURE_MODES))),
    "capture.mode.full.update.type": (
        "capture_mode_full_update_type",
        lambda p, k, v: _choice(p, k, v, FULL_UPDATE_TYPES),
    ),
    "snapshot.max.threads": ("snapshot_max_threads", _bounded(_MAX_SNAPSHOT_THREADS)),
    "snapshot.max.tasks": ("snapshot_max_tasks", _bounded(_MAX_SNAPSHOT_TASKS)),
    "snapshot.chunk.size": ("snapshot_chunk_size", _bounded(_MAX_CHUNK_SIZE)),
    "snapshot.fetch.size": ("snapshot_fetch_size", _bounded(_MAX_FETCH_SIZE, allow_zero=True)),
    "max.batch.size": ("max_batch_size", _bounded(_MAX_BATCH_SIZE)),
    "max.queue.size.in.bytes": ("max_queue_size_in_bytes", _bounded(_MAX_QUEUE_BYTES, allow_zero=True)),
    "tombstones.on.delete": ("tombstones_on_delete", _boolean),
    "skipped.operations": ("skipped_operations", _skipped_operations),
    "connect.backoff.initial.delay.ms": ("connect_backoff_initial_delay_ms", _bounded(_MAX_DELAY_MS)),
    "connect.backoff.max.delay.ms": ("connect_backoff_max_delay_ms", _bounded(_MAX_DELAY_MS)),
    "connect.max.attempts": ("connect_max_attempts", _bounded(_MAX_ATTEMPTS)),
    "cursor.oversize.handling.mode": (
        "cursor_oversize_handling_mode",
        lambda p, k, v: _choice(p, k, v, OVERSIZE_MODES),
    ),
    "cursor.oversize.skip.threshold": (
        "cursor_oversize_skip_threshold",
        _bounded(_MAX_OVERSIZE_THRESHOLD, allow_zero=True),
    ),
    "provide.transaction.metadata": ("provide_transaction_metadata", _boolean),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", _bounded(_MAX_HEARTBEAT_MS, allow_zero=True)),
    "oplog.headroom.warn.intervals": ("oplog_headroom_warn_intervals", _bounded(1000, allow_zero=True)),
    "oplog.headroom.fail": ("oplog_headroom_fail", _boolean),
    "array.encoding": ("array_encoding", lambda p, k, v: _choice(p, k, v, ARRAY_ENCODINGS)),
    "flatten.struct": ("flatten_struct", _boolean),
    "flatten.struct.delimiter": (
        "flatten_struct_delimiter",
        lambda p, k, v: _string(p, k, v, allow_empty=False),
    ),
    "delete.tombstone.handling.mode": (
        "delete_tombstone_handling_mode",
        lambda p, k, v: _choice(p, k, v, DELETE_TOMBSTONE_HANDLING_MODES),
    ),
    "add.fields": ("add_fields", _add_fields),
    "add.fields.prefix": ("add_fields_prefix", _string),
}

_MUTUALLY_EXCLUSIVE = (
    ("database.include.list", "database.exclude.list"),
    ("collection.include.list", "collection.exclude.list"),
)


def default_lake_root() -> str:
    airflow_home = os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow"))
    return os.environ.get(LAKE_ROOT_ENV) or os.path.join(airflow_home, "mongo-cdc-lake")


def load_source(path: str) -> SourceConfig:
    """Parse and validate one source YAML file; the error lists every problem the file has."""
    try:
        with open(path, encoding="utf-8") as handle:
            loader = _SourceLoader(handle)
            try:
                raw = loader.get_single_data()
            finally:
                loader.dispose()
    except yaml.YAMLError as exc:
        raise SourceConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise SourceConfigError(
            f"{path}: expected a mapping of Debezium-style keys, e.g. 'topic.prefix: inventory'"
        )
    problems = [f"{path}: {duplicate}" for duplicate in loader.duplicates]
    problems += [_unknown_key(path, str(key)) for key in sorted(str(key) for key in raw if key not in _KEYS)]
    problems += [
        f"{path}: key '{second}' cannot be used together with '{first}'; keep one of them"
        for first, second in _MUTUALLY_EXCLUSIVE
        if first in raw and second in raw
    ]
    if "topic.prefix" not in raw:
        problems.append(f"{path}: key 'topic.prefix' is required (the logical name used in lake paths)")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _KEYS:
            attribute, parse = _KEYS[key]
            try:
                values[attribute] = parse(path, key, value)
            except SourceConfigError as exc:
                problems.extend(exc.problems)
    initial = values.get("connect_backoff_initial_delay_ms", 1000)
    maximum = values.get("connect_backoff_max_delay_ms", 120_000)
    if maximum < initial:
        problems.append(
            f"{path}: key 'connect.backoff.max.delay.ms' is {maximum}; it must be >= "
            f"'connect.backoff.initial.delay.ms' ({initial})"
        )
    try:  # a relative local path is taken from the YAML's folder; a URI is kept as it is
        values["lake_root"] = resolve_root(
            values.get("lake_root") or default_lake_root(), os.path.dirname(os.path.abspath(path))
        )
    except LakeRootError as exc:
        problems.append(f"{path}: key 'lake.root': {exc}")
    if problems:
        raise SourceConfigError(*problems)
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        return SourceConfig(name=name, path=os.path.abspath(path), **values)
    except ValueError as exc:  # the flattening or capture options do not fit together
        raise SourceConfigError(f"{path}: {exc}") from None


def _unknown_key(path: str, key: str) -> str:
    close = difflib.get_close_matches(key, _KEYS, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{path}: unknown key '{key}'; {hint}allowed keys: {', '.join(sorted(_KEYS))}"


def sources_dir(default: str) -> str:
    return os.environ.get(SOURCES_DIR_ENV) or default


def load_sources(directory: str) -> tuple[list[SourceConfig], list[SourceConfigError]]:
    """Every valid ``*.yaml``/``*.yml`` source in a folder, sorted by name, plus the errors of the others.

    Each file stands alone, except that two sources writing the same lake with the same
    ``topic.prefix`` would mix their tables: both are refused, each naming the other.
    """
    configs, errors = [], []
    if not os.path.isdir(directory):
        return configs, [
            SourceConfigError(f"{directory}: sources folder does not exist; set {SOURCES_DIR_ENV}")
        ]
    for entry in sorted(os.listdir(directory)):
        if entry.endswith((".yaml", ".yml")):
            try:
                configs.append(load_source(os.path.join(directory, entry)))
            except SourceConfigError as exc:
                errors.append(exc)
    sharing: dict[tuple[str, str], list[SourceConfig]] = {}
    for config in configs:
        sharing.setdefault((config.lake_root, config.topic_prefix), []).append(config)
    clashing = [config for group in sharing.values() if len(group) > 1 for config in group]
    for config in clashing:
        others = [
            other.path for other in sharing[(config.lake_root, config.topic_prefix)] if other is not config
        ]
        errors.append(
            SourceConfigError(
                f"{config.path}: key 'topic.prefix' is {config.topic_prefix!r}, the same as in "
                f"{', '.join(others)} with the same lake root {config.lake_root}; each source of a "
                "lake needs its own topic.prefix"
            )
        )
    return [config for config in configs if config not in clashing], errors
