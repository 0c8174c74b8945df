"""Runs the Apache Kafka Java client (tests/interop/java/InteropClient.java) from Python.

The Java client is `kafka-clients.jar` with its codec jars (lz4-java, snappy-java, zstd-jni)
and slf4j-api, as shipped in the `pyflink/lib/` directory of the installed
shigawire-apache-flink-libraries package. `JavaClient.build()` compiles InteropClient.java with
javac against those jars into tests/interop/.cache/java-<hash>/, where <hash> covers the source
and the jar list, so an unchanged harness is compiled once.

`JavaClient.run()` runs one operation in one JVM: `java -cp ... InteropClient COMMAND 'JSON'`,
records on stdin and results on stdout as JSON lines, bytes as base64 (see the header of
InteropClient.java). `JavaClient.batch(step, ...)` runs several operations in one JVM (JVM
start-up dominates a step, so a test is usually one batch): create a topic, produce, consume.
A non-zero exit raises `JavaClientError` carrying the client's error class and message.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interop_data import Got, Rec

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "java" / "InteropClient.java"
CACHE = HERE / ".cache"
JARS = ("kafka-clients.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "slf4j-api.jar")
# One operation of the harness; JVM start-up is about a second of it.
RUN_TIMEOUT_S = 90.0


class JavaClientError(RuntimeError):
    def __init__(self, command: str, error: str, message: str, stderr: str) -> None:
        super().__init__(f"java {command}: {error}: {message}\n--- stderr tail ---\n{stderr}")
        self.error = error
        self.message = message


def jar_dir() -> Path:
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("shigawire-apache-flink-libraries (pyflink/lib/*.jar) is not installed")
    for location in spec.submodule_search_locations:
        lib = Path(location) / "lib"
        if (lib / "kafka-clients.jar").is_file():
            return lib
    raise RuntimeError("no pyflink/lib/kafka-clients.jar in the installed pyflink package")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def record_line(rec: Rec) -> str:
    return json.dumps(
        {
            "key": _b64(rec.key),
            "value": _b64(rec.value),
            "headers": [[name, _b64(value)] for name, value in rec.headers],
            "partition": rec.partition,
            "timestamp": rec.timestamp,
        }
    )


@dataclass
class JavaClient:
    classes: Path
    classpath: str
    bootstrap: str = ""

    @classmethod
    def build(cls) -> JavaClient:
        for tool in ("java", "javac"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on PATH (Debian: openjdk-17-jdk-headless)")
        lib = jar_dir()
        jars = [lib / name for name in JARS]
        missing = [str(j) for j in jars if not j.is_file()]
        if missing:
            raise RuntimeError(f"missing jars: {missing}")
        classpath = os.pathsep.join(str(j) for j in jars)
        digest = hashlib.sha256(SOURCE.read_bytes() + classpath.encode()).hexdigest()[:16]
        classes = CACHE / f"java-{digest}"
        if not (classes / "InteropClient.class").is_file():
            staging = CACHE / f"java-{digest}.tmp-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            result = subprocess.run(
                ["javac", "-nowarn", "-cp", classpath, "-d", str(staging), str(SOURCE)],
                capture_output=True,
                text=True,
                timeout=180,
            )
            if result.returncode != 0:
                raise RuntimeError(f"javac failed:\n{result.stdout}\n{result.stderr}")
            # Rename into place so a concurrent or interrupted build never leaves half a cache.
            try:
                staging.rename(classes)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
        return cls(classes, classpath)

    def bound(self, bootstrap: str) -> JavaClient:
        return JavaClient(self.classes, self.classpath, bootstrap)

    # ---- raw call --------------------------------------------------------------------------

    def _java(self, args: list[str], stdin: str) -> tuple[list[Any], int, str]:
        result = subprocess.run(
            [*self._jvm(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
        return lines, result.returncode, "\n".join(result.stderr.splitlines()[-25:])

    @staticmethod
    def _fail(what: str, lines: list[Any], status: int, stderr: str) -> JavaClientError:
        last = lines[-1] if lines and isinstance(lines[-1], dict) else {}
        return JavaClientError(
            what,
            str(last.get("error", f"exit status {status}")),
            str(last.get("message", "")),
            stderr,
        )

    def argv(self, command: str, options: dict[str, Any]) -> list[str]:
        """The command line of one operation, for callers that run the JVM themselves (the
        long-lived `group-member`, whose stdin is a control channel)."""
        opts = {"bootstrap": self.bootstrap, **options}
        return [*self._jvm(), command, json.dumps(opts)]

    def _jvm(self) -> list[str]:
        return [
            "java",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            "-cp",
            f"{self.classes}{os.pathsep}{self.classpath}",
            "InteropClient",
        ]

    def run(self, command: str, options: dict[str, Any], records: Iterable[Rec] = ()) -> list[Any]:
        """One operation in its own JVM; returns its result lines."""
        opts = {"bootstrap": self.bootstrap, **options}
        body = "".join(record_line(r) + "\n" for r in records)
        lines, status, stderr = self._java([command, json.dumps(opts)], body)
        if status != 0:
            raise self._fail(command, lines, status, stderr)
        return lines

    def one(self, command: str, options: dict[str, Any]) -> Any:
        lines = self.run(command, options)
        assert len(lines) == 1, f"java {command}: expected one result line, got {lines!r}"
        return lines[0]

    def batch(self, *steps: Step) -> list[list[Any]]:
        """Several operations in one JVM, in order; returns each step's result lines.

        The first failing step raises JavaClientError; later steps do not run.
        """
        body = "".join(
            json.dumps(
                {
                    "command": s.command,
                    "options": {"bootstrap": self.bootstrap, **s.options},
                    "records": [json.loads(record_line(r)) for r in s.records],
                }
            )
            + "\n"
            for s in steps
        )
        lines, status, stderr = self._java(["batch"], body)
        done = [line for line in lines if "command" in line]
        if status != 0:
            failed = steps[len(done)].command if len(done) < len(steps) else "batch"
            raise self._fail(failed, lines, status, stderr)
        assert [d["command"] for d in done] == [s.command for s in steps], lines
        return [d["results"] for d in done]

    # ---- typed operations, one JVM each ----------------------------------------------------

    def produce(self, topic: str, records: Sequence[Rec], **options: Any) -> list[tuple[int, int]]:
        step = produce_step(topic, records, **options)
        return delivered(self.run(step.command, step.options, step.records))

    def consume(self, topic: str, **options: Any) -> list[Got]:
        step = consume_step(topic, **options)
        return to_gots(self.run(step.command, step.options))


@dataclass(frozen=True)
class Step:
    command: str
    options: dict[str, Any]
    records: Sequence[Rec] = ()


def step(command: str, **options: Any) -> Step:
    return Step(command, options)


def produce_step(
    topic: str,
    records: Sequence[Rec],
    *,
    acks: str = "all",
    compression: str = "none",
    idempotence: bool = True,
    configs: dict[str, str] | None = None,
    transactional_id: str | None = None,
    end: str = "commit",
) -> Step:
    """Writes `records`, each to its own partition; results: one (partition, offset) each.
    With `transactional_id`, all of them in one transaction that `end`s with "commit" or
    "abort"."""
    options: dict[str, Any] = {
        "topic": topic,
        "acks": acks,
        "compression": compression,
        "idempotence": idempotence,
        "configs": configs or {},
    }
    if transactional_id is not None:
        options.update(transactional_id=transactional_id, end=end)
    return Step("produce", options, records)


def consume_step(
    topic: str,
    *,
    max_records: int,
    partitions: Sequence[int] | None = None,
    offsets: dict[int, int] | None = None,
    group: str | None = None,
    timeout_ms: int = 20000,
    configs: dict[str, str] | None = None,
) -> Step:
    """Reads up to `max_records`: assigned partitions from `offsets` or the beginning, or
    subscribed as `group` (then the offsets read are committed)."""
    options: dict[str, Any] = {
        "topic": topic,
        "max_records": max_records,
        "timeout_ms": timeout_ms,
        "configs": configs or {},
    }
    if partitions is not None:
        options["partitions"] = list(partitions)
    if offsets is not None:
        options["offsets"] = {str(p): o for p, o in offsets.items()}
    if group is not None:
        options["group"] = group
    return Step("consume", options)


def delivered(results: list[Any]) -> list[tuple[int, int]]:
    return [(int(x["partition"]), int(x["offset"])) for x in results]


def to_gots(results: list[Any]) -> list[Got]:
    return [
        Got(
            partition=int(x["partition"]),
            offset=int(x["offset"]),
            timestamp=int(x["timestamp"]),
            key=_unb64(x["key"]),
            value=_unb64(x["value"]),
            headers=tuple((name, _unb64(value)) for name, value in x["headers"]),
        )
        for x in results
    ]
