"""S3 for the tests: moto's S3 server on a free loopback port, a bucket per test, an Airflow ``aws``
connection pointing at it, and the ``LakeLocation`` of ``s3://<bucket>/lake``.

The server runs as a child process (``python -m moto.server``), not as moto's in-process
``ThreadedMotoServer``: some delta-rs calls (``DeltaTable.history``, every I/O of its pyarrow
``DeltaStorageHandler``) keep the GIL while they wait for the server, so an in-process server
never answers them and the call times out. A child process also serves Spark's and Airflow's
own subprocesses.

Imported by conftest.py as a pytest plugin (``pytest_plugins``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from mongo_cdc.lake.storage import LakeLocation

MOTO_KEY = "testing"  # moto accepts any credentials; these look like real ones to every client
MOTO_REGION = "us-east-1"
LAKE_CONN_ID = "lake_s3"
SECRET_LAKE_CONN_ID = "lake_s3_secret"
_START_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server that lives for the test session."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start; see {log}") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A new, empty bucket for one test."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id=MOTO_KEY,
        aws_secret_access_key=MOTO_KEY,
        region_name=MOTO_REGION,
    ).create_bucket(Bucket=name)
    return name


def aws_connection(endpoint: str, secret: str = MOTO_KEY) -> str:
    """An Airflow ``aws`` connection (JSON) whose ``endpoint_url`` is the moto server at ``endpoint``."""
    return json.dumps(
        {
            "conn_type": "aws",
            "login": MOTO_KEY,
            "password": secret,
            "extra": {"endpoint_url": endpoint, "region_name": MOTO_REGION},
        }
    )


@pytest.fixture
def lake_s3_connection(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Id of an Airflow ``aws`` connection (``AIRFLOW_CONN_LAKE_S3``) whose ``endpoint_url`` is moto."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{LAKE_CONN_ID.upper()}", aws_connection(moto_endpoint))
    return LAKE_CONN_ID


@pytest.fixture
def s3_lake(s3_bucket: str, lake_s3_connection: str) -> LakeLocation:
    """``s3://<bucket>/lake`` with the credentials the Airflow side derives from the connection."""
    from mongo_cdc_airflow.lake_storage import lake_location

    return lake_location(f"s3://{s3_bucket}/lake", lake_s3_connection)


@pytest.fixture(params=["local", "s3"])
def local_or_s3_lake(request: pytest.FixtureRequest, tmp_path: Path) -> LakeLocation:
    """The same test on a local lake (``<tmp_path>/lake``) and on ``s3_lake``."""
    if request.param == "local":
        return LakeLocation(str(tmp_path / "lake"))
    return request.getfixturevalue("s3_lake")


@pytest.fixture
def s3_lake_with_a_unique_secret(
    s3_bucket: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> LakeLocation:
    """``s3_lake`` through connection ``SECRET_LAKE_CONN_ID``, whose secret key is new for each test (moto
    takes any): text that can only have come from that connection, for tests that look for it in
    command lines and logs."""
    from mongo_cdc_airflow.lake_storage import lake_location

    secret = f"lake-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{SECRET_LAKE_CONN_ID.upper()}", aws_connection(moto_endpoint, secret))
    return lake_location(f"s3://{s3_bucket}/lake", SECRET_LAKE_CONN_ID)


def moto_options(endpoint: str) -> dict[str, str]:
    """The delta-rs storage options of the moto server, written out (for tests of the mapping)."""
    return {
        "AWS_ACCESS_KEY_ID": MOTO_KEY,
        "AWS_SECRET_ACCESS_KEY": MOTO_KEY,
        "AWS_REGION": MOTO_REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
