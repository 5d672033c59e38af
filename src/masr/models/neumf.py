"""NeuMF (He et al., WWW 2017, "Neural Collaborative Filtering"): the paper's baseline (c),
NeuMF++ when trained on (entity, song) pairs with BPR as here.

Two branches over separate embeddings of the entity e (user or playlist, ``--entity``) and the
song s, fused by one output vector h (NCF eqs. 9-12):

    phi_GMF = p_e^G (.) q_s^G                                  element-wise product, d
    phi_MLP = a_L(W_L^T ( ... a_1(W_1^T [p_e^M; q_s^M] + b_1) ... ) + b_L)      ReLU tower
    score   = h^T [phi_GMF; phi_MLP]                 distance = -score (the logit; BPR, eq. 21)

The tower starts at 2d and halves at each of its ``layers`` (1-3) layers. Pre-training (NCF
section 3.4.1): train ``branch="gmf"`` and ``branch="mlp"`` models, then
``NeuMF.from_branches(gmf, mlp, alpha)`` builds the fused model with h = [alpha h^GMF;
(1 - alpha) h^MLP] (NCF eq. 13) to fine-tune. ``masr train --model neumf`` does all three:
runs ``neumf_gmf`` and ``neumf_mlp`` (one branch each, same options), then ``neumf`` from their
best checkpoints with alpha = 0.5 (``masr.runs``' "pretrained" procedure). NCF fine-tunes with
plain SGD; masr keeps its Adam (fresh moments), like every other run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Literal

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index
from masr.models.base import Batch, ModelConfig, Recommender

Branch = Literal["fused", "gmf", "mlp"]


@dataclass
class NeuMFConfig(ModelConfig):
    """NeuMF settings (tune on the validation split)."""

    #: "user": user -> song; "playlist": playlist -> song (``--entity``).
    entity: Entity = "playlist"
    #: Embedding size d of each branch (``--dim``); the GMF branch has d predictive factors.
    dim: int = 64
    #: MLP layers (1-3): 2d -> d -> d/2 -> d/4, one halving per layer.
    layers: int = 2
    #: "fused" (NeuMF), or one branch alone ("gmf", "mlp") to pre-train it.
    branch: Branch = "fused"
    #: Standard deviation of the initial embeddings.
    init_std: float = 0.01


class NeuMF(Recommender):
    """GMF and MLP branches over (entity, song) pairs, fused by a linear output layer."""

    name = "neumf"
    config_class = NeuMFConfig
    uses_members = False

    def __init__(self, config: NeuMFConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("neumf", config.entity)
        if config.dim < 1:
            raise MasrError(f"neumf: --dim must be >= 1, not {config.dim}")
        if not 1 <= config.layers <= 3:
            raise MasrError(f"neumf: layers must be 1, 2 or 3, not {config.layers}")
        if config.branch not in ("fused", "gmf", "mlp"):
            raise MasrError(f"neumf: branch must be fused, gmf or mlp, not {config.branch!r}")
        d, n_entities = config.dim, entity_count(config.entity, n_users, n_playlists)
        self.use_gmf = config.branch in ("fused", "gmf")
        self.use_mlp = config.branch in ("fused", "mlp")
        features = 0
        if self.use_gmf:
            self.gmf_entity = nn.Embedding(n_entities, d)  # p_e^G
            self.gmf_song = nn.Embedding(n_songs, d)  # q_s^G
            features += d
        if self.use_mlp:
            self.mlp_entity = nn.Embedding(n_entities, d)  # p_e^M
            self.mlp_song = nn.Embedding(n_songs, d)  # q_s^M
            widths = [max(1, 2 * d >> k) for k in range(config.layers + 1)]  # 2d, d, d/2, d/4
            self.tower = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
            features += widths[-1]
        self.h = nn.Linear(features, 1, bias=False)  # h
        for mod in self.modules():
            if isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, std=config.init_std)
            elif isinstance(mod, nn.Linear):
                nn.init.xavier_uniform_(mod.weight)  # NCF's Glorot init for the layers
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)

    def _score(self, entities: Tensor, songs: Tensor) -> Tensor:
        """(B, C) h^T [phi_GMF; phi_MLP] for entities (B,) and songs (B, C) or (1, C)."""
        parts = []
        if self.use_gmf:
            # phi_GMF = p_e^G (.) q_s^G, (B, C, d)
            p = self.gmf_entity(entities).unsqueeze(1)  # (B, 1, d)
            parts.append(p * self.gmf_song(songs))
        if self.use_mlp:
            # W_1^T [p; q] = W_p p + W_q q: the entity and song halves of layer 1 apart
            first = self.tower[0]
            d = self.config.dim
            z_e = self.mlp_entity(entities) @ first.weight[:, :d].t() + first.bias  # (B, h1)
            z_s = self.mlp_song(songs) @ first.weight[:, d:].t()  # (B or 1, C, h1)
            z = torch.relu(z_e.unsqueeze(1) + z_s)  # (B, C, h1) a_1(W_1^T [p; q] + b_1)
            for layer in self.tower[1:]:
                z = torch.relu(layer(z))  # a_l(W_l^T z + b_l)
            parts.append(z.expand(entities.shape[0], -1, -1))
        phi = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]  # (B, C, F)
        return self.h(phi).squeeze(-1)  # (B, C) h^T phi

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        return -self._score(entity_index(self.config.entity, batch), songs)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        entities = entity_index(self.config.entity, batch)  # (B,)
        # every (row, song) pair goes through the tower: bound the (B, C, 2d) activations
        step = max(1, min(chunk, (1 << 22) // max(1, entities.shape[0] * 2 * self.config.dim)))
        out = []
        for start in range(0, self.n_songs, step):
            songs = torch.arange(start, min(start + step, self.n_songs), device=entities.device)
            out.append(-self._score(entities, songs.unsqueeze(0)))  # (B, c)
        return torch.cat(out, dim=1)

    @classmethod
    def from_branches(cls, gmf: NeuMF, mlp: NeuMF, alpha: float = 0.5) -> NeuMF:
        """The fused model initialised from a pre-trained GMF and MLP branch (NCF eq. 13):
        their embeddings and tower as they are, h = [alpha h^GMF; (1 - alpha) h^MLP]."""
        if gmf.config.branch != "gmf" or mlp.config.branch != "mlp":
            raise MasrError("neumf: from_branches needs a branch=gmf and a branch=mlp model")
        if (gmf.config.entity, gmf.config.dim, gmf.sizes()) != (
            mlp.config.entity,
            mlp.config.dim,
            mlp.sizes(),
        ):
            raise MasrError("neumf: the two branches differ in entity, dim or data sizes")
        if not 0.0 <= alpha <= 1.0:
            raise MasrError(f"neumf: alpha must lie in [0, 1], not {alpha}")
        config = replace(mlp.config, branch="fused")
        fused = cls(config, **mlp.sizes())
        state = {k: v for k, v in gmf.state_dict().items() if k.startswith("gmf_")}
        state |= {k: v for k, v in mlp.state_dict().items() if k.startswith(("mlp_", "tower"))}
        # h = [alpha h^GMF; (1 - alpha) h^MLP]
        state["h.weight"] = torch.cat(
            [alpha * gmf.state_dict()["h.weight"], (1 - alpha) * mlp.state_dict()["h.weight"]], 1
        )
        fused.load_state_dict(state)
        return fused
