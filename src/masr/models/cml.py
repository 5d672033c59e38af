"""Collaborative Metric Learning (Hsieh et al., WWW 2017): the paper's baseline (b).

An entity (user or playlist, ``--entity``) and the songs it holds are pulled together in one
Euclidean space, other songs pushed at least a margin further away:

    distance(e, s) = |x_e - y_s|^2                                   (CML eq. 1, squared)
    loss = [margin + distance(e, s+) - distance(e, s-)]_+             (CML eq. 2, hinge)
    |x_e| <= 1, |y_s| <= 1 after every step                           (CML's unit-ball clip)

The hinge loss comes from the trainer (``loss = "hinge"`` with ``config.margin``); CML's
rank-based weights and covariance regulariser are left out, as in most re-implementations
(the paper describes CML only by its Euclidean distance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index, sq_dist
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class CMLConfig(ModelConfig):
    """CML settings (tune on the validation split)."""

    #: "user": user -> song; "playlist": playlist -> song (``--entity``).
    entity: Entity = "playlist"
    #: Embedding size d (``--dim``).
    dim: int = 64
    #: Hinge margin m between squared distances (1.0 beat 0.5 on validation, embedded data).
    margin: float = 1.0
    #: Radius of the ball every embedding is clipped back into after each step.
    max_norm: float = 1.0


class CML(Recommender):
    """Squared Euclidean distance between entity and song embeddings, hinge-trained."""

    name = "cml"
    config_class = CMLConfig
    uses_members = False
    loss = "hinge"

    def __init__(self, config: CMLConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("cml", config.entity)
        if config.dim < 1:
            raise MasrError(f"cml: --dim must be >= 1, not {config.dim}")
        if not (config.margin > 0 and config.max_norm > 0):
            raise MasrError("cml: margin and max_norm must be > 0")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.entity_emb = nn.Embedding(n_entities, config.dim)  # x_e
        self.song_emb = nn.Embedding(n_songs, config.dim)  # y_s
        # N(0, 1/d): norms start near 1, inside the ball after the first clip (as CML's code).
        for table in (self.entity_emb, self.song_emb):
            nn.init.normal_(table.weight, std=config.dim**-0.5)
        self._clip_rows(self.entity_emb.weight, None)
        self._clip_rows(self.song_emb.weight, None)
        # Rows looked up since the last step: only they can have moved, only they are clipped.
        self._touched: list[tuple[Tensor, Tensor]] = []

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        entities = entity_index(self.config.entity, batch)  # (B,)
        if self.training:
            self._touched.append((entities.detach(), songs.detach()))
        x = self.entity_emb(entities)  # (B, d)
        y = self.song_emb(songs)  # (B, C, d)
        return (x.unsqueeze(1) - y).pow(2).sum(-1)  # (B, C) |x_e - y_s|^2

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """``distance`` to songs (N,) shared by the batch in GEMM form (each song looked up
        once; the rows it touches are clipped after the step, as in ``distance``)."""
        entities = entity_index(self.config.entity, batch)  # (B,)
        if self.training:
            self._touched.append((entities.detach(), songs.detach()))
        return sq_dist(self.entity_emb(entities), self.song_emb(songs))  # (B, N)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        x = self.entity_emb(entity_index(self.config.entity, batch))  # (B, d)
        return sq_dist(x, self.song_emb.weight)  # (B, V)

    @torch.no_grad()
    def _clip_rows(self, weight: Tensor, rows: Tensor | None) -> None:
        """Project ``weight[rows]`` (all rows when None) back into the ball of radius max_norm."""
        picked = weight if rows is None else weight[rows]  # (R, d)
        norms = picked.norm(dim=1, keepdim=True)  # (R, 1)
        scaled = picked * (self.config.max_norm / norms.clamp_min(self.config.max_norm))
        if rows is None:
            weight.copy_(scaled)
        else:
            weight[rows] = scaled

    def after_step(self) -> None:
        if not self._touched:
            return
        entities = torch.unique(torch.cat([e for e, _ in self._touched]))
        songs = torch.unique(torch.cat([s.reshape(-1) for _, s in self._touched]))
        self._touched.clear()
        self._clip_rows(self.entity_emb.weight, entities)
        self._clip_rows(self.song_emb.weight, songs)

    def train(self, mode: bool = True) -> CML:
        self._touched.clear()  # rows looked up for validation are never clipped late
        return super().train(mode)
