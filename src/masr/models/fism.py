"""FISM (Kabbur, Ning & Karypis, KDD 2013): factored item similarity, the paper's baseline (d).

A candidate song s is scored by its learned similarity to the playlist's member songs, the
target itself excluded (FISMauc, Kabbur et al. eq. 9):

    score(s | M) = b_s + (|M \\ {s}|)^(-alpha) * sum_{m in M, m != s} p_m . q_s
    distance = -score

Two song tables: P for songs as members, Q for songs as candidates. ``alpha`` in [0, 1] sets how
strongly long playlists are normalised (0: plain sum, 1: mean). Trained with BPR like every
gradient model here; during training the member list already lacks the positive (see the model
contract), and the explicit ``m != s`` term keeps evaluation and training consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class FISMConfig(ModelConfig):
    """FISM settings (tune on the validation split)."""

    #: Embedding size d (``--dim``).
    dim: int = 64
    #: Exponent of the member-count normalisation |M \ {s}|^-alpha.
    alpha: float = 0.5
    #: Standard deviation of the initial embeddings.
    init_std: float = 0.01


class FISM(Recommender):
    """Item-similarity model: member songs (P) vote for candidate songs (Q)."""

    name = "fism"
    config_class = FISMConfig
    uses_members = True

    def __init__(self, config: FISMConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        if config.dim < 1:
            raise MasrError(f"fism: --dim must be >= 1, not {config.dim}")
        if not 0.0 <= config.alpha <= 1.0:
            raise MasrError(f"fism: alpha must lie in [0, 1], not {config.alpha}")
        self.member_emb = nn.Embedding(n_songs, config.dim)  # P: p_m
        self.target_emb = nn.Embedding(n_songs, config.dim)  # Q: q_s
        self.song_bias = nn.Embedding(n_songs, 1)  # b_s
        nn.init.normal_(self.member_emb.weight, std=config.init_std)
        nn.init.normal_(self.target_emb.weight, std=config.init_std)
        nn.init.zeros_(self.song_bias.weight)

    def _normalise(self, count: Tensor) -> Tensor:
        """|M \\ {s}|^-alpha, with an empty member set scoring by the bias alone."""
        return count.clamp_min(1.0).pow(-self.config.alpha)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        mask = batch.member_mask.float()  # (B, L)
        p = self.member_emb(batch.members) * mask.unsqueeze(-1)  # (B, L, d), padding zeroed
        q = self.target_emb(songs)  # (B, C, d)
        # (B, C) sum over members of p_m . q_s, then remove the m == s terms
        sims = q @ p.transpose(1, 2)  # (B, C, L)
        is_target = (
            batch.members.unsqueeze(1) == songs.unsqueeze(2)
        ) & batch.member_mask.unsqueeze(1)
        total = (sims * (~is_target)).sum(-1)  # (B, C)
        count = mask.sum(1, keepdim=True) - is_target.sum(-1)  # (B, C) |M \ {s}|
        score = self.song_bias(songs).squeeze(-1) + self._normalise(count) * total
        return -score

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """``distance`` to songs (N,) shared by the batch in GEMM form: (Σ_m p_m)·q_s for every
        pair, minus each member candidate's own p_s·q_s (sampled softmax's negatives)."""
        mask = batch.member_mask.float()  # (B, L)
        p = self.member_emb(batch.members) * mask.unsqueeze(-1)  # (B, L, d), padding zeroed
        q = self.target_emb(songs)  # (N, d)
        total = p.sum(1) @ q.t()  # (B, N)
        is_target = (
            (batch.members.unsqueeze(1) == songs.view(1, -1, 1)) & batch.member_mask.unsqueeze(1)
        ).float()  # (B, N, L)
        own = (p * self.target_emb(batch.members)).sum(-1)  # (B, L) p_m . q_m
        own_total = (is_target @ own.unsqueeze(-1)).squeeze(-1)  # (B, N)
        count = mask.sum(1, keepdim=True) - is_target.sum(-1)  # (B, N) |M \ {s}|
        score = self.song_bias(songs).view(1, -1) + self._normalise(count) * (total - own_total)
        return -score

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        mask = batch.member_mask.float()  # (B, L)
        b, v = mask.shape[0], self.n_songs
        p = self.member_emb(batch.members) * mask.unsqueeze(-1)  # (B, L, d)
        q = self.target_emb.weight  # (V, d)
        total = p.sum(1) @ q.t()  # (B, V): sum over all members of p_m . q_s
        # Members that are candidates themselves: subtract their own p_s . q_s, count one less.
        own = (p * self.target_emb(batch.members)).sum(-1)  # (B, L) p_m . q_m
        is_member = torch.zeros(b, v, device=mask.device)  # (B, V)
        is_member.scatter_add_(1, batch.members, mask)
        own_total = torch.zeros(b, v, device=mask.device).scatter_add_(1, batch.members, own)
        count = mask.sum(1, keepdim=True) - is_member  # (B, V)
        score = self.song_bias.weight.t() + self._normalise(count) * (total - own_total)
        return -score
