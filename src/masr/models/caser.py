"""Caser (Tang & Wang, WSDM 2018, "Convolutional Sequence Embedding"): the paper's baseline (h).

The last L songs before the row (``window``; the paper searches L = 4-10, any L >= 1 works;
``masr.sampling.previous_songs``) form an L x d "image" E. Horizontal filters of heights
h = 1..L slide over it and are max-pooled over time, vertical filters weigh its rows (Caser
eqs. 3-9):

    o_h   = max_t relu(F^h_k * E[t:t+h, :])           n_h filters per height h   -> (L n_h)
    o_v   = sum_l F~_k[l] E[l, :]                     n_v vertical filters        -> (n_v d)
    z     = relu(W [o_h; o_v] + b)                    dropout on [o_h; o_v] in training -> (d)
    score = W'_s . [z; P_e] + b'_s                    P_e: the entity (``--entity``)
    distance = -score

Slots before a playlist's first song hold a zero padding embedding. Trained with BPR (eq. 21)
on the score, one target per row (Caser's T = 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class CaserConfig(ModelConfig):
    """Caser settings (tune on the validation split)."""

    setting_aliases: ClassVar[dict[str, str]] = {"L": "window", "l": "window"}

    #: "user" (Caser's P_u) or "playlist" (``--entity``).
    entity: Entity = "user"
    #: Embedding size d (``--dim``).
    dim: int = 64
    #: L, the number of previous songs read (4-10 in Caser's experiments).
    window: int = 5
    #: Horizontal filters per height h = 1..L.
    horizontal: int = 16
    #: Vertical filters.
    vertical: int = 4
    #: Dropout on the convolution outputs during training.
    dropout: float = 0.5
    #: Standard deviation of the initial embeddings.
    init_std: float = 0.05


class Caser(Recommender):
    """Horizontal and vertical convolutions over the last L songs, plus the entity."""

    name = "caser"
    config_class = CaserConfig
    uses_members = False

    def __init__(self, config: CaserConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("caser", config.entity)
        d, big_l = config.dim, config.window
        if d < 1 or big_l < 1 or config.horizontal < 1 or config.vertical < 1:
            raise MasrError("caser: --dim, window, horizontal and vertical must be >= 1")
        if not 0.0 <= config.dropout < 1.0:
            raise MasrError(f"caser: dropout must lie in [0, 1), not {config.dropout}")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.seq_emb = nn.Embedding(n_songs + 1, d, padding_idx=n_songs)  # E rows; row V = pad
        self.entity_emb = nn.Embedding(n_entities, d)  # P_e
        self.horizontal = nn.ModuleList(
            nn.Conv2d(1, config.horizontal, (h, d)) for h in range(1, big_l + 1)
        )  # F^h
        self.vertical = nn.Conv2d(1, config.vertical, (big_l, 1))  # F~
        self.fc = nn.Linear(big_l * config.horizontal + config.vertical * d, d)  # W, b
        self.drop = nn.Dropout(config.dropout)
        self.target_emb = nn.Embedding(n_songs, 2 * d)  # W'_s
        self.target_bias = nn.Embedding(n_songs, 1)  # b'_s
        for table in (self.seq_emb, self.entity_emb, self.target_emb):
            nn.init.normal_(table.weight, std=config.init_std)
        with torch.no_grad():
            self.seq_emb.weight[n_songs].zero_()
        nn.init.zeros_(self.target_bias.weight)

    def _query(self, batch: Batch) -> Tensor:
        """(B, 2d) [z; P_e] from the last L songs and the entity."""
        from masr.sampling import previous_songs

        prev, mask = previous_songs(batch, self.config.window)  # (B, L)
        e = self.seq_emb(torch.where(mask, prev, self.n_songs)).unsqueeze(1)  # (B, 1, L, d)
        # o_h: per height, relu(conv) max-pooled over the L - h + 1 positions, (B, n_h)
        o_h = [torch.relu(conv(e)).squeeze(3).amax(dim=2) for conv in self.horizontal]
        o_v = self.vertical(e).flatten(1)  # (B, n_v d)
        z = torch.relu(self.fc(self.drop(torch.cat([*o_h, o_v], dim=1))))  # (B, d)
        p_e = self.entity_emb(entity_index(self.config.entity, batch))  # (B, d)
        return torch.cat([z, p_e], dim=1)  # (B, 2d)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        x = self._query(batch).unsqueeze(1)  # (B, 1, 2d)
        # W'_s . [z; P_e] + b'_s, (B, C)
        score = (self.target_emb(songs) * x).sum(-1) + self.target_bias(songs).squeeze(-1)
        return -score

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        x = self._query(batch)  # (B, 2d)
        return -(x @ self.target_emb.weight.t() + self.target_bias.weight.t())  # (B, V)
