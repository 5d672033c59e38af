"""``torch.compile`` where it pays, eager where it cannot: one wrapper for MASS's scores.

A MASS step under sampled softmax is dominated by element-wise passes over (batch, negatives,
d) and (batch, negatives, members) tensors, and its full ranking (validation, evaluation) by
the same passes over (users, songs, members) tensors; on a CPU, inductor fuses them
(docs/training.md, Speed: about 30% off a training step, a third off a full-ranking pass).
Compiling needs a C++ compiler (CPU) or Triton (GPU) and takes seconds per new shape, so the
wrapper is opt-in per call site, and the first failure turns it off for good with one line on
stderr: training never stops because a compiler is missing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: MASR_COMPILE=0 turns compilation off everywhere (the test suite does: compiling costs
#: seconds per process and shape).
ENV = "MASR_COMPILE"


#: a run with a --time-limit below this many seconds trains and validates eagerly even when
#: compiling is asked for: the first compiled epoch pays about 5-10 s of compiling, later ones
#: save 10-30%, and a MASS run on the embedded data broke even at about 120 s (docs/training.md)
MIN_COMPILE_BUDGET = 90.0


def compile_pays(time_limit: float) -> bool:
    """False for a --time-limit too short for ``torch.compile`` to win back its compiling
    (``MIN_COMPILE_BUDGET``); True without a limit."""
    return not 0 < time_limit < MIN_COMPILE_BUDGET


def compile_allowed() -> bool:
    """False when $MASR_COMPILE is 0/false/no/off."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def compile_scores(model: Any, on: bool, device: Any) -> bool:
    """Switch ``model``'s scores to their compiled version (``Recommender.compile_scores``)
    where ``on``, ``device`` is a CPU (on a GPU it was not measured to pay) and $MASR_COMPILE
    allows it; True when switched on: the caller switches it off with
    ``model.compile_scores(False)``."""
    import torch

    if not (on and torch.device(device).type == "cpu" and compile_allowed()):
        return False
    return bool(model.compile_scores(True))


#: seconds that a ``Compiled`` runs ``fn`` eagerly (its calls' own time) before it compiles:
#: about what compiling MASS's scores costs on 2 CPU cores with a cold cache (20-25 s), so a
#: short job never pays more for the compiler than the compiled code could win back (on the
#: embedded data a compiled validation saves 0.4 s an epoch; docs/training.md, "Training rows
#: scored once per playlist")
EAGER_SECONDS = 20.0


class Compiled:
    """``fn`` compiled by ``torch.compile(dynamic=True)`` once its eager calls have taken
    ``EAGER_SECONDS`` in all; on any error while compiling or running it, ``fn`` itself from
    then on."""

    def __init__(self, fn: Callable[..., Any], what: str) -> None:
        self.fn, self.what = fn, what
        self._compiled: Callable[..., Any] | None = None
        self.failed = False
        self.eager_left = EAGER_SECONDS

    def __call__(self, *args: Any) -> Any:
        if self.failed:
            return self.fn(*args)
        if self._compiled is None and self.eager_left > 0:
            start = time.perf_counter()
            out = self.fn(*args)
            self.eager_left -= time.perf_counter() - start
            return out
        try:
            if self._compiled is None:
                import torch

                # kernels that read the thread count when run: a count changed by
                # masr.system.ThreadGovernor retraces (0.35 s, MASS's full ranking) rather than
                # compiling C++ again (2.3 s; docs/training.md, "Threads that follow the
                # machine")
                self._compiled = torch.compile(
                    self.fn, dynamic=True, options={"cpp.dynamic_threads": True}
                )
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
