"""The README's quick start, run as written against a real ``tidelog serve`` process.

The commands and the output they are said to print are read from README.md itself (the
"Quick start" section): each ``sh`` block is run with ``/bin/sh -e`` from the repository
root, and the ``text`` block right after it is the standard output it must print, line for
line (in any order, since records of different partitions may come in any order). Editing
the README without its commands still working breaks this test.

Three rewrites make the commands runnable in a test run, and nothing else is changed:

- the first block, ``make serve``, is not run: ``make serve`` runs ``.venv/bin/tidelog
  serve``, and the test starts that same command (``client_broker.Broker``) with a
  temporary ``--data-dir`` and a free ``--port`` instead of ./tidelog-data and 9092;
- ``127.0.0.1:9092`` in the commands becomes that broker's address;
- ``.venv/bin/`` becomes the directory of the interpreter running the tests (the project's
  own virtualenv, which ``make serve`` and ``make test`` both create).

The tidelog and confluent-kafka blocks always run. The kcat block runs in a test of its own
after them, which is skipped, and says so, only where kcat is not installed (the README asks
for ``apt-get install kcat``; ``make test`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from client_broker import Broker

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_BOOTSTRAP = "127.0.0.1:9092"
# Long enough for a group join on a loaded machine; a hung command fails instead of blocking.
BLOCK_TIMEOUT_S = 120.0

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Step:
    """One ``sh`` block of the quick start and the output the README shows for it."""

    commands: str
    expected_stdout: list[str]

    @property
    def uses_kcat(self) -> bool:
        return re.search(r"(^|[|;&(\s])kcat\s", self.commands) is not None


def quick_start_section() -> str:
    text = README.read_text()
    start = text.index("\n## Quick start\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def quick_start_steps() -> tuple[str, list[Step]]:
    """The ``make serve`` block, then every other ``sh`` block with the ``text`` block that
    follows it (an ``sh`` block the README shows no output for is a README error here)."""
    blocks = [(m.group(1), m.group(2)) for m in _FENCE.finditer(quick_start_section())]
    assert blocks and blocks[0][0] == "sh", "the quick start must open with an sh block"
    serve = blocks[0][1]
    steps: list[Step] = []
    rest = blocks[1:]
    while rest:
        (lang, commands), rest = rest[0], rest[1:]
        assert lang == "sh", f"expected an sh block in the quick start, got {lang!r}"
        assert rest and rest[0][0] == "text", (
            f"the quick start shows no output (a text block) after:\n{commands}"
        )
        steps.append(Step(commands, rest[0][1].splitlines()))
        rest = rest[1:]
    return serve, steps


def runnable(commands: str, bootstrap: str) -> str:
    venv_bin = Path(sys.executable).parent
    return commands.replace(README_BOOTSTRAP, bootstrap).replace(".venv/bin/", f"{venv_bin}/")


def run_step(step: Step, broker: Broker) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-e", "-c", runnable(step.commands, broker.bootstrap)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def assert_printed_as_shown(step: Step, result: subprocess.CompletedProcess[str]) -> None:
    context = f"commands:\n{step.commands}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, f"exit status {result.returncode}; {context}"
    assert Counter(result.stdout.splitlines()) == Counter(step.expected_stdout), context


@dataclass
class QuickStart:
    broker: Broker
    plain: list[tuple[Step, subprocess.CompletedProcess[str]]]
    kcat: list[Step]


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    """A fresh broker started as ``make serve`` starts it, and the README's blocks that need
    nothing but ``make serve`` run on it in order (the kcat block reads what they wrote)."""
    serve, steps = quick_start_steps()
    commands = [line.split("#", 1)[0].strip() for line in serve.splitlines()]
    assert [c for c in commands if c] == ["make serve"], (
        f"the quick start no longer starts the broker with `make serve` alone:\n{serve}"
    )
    broker = Broker(tmp_path_factory.mktemp("readme-broker"), "tidelog")
    try:
        plain = [(step, run_step(step, broker)) for step in steps if not step.uses_kcat]
        yield QuickStart(broker, plain, [step for step in steps if step.uses_kcat])
    finally:
        broker.stop()


def test_quick_start_without_kcat_prints_what_the_readme_shows(quick_start: QuickStart) -> None:
    steps = [step for step, _ in quick_start.plain]
    # The tidelog tools and the confluent-kafka snippet: what a user has after `make serve`.
    assert any(".venv/bin/tidelog produce" in step.commands for step in steps)
    assert any(".venv/bin/tidelog consume" in step.commands for step in steps)
    assert any("confluent_kafka" in step.commands for step in steps)
    for step, result in quick_start.plain:
        assert_printed_as_shown(step, result)


def test_quick_start_kcat_reads_back_every_record(quick_start: QuickStart) -> None:
    assert quick_start.kcat, "the quick start lost its kcat commands"
    assert "apt-get install kcat" in quick_start_section(), "kcat's install step is not named"
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat): its README lines did not run")
    for step in quick_start.kcat:
        assert_printed_as_shown(step, run_step(step, quick_start.broker))
