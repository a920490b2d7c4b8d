"""A real Spark standalone cluster on this machine, for the tests and the bench: a master and
``workers`` workers of ``cores`` cores each, every one a JVM started by the pinned pyspark's
``spark-class`` on 127.0.0.1, on free loopback ports.

Each daemon runs in a process group of its own, so ``stop`` also ends the executors a worker
started. The daemons start without ``PYTHONPATH``: Spark puts the worker JVM's own ``PYTHONPATH`` on
its Python workers' path, and what an executor can import must be decided by the job (its
``spark.pyspark.python``, the files it ships), never leak in from the process that started the
cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from mongo_cdc_dev.testing.mongod import free_ports

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
SPARK_CLASS = os.path.join(SPARK_HOME, "bin", "spark-class")
STARTUP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (``url``: the master's)."""

    def __init__(self, directory: Path, workers: int = 1, cores: int = 2, memory: str = "1g") -> None:
        """``directory``: the daemons' logs and the workers' work directories (created here);
        ``cores`` and ``memory``: what each worker offers its executors."""
        if workers < 1 or cores < 1:
            raise ValueError(f"a cluster needs one worker of one core at least, not {workers} of {cores}")
        self.directory = directory
        self.workers = workers
        directory.mkdir(parents=True)
        master_port, self.webui_port, *worker_ports = free_ports(2 + 2 * workers)
        self.url = f"spark://127.0.0.1:{master_port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "SPARK_HOME": SPARK_HOME,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        self.commands = {
            "master": [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(self.webui_port)),
            ],
        }
        for index in range(workers):
            port, webui_port = worker_ports[2 * index : 2 * index + 2]
            self.commands[self.worker_name(index)] = [
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui_port)),
                *("--cores", str(cores), "--memory", memory, "--work-dir", str(self.work_dir(index))),
                self.url,
            ]
        self.processes: dict[str, subprocess.Popen] = {}

    def worker_name(self, index: int) -> str:
        """The name of worker ``index``'s log (``<name>.log``): ``worker``, then ``worker-2``, ..."""
        return "worker" if index == 0 else f"worker-{index + 1}"

    def work_dir(self, index: int = 0) -> Path:
        """Worker ``index``'s work directory: an ``app-*`` directory per application, holding each
        of its executors' files and logs."""
        return self.directory / ("work" if index == 0 else f"work-{index + 1}")

    def start(self) -> None:
        """Start the master, then the workers; return once every worker has registered."""
        for name, command in self.commands.items():
            with open(self.directory / f"{name}.log", "wb") as log:
                self.processes[name] = subprocess.Popen(
                    [SPARK_CLASS, *command],
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: stop() also ends a worker's executors
                )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.master_status().get("aliveworkers", 0) < self.workers:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    tail = self.log_tail(name)
                    raise RuntimeError(f"Spark {name} exited with {process.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                tails = "\n".join(self.log_tail(name) for name in self.processes if name != "master")
                raise RuntimeError(f"not every Spark worker registered in {STARTUP_TIMEOUT_S} s:\n{tails}")
            time.sleep(0.5)

    def master_status(self) -> dict[str, Any]:
        """The master's ``/json/`` page: its workers, cores and applications ({} while it is not up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as response:
                return json.load(response)
        except (OSError, ValueError):  # not listening yet, or the UI answers before its JSON page is up
            return {}

    def log_tail(self, name: str, lines: int = 30) -> str:
        return "\n".join((self.directory / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master."""
        for name in reversed(self.processes):
            process = self.processes[name]
            if process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()  # a daemon that did start must not outlive the failure
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
