"""A test CA, a broker certificate for 127.0.0.1 and a client certificate, made with the
`openssl` command (the `cryptography` package is not in the venv); PEM files, EC keys.

The client's subject is CLIENT_DN; the broker's key store is its key and chain in one PEM
file, as Kafka's PEM key store is. Used by tests/interop/test_security.py and
bench/security_bench.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CLIENT_DN = "/O=Tidelog/OU=eng/CN=Erin.Example"


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr}")


def make_certificates(directory: Path) -> dict[str, Path]:
    """The CA, broker and client files in ``directory``, by role."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not on PATH (Debian: openssl)")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=Tidelog Test CA", cwd=directory)  # fmt: skip
    (directory / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, ext in (
        ("broker", "/CN=localhost", ["-extfile", "broker.ext"]),
        ("client", CLIENT_DN, []),
    ):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
                 cwd=directory)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *ext,
                 cwd=directory)  # fmt: skip
        (directory / f"{name}-keystore.pem").write_text(
            (directory / f"{name}.key").read_text() + (directory / f"{name}.pem").read_text()
        )
    return {
        "ca": directory / "ca.pem",
        "broker_keystore": directory / "broker-keystore.pem",
        "client_cert": directory / "client.pem",
        "client_key": directory / "client.key",
        "client_keystore": directory / "client-keystore.pem",
    }
