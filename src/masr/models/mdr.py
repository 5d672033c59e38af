"""MDR: Mahalanobis Distance based Recommender (paper section 4.1, eqs. 10-11).

    o_MDR(u, p, s) = |B1 ⊙ (u - s)|² + |B2 ⊙ (p - s)|² + θ_s          (eq. 11; lower = better)

Table 3's ablations keep one of the two terms (``MDRConfig.terms``; section 5.3):

    "ups" (MDR_ups, the paper's MDR):  eq. 11 as above
    "us"  (MDR_us):  o = |B1 ⊙ (u - s)|² + θ_s        (no playlist embedding, no B2)
    "ps"  (MDR_ps):  o = |B2 ⊙ (p - s)|² + θ_s        (no user embedding, no B1)

Public API:
    MDRConfig(dim=64, dropout=0.2, init_std=None, terms="ups", dropout_mode="element")
    MDR(config, n_users, n_playlists, n_songs)
    MDR.distance(batch, songs (B, C)) -> (B, C)                 training / sampled evaluation
    MDR.full_distance(batch, chunk=8192) -> (B, V)              full ranking (GEMM form)
    MDR.full_distance_from_vectors(u (B, d), p (B, d)) -> (B, V)
        eq. 11 from embedding *vectors* rather than indices, so a caller can fold unknown
        users / playlists in (e.g. the mean of the member songs' vectors). ``full_distance``
        runs on it; the tests use it as the PyTorch reference of the exported graph's fold-in,
        and tests/test_models_onnx.py traces it to ONNX. No Python control flow depends on
        tensor values; B is dynamic.
    MDR.export_weights() -> dict[str, Tensor]
        the named tensors of eq. 11; ``masr.export`` builds its ONNX graph from these alone
        (the default terms "ups" only: the ablations refuse with a MasrError).
    mahalanobis_sq(diff (..., d), metric (d,), dropout) -> (...)   shared with MASS

Initialisation (documented choice): embeddings N(0, σ²) with σ = init_std or 1/dim (the authors'
code scales by the inverse of the dimension; masr's default ``fullrank`` recipe sets init_std =
0.002 for MDR, docs/training.md "The embedding initialisation scale"); metric vectors
B1 = B2 = 1, i.e. training starts from the Euclidean distance the paper names as the special
case of eq. 3 (the reference code draws B2 from uniform[0, 1), which halves the playlist term on
average for no stated reason); song bias θ = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models.base import Batch, ModelConfig, Recommender

#: which terms of eq. 11 MDR keeps: both (the paper's MDR_ups), user-song or playlist-song only
MDR_TERMS = ("ups", "us", "ps")
#: where the training dropout's masks vary: "element" = every element of every B ⊙ (x - s)
#: (the authors' code; with shared negatives a (B, N, d) tensor), "row" = one mask per (row,
#: dimension) and term, shared by the row's candidates (the GEMM form of eq. 11 is kept)
MDR_DROPOUT_MODES = ("element", "row")


@dataclass
class MDRConfig(ModelConfig):
    """MDR hyper-parameters."""

    dim: int = 64  # embedding size d
    dropout: float = 0.2  # on the scaled difference B ⊙ (x - y) before squaring, train mode only
    init_std: float | None = None  # std of the embedding init; None = 1 / dim
    terms: str = "ups"  # eq. 11's terms: "ups" both, "us" user-song only, "ps" playlist-song only
    dropout_mode: str = "element"  # MDR_DROPOUT_MODES: the paper's per element, or per row

    def __post_init__(self) -> None:
        super().__post_init__()
        check_common("mdr", self.dim, self.dropout, self.init_std)
        if self.terms not in MDR_TERMS:
            raise MasrError(f"mdr terms: {self.terms!r} is not one of {', '.join(MDR_TERMS)}")
        if self.dropout_mode not in MDR_DROPOUT_MODES:
            raise MasrError(
                f"mdr dropout_mode: {self.dropout_mode!r} is not one of "
                f"{', '.join(MDR_DROPOUT_MODES)}"
            )


def check_common(model: str, dim: int, dropout: float, init_std: float | None) -> None:
    """One-line MasrErrors for the settings MDR and MASS share (--dim, --dropout, init_std)."""
    if int(dim) < 1:
        raise MasrError(f"{model} --dim: must be >= 1, not {dim}")
    if not 0.0 <= float(dropout) < 1.0:
        raise MasrError(f"{model} --dropout: must be in [0, 1), not {dropout}")
    if init_std is not None and not float(init_std) > 0:
        raise MasrError(f"{model} init_std: must be > 0 (or None for 1/dim), not {init_std}")


def mahalanobis_sq(
    diff: Tensor, metric: Tensor, dropout: float = 0.0, training: bool = False
) -> Tensor:
    """Squared diagonal Mahalanobis distance |B ⊙ (x - y)|² (eq. 3, squared) over the last axis.

    ``diff`` (..., d) is x - y, ``metric`` (d,) is B. As in the authors' code, dropout acts on the
    scaled difference before squaring (train mode only): (m ⊙ z)² = m² ⊙ z² with m = 0 or
    1/(1-p), so the squares are masked and rescaled instead."""
    scaled = diff * metric  # (..., d)
    if training and dropout > 0:
        return dropped_square_sum(scaled, dropout)
    return scaled.square().sum(-1)  # (...)


def dropped_square_sum(scaled: Tensor, p: float) -> Tensor:
    """Σ over the last axis of (m ⊙ z)², m = inverted dropout with rate ``p`` (0 or 1/(1-p) per
    element): the squares are masked and rescaled by 1/(1-p)² instead. The plain autograd
    reference of ``dropped_pairwise_sq`` (the tests compare the two)."""
    keep, p_eff = dropout_keep(scaled.shape, p, scaled.device, scaled.dtype)
    return (scaled.square() * keep).sum(-1) * (1.0 / (1.0 - p_eff) ** 2)


class _DroppedPairwiseSq(torch.autograd.Function):
    """Σ_j (m_j (x_j - y_j))² for broadcastable x, y, with a hand-written backward.

    The difference z = x - y is the only large tensor ((B, C, L, d) in MASS): it is formed
    once, masked in place and kept for the backward, which scales it in place by the incoming
    gradient and sums it back to the shapes of x and y. Plain autograd makes about three times
    as many passes over that tensor (the mask as floats, the square, the product, and each of
    their gradients); the values and the mask law are the same (``dropout_keep``, drawn once
    for z's shape)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, p: float) -> Tensor:  # noqa: D102
        z = x - y  # (..., d)
        # the mask in z's dtype: multiplying by a bool tensor is several times slower on CPU
        keep, p_eff = dropout_keep(z.shape, p, z.device, z.dtype)
        z.mul_(keep)  # (m z)² = m z² for m in {0, 1}
        scale = 1.0 / (1.0 - p_eff) ** 2
        ctx.save_for_backward(z)
        ctx.scale = scale
        ctx.shapes = (x.shape, y.shape)
        # Σ_j z_j² as the squared 2-norm: on CPU about 3x faster than vecdot(z, z) or (z*z).sum
        return torch.linalg.vector_norm(z, dim=-1).square_().mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # noqa: D102
        (z,) = ctx.saved_tensors
        x_shape, y_shape = ctx.shapes
        # d/dz Σ_j s (m_j z_j)² = 2 s m z (z is already masked); z is not needed afterwards
        gz = z.mul_(grad.unsqueeze(-1) * (2.0 * ctx.scale))
        gx = gz.sum_to_size(x_shape) if ctx.needs_input_grad[0] else None
        gy = gz.sum_to_size(y_shape).neg() if ctx.needs_input_grad[1] else None
        return gx, gy, None


def dropped_pairwise_sq(x: Tensor, y: Tensor, p: float) -> Tensor:
    """Σ over the last axis of (m ⊙ (x - y))² / (1-p)², x and y broadcast against each other
    (e.g. (B, C, 1, d) queries and (B, 1, L, d) members), m an inverted-dropout mask of the
    broadcast shape drawn by ``dropout_keep``: ``dropped_square_sum(x - y, p)`` with the same
    mask and values, in fewer passes over the broadcast tensor (``_DroppedPairwiseSq``)."""
    if x.dtype != y.dtype:
        raise TypeError(f"dropped_pairwise_sq: {x.dtype} and {y.dtype}")
    return _DroppedPairwiseSq.apply(x, y, p)


def dropout_keep(
    shape: torch.Size | tuple[int, ...], p: float, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, float]:
    """A dropout mask of ``shape`` (1 = kept, with probability 1 - p; else 0) and the drop rate
    it really has. On CPU the mask is cut from 16-bit pieces of 64-bit draws of torch's global
    generator, four per draw, so p is rounded to a multiple of 1/65536: about 3x cheaper than
    F.dropout's one draw per element, and dropout's masks are most of a training step's forward
    pass there (docs/training.md). Other devices draw one uniform per element (exact p)."""
    if torch.device(device).type != "cpu":
        return (torch.rand(shape, device=device, dtype=dtype) >= p).to(dtype), p
    n = math.prod(shape)
    level = round(p * 65536)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    bits = words.view(torch.int16)[:n].view(shape)  # uniform over -32768 .. 32767
    # compared straight into the wanted dtype: a bool result converted to float afterwards
    # costs several times the comparison on CPU
    keep = torch.empty(shape, dtype=dtype, device=device)
    torch.ge(bits, level - 32768, out=keep)
    return keep, level / 65536


def row_dropout_weights(metric: Tensor, n_rows: int, p: float) -> Tensor:
    """(n_rows, d) metric weights of ``dropout_mode="row"``: m ⊙ B² / (1-p)², m a 0/1 mask per
    (row, dimension) from ``dropout_keep``, so that (m_j B_j (x_j - y_j))² / (1-p)² =
    w_j (x_j - y_j)² for m_j in {0, 1} (MDR's and MASS's row dropout)."""
    keep, p_eff = dropout_keep((n_rows, metric.shape[0]), p, metric.device, metric.dtype)
    return keep.mul_(metric.square() * (1.0 / (1.0 - p_eff) ** 2))


def weighted_sum(x: Tensor, w: Tensor) -> Tensor:
    """Σ_j w_j x_j over the last axis: a matrix-vector product for one weight vector ``w``
    (d,), else an element-wise product with broadcast per-row weights (row dropout's)."""
    return x @ w if w.dim() == 1 else (x * w).sum(-1)


def init_embedding(emb: nn.Embedding, dim: int, init_std: float | None) -> None:
    """N(0, σ²) with σ = init_std or 1/dim."""
    nn.init.normal_(emb.weight, 0.0, init_std if init_std is not None else 1.0 / dim)


class MDR(Recommender):
    """User, playlist and song embeddings compared under two learned diagonal metrics (eq. 11)."""

    name = "mdr"
    config_class = MDRConfig
    uses_members = False

    def __init__(self, config: MDRConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        d = config.dim
        # the user term exists unless terms == "ps", the playlist term unless terms == "us"
        has_u, has_p = "u" in config.terms, "p" in config.terms
        self.user_emb = nn.Embedding(n_users, d) if has_u else None  # u_i
        self.playlist_emb = nn.Embedding(n_playlists, d) if has_p else None  # p_j
        self.song_emb = nn.Embedding(n_songs, d)  # s_k
        self.song_bias = nn.Embedding(n_songs, 1)  # θ_s (an embedding: APR perturbs it per row)
        self.metric_user = nn.Parameter(torch.ones(d)) if has_u else None  # B1
        self.metric_playlist = nn.Parameter(torch.ones(d)) if has_p else None  # B2
        for emb in (self.user_emb, self.playlist_emb, self.song_emb):
            if emb is not None:
                init_embedding(emb, d, config.init_std)
        nn.init.zeros_(self.song_bias.weight)

    def _sides(self, users: Tensor, playlists: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(row vectors (B, d), metric (d,)) of each kept term of eq. 11: (u, B1), (p, B2)."""
        sides = []
        if self.user_emb is not None and self.metric_user is not None:
            sides.append((self.user_emb(users), self.metric_user))
        if self.playlist_emb is not None and self.metric_playlist is not None:
            sides.append((self.playlist_emb(playlists), self.metric_playlist))
        return sides

    def _element_dropout(self) -> bool:
        """True when training with the per-element dropout (the (B, C, d) path)."""
        return self.training and self.config.dropout > 0 and self.config.dropout_mode == "element"

    def _weighted_sides(self, batch: Batch) -> list[tuple[Tensor, Tensor]]:
        """(row vectors x (B, d), weights w) of each kept term, Σ_j w_j (x_j - s_j)² being the
        term: w = B_x² (d,), or in training with ``dropout_mode="row"`` m ⊙ B_x² / (1-p)²
        (B, d), m a 0/1 mask per (row, dimension) shared by all the row's candidates:
        (m_j B_j (x_j - s_j))² / (1-p)² = m_j B_j² (x_j - s_j)² / (1-p)² for m_j in {0, 1}."""
        sides = self._sides(batch.users, batch.playlists)
        p_drop = self.config.dropout
        if not (self.training and p_drop > 0 and self.config.dropout_mode == "row"):
            return [(x, metric.square()) for x, metric in sides]
        return [(x, row_dropout_weights(metric, x.shape[0], p_drop)) for x, metric in sides]

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, C) MDR distances, eq. 11, of each row's (user, playlist) to its candidate songs."""
        p_drop = self.config.dropout
        s = self.song_emb(songs)  # (B, C, d)
        # eq. 11: o = |B1 ⊙ (u - s)|² + |B2 ⊙ (p - s)|² + θ_s  (the kept terms of MDR_us/_ps)
        if self._element_dropout():
            # dropout on B ⊙ (x - s), formed as B⊙x - B⊙s (one fused pass, dropped_pairwise_sq)
            terms = [
                dropped_pairwise_sq((x * metric).unsqueeze(1), s * metric, p_drop)  # (B, C)
                for x, metric in self._sides(batch.users, batch.playlists)
            ]
        elif self.training and p_drop > 0:  # "row": Σ_j w_bj (x_bj - s_bcj)², w per row
            terms = [
                ((x.unsqueeze(1) - s).square() * w.unsqueeze(1)).sum(-1)  # (B, C)
                for x, w in self._weighted_sides(batch)
            ]
        else:
            # GEMM form, as full_distance: Σ_x w_x·x² - 2 (Σ_x w_x⊙x)·s + (Σ_x w_x)·s² + θ_s,
            # so the (B, C, d) song rows are read by one batched product instead of four
            # element-wise passes over their differences (the sampled protocol's 101 per case)
            weighted = [(x, m.square()) for x, m in self._sides(batch.users, batch.playlists)]
            w_sum, row_term, lhs = self._row_parts(weighted)
            cross = torch.matmul(s, lhs.unsqueeze(-1)).squeeze(-1)  # (B, C)
            return row_term.unsqueeze(1) - 2.0 * cross + self._song_terms(songs, s, w_sum)
        return sum(terms[1:], terms[0]) + self.song_bias(songs).squeeze(-1)

    def _song_terms(self, songs: Tensor, s: Tensor, w_sum: Tensor) -> Tensor:
        """(Σ_x w_x)·s² + θ_s for candidate songs ``songs`` (B, C) with rows ``s`` (B, C, d):
        without gradients and with at least a catalog's worth of candidates, computed once per
        catalog song and gathered (evaluation), else from the gathered rows."""
        if not torch.is_grad_enabled() and songs.numel() >= self.song_emb.num_embeddings:
            table = self.song_emb.weight.square() @ w_sum + self.song_bias.weight.squeeze(-1)
            return table[songs]  # (B, C)
        return s.square() @ w_sum + self.song_bias(songs).squeeze(-1)

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, N) eq. 11 to songs shared by every row (sampled softmax): the GEMM form of
        ``full_distance_from_vectors`` on N songs; with per-element dropout in training, the
        (B, N, d) differences it acts on are formed as in ``distance``."""
        if self._element_dropout():
            return self.distance(batch, songs.unsqueeze(0))  # (1, N) broadcast against (B, 1)
        s = self.song_emb(songs)  # (N, d)
        return self._gemm(self._weighted_sides(batch), s, self.song_bias(songs))

    def distance_own_shared(self, batch: Batch, own: Tensor, shared: Tensor) -> Tensor:
        """(B, 1 + N) eq. 11 to each row's own song and to N shared songs, from one gather of
        the B + N song rows and one set of row terms (``_gemm``'s expansion; the own song's
        cross term is a row-wise dot product). With per-element dropout in training: the
        default."""
        if self._element_dropout():
            return super().distance_own_shared(batch, own, shared)
        n_rows = own.shape[0]
        songs = torch.cat([own, shared])  # (B + N,)
        s = self.song_emb(songs)  # (B + N, d)
        bias = self.song_bias(songs).squeeze(-1)  # (B + N,)
        w_sum, row_term, lhs = self._row_parts(self._weighted_sides(batch))
        s_own, s_shared = s[:n_rows], s[n_rows:]
        # the own song: Σ_x w_x·x² - 2 (Σ_x w_x⊙x)·s + Σ_x w_x·s² + θ_s, row by row      (B,)
        own_col = row_term - 2.0 * (lhs * s_own).sum(-1)
        own_col = own_col + weighted_sum(s_own.square(), w_sum) + bias[:n_rows]
        # the shared songs: Σ_x w_x·s² + θ_s per song (N,), or per row and song (B, N) under
        # row dropout, added to -2 (Σ_x w_x⊙x)·s by the GEMM itself (addmm), then the row term
        song_term = torch.addmm(bias[n_rows:], w_sum, s_shared.square().T) if w_sum.dim() == 2 \
            else s_shared.square() @ w_sum + bias[n_rows:]
        shared_col = torch.addmm(song_term, lhs, s_shared.T, alpha=-2.0) + row_term.unsqueeze(1)
        return torch.cat([own_col.unsqueeze(1), shared_col], dim=1)  # (B, 1 + N)

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        """(B, V) eq. 11 against every catalog song, in GEMM form (one (B, d) x (d, V) product;
        ``chunk`` is unused: the whole catalog fits one product)."""
        sides = self._sides(batch.users, batch.playlists)
        weighted = [(x, m.square()) for x, m in sides]
        return self._gemm(weighted, self.song_emb.weight, self.song_bias.weight)

    def full_distance_from_vectors(self, u: Tensor | None, p: Tensor | None) -> Tensor:
        """(B, V) eq. 11 for user vectors ``u`` (B, d) and playlist vectors ``p`` (B, d) (the
        term an ablation lacks takes None)."""
        weighted = [
            (x, m.square())
            for x, m in ((u, self.metric_user), (p, self.metric_playlist))
            if x is not None and m is not None
        ]
        return self._gemm(weighted, self.song_emb.weight, self.song_bias.weight)

    @staticmethod
    def _gemm(weighted: list[tuple[Tensor, Tensor]], songs: Tensor, bias: Tensor) -> Tensor:
        """(B, N) eq. 11 of the kept terms ``weighted`` [(x (B, d), w_x = B_x² (d,) or per-row
        weights (B, d))] to ``songs`` (N, d) with biases (N, 1), in GEMM form.

        Expanded: Σ_x Σ_j w_xj (x_j - s_j)² = Σ_x w_x·x² - 2 (Σ_x w_x⊙x)·s + (Σ_x w_x)·s², so
        the only per-row work is one GEMM with the song table (two with per-row weights)."""
        w_sum, row_term, lhs = MDR._row_parts(weighted)
        # (B1² + B2²)·s² + θ_s: per song (N,), or per row and song (B, N) under row dropout
        song_term = w_sum @ songs.square().T + bias.squeeze(-1)
        # - 2 (B1²⊙u + B2²⊙p)·s added to it by the GEMM itself, then the row term
        return torch.addmm(song_term, lhs, songs.T, alpha=-2.0).add_(row_term.unsqueeze(1))

    @staticmethod
    def _row_parts(weighted: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        """``_gemm``'s song-independent parts: Σ_x w_x ((d,) or (B, d)), Σ_x w_x·x² (B,) and
        Σ_x w_x⊙x (B, d) (the kept terms only; w_x = B_x² without row dropout)."""
        w_sum = sum((w for _, w in weighted[1:]), weighted[0][1])
        rows = [weighted_sum(x.square(), w) for x, w in weighted]
        lhs = [x * w for x, w in weighted]
        return w_sum, sum(rows[1:], rows[0]), sum(lhs[1:], lhs[0])

    def export_weights(self) -> dict[str, Tensor]:
        """The tensors of eq. 11 by name, detached (the export's only view of this model):

        user             (n_users, d)       u, one row per user
        playlist         (n_playlists, d)   p, one row per playlist
        song             (V, d)             s, one row per catalog song
        song_bias        (V,)               θ_s
        metric_user      (d,)               B1, the metric of the user term
        metric_playlist  (d,)               B2, the metric of the playlist term
        """
        if self.config.terms != "ups":
            raise MasrError(
                f"mdr terms={self.config.terms}: only the paper's MDR (terms=ups) exports to ONNX"
            )
        assert self.user_emb is not None and self.playlist_emb is not None
        assert self.metric_user is not None and self.metric_playlist is not None
        return {
            "user": self.user_emb.weight.detach(),
            "playlist": self.playlist_emb.weight.detach(),
            "song": self.song_emb.weight.detach(),
            "song_bias": self.song_bias.weight.detach().reshape(-1),
            "metric_user": self.metric_user.detach(),
            "metric_playlist": self.metric_playlist.detach(),
        }
