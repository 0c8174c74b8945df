"""A broker with its metrics listener, for the tests that scrape it: `Metrics` starts
`tidelog serve` with ``metrics.listener`` on a free port, answers plain HTTP requests and parses
``/metrics`` with Prometheus' own text parser."""

from __future__ import annotations

import http.client
from pathlib import Path

from interop_broker import BrokerProcess, free_port
from prometheus_client.parser import text_string_to_metric_families

Sample = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Metrics:
    """A broker started with its metrics listener on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.broker = BrokerProcess(
            workdir, extra_args=["--override", f"metrics.listener=http://127.0.0.1:{self.port}"]
        )

    def get(self, path: str, method: str = "GET") -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()

    def scrape(self) -> Sample:
        status, text = self.get("/metrics")
        assert status == 200, text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


def value(sample: Sample, name: str, **labels: str) -> float | None:
    return sample.get((name, frozenset(labels.items())))
