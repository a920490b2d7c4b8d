"""``field.hash.list``: each value hashed by its exact BSON bytes under the key, alike on every path,
and a raw table refusing rows hashed under another key or list until a whole copy adopts them."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

import bson
import pytest
from bson import Int64

from mongo_cdc.capture.field_filters import FieldFilters, HashKeyMissing, collection_field_rules
from mongo_cdc.capture.field_hash_marks import FIELD_HASH_PROPERTY, FieldHashChanged, FieldHashMarks
from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc.config.field_rules import parse_rules
from mongo_cdc.field_hashing import HashKey
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc_dev.testing.lake import database_source

SECRET = b"correct horse battery staple"
KEY = HashKey(SECRET)


def hashed_by_hand(value: object, key: bytes = SECRET) -> str:
    """The HMAC of ``value``'s BSON element (type byte, then value bytes), computed here from bson."""
    element = bson.encode({"v": value})[4:-1]  # type byte, name "v\0", value
    return hmac.new(key, element[:1] + element[3:], hashlib.sha256).hexdigest()


def rules(*hash_entries: str, key: HashKey | None = KEY, exclude=(), renames=()):
    parsed = parse_rules("field.exclude.list", list(exclude)) + parse_rules("field.renames", list(renames))
    return FieldFilters(parsed + parse_rules("field.hash.list", list(hash_entries)), key)


def rewritten(fields, document: dict) -> dict:
    return bson.decode(fields.document(bson.encode(document)))


def updated_fields(fields, updated: dict) -> dict:
    return bson.decode(fields.update_description({"updatedFields": bson.encode(updated)})["updatedFields"])


def test_a_hash_is_the_keyed_hmac_of_the_exact_bson_value_so_types_stay_apart():
    fields = rules("s.c.v").for_collection("s", "c")
    values = [1, Int64(1), 1.0, "1", None, True, {"a": "1"}]
    landed = [rewritten(fields, {"_id": 0, "v": value})["v"] for value in values[:6]]
    assert landed == [hashed_by_hand(value) for value in values[:6]]
    assert len(set(landed)) == 6 and all(re.fullmatch("[0-9a-f]{64}", value) for value in landed)
    other_key = rules("s.c.v", key=HashKey(b"another")).for_collection("s", "c")
    assert rewritten(other_key, {"_id": 0, "v": 1})["v"] == hashed_by_hand(1, b"another") != landed[0]


def test_equal_values_hash_equally_in_every_collection_a_wildcard_names():
    filters = rules("shop.*.email")
    users = rewritten(filters.for_collection("shop", "users"), {"_id": 1, "email": "a@b.c"})
    orders = rewritten(filters.for_collection("shop", "orders"), {"_id": 9, "email": "a@b.c", "n": 1})
    assert users["email"] == orders["email"] == hashed_by_hand("a@b.c")
    assert orders["n"] == 1  # other fields keep their values


def test_nested_fields_arrays_of_documents_and_whole_values_keep_their_structure():
    fields = rules("s.c.profile.ssn", "s.c.contacts.phone", "s.c.tags", "s.c.address").for_collection(
        "s", "c"
    )
    document = {
        "_id": 1,
        "profile": {"ssn": "123-45", "age": 30},
        "contacts": [{"phone": "555", "kind": "home"}, {"phone": 555}, "loose"],
        "tags": ["x", ["y"], {"z": 1}],
        "address": {"city": "Paris", "geo": [2.35, 48.85]},
    }
    h = hashed_by_hand
    assert rewritten(fields, document) == {
        "_id": 1,
        "profile": {"ssn": h("123-45"), "age": 30},
        "contacts": [{"phone": h("555"), "kind": "home"}, {"phone": h(555)}, "loose"],
        "tags": [h("x"), [h("y")], {"z": h(1)}],
        "address": {"city": h("Paris"), "geo": [h(2.35), h(48.85)]},
    }


def test_an_update_description_hashes_each_part_as_the_whole_documents_hashing_does():
    fields = rules("s.c.contacts.phone", "s.c.tags", "s.c.address").for_collection("s", "c")
    h = hashed_by_hand
    updated = {
        "contacts.0.phone": "556",
        "contacts.1": {"phone": "557", "kind": "work"},
        "contacts": [{"phone": "558"}],
        "tags.1": "w",
        "address.city": "Lyon",
        "address": {"city": "Nice"},
        "other": "clear",
    }
    assert updated_fields(fields, updated) == {
        "contacts.0.phone": h("556"),
        "contacts.1": {"phone": h("557"), "kind": "work"},
        "contacts": [{"phone": h("558")}],
        "tags.1": h("w"),
        "address.city": h("Lyon"),
        "address": {"city": h("Nice")},
        "other": "clear",
    }
    description = {"updatedFields": bson.encode({}), "removedFields": ["tags", "address.city"],
                   "truncatedArrays": [{"field": "tags", "newSize": 1}]}  # fmt: skip
    kept = fields.update_description(description)  # a hashed field keeps its name
    assert (kept["removedFields"], kept["truncatedArrays"]) == (
        ["tags", "address.city"],
        [{"field": "tags", "newSize": 1}],
    )


def test_hashes_name_fields_as_mongodb_does_between_the_exclusions_and_the_renames():
    fields = rules("s.c.email", "s.c.old", exclude=["s.c.old"], renames=["s.c.email:mail"]).for_collection(
        "s", "c"
    )
    assert rewritten(fields, {"_id": 1, "email": "a@b.c", "old": "gone"}) == {
        "_id": 1,
        "mail": hashed_by_hand("a@b.c"),
    }


def test_no_key_no_hashing_and_the_key_never_shows(tmp_path):
    config = database_source("src", tmp_path, "s", field_hash=parse_rules("field.hash.list", "s.c.email"))
    with pytest.raises(HashKeyMissing, match=r"field.hash.list hashes fields of s.c, but no key was given"):
        collection_field_rules(config, "s", "c")
    assert collection_field_rules(config, "s", "other") is None  # no rule, no key needed
    keyed = config.with_hash_key(HashKey(SECRET))
    assert collection_field_rules(keyed, "s", "c") is not None
    for shown in (repr(keyed), str(keyed), repr(keyed.field_hash_key), keyed.field_hash_key.check):
        assert SECRET.decode() not in shown and SECRET.hex() not in shown
    assert keyed == config  # the key is no part of what a source's settings are


def test_id_cannot_be_hashed_and_entries_take_the_exclusion_form(tmp_path):
    path = tmp_path / "src.yaml"
    for value, message in [
        (
            "shop.orders._id",
            "'shop.orders._id': the document key '_id' cannot be excluded, hashed or renamed",
        ),
        ("shop.orders", "key 'field.hash.list' has 'shop.orders'; expected <database>.<collection>.<field>"),
    ]:
        path.write_text(f"topic.prefix: p\nfield.hash.list: {value}\n")
        with pytest.raises(SourceConfigError, match=re.escape(message)):
            load_source(path)
    path.write_text("topic.prefix: p\nfield.hash.list: [shop.orders.email]\n")
    config = load_source(path)
    assert config.field_hash_conn_id == "mongo_cdc_hash" and config.field_hash_key is None


# --- the raw tables' marks ------------------------------------------------------------------------


def keyed_source(tmp_path, entries: str, secret: bytes = SECRET):
    config = database_source(
        "src", tmp_path / "lake", "s", field_hash=parse_rules("field.hash.list", entries)
    )
    return config.with_hash_key(HashKey(secret)) if entries else config


def test_a_table_keeps_its_first_mark_and_refuses_another_until_a_whole_copy_adopts_it(tmp_path):
    lake = SourceLake(LakeLocation(str(tmp_path / "lake")), "src")
    first = keyed_source(tmp_path, "s.users.email")
    FieldHashMarks(lake, first).check(["s.users", "s.plain"])  # tables created with their marks
    mark = lake.raw_table_properties("s.users")[FIELD_HASH_PROPERTY]
    assert SECRET.decode() not in mark and "s.users.email" in mark
    assert lake.raw_table_properties("s.plain") is None  # nothing hashed there: no table made
    FieldHashMarks(lake, first).check(["s.users"])  # the same key and list: lands

    other_key = keyed_source(tmp_path, "s.users.email", b"rotated")
    with pytest.raises(FieldHashChanged) as refused:
        FieldHashMarks(lake, other_key).check(["s.users"])
    assert str(refused.value).startswith(
        "s.users: the key (the password of connection 'mongo_cdc_hash') changed"
    )
    assert '{"resnapshot": true, "collections": ["s.users"]}' in str(refused.value)
    more = keyed_source(tmp_path, "s.users.email, s.users.phone")
    with pytest.raises(
        FieldHashChanged, match=r"entries were \['s.users.email'\], now \['s.users.email', 's.users.phone'\]"
    ):
        FieldHashMarks(lake, more).check(["s.users"])
    with pytest.raises(FieldHashChanged, match=r"entries were \['s.users.email'\], now \[\]"):
        FieldHashMarks(lake, keyed_source(tmp_path, "")).check(["s.users"])

    FieldHashMarks(lake, other_key).adopt("s.users")  # a re-snapshot copies it whole again
    FieldHashMarks(lake, other_key).check(["s.users"])
    with pytest.raises(FieldHashChanged):
        FieldHashMarks(lake, first).check(["s.users"])


def test_a_table_landed_in_clear_refuses_a_newly_hashed_field(tmp_path):
    lake = SourceLake(LakeLocation(str(tmp_path / "lake")), "src")
    lake.set_raw_table_properties("s.users", {})  # landed before the list named it
    FieldHashMarks(lake, keyed_source(tmp_path, "")).check(["s.users"])
    with pytest.raises(FieldHashChanged, match=r"s.users: its field.hash.list entries were \[\], now"):
        FieldHashMarks(lake, keyed_source(tmp_path, "s.users.email")).check(["s.users", "s.new"])


# --- the key from its Airflow connection ----------------------------------------------------------


def test_the_key_is_the_password_of_the_named_connection_and_a_missing_one_names_the_fix(
    tmp_path, monkeypatch
):
    from mongo_cdc_airflow.hash_key import with_hash_key

    config = database_source("src", tmp_path, "s", field_hash=parse_rules("field.hash.list", "s.c.email"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_MONGO_CDC_HASH", json.dumps({"conn_type": "generic", "password": SECRET.decode()})
    )
    assert with_hash_key(config).field_hash_key == KEY
    monkeypatch.setenv("AIRFLOW_CONN_MONGO_CDC_HASH", '{"conn_type": "generic"}')
    with pytest.raises(SourceConfigError, match="connection 'mongo_cdc_hash' has no password"):
        with_hash_key(config)
    monkeypatch.delenv("AIRFLOW_CONN_MONGO_CDC_HASH")
    with pytest.raises(
        SourceConfigError, match="field.hash.list is set but connection 'mongo_cdc_hash' does not exist"
    ):
        with_hash_key(config)
    plain = database_source("src", tmp_path, "s")
    assert with_hash_key(plain) is plain  # no list: no connection needed
