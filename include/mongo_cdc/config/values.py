"""The value types of source settings: each parses one YAML value and says what it allows.

A value type's ``parse`` returns the value a ``SourceConfig`` field holds, or raises a
``SourceConfigError`` naming the file, the key, the value and what is allowed; its ``allowed``
is the same bound written for the configuration reference page (``mongo_cdc.config.reference``).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Protocol

from bson import Timestamp

from mongo_cdc.config.field_rules import FieldRule, parse_rules
from mongo_cdc.transform.flatten_options import added_field

# Upper bound of an integer setting without a tighter one of its own: the largest 32-bit integer,
# as for Debezium's int settings (and BSON's int32 batch sizes).
MAX_INT = 2**31 - 1


class SourceConfigError(ValueError):
    """A source YAML file is invalid: one line per problem, each naming the file, the key and the fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class ValueType(Protocol):
    @property
    def allowed(self) -> str:
        """What the key accepts, as Markdown for the reference page."""
        ...

    def parse(self, path: str, key: str, value: Any) -> Any:
        """The field's value for the YAML ``value`` of ``key`` in ``path``; SourceConfigError if refused."""
        ...


def _code_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{value}`" for value in values)


class Integer:
    """An integer from ``low`` to ``high``, both included; booleans are refused."""

    def __init__(self, low: int, high: int = MAX_INT) -> None:
        self.low, self.high = low, high

    @property
    def allowed(self) -> str:
        return f"{self.low}–{self.high}"

    def parse(self, path: str, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise SourceConfigError(
                f"{path}: key '{key}' must be an integer from {self.low} to {self.high}, got {value!r}"
            )
        return value


class Choice:
    """One of a fixed set of strings."""

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = tuple(values)

    @property
    def allowed(self) -> str:
        return _code_list(self.values)

    def parse(self, path: str, key: str, value: Any) -> str:
        if value not in self.values:
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; allowed values: {', '.join(self.values)}"
            )
        return value


class Boolean:
    """``true`` or ``false`` (YAML 1.2: the loader reads ``yes``/``no``/``on``/``off`` as text)."""

    allowed = _code_list(("true", "false"))

    def parse(self, path: str, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise SourceConfigError(f"{path}: key '{key}' must be true or false, got {value!r}")
        return value


class Text:
    """A non-empty string, kept without its surrounding blanks."""

    allowed = "a non-empty string"

    def parse(self, path: str, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise SourceConfigError(f"{path}: key '{key}' must be a non-empty string, got {value!r}")
        return value.strip()


class Name(Text):
    """A ``Text`` usable as a directory and table name part and an Airflow DAG tag:
    ``[A-Za-z_][A-Za-z0-9_.-]*``, at most 100 characters (Airflow's longest tag)."""

    _FORM = r"[A-Za-z_][A-Za-z0-9_.-]{0,99}"
    allowed = "`[A-Za-z_][A-Za-z0-9_.-]*`, at most 100 characters"

    def parse(self, path: str, key: str, value: Any) -> str:
        text = super().parse(path, key, value)
        if not re.fullmatch(self._FORM, text):
            raise SourceConfigError(
                f"{path}: key '{key}' is {text!r}; use at most 100 letters, digits, '_', '-' or '.', "
                "starting with a letter or '_'"
            )
        return text


class String:
    """Any string, kept as written; ``allow_empty=False`` refuses the empty one."""

    def __init__(self, allow_empty: bool = True) -> None:
        self.allow_empty = allow_empty

    @property
    def allowed(self) -> str:
        return "a string" if self.allow_empty else "a non-empty string"

    def parse(self, path: str, key: str, value: Any) -> str:
        if not isinstance(value, str) or not (value or self.allow_empty):
            raise SourceConfigError(f"{path}: key '{key}' must be {self.allowed}, got {value!r}")
        return value


def string_items(path: str, key: str, value: Any, what: str) -> list[str]:
    """The strings of a YAML list as written, or the blank-trimmed items of a comma-separated string."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise SourceConfigError(
        f"{path}: key '{key}' must be a list of {what} or a comma-separated string, got {value!r}"
    )


class TextList:
    """Strings, as a YAML list or a comma-separated string, each matching ``pattern`` (``hint`` says
    what an item that does not is)."""

    def __init__(self, what: str, pattern: str, hint: str) -> None:
        self.what, self.pattern, self.hint = what, re.compile(pattern), hint

    @property
    def allowed(self) -> str:
        return f"{self.what}: a list or a comma-separated string"

    def parse(self, path: str, key: str, value: Any) -> tuple[str, ...]:
        items = tuple(item.strip() for item in string_items(path, key, value, self.what))
        bad = [item for item in items if not self.pattern.fullmatch(item)]
        if bad:
            raise SourceConfigError(f"{path}: key '{key}': {', '.join(map(repr, bad))} {self.hint}")
        return items


class RegexList:
    """Regular expressions, as a YAML list or a comma-separated string."""

    allowed = "regular expressions: a list or a comma-separated string"

    def parse(self, path: str, key: str, value: Any) -> tuple[re.Pattern, ...]:
        items = string_items(path, key, value, "regular expressions")
        patterns = []
        for item in items:
            try:
                patterns.append(re.compile(item))
            except re.error as exc:
                raise SourceConfigError(
                    f"{path}: key '{key}': invalid regular expression {item!r} ({exc})"
                ) from None
        return tuple(patterns)


class FieldRules:
    """Field paths (``mongo_cdc.config.field_rules.parse_rules``, which knows each key's entry form)."""

    def __init__(self, entry: str) -> None:
        self.entry = entry

    @property
    def allowed(self) -> str:
        return f"{self.entry} entries: a list or a comma-separated string"

    def parse(self, path: str, key: str, value: Any) -> tuple[FieldRule, ...]:
        try:
            return parse_rules(key, value)
        except ValueError as exc:
            raise SourceConfigError(f"{path}: {exc}") from None


class OperationSet:
    """Some of a fixed set of operation codes, as a list or a comma-separated string; ``none`` is none."""

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = tuple(values)

    @property
    def allowed(self) -> str:
        return f"a list of {_code_list(self.values)}"

    def parse(self, path: str, key: str, value: Any) -> frozenset[str]:
        items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
        if not isinstance(items, list) or any(item not in self.values for item in items):
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; allowed: a list of {', '.join(self.values)}"
            )
        return frozenset(item for item in items if item != "none")


class AddedFields:
    """``add.fields`` entries (``mongo_cdc.transform.flatten_options.added_field`` checks each)."""

    allowed = "event fields: a list or a comma-separated string"

    def parse(self, path: str, key: str, value: Any) -> tuple[str, ...]:
        items = tuple(item.strip() for item in string_items(path, key, value, "field names"))
        for item in items:
            try:
                added_field(item, prefix="")
            except ValueError as exc:
                raise SourceConfigError(f"{path}: {exc}") from None
        return items


# A BSON Timestamp's two halves are unsigned 32-bit integers.
_MAX_UINT32 = 2**32 - 1
_OP_TIME_TEXT = re.compile(r"(\d+):(\d+)")


def op_time_text(op_time: Timestamp) -> str:
    """``<seconds>:<increment>``: an op-time as ``capture.start.op.time`` accepts it back."""
    return f"{op_time.time}:{op_time.inc}"


OP_TIME_FORMATS = (
    "epoch seconds (`1767225600`), ISO-8601 with a zone (`2026-01-01T00:00:00Z`) or "
    "`<seconds>:<increment>` (`1767225600:3`)"
)


def parse_op_time(value: Any) -> Timestamp:
    """A cluster time from epoch seconds, an ISO-8601 date and time with a zone, or
    ``<seconds>:<increment>`` (OP_TIME_FORMATS); ValueError saying what is wrong, if anything more
    than the format.

    Seconds and ISO times start at the second's first operation (increment 0). An ISO time with a
    fraction of a second is refused: operations are ordered within a second by their increment, not
    by a fraction, so a fraction could only be rounded, and a rounded start is another start."""
    if isinstance(value, bool):
        raise ValueError("")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        seconds, increment = value, 0
    elif isinstance(value, str) and (match := _OP_TIME_TEXT.fullmatch(value.strip())):
        seconds, increment = int(match[1]), int(match[2])
    else:
        moment = _moment(value)
        if moment is None:
            raise ValueError("")
        if moment.tzinfo is None:
            raise ValueError("an ISO-8601 time needs its zone, e.g. Z or +02:00")
        if moment.microsecond:
            raise ValueError("whole seconds only: op-times do not count fractions")
        seconds, increment = int(moment.timestamp()), 0
    if not (1 <= seconds <= _MAX_UINT32 and increment <= _MAX_UINT32):
        raise ValueError(f"seconds from 1 to {_MAX_UINT32}, increment from 0 to {_MAX_UINT32}")
    return Timestamp(seconds, increment)


def _moment(value: Any) -> dt.datetime | None:
    """An ISO-8601 date and time (YAML reads an unquoted one as a datetime itself); None if not one."""
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and "T" in value.upper():
        try:
            return dt.datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    return None


def op_time_moment(op_time: Timestamp) -> str:
    """The op-time's second as an ISO-8601 UTC time, for people reading a message."""
    return dt.datetime.fromtimestamp(op_time.time, tz=dt.timezone.utc).isoformat(timespec="seconds")


class OpTime:
    """A cluster time (``bson.Timestamp``) in one of OP_TIME_FORMATS (``parse_op_time``); epoch seconds
    are Debezium's ``capture.start.op.time``."""

    allowed = OP_TIME_FORMATS

    def parse(self, path: str, key: str, value: Any) -> Timestamp:
        try:
            return parse_op_time(value)
        except ValueError as exc:
            why = f" ({exc})" if str(exc) else ""
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; allowed: {self.allowed.replace('`', '')}{why}"
            ) from None


class ResumeTokenData:
    """A change stream resume token's ``_data``: the hex string a change event's ``_id`` holds. Every
    token since MongoDB 4.2 is one, starting with ``82`` (its cluster time comes first)."""

    allowed = "a resume token's `_data`: hex starting with `82` (`826B1523B0000000122B0229296E04`)"

    def parse(self, path: str, key: str, value: Any) -> str:
        text = value.strip() if isinstance(value, str) else ""
        if len(text) < 18 or len(text) % 2 or not text.startswith("82") or not _is_hex(text):
            raise SourceConfigError(
                f"{path}: key '{key}' is {value!r}; allowed: the _data string of a change stream's "
                "resume token (an event's _id), an even number of hex digits starting with 82, e.g. "
                "826B1523B0000000122B0229296E04"
            )
        return text.upper()


def _is_hex(text: str) -> bool:
    return all(character in "0123456789abcdefABCDEF" for character in text)
