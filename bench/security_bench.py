"""Produce and consume throughput over PLAINTEXT, SSL and SASL_SSL listeners, same broker,
same run.

    .venv/bin/python bench/security_bench.py [--megabytes N] [--message-bytes N]

Starts one `tidelog serve` on a temporary directory with three listeners (certificates from
tests/interop/interop_certs.py, a SCRAM-SHA-256 user made with AlterUserScramCredentials),
then for each listener, with confluent-kafka: produces N MB of messages (acks=all,
lz4 off, linger 5 ms) to a one-partition topic and times until every delivery report is in;
then consumes them from the beginning and times until the last one is read. PLAINTEXT
fetches go out with sendfile; SSL and SASL_SSL encrypt every byte through OpenSSL.
Figures, never pass/fail; the last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "interop"))
from interop_certs import make_certificates


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def run(megabytes: int, message_bytes: int) -> dict[str, dict[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="tidelog-security-bench-"))
    certs = make_certificates(work)
    ports = {name: free_port() for name in ("PLAINTEXT", "SSL", "SASL_SSL")}
    listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
    tidelog = Path(sys.executable).parent / "tidelog"
    overrides = {
        "listeners": listeners,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs["broker_keystore"]),
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
    }
    command = [str(tidelog), "serve", "--data-dir", str(work / "data"), "--log-level", "WARNING"]
    for key, value in overrides.items():
        command += ["--override", f"{key}={value}"]
    broker = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    try:
        wait_for_port(ports["PLAINTEXT"], time.monotonic() + 30)
        plain = f"127.0.0.1:{ports['PLAINTEXT']}"
        admin = AdminClient({"bootstrap.servers": plain})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
        upsert = UserScramCredentialUpsertion("bench", info, b"bench-secret")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        security = {
            "PLAINTEXT": {},
            "SSL": {"security.protocol": "SSL", "ssl.ca.location": str(certs["ca"])},
            "SASL_SSL": {
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(certs["ca"]),
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "bench",
                "sasl.password": "bench-secret",
            },
        }
        count = megabytes * 1_000_000 // message_bytes
        payload = b"x" * message_bytes
        figures: dict[str, dict[str, float]] = {}
        for name, port in ports.items():
            topic = f"bench-{name.lower()}"
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
            config = {"bootstrap.servers": f"127.0.0.1:{port}", **security[name]}
            produce_s = _produce(config, topic, payload, count)
            consume_s = _consume(config, topic, count)
            total_mb = count * message_bytes / 1e6
            figures[name] = {
                "produce_mb_s": round(total_mb / produce_s, 1),
                "consume_mb_s": round(total_mb / consume_s, 1),
            }
            print(
                f"{name:10s} produce {figures[name]['produce_mb_s']:7.1f} MB/s   "
                f"consume {figures[name]['consume_mb_s']:7.1f} MB/s   ({total_mb:.0f} MB)"
            )
        return figures
    finally:
        broker.terminate()
        broker.wait(30)


def _produce(config: dict[str, str], topic: str, payload: bytes, count: int) -> float:
    producer = Producer({**config, "linger.ms": 5, "acks": "all", "batch.size": 1_000_000})
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, payload, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("messages left undelivered")
    return time.perf_counter() - start


def _consume(config: dict[str, str], topic: str, count: int) -> float:
    consumer = Consumer(
        {**config, "group.id": f"bench-{topic}", "enable.auto.commit": False,
         "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    start = time.perf_counter()
    read = 0
    while read < count:
        # consume() waits for all it is asked for: never ask for more than is left.
        for message in consumer.consume(min(10_000, count - read), 5.0):
            if message.error() is None:
                read += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--message-bytes", type=int, default=1024)
    args = parser.parse_args()
    print(json.dumps(run(args.megabytes, args.message_bytes)))


if __name__ == "__main__":
    main()
