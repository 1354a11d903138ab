"""Writing files so that a crash, a kill or a hostile folder never leaves a half-written file in
place of a good one.

A file is written under a temporary name beside its target, ``.NAME.partial-<pid>-<16 hex>``:
created with ``O_EXCL | O_NOFOLLOW`` under a random name, so nobody can predict it or plant a link
there; fsync'd, renamed over the target, and the folder fsync'd so that the rename itself
survives a power cut. A process killed while writing (SIGKILL, or SIGTERM, which runs no cleanup)
leaves its temporary behind; ``sweep_leftovers`` removes those whose process is gone, and every
writer here calls it on its folder before it starts.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
from typing import BinaryIO

from .errors import RapidMoEError

log = logging.getLogger("rapidmoe_gguf")

# .NAME.partial-<pid>-<random>; the random part is absent in names of earlier versions
_LEFTOVER_RE = re.compile(r"^\..+\.partial-(\d+)(?:-[0-9a-f]{16})?$")


def create_temp(target: str) -> tuple[str, BinaryIO]:
    """A new, empty file beside ``target`` for writing: its path and a binary file object."""
    d, b = os.path.split(os.path.abspath(target))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(d, f".{b}.partial-{os.getpid()}-{secrets.token_hex(8)}")
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:  # 64 random bits: only someone else's file can be in the way
            continue
        return path, os.fdopen(fd, "wb")


class WriteError(RapidMoEError, OSError):
    """A file could not be written; the message names it and the cause. Still an OSError, with
    the cause's errno, for callers that catch those."""


# ENOSPC: the file system is full; EDQUOT (absent on some systems): the user's quota is
_NO_ROOM = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def write_error(target: str, exc: OSError, need: int | None = None) -> WriteError:
    """The error to raise when writing ``target`` failed with ``exc``: it names the file and, when
    the disk or the quota is full, the room left there and about how much the file wants
    (``need`` bytes). Call it after removing the temporary, so that the room counts its space."""
    msg = f"cannot write {target}: {exc.strerror or exc}"
    if exc.errno in _NO_ROOM:
        msg += ": " + _room_note(os.path.dirname(os.path.abspath(target)), exc.errno, need)
    elif exc.filename:
        msg += f" ({exc.filename})"
    err = WriteError(msg)
    err.errno = exc.errno   # not strerror: with both set, str() would become "[Errno 28] ..."
    return err


def _room_note(folder: str, err: int, need: int | None) -> str:
    wants = f"; it needs about {_mib(need)}" if need else ""
    if err != errno.ENOSPC:  # a quota's room is not what statvfs reports for the disk
        return f"the disk quota for {folder} is used up{wants}"
    try:
        st = os.statvfs(folder)
        free = f" ({_mib(st.f_bavail * st.f_frsize)} free there)"
    except (OSError, AttributeError):  # no statvfs on Windows
        free = ""
    return f"the disk holding {folder} is full{free}{wants}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def fsync_file(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    """Makes the renames and removals in folder ``path`` durable (a no-op where folders cannot be
    opened, as on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process
        return True
    return True


def sweep_leftovers(folder: str) -> list[str]:
    """Removes the temporaries of writers in ``folder`` whose process no longer runs, and returns
    their names. A leftover whose process id has been reused by a live process stays; delete
    ``.*.partial-*`` files by hand when no conversion or calibration is running there."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _LEFTOVER_RE.match(name)
        if m is None or _process_alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        remove_quietly(path)
        if not os.path.lexists(path):
            removed.append(name)
            log.warning("removed %s, left by an interrupted run (process %s)", path, m.group(1))
    return removed
