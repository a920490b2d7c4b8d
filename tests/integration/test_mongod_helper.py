"""The throwaway mongod launcher (mongo_cdc_dev.testing): a missing binary is named, members crash,
restart on their data and port, and elect a new primary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mongo_cdc_dev.testing import MongodError, ReplicaSet, find_mongod


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_missing_binary_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MONGOD_BIN", str(tmp_path / "nope"))
    with pytest.raises(MongodError, match="MONGOD_BIN"):
        find_mongod()


def test_session_replica_set_accepts_writes(replica_set: ReplicaSet, db_name: str) -> None:
    assert replica_set.uri == f"mongodb://{replica_set.hosts[0]}/?replicaSet=rs0"
    with replica_set.client() as client:
        client[db_name].items.insert_one({"_id": 1, "v": "a"})
        assert client[db_name].items.find_one({"_id": 1}) == {"_id": 1, "v": "a"}


def test_a_member_holds_megabytes_not_a_preallocated_journal(tmp_path: Path) -> None:
    # WiredTiger's defaults preallocate 300 MB of journal per member; dozens of members kept
    # by a suite run once filled a CI machine's disk.
    with ReplicaSet("slim", tmp_path) as rs, rs.client() as client:
        client.db.items.insert_many([{"v": "x" * 1000} for _ in range(1000)])
        on_disk = sum(path.stat().st_blocks * 512 for path in tmp_path.rglob("*") if path.is_file())
    assert on_disk < 50 * 2**20, f"{on_disk / 2**20:.0f} MB under {tmp_path}"


def test_crash_restart_and_stop(tmp_path: Path) -> None:
    rs = ReplicaSet("solo", tmp_path, extra_args=("--oplogSize", "1", "--syncdelay", "1"))
    with rs:
        with rs.client() as client:
            client.db.items.insert_one({"_id": 1})
        rs.kill(0)
        rs.restart(0)
        assert rs.primary_index() == 0
        with rs.client() as client:
            assert client.db.items.count_documents({}) == 1
        pids = [pid for pid in rs.pids if pid is not None]
        uri = rs.uri
    assert pids and not any(_alive(pid) for pid in pids)
    assert rs.pids == [None]
    rs.stop()  # idempotent

    # The demo restarts on the same data: same dbpath, same (remembered) port.
    with ReplicaSet("solo", tmp_path) as again:
        assert again.uri == uri
        with again.client() as client:
            assert client.db.items.count_documents({}) == 1


def test_sigterm_stops_members_and_removes_scratch(tmp_path: Path) -> None:
    """A SIGTERM (``timeout``, a cancelled job) to a demo or bench ends it through its clean-up."""
    program = textwrap.dedent(
        f"""
        import tempfile, time
        from mongo_cdc_dev.testing import ReplicaSet, exit_on_sigterm
        exit_on_sigterm()
        with tempfile.TemporaryDirectory(dir={str(tmp_path)!r}) as scratch, ReplicaSet("term", scratch) as rs:
            print(rs.pids[0], scratch, flush=True)
            time.sleep(600)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pid, scratch = child.stdout.readline().split()
    try:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 128 + signal.SIGTERM
        assert not _alive(int(pid))
        assert not Path(scratch).exists()
    finally:
        if child.poll() is None:  # a failed assertion above: the child must not outlive the test
            child.kill()
        if _alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


def test_three_members_elect_new_primary_after_step_down(tmp_path: Path) -> None:
    with ReplicaSet("trio", tmp_path, members=3, extra_args=("--oplogSize", "1")) as rs:
        old = rs.primary_index()
        new = rs.step_down()
        assert new != old
        assert rs.primary_index() == new
        with rs.client() as client:
            client.db.items.insert_one({"_id": 1})
            assert client.db.items.count_documents({}) == 1
