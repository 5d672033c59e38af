"""Shared CLI plumbing: one stderr console, one error line per failure, never a traceback."""

from __future__ import annotations

import enum
import errno
import functools
import inspect
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from masr.config import DEVICES
from masr.distributed import launched
from masr.errors import MasrError

#: Logs, tables and progress bars go to stderr; stdout carries data only (CSV, JSON).
console = Console(stderr=True)


def log_line(message: str) -> None:
    """One log line on stderr, dimmed: never wrapped at the console's width (a path stays whole
    for grep and for copying), never read as Rich markup (a path or a list may hold brackets)."""
    console.print(message, style="dim", markup=False, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def choices(name: str, values: tuple[str, ...]) -> Any:
    """A ``str`` Enum of ``values`` for a Typer option, built from the library's tuple so that
    the CLI never repeats a list of choices."""
    return enum.Enum(name, {v: v for v in values}, type=str)


#: --device of train, evaluate and score: auto picks CUDA when it is usable
Device = choices("Device", DEVICES)

#: --threads of the commands that run PyTorch on a CPU (train, evaluate, reproduce, analyze)
Threads = Annotated[
    int,
    typer.Option(
        help="CPU threads for PyTorch; 0 = the cores not kept busy by other work (the lower "
        "of the 1-minute load average and a 0.2 s sample of the cores' busy time), at least "
        "1, said on stderr, and followed while training and evaluation run: a thread is "
        "dropped when other work takes a core and added back once it is free again (each "
        "change said on stderr). On a busy machine more threads than free cores are many "
        "times slower.",
    ),
]


def cpu_threads_line(threads: int, device: str) -> str:
    """Set PyTorch's CPU threads for a command on ``device`` ("cuda" leaves them alone):
    ``threads``, or with 0 the free cores (``masr.system.cpu_threads``). Returns the line to
    say on stderr ("" when the user chose, or on CUDA)."""
    from masr.config import MAX_THREADS
    from masr.errors import MasrError

    if not 0 <= threads <= MAX_THREADS:
        raise MasrError(f"--threads must be >= 0 (0 = the free cores) and at most {MAX_THREADS:,}")
    import torch

    from masr.system import cpu_threads

    if _on_cuda(device):
        return ""

    n_threads, why = cpu_threads(threads)
    torch.set_num_threads(n_threads)
    return "" if threads else f"using {why}"


def governed(threads: int, device: str, log: Callable[[str], None] | None) -> Any:
    """A context for a command's long work, after ``cpu_threads_line``: with --threads 0 on a
    CPU its training and evaluation loops keep the thread count at the free cores while they
    run (``masr.system.governed_threads``), saying each change through ``log``; otherwise
    nothing."""
    if threads or _on_cuda(device):
        return nullcontext()
    from masr.system import governed_threads

    return governed_threads(log)


def _on_cuda(device: str) -> bool:
    """Whether the command's work runs on CUDA (``--device auto`` on a GPU machine too)."""
    from masr.train import resolve_device

    return resolve_device(device).type == "cuda"


def log_after(first_line: str) -> Callable[[str], None]:
    """``log_line`` that says ``first_line`` (if any) before its first message: a command that
    fails before it logs anything leaves its one error line alone on stderr."""
    pending = [first_line] if first_line else []

    def log(message: str) -> None:
        while pending:
            log_line(pending.pop())
        log_line(message)

    return log


#: --data of the commands that read trained runs (evaluate, analyze); default Path("data")
RunsData = Annotated[Path, typer.Option(help="Prepared data directory the runs were trained on.")]


def unwrap(doc: str | None) -> str:
    """A command's docstring as Typer help that Rich can wrap to the terminal: the lines of each
    prose paragraph joined into one (Typer keeps single line breaks, which left ragged half-lines
    at 80 columns); indented blocks (examples) keep their lines."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    out = []
    for para in paragraphs:
        lines = para.split("\n")
        if any(line.startswith(" ") for line in lines):
            out.append(para)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def error_line(message: str) -> None:
    """Print ``masr: error: message`` on stderr. Under torchrun every process may say the same
    line: those after the first name their rank (``masr: error (rank 1 of 2): ...``), so one
    failure does not read as several (usage errors too, said before any command runs)."""
    rank, size = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    where = f" (rank {rank} of {size})" if launched() and rank != "0" else ""
    sys.stderr.write(f"masr: error{where}: {message}\n")
    sys.stderr.flush()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``masr: error: message`` on stderr (``error_line``) and return the Exit to
    raise."""
    error_line(message)
    return typer.Exit(code)


def _broken_pipe(exc: OSError) -> bool:
    """The reader of stdout went away: Python's BrokenPipeError, or the same error raised by a
    Rust writer (Polars: "Broken pipe (os error 32)")."""
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE or (
        "os error 32" in str(exc)
    )


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (tests): nothing to quiet
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, ``docker stop``, a batch scheduler) raised in the main
    thread: unwinds like Ctrl-C, so runs are marked interrupted, locks released and temporary
    files removed, then exits with 143."""


def stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The error line and exit status of a command stopped by SIGTERM (143) or Ctrl-C (130)."""
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", 143
    return "interrupted", 130


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _catch_sigterm() -> None:
    """Route SIGTERM to ``Terminated`` (main thread only; elsewhere signals cannot be set)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not settable here: the default (exit at once) stays
            pass


def handle_errors(func: F) -> F:
    """Turn MasrError, Ctrl-C, SIGTERM and OS errors (ENOSPC, EACCES) into one clear line on
    stderr and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _catch_sigterm()
        name = func.__module__.rpartition(".")[2]
        if launched() and name != "train":
            # every process would run the whole command: copies colliding on the same files
            raise fail(f"masr {name} runs as one process; only masr train runs under torchrun")
        try:
            return func(*args, **kwargs)
        except MasrError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
            raise fail(*stopped(exc)) from None
        except MemoryError:
            raise fail(OUT_OF_MEMORY) from None
        except ModuleNotFoundError as exc:  # a scoring-only install (no torch, no onnx)
            needed = MISSING_DEPENDENCY.get((exc.name or "").partition(".")[0])
            if needed is None:
                raise
            raise fail(f"masr {name} needs {needed}") from None
        except OSError as exc:  # a full disk, a read-only folder: the file and the reason
            if _broken_pipe(exc):  # `masr score ... | head`: stop quietly, as Unix tools do
                _quiet_stdout()
                raise typer.Exit(141) from None
            where = f"{exc.filename}: " if exc.filename else ""
            raise fail(f"{where}{exc.strerror or exc}") from None
        except Exception as exc:
            if _allocation_failed(exc):  # PyTorch's allocator says so in a RuntimeError
                raise fail(OUT_OF_MEMORY) from None
            if not _peer_stopped(exc):
                raise
            raise fail(  # fail names this rank
                "another process of this torchrun stopped; its own error line says why"
            ) from None

    return wrapper  # type: ignore[return-value]


#: What a command needs that a scoring-only install (exported/README.md) lacks, and how to get it.
MISSING_DEPENDENCY = {
    "torch": "PyTorch, which is not installed here: pip install torch "
    "(masr score runs without it)",
    "onnx": "the onnx package, which is not installed here: pip install onnx",
}

OUT_OF_MEMORY = (
    "out of memory; try a smaller input or smaller sizes (train, evaluate and score: a "
    "smaller --batch-size; train: a smaller --dim or --neg)"
)


def _allocation_failed(exc: BaseException) -> bool:
    """PyTorch's "can't allocate memory" (CPU) or "out of memory" (CUDA), raised as a
    RuntimeError rather than MemoryError."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "CUDA out of memory" in text
    )


def _peer_stopped(exc: BaseException) -> bool:
    """Under torchrun, the collective error a rank gets when another rank has exited (an
    error there, a kill): torch.distributed's DistBackendError, or gloo's "Connection closed
    by peer" as a RuntimeError. Never True in one process."""
    # torchrun's environment: the process group may be gone by the time the error gets here
    if not launched():
        return False
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc)
    return bool(kinds & {"DistBackendError", "DistNetworkError"}) or any(
        words in text for words in ("Connection closed by peer", "Connection reset by peer")
    )
