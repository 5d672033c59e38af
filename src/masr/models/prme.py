"""PRME (Feng et al., IJCAI 2015, "Personalized Ranking Metric Embedding"): the paper's baseline
(f), personalised first-order Markov transitions in two Euclidean spaces.

Every song has a point X^P(s) in the preference space, shared with the entities e (users or
playlists, ``--entity``), and a point X^S(s) in the sequential space (PRME eqs. 3-5):

    D^P(e, s)     = |X^P(e) - X^P(s)|^2                         preference
    D^S(s', s)    = |X^S(s') - X^S(s)|^2                        transition from previous song s'
    distance      = alpha D^P(e, s) + (1 - alpha) D^S(s', s)    (eq. 5)
    distance      = D^P(e, s)       for a first song (no s'), as PRME past its time threshold

s' is the song before the row in its playlist's order (``masr.sampling.previous_songs``): for a
training row the training song preceding it, when scoring a playlist its last training song.
Trained with BPR (eq. 21) on -distance, as PRME's own pairwise loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index, sq_dist
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class PRMEConfig(ModelConfig):
    """PRME settings (tune on the validation split)."""

    #: "user" (PRME's personalisation) or "playlist" (``--entity``).
    entity: Entity = "user"
    #: Embedding size d of each space (``--dim``).
    dim: int = 64
    #: Weight of the preference distance against the transition distance (PRME used 0.2).
    alpha: float = 0.2
    #: Standard deviation of the initial embeddings.
    init_std: float = 0.1


class PRME(Recommender):
    """Preference distance to the entity plus transition distance from the previous song."""

    name = "prme"
    config_class = PRMEConfig
    uses_members = False

    def __init__(self, config: PRMEConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("prme", config.entity)
        if config.dim < 1:
            raise MasrError(f"prme: --dim must be >= 1, not {config.dim}")
        if not 0.0 <= config.alpha <= 1.0:
            raise MasrError(f"prme: alpha must lie in [0, 1], not {config.alpha}")
        n_entities = entity_count(config.entity, n_users, n_playlists)
        self.entity_pref = nn.Embedding(n_entities, config.dim)  # X^P(e)
        self.song_pref = nn.Embedding(n_songs, config.dim)  # X^P(s)
        self.song_seq = nn.Embedding(n_songs, config.dim)  # X^S(s)
        for table in (self.entity_pref, self.song_pref, self.song_seq):
            nn.init.normal_(table.weight, std=config.init_std)

    def _context(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """X^P(e) (B, d), X^S(s') (B, d) and whether s' exists (B,)."""
        from masr.sampling import previous_songs

        prev, has_prev = previous_songs(batch, 1)  # (B, 1), (B, 1)
        x_e = self.entity_pref(entity_index(self.config.entity, batch))  # (B, d)
        return x_e, self.song_seq(prev[:, 0]), has_prev[:, 0]

    def _mix(self, d_pref: Tensor, d_seq: Tensor, has_prev: Tensor) -> Tensor:
        # alpha D^P + (1 - alpha) D^S, or D^P alone without a previous song
        a = self.config.alpha
        return torch.where(has_prev.unsqueeze(1), a * d_pref + (1 - a) * d_seq, d_pref)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        x_e, x_prev, has_prev = self._context(batch)
        d_pref = (x_e.unsqueeze(1) - self.song_pref(songs)).pow(2).sum(-1)  # (B, C) D^P
        d_seq = (x_prev.unsqueeze(1) - self.song_seq(songs)).pow(2).sum(-1)  # (B, C) D^S
        return self._mix(d_pref, d_seq, has_prev)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        x_e, x_prev, has_prev = self._context(batch)
        return self._mix(
            sq_dist(x_e, self.song_pref.weight), sq_dist(x_prev, self.song_seq.weight), has_prev
        )
