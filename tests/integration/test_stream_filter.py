"""The change stream's namespace $match passes exactly the captured namespaces, on a real mongod.

The pull's stream must return only captured namespaces, so an uncaptured database's writes
(even an event over 16 MB there) never reach the client, while filters the server cannot
express exactly fall back to the client with the same result.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from mongo_cdc.capture.oversized_events import OversizedEventError
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_filter import full_match_regex, namespace_filter, server_regex
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import pack_cluster_time
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

MB = 1024 * 1024

# Translatable patterns, compared with Python's fullmatch on NAMES by the server's own $regex.
TRANSLATABLE = [
    "shop",
    "shop.*",
    r"shop\.orders",
    "a|b",
    "(shop|inv)_[0-9]{2,}",
    "[^x]+",
    "sh?op$",
    "^shop",
    "x.y",
    r"a\-b",
    "[]a]+",
    "a{2}",
    "(?:ab)+?",
    "[.$^]+",
    "ü+.",
]
NAMES = [
    "shop", "shop2", "shop.orders", "shopXorders", "a", "b", "ab", "abab", "inv_12", "inv_1", "shop_123",
    "x\ny", "x\ry", "xy", "xzy", "sop", "shop\n", "a-b", "]a]", "aa", "aaa", ".$^", "üü\n", "üüx", "x",
]  # fmt: skip
UNTRANSLATABLE = [r"\d+", "(?i)shop", "(?=s)shop", "[[:alpha:]]+", "x{,3}", "(?P<n>a)", r"\bshop", "a{x}"]


@pytest.mark.filterwarnings("ignore:Possible nested set:FutureWarning")  # the [[:alpha:]] example
def test_translated_patterns_match_exactly_what_python_matches(replica_set, db_name):
    with make_client(replica_set.uri) as client:
        names = client[db_name].names
        names.insert_many([{"n": name} for name in NAMES])
        for text in [*TRANSLATABLE, "shop|(x.y)"]:
            pattern = re.compile(text)
            regex, left_out = full_match_regex((pattern,))
            assert regex is not None and left_out == [], text
            on_server = sorted(doc["n"] for doc in names.find({"n": {"$regex": regex}}))
            assert on_server == sorted(n for n in NAMES if pattern.fullmatch(n)), text
        # a list is one alternation: any of its patterns matching the whole name
        both, _ = full_match_regex((re.compile("shop"), re.compile("a+")))
        on_server = sorted(doc["n"] for doc in names.find({"n": {"$regex": both}}))
        assert on_server == ["a", "aa", "aaa", "shop"]
    for text in UNTRANSLATABLE:
        assert server_regex(re.compile(text)) is None, text


def test_untranslatable_patterns_widen_the_server_filter_never_narrow_it():
    def config(**lists: tuple[str, ...]) -> SourceConfig:
        patterns = {key: tuple(re.compile(p) for p in value) for key, value in lists.items()}
        return SourceConfig(name="f", path="f.yaml", topic_prefix="f", **patterns)

    # an include list the server cannot express entirely is not sent: it would drop names
    included = namespace_filter(config(database_include=("shop", r"inv\d")))
    assert included.client_only == (r"database.include.list: inv\d",)
    system_only = {"$nin": ["admin", "config", "local"]}
    assert _conditions(included.stage, "ns.db") == [system_only] * 2
    # an exclude list is sent without the patterns the server cannot express: it excludes less
    excluded = namespace_filter(config(collection_exclude=(r"shop\.audit", r"shop\.\w+_tmp")))
    assert excluded.client_only == (r"collection.exclude.list: shop\.\w+_tmp",)
    regexes = {str(match["$regexMatch"]["regex"]) for match in _conditions(excluded.stage, "$not")}
    assert regexes == {r"\A(?:(?:shop\.audit))\z"}


def _conditions(stage: object, key: str) -> list:
    """Every value under ``key`` anywhere in a pipeline stage."""
    if isinstance(stage, list):
        return [found for item in stage for found in _conditions(item, key)]
    if not isinstance(stage, dict):
        return []
    own = [value for name, value in stage.items() if name == key and isinstance(value, list | dict)]
    found = [c for value in stage.values() for c in _conditions(value, key)]
    return [item for value in own for item in (value if isinstance(value, list) else [value])] + found


def _config(tmp_path: Path, name: str, include: str, database: str, **settings: object) -> SourceConfig:
    return database_source(
        name,
        tmp_path / name,
        include,
        collection_exclude=(re.compile(rf"{database}\.skipped"),),
        **settings,
    )


def test_the_stream_returns_only_captured_namespaces(replica_set, db_name, tmp_path, caplog):
    other = f"{db_name}_other"
    server = _config(tmp_path, "server", db_name, db_name)
    # the same databases through a lookahead, which the server filter cannot take: client filtering
    client_side = _config(tmp_path, "client", f"(?=t_){db_name}", db_name)
    with make_client(replica_set.uri) as client:
        keepers = {}
        for config in (server, client_side, replace(client_side, name="fails")):
            keepers[config.name] = memory_keeper(config, replica_set.name)
            start_without_snapshot(client, replica_set.name, keepers[config.name])

        captured = client[db_name]
        captured.docs.insert_many([{"_id": i} for i in range(3)])
        captured.docs.update_one({"_id": 0}, {"$set": {"a": 1}})
        captured.docs.delete_one({"_id": 1})
        captured.skipped.insert_many([{"_id": i} for i in range(10)])  # collection.exclude.list
        client[other].busy.insert_many([{"_id": i} for i in range(50)])
        client[other].big.insert_one({"_id": "big", "a": "a" * (8 * MB)})
        # with the looked-up document the event is ~23 MB: the server cannot send it
        client[other].big.update_one({"_id": "big"}, {"$set": {"b": "b" * (7 * MB)}})

        # default cursor.oversize.handling.mode fail: the oversized event never reaches the pull
        result = pull_changes(ReplicaSetCapture(client, server, keepers["server"]))
        landed = {f"{db_name}.docs": {"c": 3, "u": 1, "d": 1}}
        assert result.to_dict()["events"] == landed
        assert result.events_received == 5

        # Without the server filter, that event stops the pull (the behaviour before the $match) ...
        with pytest.raises(OversizedEventError):
            pull_changes(ReplicaSetCapture(client, replace(client_side, name="fails"), keepers["fails"]))
        # ... and with skip every database's events reach the client, which lands the same ones (the
        # collection.exclude.list, still translatable, keeps the 10 "skipped" events on the server).
        caplog.clear()
        caplog.set_level(logging.WARNING, logger="mongo_cdc.capture.streaming")
        skipping = replace(client_side, cursor_oversize_handling_mode="skip")
        wide = pull_changes(ReplicaSetCapture(client, skipping, keepers["client"]))
        assert wide.to_dict()["events"] == landed
        assert wide.events_received == 5 + 50 + 2
        fallbacks = [r.getMessage() for r in caplog.records if "cannot be matched on the server" in r.message]
        assert fallbacks == [
            f"replica set {replica_set.name}: database.include.list: (?=t_){db_name} cannot be matched on "
            "the server exactly; every namespace it could concern is sent to the pull and filtered there"
        ]

        # a busy uncaptured database and a quiet captured one: the offset still moves past the writes
        client[other].busy.insert_many([{"_id": i} for i in range(50, 80)])
        written = client.admin.command("ping")["operationTime"]
        quiet = pull_changes(ReplicaSetCapture(client, server, keepers["server"]))
        assert quiet.events_received == 0 and quiet.batches == 0
        assert keepers["server"].load().cluster_time >= pack_cluster_time(written.time, written.inc)
