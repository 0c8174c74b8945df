"""Scraping a metrics listener in tests: `Metrics` starts `tidelog serve` with
``metrics.listener`` on a free port; `http_get` and `scrape` ask any such listener (the
broker's or the agent's) and parse ``/metrics`` with Prometheus' own text parser;
`PrometheusServer` is a real Prometheus (Debian's ``prometheus`` package) scraping them."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from interop_broker import BrokerProcess, free_port
from interop_data import wait_until
from prometheus_client.parser import text_string_to_metric_families

#: The job name the example scrape config gives the brokers, which the rules select.
JOB = "tidelog"
#: How long Prometheus may take to start, and to show what a scrape brought.
PROMETHEUS_TIMEOUT_S = 60.0

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


def tool(name: str) -> str:
    """The path of a Prometheus binary; a clear failure (never a skip) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: install Debian's prometheus package (make deps)")
    return path


class PrometheusServer:
    """A Prometheus server of the test's own: a temp storage dir, a free loopback port, a
    config that scrapes the given metrics listeners (``host:port``) every second as job
    :data:`JOB` and evaluates the given alert rule files."""

    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        self.config_path = workdir / "prometheus.yml"
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }
        # JSON is YAML: no YAML writer needed.
        self.config_path.write_text(json.dumps(config, indent=2))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        wait_until(self._ready, "Prometheus to be ready", timeout=PROMETHEUS_TIMEOUT_S)

    def _ready(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]

    def scalar(self, query: str) -> float | None:
        """The value of a query that yields at most one series (None: no series)."""
        data = self.api("query", query=query)
        assert data["resultType"] == "vector", data
        if not data["result"]:
            return None
        [series] = data["result"]
        return float(series["value"][1])

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]


# -- metric names out of PromQL --------------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# An identifier not inside a number (0.99, 1e3) or a Grafana variable; group 2 marks a call.
_IDENTIFIERS = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
)


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once label matchers,
    ranges, grouping clauses, strings, function calls, keywords and numbers are set aside."""
    for pattern in (_STRINGS, _MATCHERS, _RANGES, _GROUPINGS):
        expression = pattern.sub(" ", expression)
    return {
        match[1]
        for match in _IDENTIFIERS.finditer(expression)
        if not match[2] and match[1].lower() not in _KEYWORDS
    }
