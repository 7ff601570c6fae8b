"""Writing files so that nothing is overwritten or lost: atomic, durable, with the user's umask.

Standard library only, so every layer (the tiny model's writer included) can use it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """``text`` and a final newline as UTF-8, atomically (see :func:`write_bytes_atomically`)."""
    write_bytes_atomically(path, (text + "\n").encode())


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: readers see the old file or
    the whole new one, and after a crash the folder holds one of the two.

    The new file keeps the mode of the file it replaces (a team's group-writable baseline
    stays so); a new file gets ``0o666`` less the umask, as ``open()`` would give it (the
    temp file itself is created 0600).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                mode = stat.S_IMODE(path.stat().st_mode)
            except FileNotFoundError:
                mode = 0o666 & ~umask()
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make a rename or link in ``folder`` durable: it is an entry of the folder, not of the file."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """This process's umask, read without changing it where the kernel says it (Linux 4.7+:
    ``Umask:`` in /proc/self/status); elsewhere set and restored at once, under a lock."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)  # for the instant it is set, files of other threads get less access, not more
        os.umask(mask)
    return mask


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (flock on the folder itself: no lock file is left behind)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def keep_aside(path: Path) -> Path:
    """Give the file at ``path`` a second name that no other file has, and return it.

    The name is ``<stem>.<its mtime to the microsecond>[-<n>]<suffix>``, claimed with a hard
    link, which fails rather than replace a file of that name: versions written within the
    same second never overwrite each other, and ``path`` itself stays in place until the new
    file is renamed over it. Where the filesystem has no hard links, the name is claimed with
    ``O_EXCL`` and the file renamed to it.
    """
    stamp = datetime.fromtimestamp(path.stat().st_mtime).astimezone().strftime("%Y%m%dT%H%M%S.%f")  # local time
    n = 0
    while True:
        kept = path.with_name(f"{path.stem}.{stamp}{f'-{n}' if n else ''}{path.suffix}")
        n += 1
        try:
            os.link(path, kept)
            return kept
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        try:
            os.close(os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        os.replace(path, kept)
        return kept


def unwritable(path: Path) -> str | None:
    """Why a file could not be written at ``path`` later, or None when it could.

    For checking before hours of measurement rather than after them: ``path`` must not be a
    folder, and the nearest of its folders that exists must take a new file (a probe file is
    created there and removed; the missing folders below it would be created in it). A real
    creation, unlike permission bits, also catches read-only mounts and root on /sys.
    """
    if path.is_dir():
        return "it is a folder; expected the path of a file"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder" + (f", so {path.parent} cannot be created" if folder != path.parent else "")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".qwenperf-probe-")
    except OSError as exc:
        return f"cannot create a file in {folder}: {exc.strerror}"
    os.close(fd)
    os.unlink(probe)
    return None


def unwritable_folder(folder: Path) -> str | None:
    """Why files could not be written in ``folder`` (created if missing) later, or None when they could."""
    if folder.exists() and not folder.is_dir():
        return "it is a file; expected a folder"
    return unwritable(folder / ".qwenperf-probe")
