"""An exponential moving average of the trained weights (Polyak averaging), for ``--ema``.

Training keeps stepping the live weights; the average is what validation ranks, what
``best.pt`` holds and so what evaluation, export and scoring serve. After n updates with
per-update decay ``r`` the average is the bias-corrected sum

    avg_n = Σ_{i=1..n} (1 - r) r^(n-i) θ_i / (1 - r^n)

of the weights θ_i after each update (the starting weights carry no weight, as in Adam's
moment estimates). One update per ``every`` optimiser steps with r = decay^every keeps the
same time constant, 1 / (1 - decay) steps, at 1 / every of the cost: one pass over AOTM's
MDR tables (10.3 M floats) takes about 7 ms on one CPU core, a third of a 20 ms MDR step.

Public API:
    WeightAverage(params, decay, every=EMA_EVERY)
        .step()                     after every optimiser step
        .applied(params) -> ctx     the averaged values in ``params`` inside, the live ones after
        .state_dict() / .load_state_dict(state)   plain tensors and ints (weights_only)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from masr.errors import MasrError

#: optimiser steps per update of the average (its decay per update is decay ** EMA_EVERY)
EMA_EVERY = 8


class WeightAverage:
    """The bias-corrected exponential moving average of ``params`` (module docstring)."""

    def __init__(self, params: list[Tensor], decay: float, every: int = EMA_EVERY):
        if not 0 < decay < 1:
            raise MasrError(f"--ema must be in (0, 1), not {decay}")
        self.params = list(params)
        self.decay, self.every = decay, every
        self.rate = decay**every  # r: decay per update
        self.steps = 0  # optimiser steps seen
        self.updates = 0  # n
        self.total = [torch.zeros_like(p) for p in self.params]  # (1 - r^n) avg_n

    @torch.no_grad()
    def step(self) -> None:
        """Count an optimiser step; every ``every``-th folds the live weights into the sum."""
        self.steps += 1
        if self.steps % self.every:
            return
        self.updates += 1
        for total, p in zip(self.total, self.params, strict=True):
            total.mul_(self.rate).add_(p.detach(), alpha=1 - self.rate)

    def averaged(self) -> list[Tensor]:
        """avg_n for each parameter; the live weights before the first update."""
        if not self.updates:
            return [p.detach().clone() for p in self.params]
        norm = 1 - self.rate**self.updates
        return [total / norm for total in self.total]

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the parameters inside the block, the live ones restored
        after it (also on an exception)."""
        live = [p.detach().clone() for p in self.params]
        try:
            with torch.no_grad():
                for p, avg in zip(self.params, self.averaged(), strict=True):
                    p.copy_(avg)
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self.params, live, strict=True):
                    p.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {
            "decay": self.decay,
            "every": self.every,
            "steps": self.steps,
            "updates": self.updates,
            "total": [t.detach().cpu() for t in self.total],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["total"]) != len(self.params) or int(state["every"]) != self.every:
            raise MasrError("last.pt: the weight average does not match the model; cannot resume")
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        for total, saved in zip(self.total, state["total"], strict=True):
            total.copy_(saved)
