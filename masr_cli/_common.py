"""Shared CLI plumbing: one stderr console, one error line per failure, never a traceback."""

from __future__ import annotations

import enum
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from masr.config import DEVICES
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


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``masr: error: message`` on stderr and return the Exit to raise."""
    sys.stderr.write(f"masr: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Turn MasrError, Ctrl-C and OS errors (ENOSPC, EACCES) into one clear line on stderr and a
    non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MasrError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except MemoryError:
            raise fail("out of memory; try a smaller --batch-size or a smaller input") from None
        except BrokenPipeError:
            raise
        except OSError as exc:  # a full disk, a read-only folder: the file and the reason
            where = f"{exc.filename}: " if exc.filename else ""
            raise fail(f"{where}{exc.strerror or exc}") from None

    return wrapper  # type: ignore[return-value]
