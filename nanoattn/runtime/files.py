"""Files that processes share: written atomically, guarded by locks.

- Atomic writes: a file is written beside its target under a dot-name and renamed over it, so a
  reader (or a kill at any instant) sees the old content or the new, never a torn file.
- Locks: ``exclusive_lock`` holds an advisory ``flock`` on a directory for as long as a block
  runs. The OS releases it when the process dies, however it dies, so a SIGKILLed run never
  leaves a stale lock; a file inside holds the holder's PID only to name it in the refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def temporary_sibling(path: Path, tag: str = "tmp") -> Path:
    """A dot-name beside ``path``, unique to this process: readers skip it, cleaners recognise it."""
    return path.with_name(f".{path.name}.{tag}{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make the renames inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling and a rename; durable once it returns."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)
    return path


class LockedError(OSError):
    """Another process holds the lock (the message names it)."""


HOLDER_FILE = ".lock"  # inside a locked directory: the holder's PID, for the refusal's message only
_HELD_LOCKS: set[Path] = set()  # the directories this process holds locked


@contextlib.contextmanager
def exclusive_lock(directory: str | Path, what: str, *, wait: bool = False,
                   reentrant: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (created if missing) while the block runs.

    The lock is the directory's own inode, so no lock file ever has to be deleted (unlinking a
    lock file races with a process that has just opened it). ``what`` names the guarded thing in
    the refusal. Without ``wait`` a held lock raises ``LockedError`` at once, naming the holder's
    PID; with ``wait`` this blocks until it is free. With ``reentrant``, a block inside one that holds
    the lock in this process runs at once (a lab holds its runs folder and writes its page there);
    otherwise this process's own lock is refused like another's.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    held = directory.resolve()
    if reentrant and held in _HELD_LOCKS:
        yield
        return
    holder = directory / HOLDER_FILE
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            try:
                pid = holder.read_text().strip()
            except OSError:
                pid = "unknown"
            raise LockedError(f"{what} is in use by process {pid or 'unknown'}; wait for it to finish "
                              "or stop it first") from None
        holder.write_text(f"{os.getpid()}\n")
        _HELD_LOCKS.add(held)
        try:
            yield
        finally:
            _HELD_LOCKS.discard(held)
            with contextlib.suppress(OSError):
                holder.unlink()
    finally:
        os.close(fd)  # closing the descriptor releases the lock
