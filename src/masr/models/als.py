"""Weighted matrix factorisation for implicit feedback (Hu, Koren & Volinsky, ICDM 2008).

Every (entity, song) cell is a target: preference p = 1 where the entity holds the song, else 0,
with confidence c = 1 + confidence_weight * r (r = how many of the entity's playlists hold the
song; 1 for playlists). Minimise

    sum_{e,s} c_es (p_es - x_e . y_s)^2 + reg (sum_e |x_e|^2 + sum_s |y_s|^2)

by alternating least squares. Each half-step solves, for every entity e at once,

    (Y^T Y + reg I + Y^T (C^e - I) Y) x_e = Y^T C^e p(e)                  (Hu et al., eq. 4)

with a few conjugate-gradient steps warm-started from the previous factors (Takacs et al. 2011;
the ``implicit`` library's default). Y^T (C^e - I) Y x is never formed per entity: it is
sum_{s in e} (c_es - 1) (y_s . x) y_s, one sampled dense product and one sparse product over the
non-zeros, so a half-step costs O(nnz * d + E * d^2) and runs on the GPU when ``fit`` gets one.
Closed form per step (``trainable = False``): ``masr train`` calls ``fit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from masr.errors import MasrError
from masr.models._baseline import (
    Entity,
    check_entity,
    entity_count,
    entity_index,
    interaction_matrix,
    sparse_csr,
)
from masr.models.base import Batch, ModelConfig, Recommender

if TYPE_CHECKING:
    from masr.dataset import PreparedData


@dataclass
class ALSConfig(ModelConfig):
    """WMF settings; defaults are the anchor's (``implicit``: 128 factors, reg 1, alpha 5)."""

    #: "user": user -> song (all of a user's playlists pooled); "playlist": playlist -> song.
    entity: Entity = "playlist"
    #: Number of latent factors d.
    dim: int = 128
    #: L2 weight lambda on both factor tables (``--reg``).
    reg: float = 1.0
    #: alpha of c = 1 + alpha * r: how much more an observed cell counts than a missing one.
    confidence: float = 5.0
    #: Alternating sweeps (one entity half-step + one song half-step each).
    iterations: int = 15
    #: Conjugate-gradient steps per half-step.
    cg_steps: int = 3
    #: Standard deviation of the initial factors.
    init_std: float = 0.01


def conjugate_gradient(
    x: Tensor, apply_a: Callable[[Tensor], Tensor], b: Tensor, steps: int
) -> Tensor:
    """Run ``steps`` CG iterations on every row's system A_e x_e = b_e at once.

    ``x`` (E, d) is the warm start (updated and returned), ``apply_a(p)`` returns A_e p_e
    for every row of p (E, d), ``b`` is (E, d). Each A_e must be symmetric positive definite."""
    r = b - apply_a(x)  # (E, d) residuals
    p = r.clone()
    rs_old = (r * r).sum(1, keepdim=True)  # (E, 1)
    for _ in range(steps):
        ap = apply_a(p)  # (E, d)
        # Rows that already converged have p = 0: keep their step at zero instead of 0/0.
        step = rs_old / (p * ap).sum(1, keepdim=True).clamp_min(1e-30)  # (E, 1)
        x = x + step * p
        r = r - step * ap
        rs_new = (r * r).sum(1, keepdim=True)  # (E, 1)
        p = r + (rs_new / rs_old.clamp_min(1e-30)) * p
        rs_old = rs_new
    return x


def als_half_step(
    x: Tensor, y: Tensor, counts: Tensor, confidence: float, reg: float, steps: int
) -> Tensor:
    """New rows of ``x`` (E, d) given fixed ``y`` (V, d) and ``counts`` (E, V) sparse CSR r."""
    d = y.shape[1]
    # (Y^T Y + reg I): the part of every A_e shared by all entities, (d, d)
    shared = y.t() @ y + reg * torch.eye(d, dtype=y.dtype, device=y.device)
    extra = sparse_csr(
        counts.crow_indices(), counts.col_indices(), confidence * counts.values(), counts.shape
    )  # (E, V) sparse: c - 1 = alpha * r on the non-zeros
    # b_e = Y^T C^e p(e) = sum_{s in e} c_es y_s   (p = 1 exactly on the non-zeros)
    conf = sparse_csr(
        counts.crow_indices(), counts.col_indices(), 1.0 + extra.values(), counts.shape
    )
    b = torch.sparse.mm(conf, y)  # (E, d)

    def apply_a(p: Tensor) -> Tensor:
        # A_e p_e = (Y^T Y + reg I) p_e + sum_{s in e} (c_es - 1) (y_s . p_e) y_s
        dots = torch.sparse.sampled_addmm(extra, p, y.t(), beta=0.0)  # (E, V) sparse y_s . p_e
        weighted = sparse_csr(
            extra.crow_indices(), extra.col_indices(), dots.values() * extra.values(), extra.shape
        )
        return p @ shared + torch.sparse.mm(weighted, y)  # (E, d)

    return conjugate_gradient(x, apply_a, b, steps)


class ALS(Recommender):
    """distance(e, s) = -(x_e . y_s) with x, y fitted by weighted alternating least squares."""

    name = "als"
    config_class = ALSConfig
    trainable = False
    uses_members = False

    def __init__(self, config: ALSConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("als", config.entity)
        for option, value in (
            ("--dim", config.dim),
            ("iterations", config.iterations),
            ("cg_steps", config.cg_steps),
        ):
            if value < 1:
                raise MasrError(f"als: {option} must be >= 1, not {value}")
        if config.reg < 0 or config.confidence < 0:
            raise MasrError("als: --reg and confidence must be >= 0")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.register_buffer("entity_factors", torch.zeros(n_entities, config.dim))  # (E, d)
        self.register_buffer("song_factors", torch.zeros(n_songs, config.dim))  # (V, d)

    def fit(self, data: PreparedData, device: torch.device) -> None:
        cfg = self.config
        rows = data.train_user if cfg.entity == "user" else data.train_playlist
        n_rows = self.entity_factors.shape[0]
        # r: (E, V) counts of the entity's playlists holding each song, and its transpose
        counts = interaction_matrix(
            rows, data.train_song, n_rows, self.n_songs, device, binary=False
        )
        counts_t = interaction_matrix(
            data.train_song, rows, self.n_songs, n_rows, device, binary=False
        )
        # Drawn on the CPU from torch's global generator (seeded by `masr train --seed`), so the
        # start does not depend on the device.
        x = (torch.randn(n_rows, cfg.dim) * cfg.init_std).to(device)  # (E, d)
        y = (torch.randn(self.n_songs, cfg.dim) * cfg.init_std).to(device)  # (V, d)
        for _ in range(cfg.iterations):
            x = als_half_step(x, y, counts, cfg.confidence, cfg.reg, cfg.cg_steps)
            y = als_half_step(y, x, counts_t, cfg.confidence, cfg.reg, cfg.cg_steps)
        self.entity_factors = x
        self.song_factors = y

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        e = self.entity_factors[entity_index(self.config.entity, batch)]  # (B, d)
        return -(self.song_factors[songs] * e.unsqueeze(1)).sum(-1)  # (B, C)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        e = self.entity_factors[entity_index(self.config.entity, batch)]  # (B, d)
        return -(e @ self.song_factors.t())  # (B, V)
