"""The `tidelog` entry point: a misspelt flag is reported by the subcommand it was given to,
and a reader that closes the pipe early (`| head`) ends the command quietly."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.cli.main import build_parser, main
from tidelog.records import BatchBuilder, Compression, set_base_offset

TIDELOG = Path(sys.executable).parent / "tidelog"


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every runnable command path: ("consume",), ("groups", "describe"), ..."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield path
        return
    for name, sub in actions[0].choices.items():
        yield from _leaf_commands(sub, (*path, name))


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_every_subcommand_reports_an_unknown_flag_with_its_own_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = list(_leaf_commands(build_parser()))
    assert ("consume",) in commands and ("groups", "describe") in commands
    for path in commands:
        err = _usage_error(capsys, *path, "--no-such-flag")
        name = " ".join(path)
        assert err.startswith(f"usage: tidelog {name} "), (path, err)
        # Reported before any missing required argument, so the typo is what the user sees.
        assert (
            err.splitlines()[-1] == f"tidelog {name}: error: unrecognized arguments: --no-such-flag"
        )


def test_the_misspellings_of_the_issue(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, "consume", "--topik", "x")
    assert err.startswith("usage: tidelog consume [-h]")
    assert err.splitlines()[-1] == "tidelog consume: error: unrecognized arguments: --topik"
    err = _usage_error(capsys, "groups", "describe", "--al-groups")
    assert err.startswith("usage: tidelog groups describe [-h]")
    assert err.splitlines()[-1] == (
        "tidelog groups describe: error: unrecognized arguments: --al-groups"
    )
    # A stray positional is still refused by the subcommand, not the top level.
    err = _usage_error(capsys, "consume", "--topic", "x", "extra")
    assert err.splitlines()[-1] == "tidelog consume: error: unrecognized arguments: extra"


def test_what_argparse_accepted_before_is_still_accepted() -> None:
    parser = build_parser()
    args = parser.parse_args(["consume", "--top", "t", "--offset", "-1", "--partition", "0"])
    assert (args.topic, args.offset, args.partition) == ("t", "-1", 0)
    args = parser.parse_args(["groups", "describe", "--bootstrap-server=h:1", "g", "--members"])
    assert (args.group, args.bootstrap_server, args.members) == ("g", "h:1", True)
    args = parser.parse_args(["groups", "describe", "--all-groups", "--state"])
    assert args.all_groups and args.state and args.group is None


def test_unknown_command_and_missing_group_keep_argparse_messages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _usage_error(capsys, "consum")
    assert err.startswith("usage: tidelog [-h]") and "invalid choice: 'consum'" in err
    err = _usage_error(capsys, "groups", "describe")
    assert err.splitlines()[-1] == (
        "tidelog groups describe: error: one of the arguments GROUP --all-groups is required"
    )
    err = _usage_error(capsys, "groups", "describe", "g", "--all-groups")
    assert "not allowed with argument GROUP" in err


def _big_segment(path: Path) -> None:
    builder = BatchBuilder(compression=Compression.NONE)
    for n in range(5000):
        builder.append(b"k%d" % n, b"value-%d" % n, (), timestamp=1_700_000_000_000 + n)
    data = bytearray(builder.close())
    set_base_offset(data, 0, 0)
    path.write_bytes(bytes(data))


def test_a_reader_closing_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    _big_segment(segment)
    # 5000 record lines are far more than a pipe holds, so writes after `head` exits fail.
    done = subprocess.run(
        [
            "bash",
            "-c",
            'set -o pipefail; "$0" dump-log --print-data-log "$1" | head -1',
            str(TIDELOG),
            str(segment),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == ""
    assert done.returncode == 0
    assert done.stdout == f"Dumping {segment}\n"
