"""One writer per output: a lock file held while a command writes a run, a data folder or an export.

Why: two ``masr train`` on one runs directory both exited 0 while one silently overwrote the
other's work, and with other timings ``best.pt``, ``last.pt`` and ``run.json`` came from
different processes. Atomic renames (``masr.atomic``) keep each file whole; the lock keeps the
*set* of files to one writer.

Semantics of ``locked(path, command)``:

* The lock is the file ``path`` holding JSON ``{pid, host, command, argv, started}``, created
  with ``O_CREAT | O_EXCL``: of two processes, the OS lets exactly one create it.
* Held by a live process: ``MasrError`` naming the holder, at once (never waits).
* Left by a process that is gone (``kill -9``, a crash): same host and ``os.kill(pid, 0)`` says
  no such process. It is taken over with one warning line on stderr.
* Left by another host: never broken (its pid means nothing here); the error says which file
  to remove once that host's command is known to be gone. So is an unreadable lock file.
* Released (removed, if still ours) when the ``with`` block ends, normally or by an exception.
* Readers (evaluate, export of a finished run, reuse of a finished run) never take it.

Limits: a reused pid makes a stale lock look alive (the error then says to remove the file);
machines sharing a filesystem must have distinct host names. Torch-free.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from masr.errors import MasrError

#: how long to wait for a lock file that another process has created but not yet written
_SETTLE_S = 2.0


def lock_path(target: str | os.PathLike[str]) -> Path:
    """The lock of an output that appears by a rename (a folder, an export): ``<target>.lock``
    next to it, since the target itself does not exist while it is being written."""
    path = Path(target)
    if not path.name:  # "." or "/"
        path = Path(os.path.abspath(path))
    if not path.name:  # the root: nothing beside it to hold the lock, and never an output
        raise MasrError(f"{target}: is the root folder; choose a folder below it")
    return path.with_name(path.name + ".lock")


def _warn(message: str) -> None:
    sys.stderr.write(f"masr: warning: {message}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def locked(
    path: str | os.PathLike[str], command: str, warn: Callable[[str], None] | None = None
) -> Iterator[Path]:
    """Hold the lock file ``path`` for the block (module docstring); ``command`` names the
    holder in other processes' errors, e.g. ``"masr train"``."""
    path = Path(path)
    # the folders the lock creates: removed again when the block leaves them empty (a command
    # that failed before writing anything leaves no empty output folder behind)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    mine = _acquire(path, command, warn or _warn)
    try:
        yield path
    finally:
        if _read(path, settle=0.0) == mine:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (the command wrote there), or gone
                break


def _acquire(path: Path, command: str, warn: Callable[[str], None]) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "argv": sys.argv,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    deadline = time.monotonic() + 10.0
    missing = 0  # creations refused in a folder that exists (/proc, a vanished mount)
    while time.monotonic() < deadline:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError as exc:  # another command removed the empty folder it made
            if path.parent.is_dir():
                missing += 1
                if missing >= 3:  # no race: nothing can be created there (QA: 10 s, then
                    raise MasrError(  # "other processes keep taking it")
                        f"{path}: cannot be created ({exc.strerror}); the output must go "
                        "where files can be written"
                    ) from None
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        except FileExistsError:
            holder = _read(path, settle=_SETTLE_S)
            if holder is None:  # released (or taken over) meanwhile: try again
                continue
            if not _stale(holder):
                raise MasrError(_busy(path, holder)) from None
            if _break(path, holder):
                warn(f"{path}: taking over the lock of {_who(holder)}, which is no longer running")
            continue
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(mine, fh)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # a full disk: no empty lock file left to block the next try
            with contextlib.suppress(OSError):
                path.unlink()
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        return json.loads(json.dumps(mine))  # as _read will see it (argv: list)
    raise MasrError(f"{path}: could not take the lock (other processes keep taking it); retry")


def _read(path: Path, settle: float) -> dict[str, Any] | None:
    """The holder's record; None when the file is gone; ``{}`` when it stays unreadable (a
    writer between creating and filling it gets ``settle`` seconds)."""
    until = time.monotonic() + settle
    while True:
        try:
            holder = json.loads(path.read_text())
            if isinstance(holder, dict) and "pid" in holder:
                return holder
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass
        if time.monotonic() >= until:
            return {}
        time.sleep(0.05)


def live_holder(path: str | os.PathLike[str]) -> str | None:
    """Who holds the lock at ``path`` now (command, pid, host, start), when a live process of
    this host or any process of another host does; None when the lock is free or stale. For
    readers, which never take a lock: to say that what they read is still being written."""
    holder = _read(Path(path), settle=0.0)
    if not holder or _stale(holder):
        return None
    return _who(holder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _stale(holder: dict[str, Any]) -> bool:
    if holder.get("host") != socket.gethostname():
        return False
    try:
        return int(holder["pid"]) > 0 and not _alive(int(holder["pid"]))
    except (KeyError, TypeError, ValueError):
        return False


def _break(path: Path, holder: dict[str, Any]) -> bool:
    """Remove the stale lock ``holder`` if it is still the one at ``path``. A short-lived guard
    file makes check-and-remove one step, so that of two processes breaking the same stale lock
    neither removes the fresh lock the other has just taken."""
    guard = path.with_name(path.name + ".break")
    try:
        os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        with contextlib.suppress(OSError):  # a breaker killed within those microseconds
            if time.time() - guard.stat().st_mtime > 30:
                guard.unlink()
        time.sleep(0.05)
        return False
    try:
        if _read(path, settle=0.0) != holder:
            return False
        path.unlink()
        return True
    finally:
        guard.unlink()


def _who(holder: dict[str, Any]) -> str:
    return (
        f"{holder.get('command', 'masr')} (pid {holder.get('pid')} on {holder.get('host')}, "
        f"since {holder.get('started')})"
    )


def _busy(path: Path, holder: dict[str, Any]) -> str:
    if not holder:
        return f"{path}: unreadable lock file; if no masr command is writing here, remove it"
    if holder.get("host") != socket.gethostname():
        return (
            f"{path}: held by {_who(holder)}; another host's lock is never broken here: "
            f"once that command is gone, remove {path}"
        )
    return (
        f"{path}: held by {_who(holder)}, still running; wait for it to finish or write "
        "elsewhere (remove the file only if that pid is not masr)"
    )
