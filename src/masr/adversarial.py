"""Adversarial perturbations for APR (eqs. 22-24): the fast gradient method on every parameter.

With the noise initialised at zero (as in the paper), the gradient of eq. 22 with respect to
delta is the gradient of the clean BPR loss with respect to the parameters, so one backward pass
gives both the clean update and the direction of delta (eq. 24):

    delta = eps * s(theta) * g / ||g||_2

* embedding tables (``model.embedding_tables()``): the norm is taken per row, and only rows the
  batch touched (non-zero gradient) get noise;
* every other tensor (metric vectors, biases, query weights): one norm per tensor;
* ``noise="flexible"``: s(theta) = std(theta) of that tensor (the paper's choice);
  ``noise="fixed"``: s(theta) = 1, i.e. |delta| = eps (He et al.'s fixed-magnitude APR).

``perturbed`` adds delta in place (rows only, for tables) and restores the exact old values on
exit, so L(Theta + delta) is computed with the model's own forward and its gradient lands in the
same ``.grad`` tensors. Nothing is carried from one batch to the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from masr.config import NOISE_MODES
from masr.models.base import Recommender


@dataclass
class Delta:
    """The perturbation of one parameter: ``values`` added at ``rows`` (tables) or whole."""

    values: Tensor  # (R, ...) rows of a table, or the parameter's shape
    rows: Tensor | None = None  # (R,) long row indices; None = the whole tensor


def noise_scales(model: Recommender, eps: float, noise: str) -> dict[str, Tensor]:
    """|delta| per row (tables) or per tensor: eps * std(param) ("flexible") or eps ("fixed").
    A one-element parameter has no std (the paper's s(θ) is undefined there; a metric vector at
    d = 1): it gets eps, as "fixed" gives."""
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, not {noise!r}")
    scales = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if noise == "fixed" or param.numel() < 2:
            scales[name] = torch.tensor(float(eps), device=param.device)
        else:
            scales[name] = eps * param.detach().std()
    return scales


def _unit_rows(values: Tensor) -> Tensor:
    """Each row of ``values`` (R, ...) scaled to norm 1; all-zero rows stay zero."""
    flat = values.reshape(values.shape[0], -1)  # (R, D)
    norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True)  # (R, 1)
    unit = torch.where(norms > 0, flat / norms.clamp_min(torch.finfo(flat.dtype).tiny), 0.0)
    return unit.reshape(values.shape)


def fast_gradient_deltas(model: Recommender, scales: dict[str, Tensor]) -> dict[str, Delta]:
    """Eq. 24 from the gradients currently in ``param.grad`` (the clean loss's, at delta = 0)."""
    tables = model.embedding_tables()
    deltas: dict[str, Delta] = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None or name not in scales:
            continue
        scale = scales[name]
        if name in tables:
            if grad.is_sparse:
                grad = grad.coalesce()
                rows, values = grad.indices()[0], grad.values()  # (R,), (R, d)
            else:
                # dense gradient: the touched rows are the ones with a non-zero gradient
                rows = grad.reshape(grad.shape[0], -1).abs().sum(1).nonzero().squeeze(1)  # (R,)
                values = grad.index_select(0, rows)  # (R, d)
            deltas[name] = Delta(values=scale * _unit_rows(values), rows=rows)
        else:
            g = grad.to_dense() if grad.is_sparse else grad
            norm = torch.linalg.vector_norm(g)
            unit = torch.where(norm > 0, g / norm.clamp_min(torch.finfo(g.dtype).tiny), 0.0)
            deltas[name] = Delta(values=scale * unit)
    return deltas


@contextlib.contextmanager
def perturbed(model: Recommender, deltas: dict[str, Delta]) -> Iterator[None]:
    """Parameters at Theta + delta inside the block; the exact old values restored after."""
    params = dict(model.named_parameters())
    saved: list[tuple[Tensor, Tensor | None, Tensor]] = []
    try:
        with torch.no_grad():
            for name, delta in deltas.items():
                param = params[name]
                if delta.rows is None:
                    saved.append((param, None, param.detach().clone()))
                    param.add_(delta.values)
                else:
                    saved.append((param, delta.rows, param.index_select(0, delta.rows)))
                    param.index_add_(0, delta.rows, delta.values.to(param.dtype))
        yield
    finally:
        with torch.no_grad():
            for param, rows, old in saved:
                if rows is None:
                    param.copy_(old)
                else:
                    param.index_copy_(0, rows, old)
