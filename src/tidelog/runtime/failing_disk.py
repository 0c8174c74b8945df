"""A disk that fails on demand: fsyncs of files inside chosen directories raise ``EIO``.

:class:`FailingDirs` wraps an fsync; the tests of log dir failure use it in-process. For a
real broker process, :func:`with_failing_dirs` turns it on when the environment variable
:data:`FAILING_DIRS_ENV` names a control file: while that file lists a directory (one
absolute path per line), every fsync of a partition log file inside it fails, as a dying
disk's does. Only whoever starts the process can turn this on -- no request, config key or
command-line flag reaches it -- and without the variable the real fsync is used as is.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Collection, Mapping

__all__ = ["FAILING_DIRS_ENV", "FailingDirs", "with_failing_dirs"]

FAILING_DIRS_ENV = "TIDELOG_TEST_FAILING_DIRS"

_log = logging.getLogger(__name__)

Fsync = Callable[[int], None]


def path_of_fd(fd: int) -> str:
    """The path an open file descriptor refers to (Linux)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def is_inside(path: str, directories: Collection[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in directories)


class FailingDirs:
    """``fsync``, except for files inside the directories ``failing()`` returns: those
    raise ``OSError(EIO)``. ``failures`` counts the fsyncs refused."""

    def __init__(self, fsync: Fsync, failing: Callable[[], Collection[str]]) -> None:
        self._fsync = fsync
        self._failing = failing
        self.failures = 0

    def __call__(self, fd: int) -> None:
        failing = self._failing()
        if failing:
            path = path_of_fd(fd)
            if is_inside(path, failing):
                self.failures += 1
                raise OSError(errno.EIO, f"injected I/O error syncing {path}")
        self._fsync(fd)


def _listed_dirs(control: str) -> list[str]:
    try:
        with open(control, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def with_failing_dirs(fsync: Fsync, environ: Mapping[str, str] = os.environ) -> Fsync:
    """``fsync`` itself, or, when ``environ`` sets :data:`FAILING_DIRS_ENV`, a
    :class:`FailingDirs` failing inside the directories its control file lists."""
    control = environ.get(FAILING_DIRS_ENV)
    if not control:
        return fsync
    _log.warning("fault injection: fsyncs fail in the directories listed in %s", control)
    return FailingDirs(fsync, lambda: _listed_dirs(control))
