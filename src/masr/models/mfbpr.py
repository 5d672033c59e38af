"""MF-BPR (Rendle et al., UAI 2009): matrix factorisation ranked by the dot product, trained
with the BPR loss (the paper's baseline (a)).

    score(e, s) = x_e . y_s (+ b_s when ``song_bias``)       distance = -score

``e`` is a user (user -> song) or a playlist (playlist -> song), ``--entity``; the paper ran both
and reported the better one. Trained by ``masr train`` with eq. 21, as every BPR model here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class MFBPRConfig(ModelConfig):
    """MF-BPR settings (tune on the validation split)."""

    #: "user": user -> song; "playlist": playlist -> song (``--entity``).
    entity: Entity = "playlist"
    #: Embedding size d (``--dim``).
    dim: int = 64
    #: Add a learned per-song bias b_s (Rendle's model has none; it usually helps ranking).
    song_bias: bool = False
    #: Standard deviation of the initial embeddings.
    init_std: float = 0.01


class MFBPR(Recommender):
    """Dot-product matrix factorisation over (entity, song) pairs."""

    name = "mfbpr"
    config_class = MFBPRConfig
    uses_members = False

    def __init__(self, config: MFBPRConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("mfbpr", config.entity)
        if config.dim < 1:
            raise MasrError(f"mfbpr: --dim must be >= 1, not {config.dim}")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.entity_emb = nn.Embedding(n_entities, config.dim)  # x_e
        self.song_emb = nn.Embedding(n_songs, config.dim)  # y_s
        nn.init.normal_(self.entity_emb.weight, std=config.init_std)
        nn.init.normal_(self.song_emb.weight, std=config.init_std)
        self.song_bias = nn.Embedding(n_songs, 1) if config.song_bias else None  # b_s
        if self.song_bias is not None:
            nn.init.zeros_(self.song_bias.weight)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        x = self.entity_emb(entity_index(self.config.entity, batch))  # (B, d)
        y = self.song_emb(songs)  # (B, C, d)
        score = (y * x.unsqueeze(1)).sum(-1)  # (B, C) x_e . y_s
        if self.song_bias is not None:
            score = score + self.song_bias(songs).squeeze(-1)
        return -score

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """``distance`` to songs (N,) shared by the batch, as one GEMM: each song's row is
        looked up once, so its sparse gradient has N rows, not B·N."""
        bias = self.song_bias(songs) if self.song_bias is not None else None
        return self._gemm_distance(batch, self.song_emb(songs), bias)  # (B, N)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        bias = self.song_bias.weight if self.song_bias is not None else None
        return self._gemm_distance(batch, self.song_emb.weight, bias)  # (B, V)

    def _gemm_distance(self, batch: Batch, y: Tensor, bias: Tensor | None) -> Tensor:
        """-(x_e . y_s + b_s) for every row and every song of ``y`` (S, d), ``bias`` (S, 1)."""
        score = self.entity_emb(entity_index(self.config.entity, batch)) @ y.t()  # (B, S)
        if bias is not None:
            score = score + bias.t()  # (1, S) broadcast
        return -score
