"""EASE (Steck, WWW 2019): a shallow item-to-item autoencoder with a closed-form solution.

With X the (P, V) binary playlist x song matrix of the training split and L2 weight lambda:

    P = (X^T X + lambda I)^-1
    B = I - P diagMat(1 / diag(P))        (so diag(B) = 0: a song never explains itself)
    score(s | playlist) = sum_{m in members} B[m, s]

B is a dense V x V matrix: fitting needs two such matrices at once (Gram matrix and its
Cholesky factor, then the inverse), so ``fit`` refuses up front when they would not fit in the
fitting device's free memory, and says how much is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from masr.errors import MasrError
from masr.models._baseline import (
    FittedBuffers,
    human_bytes,
    interaction_matrix,
    member_indicator_sparse,
)
from masr.models.base import Batch, ModelConfig, Recommender
from masr.system import available_memory

if TYPE_CHECKING:
    from masr.dataset import PreparedData

#: Peak memory of ``fit`` in V x V float32 matrices (Gram/Cholesky factor + inverse).
_PEAK_MATRICES = 2


@dataclass
class EASEConfig(ModelConfig):
    """EASE's single hyper-parameter (tune on the validation split)."""

    #: L2 weight lambda on B (``masr train --model ease --reg``); larger for denser data.
    reg: float = 250.0


def ease_memory_bytes(n_songs: int) -> int:
    """Bytes ``EASE.fit`` needs at its peak for a catalog of ``n_songs`` songs."""
    return _PEAK_MATRICES * n_songs * n_songs * 4


class EASE(FittedBuffers, Recommender):
    """score(s | members) = sum_m B[m, s], B from the closed form above."""

    name = "ease"
    config_class = EASEConfig
    trainable = False
    uses_members = True
    resizable_buffers = ("weights",)

    def __init__(self, config: EASEConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        if not config.reg > 0:
            raise MasrError(
                f"ease: --reg must be > 0 (the Gram matrix is singular), not {config.reg}"
            )
        # (V, V) after fit; empty until then so that building the model allocates nothing.
        self.register_buffer("weights", torch.zeros(0, 0))

    def fit(self, data: PreparedData, device: torch.device) -> None:
        v = self.n_songs
        device = torch.device(device)
        need, free = ease_memory_bytes(v), available_memory(device)
        if need > free:
            raise MasrError(
                f"ease: the {v:,} x {v:,} song matrix needs {human_bytes(need)} of memory to fit "
                f"({_PEAK_MATRICES} float32 copies) but only {human_bytes(free)} is free on "
                f"{device.type}; "
                "use a machine with more memory, or shrink the catalog with "
                "`masr prep --min-song-playlists`"
            )
        x = interaction_matrix(data.train_playlist, data.train_song, data.n_playlists, v, device)
        xt = x.to_sparse_coo().t().coalesce().to_sparse_csr()  # (V, P)
        gram = torch.sparse.mm(xt, x).to_dense()  # (V, V) X^T X
        del x, xt
        gram.diagonal().add_(self.config.reg)  # X^T X + lambda I
        chol, info = torch.linalg.cholesky_ex(gram)  # (V, V) lower factor
        del gram
        if int(info) != 0:
            raise MasrError(
                f"ease: X^T X + reg I is not positive definite; raise --reg ({self.config.reg})"
            )
        p = torch.cholesky_inverse(chol)  # (V, V) P = (X^T X + lambda I)^-1
        del chol
        # B = I - P diagMat(1/diag(P)): off the diagonal B[i, j] = -P[i, j] / P[j, j]; diag(B) = 0
        p.div_(-p.diagonal().clone())
        p.diagonal().zero_()
        self.weights = p

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        members = member_indicator_sparse(batch, self.n_songs)  # (B, V) sparse 0/1
        return -torch.sparse.mm(members, self.weights)  # (B, V) = -(x_playlist @ B)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        # Only the candidate columns: sum over members of B[m, s] for each (row, candidate).
        picked = self.weights[batch.members.unsqueeze(2), songs.unsqueeze(1)]  # (B, L, C)
        return -(picked * batch.member_mask.unsqueeze(2)).sum(1)  # (B, C)
