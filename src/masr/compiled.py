"""``torch.compile`` where it pays, eager where it cannot: one wrapper for the training paths.

A MASS step under sampled softmax is dominated by element-wise passes over (batch, negatives,
d) and (batch, negatives, members) tensors; on a CPU, inductor fuses them (docs/training.md,
Speed: about 30% off a step). Compiling needs a C++ compiler (CPU) or Triton (GPU) and takes
seconds per new shape, so the wrapper is opt-in per call site, and the first failure turns it
off for good with one line on stderr: training never stops because a compiler is missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

#: MASR_COMPILE=0 turns compilation off everywhere (the test suite does: compiling costs
#: seconds per process and shape).
ENV = "MASR_COMPILE"


def compile_allowed() -> bool:
    """False when $MASR_COMPILE is 0/false/no/off."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class Compiled:
    """``fn`` compiled by ``torch.compile(dynamic=True)`` on first use; on any error while
    compiling or running it, ``fn`` itself from then on."""

    def __init__(self, fn: Callable[..., Any], what: str) -> None:
        self.fn, self.what = fn, what
        self._compiled: Callable[..., Any] | None = None
        self.failed = False

    def __call__(self, *args: Any) -> Any:
        if self.failed:
            return self.fn(*args)
        try:
            if self._compiled is None:
                import torch

                self._compiled = torch.compile(self.fn, dynamic=True)
            return self._compiled(*args)
        except Exception as err:  # no compiler, unsupported op...: eager, once said
            self.failed = True
            text = str(err).strip()
            first = text.splitlines()[0][:160] if text else ""
            print(
                f"masr: torch.compile of {self.what} failed ({type(err).__name__}: {first}); "
                f"training on without it (set {ENV}=0 to skip the attempt)",
                file=sys.stderr,
            )
            return self.fn(*args)
