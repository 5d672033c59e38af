"""TransRec (He, Kang & McAuley, RecSys 2017, "Translation-based Recommendation"): the paper's
baseline (g). Songs are points in one space; an entity e (user or playlist, ``--entity``) is a
translation vector that carries the previous song s' to the next one (TransRec eq. 2):

    T_e        = t + t_e                                global plus personal translation
    distance   = |gamma_s' + T_e - gamma_s|^2 - beta_s      (score = beta_s - d(...))

s' is the song before the row in its playlist's order (``masr.sampling.previous_songs``); a
playlist's first song starts from a learned start point gamma_0. Song points are kept in the
unit ball (TransRec's Psi) by clipping the rows a step touched; t_e starts at zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index, sq_dist
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class TransRecConfig(ModelConfig):
    """TransRec settings (tune on the validation split)."""

    #: "user" (TransRec's personal translation) or "playlist" (``--entity``).
    entity: Entity = "user"
    #: Embedding size d (``--dim``).
    dim: int = 64
    #: Radius of the ball song points are clipped back into after each step (0: no clipping).
    max_norm: float = 1.0
    #: Standard deviation of the initial song points.
    init_std: float = 0.1


class TransRec(Recommender):
    """Previous song + (global + personal) translation, squared distance to the candidate."""

    name = "transrec"
    config_class = TransRecConfig
    uses_members = False

    def __init__(self, config: TransRecConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("transrec", config.entity)
        if config.dim < 1 or config.max_norm < 0:
            raise MasrError("transrec: --dim must be >= 1 and max_norm >= 0")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.song_emb = nn.Embedding(n_songs + 1, config.dim)  # gamma_s; row V: start gamma_0
        self.translation = nn.Embedding(n_entities, config.dim)  # t_e
        self.global_translation = nn.Parameter(torch.zeros(config.dim))  # t
        self.song_bias = nn.Embedding(n_songs, 1)  # beta_s
        nn.init.normal_(self.song_emb.weight, std=config.init_std)
        nn.init.zeros_(self.translation.weight)
        nn.init.zeros_(self.song_bias.weight)
        self._touched: list[Tensor] = []  # song rows looked up since the last step

    def _query(self, batch: Batch) -> Tensor:
        """(B, d) gamma_s' + t + t_e, with gamma_0 when a row has no previous song."""
        from masr.sampling import previous_songs

        prev, has_prev = previous_songs(batch, 1)  # (B, 1)
        prev = torch.where(has_prev[:, 0], prev[:, 0], self.n_songs)  # (B,) V = start
        if self.training:
            self._touched.append(prev.detach())
        t_e = self.translation(entity_index(self.config.entity, batch))  # (B, d)
        return self.song_emb(prev) + self.global_translation + t_e

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        if self.training:
            self._touched.append(songs.detach().reshape(-1))
        x = self._query(batch).unsqueeze(1)  # (B, 1, d)
        # |gamma_s' + T_e - gamma_s|^2 - beta_s, (B, C)
        return (x - self.song_emb(songs)).pow(2).sum(-1) - self.song_bias(songs).squeeze(-1)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        x = self._query(batch)  # (B, d)
        y = self.song_emb.weight[: self.n_songs]  # (V, d)
        return sq_dist(x, y) - self.song_bias.weight.t()  # (B, V)

    @torch.no_grad()
    def after_step(self) -> None:
        if not self._touched or self.config.max_norm <= 0:
            self._touched.clear()
            return
        rows = torch.unique(torch.cat(self._touched))
        self._touched.clear()
        w = self.song_emb.weight
        norms = w[rows].norm(dim=1, keepdim=True)  # (R, 1)
        w[rows] = w[rows] * (self.config.max_norm / norms.clamp_min(self.config.max_norm))

    def train(self, mode: bool = True) -> TransRec:
        self._touched.clear()
        return super().train(mode)
