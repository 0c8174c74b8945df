"""Scraping a metrics listener in tests: `Metrics` starts `tidelog serve` with
``metrics.listener`` on a free port; `http_get` and `scrape` ask any such listener (the
broker's or the agent's) and parse ``/metrics`` with Prometheus' own text parser."""

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
        return http_get(self.port, path, method)

    def scrape(self) -> Sample:
        return scrape(self.port)


def http_get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    """(status, body) of one plain HTTP request to 127.0.0.1:port."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> Sample:
    """``/metrics`` of 127.0.0.1:port, parsed by Prometheus' own text parser."""
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(sample: Sample, name: str, **labels: str) -> float | None:
    return sample.get((name, frozenset(labels.items())))
