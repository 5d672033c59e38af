"""CMN (Ebesu, Shen & Fang, SIGIR 2018, "Collaborative Memory Network"): the paper's baseline
(e), CMN++ with the entity e a user or a playlist (``--entity``).

A candidate song s is scored from e's own memory and from the memories of the *neighbourhood*
N(s), the other entities that hold s in training (CMN eqs. 1-7):

    z^0      = m_e + e_s                                        query, d
    q^h_v    = z^(h-1) . m_v              for v in N(s)         attention logits (eq. 1, 6)
    p^h      = softmax_v(q^h)                                   (eq. 2)
    o^h      = sum_v p^h_v c_v                                  neighbourhood output (eq. 3)
    z^h      = relu(W^h z^(h-1) + o^h)                          next hop's query (eq. 6)
    score    = v^T relu(U (m_e (.) e_s) + W o^H + b)            (eq. 4, 7)   distance = -score

M (m) is the memory of the entities, E (e) the song memory, C (c) the external memory. ``hops``
is H (1-4). N(s) holds at most ``neighbours`` entities (a fixed seeded sample for songs held by
more) and never the row's own entity, so a training positive does not find e in its own
neighbourhood, which a held-out song never does. The neighbourhoods come from the training
interactions the batch was built from (``Batch.source``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models._baseline import Entity, check_entity, entity_count, entity_index
from masr.models.base import Batch, ModelConfig, Recommender

#: elements of the largest (rows, songs, neighbours, d) gather one step materialises
_CELLS = 1 << 22


@dataclass
class CMNConfig(ModelConfig):
    """CMN settings (tune on the validation split)."""

    #: "user": user neighbourhoods; "playlist": playlist neighbourhoods (``--entity``).
    entity: Entity = "playlist"
    #: Memory size d (``--dim``).
    dim: int = 64
    #: Memory hops H (1-4). 1: the best on validation of the embedded data (1 / 2 / 4 hops:
    #: 0.8825 / 0.8772 / 0.8640 sampled hit@10) and of AOTM-2011, user-based (0.521 / 0.401;
    #: docs/reproduction.md)
    hops: int = 1
    #: At most this many neighbours per song (a fixed seeded sample of its holders).
    neighbours: int = 32
    #: Standard deviation of the initial memories.
    init_std: float = 0.01


class CMN(Recommender):
    """Entity memory plus attention over the song's neighbourhood of entities, over H hops."""

    name = "cmn"
    config_class = CMNConfig
    uses_members = False

    def __init__(self, config: CMNConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        check_entity("cmn", config.entity)
        if config.dim < 1 or config.neighbours < 1:
            raise MasrError("cmn: --dim and neighbours must be >= 1")
        if not 1 <= config.hops <= 4:
            raise MasrError(f"cmn: hops must be 1 to 4, not {config.hops}")
        d, n_entities = config.dim, entity_count(config.entity, n_users, n_playlists)
        self.entity_mem = nn.Embedding(n_entities, d)  # M: m_e, m_v
        self.song_mem = nn.Embedding(n_songs, d)  # E: e_s
        self.external_mem = nn.Embedding(n_entities, d)  # C: c_v
        self.hop = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(config.hops - 1))
        self.u = nn.Linear(d, d, bias=True)  # U (with b)
        self.w = nn.Linear(d, d, bias=False)  # W
        self.v = nn.Linear(d, 1, bias=False)  # v
        for table in (self.entity_mem, self.song_mem, self.external_mem):
            nn.init.normal_(table.weight, std=config.init_std)
        for layer in (*self.hop, self.u, self.w, self.v):
            nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(self.u.bias)

    def neighbourhoods(self, batch: Batch) -> Tensor:
        """(V, K) entities holding each song (-1 = none), a fixed seeded sample of at most K,
        built from ``batch.source`` once per index."""
        from masr.sampling import song_holders

        index = batch.source
        if index is None:
            raise MasrError("cmn reads neighbourhoods: build its batches with masr.sampling")
        key = ("cmn", self.config.entity, self.config.neighbours)
        if key not in index.cache:
            indptr, holders = song_holders(index, self.config.entity)  # (V+1,), (H,)
            counts = indptr[1:] - indptr[:-1]  # (V,)
            song = torch.repeat_interleave(torch.arange(self.n_songs, device=indptr.device), counts)
            gen = torch.Generator(device=indptr.device).manual_seed(0)
            noise = torch.rand(holders.shape[0], generator=gen, device=indptr.device)  # (H,)
            order = torch.argsort(song.double() + noise.double())  # by song, then at random
            rank = torch.arange(holders.shape[0], device=indptr.device) - indptr[song]  # (H,)
            keep = rank < self.config.neighbours
            table = torch.full(
                (self.n_songs, self.config.neighbours), -1, dtype=torch.long, device=indptr.device
            )
            table[song[keep], rank[keep]] = holders[order][keep]
            index.cache[key] = table
        return index.cache[key]

    def _score(self, entities: Tensor, songs: Tensor, table: Tensor) -> Tensor:
        """(B, C) scores for entities (B,) and songs (S, C), S = B or 1 (shared candidates)."""
        shared = songs.shape[0] == 1 and entities.shape[0] != 1
        nb = table[songs]  # (S, C, K)
        nb_mask = (nb >= 0) & (nb != entities.view(-1, 1, 1))  # (B, C, K): not e itself
        # a song with no neighbour attends to slot 0 and then drops it: o = 0, no NaN
        empty = ~nb_mask.any(-1, keepdim=True)  # (B, C, 1)
        first = torch.arange(nb.shape[-1], device=nb.device) == 0  # (K,)
        attend = nb_mask | (empty & first)  # (B, C, K)
        m_v = self.entity_mem(nb.clamp_min(0))  # (S, C, K, d)
        c_v = self.external_mem(nb.clamp_min(0))  # (S, C, K, d)
        m_e = self.entity_mem(entities)  # (B, d)
        e_s = self.song_mem(songs)  # (S, C, d)
        if shared:
            m_v, c_v, e_s = m_v[0], c_v[0], e_s[0]  # (C, K, d), (C, K, d), (C, d)
        z = m_e.unsqueeze(1) + e_s  # (B, C, d) z^0 = m_e + e_s
        o = z
        for h in range(self.config.hops):
            if h > 0:
                z = torch.relu(self.hop[h - 1](z) + o)  # z^h = relu(W^h z^(h-1) + o^h)
            # q^h_v = z^(h-1) . m_v, (B, C, K)
            if shared:
                q = torch.einsum("bcd,ckd->bck", z, m_v)
            else:
                q = torch.einsum("bcd,bckd->bck", z, m_v)
            # p^h = softmax over the neighbourhood, padding and e itself masked out
            p = torch.softmax(q.masked_fill(~attend, float("-inf")), dim=-1) * nb_mask
            # o^h = sum_v p^h_v c_v, (B, C, d)
            if shared:
                o = torch.einsum("bck,ckd->bcd", p, c_v)
            else:
                o = torch.einsum("bck,bckd->bcd", p, c_v)
        # score = v^T relu(U (m_e (.) e_s) + W o^H + b), (B, C)
        return self.v(torch.relu(self.u(m_e.unsqueeze(1) * e_s) + self.w(o))).squeeze(-1)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        table = self.neighbourhoods(batch)
        entities = entity_index(self.config.entity, batch)  # (B,)
        c, k, d = songs.shape[1], self.config.neighbours, self.config.dim
        step = max(1, _CELLS // max(1, c * k * d))  # rows per (rows, C, K, d) gather
        return torch.cat(
            [
                -self._score(entities[i : i + step], songs[i : i + step], table)
                for i in range(0, entities.shape[0], step)
            ],
            dim=0,
        )

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        table = self.neighbourhoods(batch)
        entities = entity_index(self.config.entity, batch)  # (B,)
        k, d = self.config.neighbours, self.config.dim
        # shared candidates: (c, K, d) gathers and (B, c, K) logits
        step = max(1, min(chunk, _CELLS // max(1, k * max(d, entities.shape[0]))))
        out = []
        for start in range(0, self.n_songs, step):
            songs = torch.arange(start, min(start + step, self.n_songs), device=entities.device)
            out.append(-self._score(entities, songs.unsqueeze(0), table))  # (B, c)
        return torch.cat(out, dim=1)
