"""A real StatsD server on loopback for the metrics tests, and Airflow's client pointed at it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics import stats_utils


class StatsdListener:
    """What a StatsD server on loopback received: ``name`` to a list of (value, type) in order."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.received: dict[str, list[tuple[float, str]]] = {}

    def drain(self) -> dict[str, list[tuple[float, str]]]:
        """Everything sent so far (the client sends each metric at once, one datagram or line each)."""
        while True:
            try:
                datagram = self.socket.recv(65536)
            except TimeoutError:
                return self.received
            for line in datagram.decode().splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                self.received.setdefault(name, []).append((float(value), kind.split("|")[0]))

    def last(self, name: str) -> float:
        assert name in self.received, sorted(self.received)
        return self.received[name][-1][0]

    def total(self, name: str) -> float:
        assert name in self.received, sorted(self.received)
        return sum(value for value, _ in self.received[name])


@contextlib.contextmanager
def airflow_statsd(monkeypatch: pytest.MonkeyPatch, **metrics: str) -> Iterator[StatsdListener]:
    """Airflow's ``[metrics]`` pointed at a new listener (``metrics``: more settings of that section),
    and its client set up from them as a task process sets it up when it starts
    (``task_runner.main``); back to no metrics afterwards."""
    listener = StatsdListener()
    settings = {"statsd_on": "True", "statsd_host": "127.0.0.1", "statsd_port": str(listener.port), **metrics}
    with monkeypatch.context() as patch:
        for key, value in settings.items():
            patch.setenv(f"AIRFLOW__METRICS__{key.upper()}", value)
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        try:
            yield listener
        finally:
            listener.socket.close()
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
