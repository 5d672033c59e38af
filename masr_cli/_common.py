"""Shared CLI plumbing: one stderr console, one error line per failure, never a traceback."""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from masr.errors import MasrError

#: Logs, tables and progress bars go to stderr; stdout carries data only (CSV, JSON).
console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


class Device(str, enum.Enum):
    """--device of train, evaluate and score: auto picks CUDA when it is usable."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``masr: error: message`` on stderr and return the Exit to raise."""
    sys.stderr.write(f"masr: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Turn MasrError (and Ctrl-C) into one clear line on stderr and a non-zero exit."""

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

    return wrapper  # type: ignore[return-value]
