"""Field exclusion and renames, sanitized column names, snapshot-only-some-collections,
and the capture filters, each changing the output as documented."""

from __future__ import annotations

import re

import bson
import pyarrow as pa
import pytest
import yaml
from bson import json_util
from bson_by_hand import DBPOINTER, SYMBOL, UNDEFINED, array, document, embedded

from mongo_cdc.capture.field_filters import FieldFilters, FieldRenameConflict, collection_field_rules
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc.config.field_rules import parse_rules
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import column_types
from mongo_cdc.transform.table_layout import TableLayout, avro_name, documents_to_batch
from mongo_cdc_dev.testing import ReplicaSet
from mongo_cdc_dev.testing.lake import memory_keeper


def rules_for(namespace: str, exclude: object = (), renames: object = ()):
    db, collection = namespace.split(".", 1)
    rules = parse_rules("field.exclude.list", list(exclude)) + parse_rules("field.renames", list(renames))
    return FieldFilters(rules).for_collection(db, collection)


def rewritten(fields, document: dict) -> dict:
    """``document`` through the rules, which rewrite BSON."""
    return bson.decode(fields.document(bson.encode(document)))


def rewritten_description(fields, description: dict) -> dict:
    """An update description through the rules, ``updatedFields`` decoded (the rules rewrite BSON)."""
    raw = {**description, "updatedFields": bson.encode(description["updatedFields"])}
    rewritten = fields.update_description(raw)
    return {**rewritten, "updatedFields": bson.decode(rewritten["updatedFields"])}


# --- the document rewriting ------------------------------------------------------------------------


def test_exclusion_reaches_nested_fields_and_every_sub_document_of_an_array():
    fields = rules_for(
        "shop.orders", exclude=["shop.orders.secret", "shop.orders.items.cost", "shop.orders.a.b.c"]
    )
    document = {
        "_id": 1,
        "secret": "x",
        "items": [{"sku": "A", "cost": 3}, 7, [{"sku": "B", "cost": 4}]],
        "a": {"b": {"c": 1, "d": 2}, "c": 3},
        "cost": 5,  # same name at another level: kept
    }
    assert rewritten(fields, document) == {
        "_id": 1,
        "items": [{"sku": "A"}, 7, [{"sku": "B"}]],
        "a": {"b": {"d": 2}, "c": 3},
        "cost": 5,
    }


def test_renames_keep_the_field_position_and_apply_one_after_the_other():
    # the second entry names the field by the name the first one gave it (Debezium's order)
    fields = rules_for("shop.orders", renames=["shop.orders.name:label", "shop.orders.label.first:given"])
    renamed = rewritten(fields, {"_id": 1, "name": {"first": "Ada", "last": "L"}, "z": 0})
    assert list(renamed) == ["_id", "label", "z"]
    assert renamed["label"] == {"given": "Ada", "last": "L"}


def test_exclusions_come_before_renames_whatever_the_key_order():
    fields = rules_for("s.c", exclude=["s.c.old"], renames=["s.c.new:old"])
    assert rewritten(fields, {"_id": 1, "old": 1, "new": 2}) == {"_id": 1, "old": 2}


def test_wildcards_select_databases_and_collections_not_fields():
    rules = parse_rules("field.exclude.list", "shop*.*.secret, *.audit.ip")
    filters = FieldFilters(rules)
    assert filters.for_collection("shop_eu", "orders") is not None
    assert filters.for_collection("other", "orders") is None  # the snapshot keeps its fast path
    assert rewritten(filters.for_collection("other", "audit"), {"_id": 1, "ip": 1, "secret": 2}) == {
        "_id": 1,
        "secret": 2,
    }
    assert filters.for_collection("shopx", "orders.archive") is not None  # '*' spans a dotted name
    exact = FieldFilters(parse_rules("field.exclude.list", "shop.orders.a"))
    assert exact.for_collection("shopx", "orders") is None


def test_update_descriptions_follow_dotted_paths_and_array_positions():
    fields = rules_for(
        "shop.orders",
        exclude=["shop.orders.secret", "shop.orders.items.cost"],
        renames=["shop.orders.customer.name:fullName"],
    )
    description = {
        "updatedFields": {
            "secret": 1,
            "secret.inner": 2,
            "items.0.cost": 3,
            "items.1": {"sku": "B", "cost": 4},
            "items": [{"sku": "C", "cost": 5}],
            "customer.name": "Ada",
            "customer": {"name": "Bob", "age": 3},
            "total": 9,
        },
        "removedFields": ["secret", "items.2.cost", "customer.name", "customer", "total"],
        "truncatedArrays": [{"field": "items", "newSize": 1}, {"field": "secret", "newSize": 0}],
    }
    assert rewritten_description(fields, description) == {
        "updatedFields": {
            "items.1": {"sku": "B"},
            "items": [{"sku": "C"}],
            "customer.fullName": "Ada",
            "customer": {"fullName": "Bob", "age": 3},
            "total": 9,
        },
        "removedFields": ["customer.fullName", "customer", "total"],
        "truncatedArrays": [{"field": "items", "newSize": 1}],
    }


def test_update_descriptions_keep_the_bytes_of_every_other_value():
    """The rules rewrite ``updatedFields`` by elements: values of the deprecated types stay as sent."""
    fields = rules_for("s.c", exclude=["s.c.secret", "s.c.items.cost"], renames=["s.c.name:title"])
    updated = [
        ("name.first", SYMBOL),
        ("secret", DBPOINTER),
        ("items", array([embedded([("cost", UNDEFINED), ("sku", SYMBOL)]), DBPOINTER])),
        ("$odd.name", UNDEFINED),
    ]
    rewritten = fields.update_description({"updatedFields": document(updated), "removedFields": ["secret"]})
    assert rewritten["updatedFields"] == document(
        [
            ("title.first", SYMBOL),
            ("items", array([embedded([("sku", SYMBOL)]), DBPOINTER])),
            ("$odd.name", UNDEFINED),
        ]
    )
    assert rewritten["removedFields"] == []


def test_a_rename_onto_an_existing_field_is_refused_not_overwritten():
    fields = rules_for("s.c", renames=["s.c.a:b"])
    with pytest.raises(FieldRenameConflict, match=r"'s.c.a:b'.*already has a field 'b'"):
        fields.document(bson.encode({"_id": 1, "a": 1, "b": 2}))
    with pytest.raises(FieldRenameConflict, match="sets both 'a' and 'b'"):
        fields.update_description({"updatedFields": bson.encode({"a": 1, "b": 2})})


# --- validation ------------------------------------------------------------------------------------


def write(tmp_path, content: dict, name: str = "src.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"topic.prefix": "p", **content}))
    return path


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"field.exclude.list": "shop.orders"},
            "key 'field.exclude.list' has 'shop.orders'; expected <database>.<collection>.<field>",
        ),
        ({"field.exclude.list": ["shop..x"]}, "key 'field.exclude.list' has 'shop..x'; expected"),
        ({"field.exclude.list": {"a": 1}}, "key 'field.exclude.list' must be a list or a comma-separated"),
        (
            {"field.renames": "shop.orders.a"},
            "key 'field.renames' has 'shop.orders.a'; expected <database>.<collection>.<field>"
            "[.<nested field>...]:<new name>",
        ),
        ({"field.renames": "shop.orders.a:"}, "key 'field.renames' has 'shop.orders.a:'; expected"),
        ({"field.renames": "shop.orders.a:b.c"}, "key 'field.renames' has 'shop.orders.a:b.c'; expected"),
        ({"field.exclude.list": "shop.*._id"}, "'shop.*._id': the document key '_id' cannot be excluded"),
        ({"field.renames": "shop.orders._id:key"}, "'shop.orders._id:key': the document key '_id' cannot"),
        ({"sanitize.field.names": "yes"}, "key 'sanitize.field.names' must be true or false"),
        (
            {"snapshot.include.collection.list": ["shop.(orders"]},
            "key 'snapshot.include.collection.list': invalid regular expression",
        ),
    ],
)
def test_malformed_entries_are_refused_naming_key_entry_and_format(tmp_path, content, message):
    with pytest.raises(SourceConfigError, match=re.escape(message)):
        load_source(write(tmp_path, content))


def test_nested_id_fields_are_ordinary_fields(tmp_path):
    config = load_source(write(tmp_path, {"field.renames": "shop.orders.ref._id:refId"}))
    assert rewritten(collection_field_rules(config, "shop", "orders"), {"_id": 1, "ref": {"_id": 2}}) == {
        "_id": 1,
        "ref": {"refId": 2},
    }


# --- sanitize.field.names --------------------------------------------------------------------------


def test_avro_names_replace_every_other_character_and_a_leading_digit():
    assert [avro_name(n) for n in ("ok_1", "unit-price", "1st", "a.b c", "é", "")] == [
        "ok_1",
        "unit_price",
        "_st",
        "a_b_c",
        "_",
        "_",
    ]


def test_sanitized_columns_keep_valid_names_and_move_colliding_ones_aside():
    document = {"_id": 1, "a-b": 1, "a_b": 2, "__op": 3, "n": {"x.y": 1, "x_y": 2}, "l": [{"k-1": 1}]}
    empty = TableLayout((("__op", column_types.STRING),), sanitize_field_names=True)
    layout, batch = documents_to_batch(empty, {"__op": pa.array(["c"])}, [document])
    names = {column.column: column.field for column in layout.document_columns}
    assert names == {"_id": "_id", "___op": "__op", "_a_b": "a-b", "a_b": "a_b", "l": "l", "n": "n"}
    assert [field.name for field in batch.schema.field("n").type] == ["_x_y", "x_y"]
    assert batch.schema.field("l").type.value_type.field(0).name == "k_1"
    # values still come from the documents' own names
    [row] = batch.to_pylist()
    assert (row["__op"], row["___op"], row["_a_b"], row["a_b"], row["n"]) == (
        "c",
        3,
        1,
        2,
        {"_x_y": 1, "x_y": 2},
    )
    unsanitized = TableLayout((("__op", column_types.STRING),)).evolved(empty.survey([document]))
    assert "a-b" in {column.column for column in unsanitized.document_columns}


# --- end to end against the real replica set ---------------------------------------------------------


def after_of(row: dict) -> dict | None:
    return None if row["after"] is None else bson.decode(row["after"])


def test_rules_sanitizing_and_snapshot_include_through_the_dag(cdc_source, replica_set: ReplicaSet, db_name):
    db = replica_set.client()[db_name]
    db.orders.insert_many(
        [
            {"_id": 1, "name": "a", "secret": "s1", "items": [{"sku": "A", "cost": 1}], "unit-price": 2},
            {"_id": 2, "name": "b", "secret": "s2", "items": [], "unit-price": 3},
        ]
    )
    db.audit.insert_one({"_id": "before-snapshot", "ip": "1.2.3.4"})
    source = cdc_source(
        db_name,
        **{
            "field.exclude.list": f"{db_name}.orders.secret, {db_name}.*.items.cost, {db_name}.audit.ip",
            "field.renames": [f"{db_name}.orders.name:title"],
            "sanitize.field.names": True,
            "snapshot.include.collection.list": [re.escape(db_name) + r"\.orders"],
        },
    )
    source.run(skip_spark=True)
    assert [after_of(r) for r in source.raw_rows("orders")] == [
        {"_id": 1, "title": "a", "items": [{"sku": "A"}], "unit-price": 2},
        {"_id": 2, "title": "b", "items": [], "unit-price": 3},
    ]
    assert source.raw_rows("audit") == []  # streamed only: its existing document is not copied

    db.orders.update_one({"_id": 1}, {"$set": {"secret": "s3", "name": "a2", "items.0.cost": 5}})
    db.orders.update_one({"_id": 2}, {"$unset": {"secret": ""}, "$push": {"items": {"sku": "B", "cost": 6}}})
    db.audit.insert_one({"_id": "streamed", "ip": "5.6.7.8", "user": "u"})
    source.run()

    streamed = [r for r in source.raw_rows("orders") if r["op"] == "u"]
    assert [after_of(r) for r in streamed] == [
        {"_id": 1, "title": "a2", "items": [{"sku": "A"}], "unit-price": 2},
        {"_id": 2, "title": "b", "items": [{"sku": "B"}], "unit-price": 3},
    ]
    descriptions = [r["updateDescription"] for r in streamed]
    assert bson.decode(descriptions[0]["updatedFields"]) == {"title": "a2"}
    assert bson.decode(descriptions[1]["updatedFields"]) == {"items": [{"sku": "B"}]}
    assert descriptions[1]["removedFields"] == []
    audit = [(after_of(r), r["op"]) for r in source.raw_rows("audit")]
    assert audit == [({"_id": "streamed", "user": "u"}, "c")]

    state = {row["__id"]: row for row in source.state_rows("orders")}
    assert set(state) == {"1", "2"}
    assert (state["1"]["title"], state["1"]["unit_price"], state["1"]["items"]) == ("a2", 2, [{"sku": "A"}])
    assert "secret" not in state["1"] and "name" not in state["1"]
    assert json_util.loads(state["2"]["__doc"]) == {
        "_id": 2,
        "title": "b",
        "items": [{"sku": "B"}],
        "unit-price": 3,
    }
    changes = sorted(
        source.change_rows("orders"),
        key=lambda row: (row["__cluster_time"], row["__event_order"], row["_id"]),
    )
    assert [(row["__op"], row["title"], row["unit_price"]) for row in changes] == [
        ("r", "a", 2),
        ("r", "b", 3),
        ("u", "a2", 2),
        ("u", "b", 3),
    ]
    assert [row["_id"] for row in source.state_rows("audit")] == ["streamed"]


# --- the capture filters and skipped.operations --------------------------------------------------------


def landed(config, namespaces: list[str]) -> dict[str, list[str]]:
    """The ops of every raw row landed per namespace (tombstones as 'tombstone')."""
    source_lake = SourceLake(LakeLocation(config.lake_root), config.topic_prefix)
    found = {}
    for namespace in namespaces:
        ops = source_lake.committed_raw(namespace, columns=["op"]).column("op").to_pylist()
        found[namespace] = sorted(op or "tombstone" for op in ops)
    return found


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"database.include.list": ["{one}"]}, {"{one}.a": "full", "{one}.b": "full"}),
        ({"database.exclude.list": ["{one}"]}, {"{two}.a": "full", "{two}.b": "full"}),
        (
            {"database.include.list": ["{one}", "{two}"], "collection.include.list": ["{one}.a", ".*[.]b"]},
            {"{one}.a": "full", "{one}.b": "full", "{two}.b": "full"},
        ),
        (
            {"database.include.list": ["{one}", "{two}"], "collection.exclude.list": ["{one}.a"]},
            {"{one}.b": "full", "{two}.a": "full", "{two}.b": "full"},
        ),
        (
            {"database.include.list": ["{one}"], "skipped.operations": "c,d"},
            {"{one}.a": ["r", "u"], "{one}.b": ["r", "u"]},
        ),
        (
            {"database.include.list": ["{one}"], "skipped.operations": ["u"]},
            {"{one}.a": ["c", "d", "r", "tombstone"], "{one}.b": ["c", "d", "r", "tombstone"]},
        ),
    ],
    ids=["db-include", "db-exclude", "coll-include", "coll-exclude", "skip-c-d", "skip-u"],
)
def test_capture_filters_and_skipped_operations_change_what_lands(
    replica_set: ReplicaSet, db_name, tmp_path, settings, expected
):
    one, two = f"{db_name[:50]}_1", f"{db_name[:50]}_2"
    names = [f"{db}.{c}" for db in (one, two) for c in ("a", "b")]
    content = {
        key: [item.format(one=one, two=two) for item in value] if isinstance(value, list) else value
        for key, value in settings.items()
    }
    path = tmp_path / "filters.yaml"
    path.write_text(yaml.safe_dump({"topic.prefix": "f", "lake.root": str(tmp_path / "lake"), **content}))
    config = load_source(path)
    with make_client(replica_set.uri, {}) as client:
        for namespace in names:
            db, collection = namespace.split(".")
            client[db][collection].insert_one({"_id": 0})
        keeper = memory_keeper(config, replica_set.name)
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        for namespace in names:
            db, collection = namespace.split(".")
            client[db][collection].insert_one({"_id": 1})
            client[db][collection].update_one({"_id": 0}, {"$set": {"x": 1}})
            client[db][collection].delete_one({"_id": 1})
        pull_changes(ReplicaSetCapture(client, config, keeper))
    full = ["c", "d", "r", "tombstone", "u"]
    want = {ns.format(one=one, two=two): full if ops == "full" else ops for ns, ops in expected.items()}
    assert landed(config, names) == {ns: want.get(ns, []) for ns in names}


def test_a_narrowed_snapshot_keeps_the_streaming_position_of_the_stream_only_collections(
    replica_set: ReplicaSet, db_name, tmp_path
):
    path = tmp_path / "narrow.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "topic.prefix": "n",
                "lake.root": str(tmp_path / "lake"),
                "database.include.list": [db_name],
                "snapshot.include.collection.list": [f"{db_name}.copied"],
            }
        )
    )
    config = load_source(path)
    names = [f"{db_name}.copied", f"{db_name}.streamed"]
    with make_client(replica_set.uri, {}) as client:
        client[db_name].copied.insert_one({"_id": 0})
        client[db_name].streamed.insert_one({"_id": 0})
        keeper = memory_keeper(config, replica_set.name)
        run_snapshot(ReplicaSetCapture(client, config, keeper))
        pull_changes(ReplicaSetCapture(client, config, keeper))
        client[db_name].streamed.insert_one({"_id": 1})  # written between two runs
        run_snapshot(ReplicaSetCapture(client, config, keeper))  # as snapshot.mode always does
        pull_changes(ReplicaSetCapture(client, config, keeper))
    assert landed(config, names) == {names[0]: ["r", "r"], names[1]: ["c"]}
