"""mongo-cdc Extended JSON (mongo_cdc.extjson): lossless for every BSON type; snapshot rows built on it."""

from __future__ import annotations

import json
import math
import re
import uuid

import bson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.json_util import JSONOptions
from bson.json_util import loads as json_util_loads
from bson.raw_bson import RawBSONDocument
from deltalake import DeltaTable

from mongo_cdc import extjson
from mongo_cdc.capture import chunk_reads, snapshot
from mongo_cdc.capture.field_filters import FieldFilters
from mongo_cdc.capture.raw_rows import SourceInfo
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot_columns import SnapshotColumns
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.field_rules import parse_rules
from mongo_cdc.lake import RAW_SCHEMA
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc_dev.testing.lake import memory_keeper

LOADS_OPTIONS = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
OID = ObjectId("65a1b2c3d4e5f60718293a4b")

# One value per BSON type (the deprecated symbol/undefined/DBPointer aside), plus edge values.
VALUES = {
    "double": 12.5,
    "double_integral": 1.0,
    "double_negative_zero": -0.0,
    "double_max": 1.7976931348623157e308,
    "double_min_subnormal": 5e-324,
    "string": 'héllo "quoted" \\ back\nslash \x01 🚀',
    "document": {"a": 1, "b": {"c": [1, 2]}},
    "empty_document": {},
    "array": [1, "two", 3.0, None, {"four": 4}],
    "empty_array": [],
    "binary_generic": Binary(b"\x00\x01\xfe\xff", 0),
    "binary_uuid": Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 4),
    "binary_user": Binary(b"abc", 0x80),
    "objectid": OID,
    "bool_true": True,
    "bool_false": False,
    "date": DatetimeMS(1_700_000_000_123),
    "date_before_epoch": DatetimeMS(-1),
    "date_before_year_1": DatetimeMS(-62_135_596_800_000 - 86_400_000 * 400),
    "date_after_year_9999": DatetimeMS(253_402_300_800_000 + 1),
    "null": None,
    "regex": Regex("^a.*b$", "imsx"),
    "code": Code("function () { return 1; }"),
    "code_with_scope": Code("function () { return x; }", {"x": 1}),
    "int32": 1234,
    "int32_min": -(2**31),
    "int32_max": 2**31 - 1,
    "int64": Int64(1234),
    "int64_beyond_int32": 2**40,
    "int64_min": Int64(-(2**63)),
    "timestamp": Timestamp(1_700_000_000, 7),
    "decimal128": Decimal128("1.10"),
    "decimal128_nan": Decimal128("NaN"),
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "dbref": DBRef("customers", OID, "shop", extra="field"),
    "nan": float("nan"),
    "inf": float("inf"),
    "ninf": float("-inf"),
}


def decoded(document: dict) -> dict:
    """``document`` as a snapshot or a change stream hands it to ``encode``."""
    return bson.decode(bson.encode(document), extjson.DECODE_OPTIONS)


def assert_round_trip(document: dict) -> str:
    """encode -> json_util.loads gives back exactly the same BSON (types, bits and field order)."""
    original = bson.encode(document)
    text = extjson.encode_str(bson.decode(original, extjson.DECODE_OPTIONS))
    assert bson.encode(json_util_loads(text, json_options=LOADS_OPTIONS)) == original, text
    return text


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_bson_type_round_trips_through_json_util(name):
    assert_round_trip({"_id": 1, name: VALUES[name]})


def test_a_document_with_every_type_round_trips():
    text = assert_round_trip({"_id": OID, **VALUES, "nested": {"deep": [VALUES, [VALUES]]}})
    json.loads(text)  # strict JSON: no bare NaN/Infinity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), {"$numberDouble": "NaN"}),
        (float("inf"), {"$numberDouble": "Infinity"}),
        (float("-inf"), {"$numberDouble": "-Infinity"}),
    ],
)
def test_non_finite_doubles_are_spelled_out_wherever_they_are(value, expected):
    document = {"_id": 1, "top": value, "sub": {"x": value}, "list": [1, [value]], "null": None, "s": "null"}
    parsed = json.loads(assert_round_trip(document))
    assert parsed["top"] == parsed["sub"]["x"] == parsed["list"][1][0] == expected
    assert parsed["null"] is None and parsed["s"] == "null"


def test_a_document_with_null_text_but_no_nan_is_unchanged():
    document = {"_id": 1, "a": None, "b": "null", "c": [None, 1.5]}
    assert json.loads(extjson.encode(decoded(document))) == document


def test_int32_int64_double_and_dates_keep_their_types():
    parsed = json.loads(
        extjson.encode(decoded({"i32": 5, "i64": Int64(5), "big": 2**40, "f": 5.0, "d": DatetimeMS(-5)}))
    )
    assert parsed == {
        "i32": 5,
        "i64": {"$numberLong": "5"},
        "big": {"$numberLong": str(2**40)},
        "f": 5.0,
        "d": {"$date": {"$numberLong": "-5"}},
    }
    assert isinstance(parsed["f"], float) and isinstance(parsed["i32"], int)


def test_encode_str_is_encode_as_text():
    document = decoded({"_id": OID, "v": VALUES["string"]})
    assert extjson.encode_str(document) == extjson.encode(document).decode()


@pytest.mark.parametrize(
    ("document_id", "expected"),
    [
        (1234, {"id": "1234"}),
        (12.34, {"id": "12.34"}),
        ("1234", {"id": '"1234"'}),
        (OID, {"id": '{"$oid":"65a1b2c3d4e5f60718293a4b"}'}),
        (Int64(1234), {"id": '{"$numberLong":"1234"}'}),
        (Binary(b"\x01\x02\x03", 0), {"id": '{"$binary":{"base64":"AQID","subType":"00"}}'}),
        ({"a": 1, "b": "x"}, {"id": '{"a":1,"b":"x"}'}),
    ],
)
def test_debezium_key_is_the_extended_json_of_the_id(document_id, expected):
    key = extjson.document_key(decoded({"_id": document_id})["_id"])
    assert json.loads(key) == expected
    # the id text itself parses back to the same _id
    restored = json_util_loads(f'{{"_id": {expected["id"]}}}', json_options=LOADS_OPTIONS)
    assert bson.encode(restored) == bson.encode({"_id": document_id})


def test_objectid_key_fast_path_matches_the_generic_encoding():
    import orjson

    for oid in (OID, ObjectId(), ObjectId("000000000000000000000000")):
        assert extjson.document_key(oid) == orjson.dumps({"id": extjson.encode_str(oid)}).decode()


def test_unknown_types_are_refused_not_stringified():
    with pytest.raises(TypeError):
        extjson.encode({"v": object()})


# ---------------------------------------------------------------------------------------------
# The snapshot hot path builds the same rows as encoding documents one by one.
# ---------------------------------------------------------------------------------------------


def _snapshot_documents() -> list[dict]:
    documents = [{"_id": i, **{name: VALUES[name] for name in sorted(VALUES)[i % 7 :: 7]}} for i in range(40)]
    documents += [
        {"_id": OID, "nan": float("nan")},
        {"_id": "text-id", "s": "ünïcødé"},
        {"_id": {"compound": 1}, "big": "x" * 300_000},
        {"_id": Binary(b"\x07", 0)},
    ]
    documents += [
        {"_id": ObjectId(), "n": i, "when": DatetimeMS(i), "big": Int64(i), "p": i / 7, "tags": [str(i)]}
        for i in range(2_500)
    ]
    return documents


def test_snapshot_columns_build_the_rows_of_the_documents_one_by_one():
    cluster_time = 5 << 32 | 1
    block = SourceInfo("p", "rs0").block("db", "coll", cluster_time, 5000, snapshot=True)
    raw = [bson.encode(document) for document in _snapshot_documents()]
    documents = [bson.decode(data, extjson.DECODE_OPTIONS) for data in raw]
    buffer = SnapshotColumns(block, cluster_time, 9, max_rows=1_000)
    # _ids of every type (keys decoded one by one), then ObjectIds only (keys built in bulk)
    first = list(buffer.record_batches(b"".join(raw[:100])))
    rest = list(buffer.record_batches(b"".join(raw[100:])))
    assert [batch.num_rows for batch in first + rest] == [100, 1_000, 1_000, 444]
    batched = pa.Table.from_batches(first + rest)
    one_by_one = rows_to_table(
        [
            {
                "key": extjson.document_key(document["_id"]),
                "op": "r",
                "after": data,
                "source": block,
                "cluster_time": cluster_time,
                "event_order": "",
            }
            for document, data in zip(documents, raw, strict=True)
        ],
        9,
    )
    assert batched.schema == one_by_one.schema == RAW_SCHEMA
    assert batched.drop_columns(["ts_ms"]).equals(one_by_one.drop_columns(["ts_ms"]))
    assert batched.column("after").to_pylist() == raw  # the server's own bytes, not re-encoded


def test_snapshot_columns_refuse_a_batch_with_a_bad_document_length():
    block = SourceInfo("p", "rs0").block("db", "coll", 5 << 32 | 1, 5000, snapshot=True)
    data = bson.encode({"_id": OID})
    for damaged in (data + data[:3], data + b"\x00\x00\x00\x00" + data, data[:-1]):
        with pytest.raises(bson.errors.InvalidBSON, match="bad document length"):
            list(SnapshotColumns(block, 5 << 32 | 1, 1).record_batches(damaged))


def test_snapshot_columns_re_encode_only_documents_of_collections_with_field_rules():
    rules = FieldFilters(parse_rules("field.exclude.list", ["db.coll.secret"])).for_collection("db", "coll")
    block = SourceInfo("p", "rs0").block("db", "coll", 5 << 32 | 1, 5000, snapshot=True)
    document = {"_id": 1, "secret": "x", "kept": {"$numberLong": "5"}}
    buffer = SnapshotColumns(block, 5 << 32 | 1, 1, rules)
    [rows] = buffer.record_batches(bson.encode(document))
    assert rows.column("after").to_pylist() == [bson.encode({"_id": 1, "kept": {"$numberLong": "5"}})]
    assert rows.column("key").to_pylist() == ['{"id":"1"}']


class BatchSizes:
    """``SourceLake.write_chunk`` that also records the rows of each Arrow batch the snapshot hands over."""

    def __init__(self, monkeypatch) -> None:
        self.sizes: list[int] = []
        write_chunk = SourceLake.write_chunk

        def recording(source_lake, rs, seq, chunk, data):
            def batches():
                # a small chunk comes held whole, as a table of the batches read
                for batch in data.to_batches() if isinstance(data, pa.Table) else data:
                    self.sizes.append(batch.num_rows)
                    yield batch

            write_chunk(
                source_lake, rs, seq, chunk, pa.RecordBatchReader.from_batches(data.schema, batches())
            )

        monkeypatch.setattr(SourceLake, "write_chunk", recording)


def test_snapshot_rows_equal_documents_encoded_one_by_one(replica_set, db_name, tmp_path, monkeypatch):
    # small record batches and server batches so every boundary of the hot loop is crossed
    monkeypatch.setattr(snapshot, "ROW_GROUP_ROWS", 100)
    handed_over = BatchSizes(monkeypatch)
    documents = _snapshot_documents()
    with replica_set.client(datetime_conversion=DatetimeConversion.DATETIME_MS) as client:
        client[db_name]["things"].insert_many(documents)
        client[db_name].create_collection("nothing")
        config = SourceConfig(
            name="t",
            path="<test>",
            topic_prefix="t",
            lake_root=str(tmp_path),
            database_include=(re.compile(re.escape(db_name)),),
            snapshot_fetch_size=333,
        )
        keeper = memory_keeper(config, "rs0")
        result = snapshot.run_snapshot(ReplicaSetCapture(client, config, keeper))
        raw_things = client[db_name].get_collection("things", codec_options=CodecOptions(RawBSONDocument))
        expected = {
            extjson.document_key(bson.decode(d.raw, extjson.DECODE_OPTIONS)["_id"]): d.raw
            for d in raw_things.find()
        }

    assert result.documents == {f"{db_name}.nothing": 0, f"{db_name}.things": len(documents)}
    source_lake = keeper.lake
    # an empty collection gets no raw table; the snapshot's manifest says it was copied (empty)
    assert table_if_exists(source_lake.raw_uri(f"{db_name}.nothing"), {}) is None
    [manifest] = [batch.manifest for batch in source_lake.batches() if batch.manifest is not None]
    assert set(manifest.collections) == {f"{db_name}.nothing", f"{db_name}.things"}
    # the Arrow batches handed to delta-rs: at most ROW_GROUP_ROWS rows of one server batch (333 rows)
    assert max(handed_over.sizes) <= 100 and sum(handed_over.sizes) == len(documents)
    assert handed_over.sizes[:5] == [100, 100, 100, 33, 100]  # replies of snapshot.fetch.size (333)
    things = DeltaTable(source_lake.raw_uri(f"{db_name}.things"))
    assert things.version() == 0  # the whole copy is one commit
    for uri in things.file_uris():
        # every data file has the raw schema (the hour partition is in the Delta log, not the file)
        assert pq.read_schema(uri).remove_metadata() == RAW_SCHEMA.remove(RAW_SCHEMA.get_field_index("hour"))
    table = source_lake.committed_raw(f"{db_name}.things")
    assert table.schema == RAW_SCHEMA
    assert (
        dict(zip(table.column("key").to_pylist(), table.column("after").to_pylist(), strict=True)) == expected
    )
    assert set(table.column("op").to_pylist()) == {"r"}
    assert set(table.column("batch_seq").to_pylist()) == {result.seq}
    sources = table.column("source").to_pylist()
    assert all(s == sources[0] for s in sources) and sources[0]["snapshot"] is True
    assert sources[0]["db"] == db_name and sources[0]["collection"] == "things"
    assert len(set(table.column("cluster_time").to_pylist())) == 1
    assert set(table.column("event_order").to_pylist()) == {""}
    assert all(v is None for name in ("before", "updateDescription") for v in table.column(name).to_pylist())
    nan_row = bson.decode(expected[extjson.document_key(OID)])
    assert math.isnan(nan_row["nan"])


def test_raw_batch_replies_are_cut_without_decoding_their_batch():
    batch = [{"_id": i, "v": "x" * i} for i in range(3)]
    reply = {"cursor": {"nextBatch": batch, "id": Int64(7), "ns": "db.c"}, "ok": 1.0}
    small, array, key = chunk_reads._without_batch(memoryview(bson.encode(reply)))
    assert key == "nextBatch"
    assert bson.decode(small) == {"cursor": {"nextBatch": [], "id": 7, "ns": "db.c"}, "ok": 1.0}
    assert bson._array_of_documents_to_buffer(array) == b"".join(bson.encode(d) for d in batch)
    # a type the walk does not know (a regex): pymongo's own unpacking takes the reply
    odd = {"note": Regex("^x"), **reply}
    assert chunk_reads._without_batch(memoryview(bson.encode(odd))) is None
