"""The start position keys, ``capture.start.op.time`` and ``capture.start.resume.token``: their
formats, their refusals (each naming the file, the key, the value and what is allowed), and the
snapshot modes they work with."""

from __future__ import annotations

import pytest
import yaml
from bson import Timestamp

from mongo_cdc.config import SourceConfigError, load_source
from mongo_cdc.config.values import op_time_text

# 2026-01-01T00:00:00Z
NEW_YEAR = 1767225600
TOKEN = "826B1523B0000000122B0229296E04"


def load(tmp_path, text: str):
    path = tmp_path / "shop.yaml"
    path.write_text(f"topic.prefix: shop\nsnapshot.mode: no_data\n{text}\n")
    return load_source(str(path))


def refusal(tmp_path, text: str) -> str:
    with pytest.raises(SourceConfigError) as refused:
        load(tmp_path, text)
    return str(refused.value)


@pytest.mark.parametrize(
    "written",
    [
        f"{NEW_YEAR}",  # epoch seconds, as Debezium takes them
        f'"{NEW_YEAR}"',
        "2026-01-01T00:00:00Z",  # unquoted: YAML reads it as a datetime itself
        '"2026-01-01T00:00:00Z"',
        '"2026-01-01T02:00:00+02:00"',
        f"{NEW_YEAR}:0",  # unquoted: YAML 1.1 would read a base-60 number
        f'"{NEW_YEAR}:0"',
    ],
)
def test_the_three_formats_give_the_same_timestamp(tmp_path, written):
    config = load(tmp_path, f"capture.start.op.time: {written}")
    assert config.capture_start_op_time == Timestamp(NEW_YEAR, 0)
    assert config.start_position_key == "capture.start.op.time"


def test_an_increment_is_kept_and_written_back_in_the_form_the_key_accepts(tmp_path):
    op_time = load(tmp_path, f"capture.start.op.time: {NEW_YEAR}:7").capture_start_op_time
    assert op_time == Timestamp(NEW_YEAR, 7)
    written_back = load(tmp_path, f"capture.start.op.time: '{op_time_text(op_time)}'")
    assert written_back.capture_start_op_time == op_time


def test_without_the_keys_the_stream_starts_from_now(tmp_path):
    config = load(tmp_path, "")
    assert (config.capture_start_op_time, config.capture_start_resume_token) == (None, None)
    assert config.start_position_key is None


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("yesterday", ""),
        ("true", ""),
        ("-5", ""),
        ("2026-01-01", ""),  # a date: which second of it?
        ('"2026-01-01T00:00:00"', "needs its zone"),
        ('"2026-01-01T00:00:00.5Z"', "whole seconds only"),
        (f"{NEW_YEAR}000", "seconds from 1 to 4294967295"),  # milliseconds by mistake
        ("0", "seconds from 1"),
        (f"{NEW_YEAR}:4294967296", "increment from 0 to 4294967295"),
    ],
)
def test_a_bad_op_time_names_the_file_the_key_the_value_and_the_formats(tmp_path, written, why):
    message = refusal(tmp_path, f"capture.start.op.time: {written}")
    assert message.startswith(f"{tmp_path / 'shop.yaml'}: key 'capture.start.op.time' is ")
    assert "epoch seconds (1767225600), ISO-8601 with a zone (2026-01-01T00:00:00Z)" in message
    assert "<seconds>:<increment> (1767225600:3)" in message
    assert why in message


def test_a_resume_token_is_its_data_hex(tmp_path):
    config = load(tmp_path, f"capture.start.resume.token: {TOKEN.lower()}")
    assert config.capture_start_resume_token == TOKEN  # as the server writes tokens
    assert config.start_position_key == "capture.start.resume.token"


@pytest.mark.parametrize("written", ["'{_data: 82}'", "82ZZ00000000000000", "8200", "0123456789abcdef0123"])
def test_a_bad_resume_token_names_the_key_and_the_form(tmp_path, written):
    message = refusal(tmp_path, f"capture.start.resume.token: {written}")
    assert "key 'capture.start.resume.token' is " in message
    assert "the _data string of a change stream's resume token" in message


def test_the_op_time_and_the_token_exclude_each_other(tmp_path):
    message = refusal(tmp_path, f"capture.start.op.time: {NEW_YEAR}\ncapture.start.resume.token: {TOKEN}")
    assert (
        "key 'capture.start.resume.token' cannot be used together with 'capture.start.op.time'; "
        "keep one of them"
    ) in message


@pytest.mark.parametrize("mode", ["initial", "when_needed", "always", "initial_only"])
@pytest.mark.parametrize("key", ["capture.start.op.time", "capture.start.resume.token"])
def test_a_start_position_is_refused_with_a_mode_that_copies_naming_the_modes_it_works_with(
    tmp_path, mode, key
):
    path = tmp_path / "shop.yaml"
    value = NEW_YEAR if key == "capture.start.op.time" else TOKEN
    path.write_text(yaml.safe_dump({"topic.prefix": "shop", "snapshot.mode": mode, key: value}))
    with pytest.raises(SourceConfigError) as refused:
        load_source(str(path))
    assert str(refused.value) == (
        f"{path}: key '{key}' starts streaming without copying, which snapshot.mode '{mode}' does not "
        f"do; it works with snapshot.mode no_data or never: set one of them, or drop '{key}'"
    )


def test_never_takes_a_start_position_as_no_data_does(tmp_path):
    path = tmp_path / "shop.yaml"
    path.write_text(f"topic.prefix: shop\nsnapshot.mode: never\ncapture.start.op.time: {NEW_YEAR}\n")
    assert load_source(str(path)).capture_start_op_time == Timestamp(NEW_YEAR, 0)
