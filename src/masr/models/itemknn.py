"""Item-kNN (Sarwar et al. 2001): songs similar to a playlist's member songs come next.

Similarity between a member song m and a candidate song s is the asymmetric cosine of their
playlist sets (Aiolli 2013), shrunk toward zero when the overlap is small (the shrink term as in
Dacrema et al. 2019):

    sim(m -> s) = |P(m) ∩ P(s)| / (|P(m)|^alpha * |P(s)|^(1-alpha) + shrink)

``alpha = 0.5`` is plain cosine; ``alpha = 1`` (no shrink) is P(s | m), the share of m's
playlists that also hold s; ``alpha > 0.5`` thus penalises popular candidates less. Optionally
only each candidate's ``neighbours`` most similar member songs are kept. A playlist's score for
s is the sum of sim(m -> s) over its member songs, and distance = -score.

The song x song matrix is kept sparse: at 64K songs a dense float32 copy would take 16 GiB, while
the co-occurrence matrix of real playlists has a few tens of millions of non-zeros.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from masr.errors import MasrError
from masr.models._baseline import FittedBuffers, interaction_matrix, sparse_coo, sparse_csr
from masr.models.base import Batch, ModelConfig, Recommender

if TYPE_CHECKING:
    from masr.dataset import PreparedData


@dataclass
class ItemKNNConfig(ModelConfig):
    """Item-kNN similarity settings (tune on the validation split)."""

    #: Asymmetric-cosine exponent on the member song's popularity; 0.5 is cosine, 1 is P(s | m).
    alpha: float = 0.5
    #: Added to the denominator: damps similarities backed by few shared playlists.
    shrink: float = 0.0
    #: Keep only each candidate song's top-k most similar songs; 0 keeps all of them.
    neighbours: int = 0


def cooccurrence(data: PreparedData, n_songs: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Off-diagonal co-occurrences of the training split as COO arrays: candidate s (nnz,),
    member m (nnz,), shared playlists c_ms (nnz,), and playlists per song n (V,)."""
    # X: (P, V) binary playlist x song matrix of the training split.
    x = interaction_matrix(
        data.train_playlist, data.train_song, data.n_playlists, n_songs, torch.device("cpu")
    )
    xt = x.to_sparse_coo().t().coalesce().to_sparse_csr()  # (V, P)
    co = torch.sparse.mm(xt, x).to_sparse_coo().coalesce()  # (V, V) X^T X, symmetric
    cand, memb = co.indices()
    counts = co.values()
    keep = cand != memb  # a song is not its own neighbour
    n = torch.as_tensor(data.song_popularity[:n_songs], dtype=torch.float32)  # (V,) |P(s)|
    return cand[keep], memb[keep], counts[keep], n


class ItemKNN(FittedBuffers, Recommender):
    """score(s | members) = sum_m sim(m -> s); a sparse (V, V) similarity fitted in closed form."""

    name = "itemknn"
    config_class = ItemKNNConfig
    trainable = False
    uses_members = True
    # The similarity is stored as CSR arrays with row = member m, column = candidate s: scoring
    # a playlist adds up its members' rows, touching only their non-zeros.
    resizable_buffers = ("sim_crow", "sim_col", "sim_val")

    def __init__(self, config: ItemKNNConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        if not 0.0 <= config.alpha <= 1.0:
            raise MasrError(f"itemknn: alpha must lie in [0, 1], not {config.alpha}")
        if config.shrink < 0:
            raise MasrError(f"itemknn: shrink must be >= 0, not {config.shrink}")
        if config.neighbours < 0:
            raise MasrError(
                f"itemknn: neighbours must be >= 0 (0 = all), not {config.neighbours}"
            )
        self.register_buffer("sim_crow", torch.zeros(n_songs + 1, dtype=torch.long))  # (V+1,)
        self.register_buffer("sim_col", torch.zeros(0, dtype=torch.long))  # (nnz,)
        self.register_buffer("sim_val", torch.zeros(0))  # (nnz,)
        self._key_cache: tuple[tuple, Tensor] | None = None

    def fit(self, data: PreparedData, device: torch.device) -> None:
        self.set_similarity(*cooccurrence(data, self.n_songs), device)

    def set_similarity(
        self, cand: Tensor, memb: Tensor, counts: Tensor, n: Tensor, device: torch.device
    ) -> None:
        """Fit from a precomputed ``cooccurrence`` (lets a search over alpha/shrink/neighbours
        count co-occurrences once)."""
        cfg = self.config
        v = self.n_songs
        # sim(m -> s) = c_ms / (n_m^alpha n_s^(1-alpha) + shrink)
        denom = n[memb].pow(cfg.alpha) * n[cand].pow(1.0 - cfg.alpha) + cfg.shrink
        sim = counts / denom  # (nnz,)
        if cfg.neighbours:
            # Rank each candidate's similarities (stable sorts: by value desc, then by row).
            order = torch.argsort(sim, descending=True, stable=True)
            order = order[torch.argsort(cand[order], stable=True)]
            cand, memb, sim = cand[order], memb[order], sim[order]
            starts = torch.zeros(v + 1, dtype=torch.long)
            starts[1:] = torch.cumsum(torch.bincount(cand, minlength=v), 0)
            rank = torch.arange(cand.shape[0]) - starts[cand]
            keep = rank < cfg.neighbours
            cand, memb, sim = cand[keep], memb[keep], sim[keep]
        csr = sparse_coo(torch.stack([memb, cand]), sim, (v, v)).coalesce().to_sparse_csr()
        self.sim_crow = csr.crow_indices().to(device)
        self.sim_col = csr.col_indices().to(device)
        self.sim_val = csr.values().to(device)

    def similarity(self) -> Tensor:
        """(V, V) sparse CSR: entry (m, s) is sim(m -> s)."""
        v = self.n_songs
        return sparse_csr(self.sim_crow, self.sim_col, self.sim_val, (v, v))

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        b = batch.members.shape[0]
        row = torch.arange(b, device=batch.members.device)[:, None].expand_as(batch.members)
        row, member = row[batch.member_mask], batch.members[batch.member_mask]  # (M,), (M,)
        # Expand every member into its similarity row: (T,) entries (row, candidate, sim).
        start, stop = self.sim_crow[member], self.sim_crow[member + 1]  # (M,)
        length = stop - start
        entry_row = torch.repeat_interleave(row, length)  # (T,)
        offset = torch.arange(entry_row.shape[0], device=row.device) - torch.repeat_interleave(
            torch.cumsum(length, 0) - length, length
        )
        entry = torch.repeat_interleave(start, length) + offset  # (T,) positions in sim_col
        dist = torch.zeros(b * self.n_songs, device=row.device, dtype=self.sim_val.dtype)
        # distance(s) = -sum over members m of sim(m -> s)   (negated while adding: no copy)
        dist.index_add_(
            0, entry_row * self.n_songs + self.sim_col[entry], self.sim_val[entry], alpha=-1
        )
        return dist.view(b, self.n_songs)  # (B, V)

    def _sorted_keys(self) -> Tensor:
        """(nnz,) m * V + s for every stored similarity, ascending (CSR order), cached."""
        tag = (self.sim_col.data_ptr(), self.sim_col.device, self.sim_col.shape[0])
        if self._key_cache is None or self._key_cache[0] != tag:
            rows = torch.repeat_interleave(
                torch.arange(self.n_songs, device=self.sim_col.device), torch.diff(self.sim_crow)
            )
            self._key_cache = (tag, rows * self.n_songs + self.sim_col)
        return self._key_cache[1]

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        keys = self._sorted_keys()  # (nnz,)
        if keys.numel() == 0:
            return torch.zeros(songs.shape, device=songs.device)
        # Look up sim(m -> s) for every (row, member, candidate) by binary search on m * V + s.
        query = batch.members.unsqueeze(2) * self.n_songs + songs.unsqueeze(1)  # (B, L, C)
        pos = torch.searchsorted(keys, query).clamp_(max=keys.numel() - 1)  # (B, L, C)
        found = (keys[pos] == query) & batch.member_mask.unsqueeze(2)  # (B, L, C)
        sim = torch.where(found, self.sim_val[pos], 0.0)  # (B, L, C)
        return -sim.sum(1)  # (B, C)
