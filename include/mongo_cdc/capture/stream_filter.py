"""Server-side namespace filtering of a pull's change stream: a ``$match`` on the captured namespaces.

A pull opens one deployment-wide change stream. Without a filter the server sends every
database's events and the client drops what it does not capture, so an uncaptured database costs
network and decoding, and an event over 16 MB there even stops the pull (BSONObjectTooLarge). The
``$match`` built here keeps on the server:

* data events and ``drop`` events whose namespace is captured;
* ``rename`` events whose old **or** new namespace (``to``) is captured;
* any other event of a captured database (``dropDatabase``, and whatever operation a newer server
  adds: the pull counts those as not captured yet, as before);
* ``invalidate`` (it has no namespace).

It matches only on ``operationType``, ``ns`` and ``to``, never on the documents, so it runs
before (and never needs) an oversized event's content; it goes first in the pipeline, ahead of
``oversized_events.pipeline``.

The filters are Python regular expressions that must match a whole name. One is sent to the
server only when ``server_regex`` can translate it into a PCRE pattern matching exactly the same
names: literal text, escaped punctuation, ``.``, classes of literals and ranges, groups,
alternation, anchors and quantifiers. Anything else (``\\d``, ``\\w`` and other letter escapes,
whose Python meaning is Unicode-wide; lookarounds; inline flags; POSIX-looking classes)
is left to the client: an include list with such a pattern is not sent at all (the server
passes every name of that kind), an exclude list is sent without it. The client filter
(``SourceConfig.captures_*``) still decides every event, so the result is the same either way;
only what crosses the network differs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bson.regex import Regex

from mongo_cdc.capture.raw_rows import DATA_OPERATIONS
from mongo_cdc.config import SYSTEM_DATABASES, SourceConfig
from mongo_cdc.lake import DROP, RENAME

# events that name a collection, which the collection filters apply to
_COLLECTION_EVENTS = sorted({*DATA_OPERATIONS, DROP, RENAME})
_QUANTIFIER = re.compile(r"\{[0-9]+(,[0-9]*)?\}")
# Python's own ``.`` and ``$`` (not multiline): PCRE's depend on the newline convention it was built with
_ANY_BUT_NEWLINE = r"[^\n]"
_END = r"(?=\n?\z)"


@dataclass(frozen=True)
class NamespaceFilter:
    """The ``$match`` stage, and the filter patterns only the client applies (``<key>: <pattern>``)."""

    stage: dict[str, Any]
    client_only: tuple[str, ...]


def server_regex(pattern: re.Pattern) -> str | None:
    """PCRE text of ``pattern`` as Python matches it (not anchored), or None when not provably the same."""
    if pattern.flags & ~re.UNICODE:
        return None
    text, out, i = pattern.pattern, [], 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            escaped = text[i + 1 : i + 2]
            if not _literal_escape(escaped):
                return None
            out.append(char + escaped)
            i += 2
        elif char == "[":
            end = _class_end(text, i)
            if end is None:
                return None
            out.append(text[i:end])
            i = end
        elif char == "(":
            if text.startswith("(?", i) and not text.startswith("(?:", i):
                return None  # lookarounds, named groups, inline flags, comments
            out.append(char)
            i += 1
        elif char == "{":
            quantifier = _QUANTIFIER.match(text, i)
            if quantifier is None:  # Python reads it as a literal, PCRE versions differ
                return None
            out.append(quantifier.group())
            i = quantifier.end()
        else:
            out.append({".": _ANY_BUT_NEWLINE, "$": _END, "^": r"\A"}.get(char, char))
            i += 1
    return "".join(out)


def _literal_escape(escaped: str) -> bool:
    """A backslash before ASCII punctuation means that character in both dialects."""
    return len(escaped) == 1 and escaped.isascii() and not escaped.isalnum() and escaped.isprintable()


def _class_end(text: str, start: int) -> int | None:
    """Index after the ``[...]`` class at ``start`` if it holds only literals and ranges, else None."""
    i = start + 1
    if text.startswith("^", i):
        i += 1
    if text.startswith("]", i):  # a leading ] is a literal in both
        i += 1
    while i < len(text):
        char = text[i]
        if char == "]":
            return i + 1
        if char == "[":  # [:alpha:] and friends in PCRE, a literal in Python
            return None
        if char == "\\":
            if not _literal_escape(text[i + 1 : i + 2]):
                return None
            i += 2
        else:
            i += 1
    return None


def full_match_regex(patterns: tuple[re.Pattern, ...]) -> tuple[str | None, list[re.Pattern]]:
    """One PCRE regex matching a whole name when any translatable pattern does, and the ones left out."""
    translated, left_out = [], []
    for pattern in patterns:
        regex = server_regex(pattern)
        if regex is None:
            left_out.append(pattern)
        else:
            translated.append(f"(?:{regex})")
    return (r"\A(?:" + "|".join(translated) + r")\z" if translated else None), left_out


class _Builder:
    def __init__(self, config: SourceConfig) -> None:
        self.client_only: list[str] = []
        self.database = self._list(config, "database")
        self.collection = self._list(config, "collection")

    def _list(self, config: SourceConfig, kind: str) -> tuple[str, str | None]:
        """("include" | "exclude", the server regex or None) of one kind of list."""
        include, exclude = getattr(config, f"{kind}_include"), getattr(config, f"{kind}_exclude")
        if include:
            regex, left_out = full_match_regex(include)
            if left_out:  # the server cannot tell which names those match: it passes them all
                regex = None
            self._note(f"{kind}.include.list", left_out)
            return "include", regex
        regex, left_out = full_match_regex(exclude)
        self._note(f"{kind}.exclude.list", left_out)
        return "exclude", regex

    def _note(self, key: str, patterns: list[re.Pattern]) -> None:
        self.client_only.extend(f"{key}: {pattern.pattern}" for pattern in patterns)

    def database_captured(self, field: str) -> list[dict[str, Any]]:
        conditions: list[dict[str, Any]] = [{f"{field}.db": {"$nin": sorted(SYSTEM_DATABASES)}}]
        kind, regex = self.database
        if regex is not None:
            condition = Regex(regex) if kind == "include" else {"$not": Regex(regex)}
            conditions.append({f"{field}.db": condition})
        return conditions

    def collection_captured(self, field: str) -> list[dict[str, Any]]:
        """The collection conditions alone (``captures_collection`` without the database part)."""
        conditions: list[dict[str, Any]] = [{f"{field}.coll": {"$not": Regex(r"\Asystem\.")}}]
        kind, regex = self.collection
        if regex is not None:
            namespace = {"$concat": [f"${field}.db", ".", f"${field}.coll"]}
            matches = {"$regexMatch": {"input": namespace, "regex": regex}}
            conditions.append({"$expr": matches if kind == "include" else {"$not": [matches]}})
        return conditions


def namespace_filter(config: SourceConfig) -> NamespaceFilter:
    """The change stream's ``$match`` on what ``config`` captures (see the module's docstring)."""
    build = _Builder(config)

    def captured(field: str) -> dict[str, Any]:
        return {"$and": [*build.database_captured(field), *build.collection_captured(field)]}

    stage = {
        "$match": {
            "$or": [
                {"operationType": "invalidate"},
                {"operationType": RENAME, "$or": [captured("ns"), captured("to")]},
                {
                    "$and": [
                        *build.database_captured("ns"),
                        {
                            "$or": [
                                {"operationType": {"$nin": _COLLECTION_EVENTS}},
                                {"$and": build.collection_captured("ns")},
                            ]
                        },
                    ]
                },
            ]
        }
    }
    return NamespaceFilter(stage, tuple(build.client_only))
