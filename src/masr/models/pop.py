"""Popularity: every playlist gets the songs held by the most training playlists.

The simplest anchor of the comparison: any model that does not beat it has learned nothing
personal. Closed form (``trainable = False``); ``fit`` counts training playlists per song.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from masr.models.base import Batch, ModelConfig, Recommender

if TYPE_CHECKING:
    from masr.dataset import PreparedData


@dataclass
class PopularityConfig(ModelConfig):
    """Popularity has no hyper-parameters."""


class Popularity(Recommender):
    """distance(s) = -(number of training playlists holding s)."""

    name = "pop"
    config_class = PopularityConfig
    trainable = False
    uses_members = False

    def __init__(self, config: PopularityConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        self.register_buffer("popularity", torch.zeros(n_songs))  # (V,) playlist counts

    def fit(self, data: PreparedData, device: torch.device) -> None:
        counts = torch.as_tensor(data.song_popularity[: self.n_songs], dtype=torch.float32)
        self.popularity = counts.to(device)  # (V,)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        return -self.popularity[songs]  # (B, C)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        return -self.popularity.expand(batch.users.shape[0], -1)  # (B, V)
