"""Write aside, then rename: nothing masr writes is ever left half-written."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from masr.errors import MasrError
from masr.lock import lock_path, locked

#: an OS error number in a Rust writer's message (Polars: "... (os error 28)")
_OS_ERROR_NUMBER = re.compile(r"\(os error (\d+)\)")


def _named_os_error(exc: BaseException, path: Path, tmp: Path) -> OSError | None:
    """``exc``, raised while writing ``tmp`` (a file, or a folder of files) for ``path``, as an
    OSError that names ``path`` (or the file in it), not the temporary name, nor nothing; None
    when it is no OS error or one about another file. A Rust writer's I/O error (Polars'
    ComputeError "... (os error 28)") becomes the OSError it stands for."""
    where = str(path)
    if isinstance(exc, OSError):
        name = None if exc.filename is None else str(exc.filename)
        if name is not None and name != str(tmp) and not name.startswith(f"{tmp}{os.sep}"):
            return None  # about another file: as it is
        if name is not None:  # the temporary file or one in the temporary folder
            where = where + name[len(str(tmp)):]
        number, reason = exc.errno, exc.strerror
        found = _OS_ERROR_NUMBER.search(str(exc)) if number is None else None
        if found is not None:  # Polars' own OSError "... (os error 28)" carries no errno
            number, reason = int(found.group(1)), None
    else:
        polars = type(exc).__module__.startswith("polars")
        found = _OS_ERROR_NUMBER.search(str(exc)) if polars else None
        if found is None:
            return None
        number, reason = int(found.group(1)), None
    if reason is None and number is not None:
        reason = os.strerror(number)
    return OSError(number, reason or " ".join(str(exc).split()), where)


@contextlib.contextmanager
def _creating(path: Path) -> Iterator[None]:
    """Around the creation of a temporary entry beside ``path``: an OS error names ``path``,
    not the random temporary name (QA: ``synth --out /proc/x`` named ``/proc/.x.2gnc3w4i.tmp``)."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: str | os.PathLike[str], directory: bool = False) -> None:
    """mkstemp/mkdtemp create private (0600/0700) entries; give the final file the permissions
    an ordinary ``open`` or ``mkdir`` would (0666/0777 less the umask)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def _target(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """Where a write to ``path`` really goes, and whether it must go there directly.

    A symbolic link is followed, so that the file it names is replaced and the link stays a
    link. A path naming something that is not a regular file or folder (``/dev/stdout``,
    ``/dev/null``, a named pipe, a terminal) cannot be renamed over without destroying it: it
    is written to in place (``direct`` True), as ``> /dev/stdout`` in a shell would."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # follows links
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return path, True
    if path.is_symlink():
        return Path(os.path.realpath(path)), False
    return path, False


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb") -> Iterator:
    """Open a temporary file next to ``path``; rename it over ``path`` only on success (a
    device or named pipe such as ``/dev/stdout`` is written to directly)."""
    with atomic_path(path) as tmp, open(tmp, mode) as fh:
        yield fh
        fh.flush()
        if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            os.fsync(fh.fileno())


def gzip_writer(fh: IO[bytes]) -> gzip.GzipFile:
    """``fh`` (an open binary file) gzipped: level 6, as gzip(1) (level 9 is several times
    slower for a few percent), and no time stamp or file name in the header (the same bytes
    for the same data); closing it ends the gzip stream, not ``fh``."""
    return gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=6, mtime=0)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary *file path* next to ``path`` (for writers that take a path, such as
    ``torch.save`` or ``DataFrame.write_parquet``); rename it over ``path`` on success. A
    symbolic link is followed (the file it names is replaced); a device or named pipe is
    yielded as it is and written in place."""
    path, direct = _target(path)
    if direct:
        try:
            yield path
        except BaseException as exc:  # /dev/full: the error names the device, as for a file
            named = _named_os_error(exc, path, path)
            if named is not None:
                raise named from exc
            raise
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _creating(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _publish_mode(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        named = _named_os_error(exc, path, Path(tmp))
        if named is not None:
            raise named from exc
        raise


def check_output_file(path: str | os.PathLike[str], option: str) -> None:
    """Refuse (MasrError), before any work, an output file path that cannot be written: an
    existing folder, or a path below a file (``afile/x.json``); a missing folder on the way is
    fine (it is created)."""
    target = Path(path)
    if target.is_dir():
        raise MasrError(f"{option} {path}: is a directory; give a file name")
    check_parents(target, option)


def resolved(path: str | os.PathLike[str], option: str) -> Path:
    """``path`` made absolute with its links followed; MasrError for a loop of links."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError) as exc:
        raise MasrError(f"{option} {path}: {exc}") from None


def check_output_dir(
    path: str | os.PathLike[str],
    option: str,
    writes: str | None = None,
    creatable: bool = True,
) -> None:
    """Refuse (MasrError) an output folder path that is a file or lies below one, or, with
    ``creatable``, a place where nothing can be made (``check_creatable``); a missing folder
    is fine (it is created). ``writes``: what the command writes there, said instead of "not a
    folder" (``reproduce writes a folder (runs, tables, plots)``)."""
    if Path(path).exists() and not Path(path).is_dir():
        why = writes or f"not a folder; choose another {option}"
        raise MasrError(f"{option} {path}: is a file{'; ' if writes else ', '}{why}")
    if Path(path).is_symlink() and not Path(path).exists():  # mkdir says only "File exists"
        raise MasrError(
            f"{option} {path}: a link to {os.readlink(path)}, which does not exist; create "
            f"that folder or choose another {option}"
        )
    check_parents(path, option)
    if creatable:
        check_creatable(path, option)


def check_creatable(path: str | os.PathLike[str], option: str) -> None:
    """Refuse (MasrError) a place where nothing can be made (``/proc/x``, a read-only disk):
    a temporary folder is made and removed in the nearest folder there is, before any work."""
    import tempfile

    target = resolved(path, option)
    existing = next((f for f in (target, *target.parents) if f.is_dir()), None)
    if existing is None:
        return
    try:
        Path(tempfile.mkdtemp(prefix=".masr-check.", suffix=".tmp", dir=existing)).rmdir()
    except OSError as exc:
        raise MasrError(
            f"{option} {path}: nothing can be made in {existing} ({exc.strerror or exc}); "
            f"choose another {option}"
        ) from None


def check_parents(path: str | os.PathLike[str], option: str) -> None:
    """Refuse (MasrError) an output path below a file (``afile/out``), which no folder can be
    made for: the OS says only "File exists" or "Not a directory" about it."""
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise MasrError(f"{option} {path}: {parent} is a file, not a directory")
            return


def check_replaceable_dir(
    path: str | os.PathLike[str],
    marker: str | None,
    option: str = "--out",
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Refuse (MasrError) an output folder that ``atomic_dir`` must not replace whole: a path
    that exists and is not a folder (a file, the input itself), a folder that is neither empty
    nor an earlier output of this kind (no ``marker`` file in it: another program's files, a
    runs folder; not checked for ``marker`` None, where the caller knows its own outputs), the
    current folder or one above it, a folder holding one of ``inputs`` or inside one (a folder
    of Parquet parts, read whole), or a path below a file (``check_parents``)."""
    check_parents(path, option)
    target = Path(path).resolve()
    for item in inputs:
        source = Path(item).resolve()
        if source == target or target in source.parents:
            what = "is" if source == target else "holds"
            raise MasrError(f"{option} {path}: {what} the input {item}; choose another {option}")
        if source in target.parents and source.is_dir():  # a folder of parts: read them all
            raise MasrError(
                f"{option} {path}: is inside the input folder {item}, whose parts it would "
                f"join; choose another {option}"
            )
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        raise MasrError(
            f"{option} {path}: is the current folder or above it, and would be replaced whole; "
            f"choose a new folder, e.g. {option} data"
        )
    if not target.exists():
        return
    if not target.is_dir():
        raise MasrError(f"{option} {path}: exists and is not a folder; choose another {option}")
    if marker is not None and any(target.iterdir()) and not (target / marker).is_file():
        raise MasrError(
            f"{option} {path}: a folder with other files in it (no {marker}), which would be "
            f"replaced whole; choose an empty or new folder, or remove it first"
        )


@contextlib.contextmanager
def atomic_group() -> Iterator[Callable[[str | os.PathLike[str]], Path]]:
    """Several files published together: ``stage(path)`` gives a temporary path next to
    ``path``; when the block succeeds every one is renamed over its path, in the order staged,
    and when it fails (an error, Ctrl-C) every temporary file is removed and the old files stay
    as they were: a set of files that belong together (an export's model, metadata and id maps)
    is never left half old, half new. A symbolic link is followed; a device or pipe is refused
    (MasrError)."""
    staged: list[tuple[Path, Path]] = []

    def stage(path: str | os.PathLike[str]) -> Path:
        final, direct = _target(path)
        if direct:
            raise MasrError(
                f"{path}: not a regular file (a device or pipe); a set of files is written "
                "next to it, so give a file path"
            )
        final.parent.mkdir(parents=True, exist_ok=True)
        with _creating(final):
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        staged.append((Path(tmp), final))
        return Path(tmp)

    try:
        yield stage
        for tmp, _ in staged:
            _publish_mode(tmp)
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException as exc:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        name = getattr(exc, "filename", None)
        for tmp, final in staged:  # an OS error about one of the temporary files: its name
            if isinstance(exc, OSError) and name is not None and str(name) == str(tmp):
                raise _named_os_error(exc, final, tmp) or exc from exc
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success it replaces ``path`` whole.

    An existing ``path`` is moved aside first and removed only after the new one is in place,
    so a crash at any point leaves either the old or the new directory, never a mix. A symbolic
    link is followed (``data -> /big/disk/data``): the folder it names is replaced, the link
    stays, as the checks before (``check_replaceable_dir``) judged that folder.
    """
    path, _ = _target(path)  # a link: the folder it names
    path.parent.mkdir(parents=True, exist_ok=True)
    with _creating(path):
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        _publish_mode(tmp, directory=True)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            try:
                os.replace(path, old / "content")
            except OSError:
                old.rmdir()
                raise
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        named = _named_os_error(exc, path, tmp)
        if named is not None:
            raise named from exc
        raise


def check_not_inside(
    path: str | os.PathLike[str], data: str | os.PathLike[str], option: str
) -> None:
    """Refuse an output path (a folder or a file) inside the prepared data folder ``data``,
    which ``masr prep`` replaces whole (the runs, reports or files in it would go with it)."""
    target, prepared = Path(path).resolve(), Path(data).resolve()
    if target == prepared or prepared in target.parents:
        raise MasrError(
            f"{option} {path}: inside the prepared data folder {data}, which `masr prep` replaces "
            f"whole; choose a folder beside it"
        )


#: what ``tempfile`` names the entries above: ``.NAME.`` + 8 random characters + ``.tmp`` (or
#: ``.old``, an ``atomic_dir``'s previous folder moved aside)
_TEMP_ENTRY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.(?:tmp|old)")


@contextlib.contextmanager
def sole_writer(
    path: str | os.PathLike[str],
    command: str,
    say: Callable[[str], None] | None = None,
    *,
    sidecars: bool = False,
) -> Iterator[None]:
    """The block as the one writer of ``path``, a file or a folder (``PATH.lock`` beside it,
    held with ``masr.lock``), after removing what a killed writer of it left
    (``remove_temp_entries``, with ``sidecars``: also of PATH.anything; said to ``say``).
    Where the write really goes, as ``atomic_path`` and ``atomic_dir`` write it (``_target``):
    what a symbolic link names; a device or a pipe, written in place, is neither locked nor
    cleaned."""
    final, direct = _target(path)
    if direct:
        yield
        return
    with locked(lock_path(final), command):
        if remove_temp_entries(final.parent, [final.name], sidecars=sidecars) and say:
            say(f"removed the temporary files of an earlier, killed {command} --out {path}")
        yield


def remove_temp_entries(
    folder: str | os.PathLike[str], names: Iterable[str] | None = None, *, sidecars: bool = False
) -> int:
    """Remove what a killed writer left in ``folder`` (SIGKILL runs no clean-up): the
    temporary files and folders of ``atomic_path``, ``atomic_group`` and ``atomic_dir`` for
    the entries ``names`` (every name when None; with ``sidecars`` also NAME.anything: an
    export's JSON, id maps, weights and check folder); how many. Only for a caller that holds
    the lock of those entries (``masr.lock``): no other writer is at work on them."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    wanted = None if names is None else set(names)
    removed = 0
    for entry in folder.iterdir():
        found = _TEMP_ENTRY.fullmatch(entry.name)
        if found is None:
            continue
        stem = found["name"]
        if wanted is not None and stem not in wanted and not (
            sidecars and any(stem.startswith(f"{name}.") for name in wanted)
        ):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed += 1
    return removed
