"""An exclusive lock on a file, held by one process at a time: how a data directory is owned.

The lock is ``flock(2)`` on an open file description, so it is released by the kernel when the
process dies, however it dies: a lock file left behind after a crash is never "stale". It is
taken without waiting: a second owner is refused at once, not queued.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

__all__ = ["FileLock", "LockHeldError", "lock_directory"]


class LockHeldError(Exception):
    """Another process (or another open of the same file in this one) holds the lock."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} is locked by another process")
        self.path = path


class FileLock:
    """An exclusive ``flock`` on ``path``, held until :meth:`release` (or the process ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: str | os.PathLike[str], *, mode: int = 0o644) -> FileLock:
        """Create ``path`` if missing and lock it; :class:`LockHeldError` if it is held.

        Failing to open the file (permissions, a full inode table...) raises that OSError.
        """
        path = Path(path)
        # O_CLOEXEC: a child process must not inherit, and so keep, the lock.
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeldError(path) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"the lock on {self.path} was released")
        return self._fd

    def release(self) -> None:
        """Unlock (closing the descriptor unlocks); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_directory(directory: str | os.PathLike[str], name: str, *, mode: int = 0o644) -> FileLock:
    """Create ``directory`` (and its parents) if missing and lock the file ``name`` in it.

    A path that exists but is not a directory raises :class:`NotADirectoryError` naming it
    (``mkdir`` alone would say "File exists", which reads as if all were well).
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(
            errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory)
        ) from None
    return FileLock.acquire(directory / name, mode=mode)
