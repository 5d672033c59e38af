"""MASS: Mahalanobis distance-based Attentive Song Similarity recommender (section 4.2, eqs. 12-19).

The paper's "us" variant: a personalised query built from the user and the candidate song is
compared with the playlist's member songs, and the member distances are pooled with an attention
computed from a separate embedding memory.

    q      = ReLU(W1 [u; s_k] + b1)                                   (eq. 12)
    d²_t   = |B3 ⊙ (q - s_t)|²           for member songs t             (eqs. 14-15)
    q^(a)  = ReLU(W2 [u^(a); s_k^(a)] + b2)                           (eq. 16)
    d²a_t  = |B4 ⊙ (q^(a) - s_t^(a))|²                                 (eq. 17)
    α_t    = softmin_t(d²a_t) over the real members (padding masked)   (eq. 18)
    o      = Σ_t α_t d²_t + b_{s_k}                                    (eq. 19, as a distance)

Ablations (section 5.3, Tables 3-4), chosen by ``MASSConfig.context`` and ``.attention``:

    context "user" (MASS_us, the paper's):  c = u,       c^(a) = u^(a)
    context "playlist" (MASS_ps):           c = p,       c^(a) = p^(a)
    context "user+playlist" (MASS_ups):     c = [u; p],  c^(a) = [u^(a); p^(a)]
        q = ReLU(W1 [c; s_k] + b1),  q^(a) = ReLU(W2 [c^(a); s_k^(a)] + b2)     (eqs. 12, 16)
    attention "mem-metric" (the paper's):   eqs. 16-18 as above
    attention "nonmem-*":                   U^(a), S^(a), P^(a) replaced by U, S, P (shared)
    attention "*-dot":                      α_t = softmax_t(q^(a) · s_t^(a))  (replaces 17-18)
    attention "none":                       α_t = 1 / |members|               (FISM-like)

Two readings of the printed equations: eqs. 14, 17 and 18 print d² = ‖eᵀe‖²₂, literally the
fourth power (Σ e²)²; the left-hand side d²_M and eq. 3's definition say Σ e², which is what is
computed (a typo in the print). Eq. 12's text calls the bias "b ∈ ℝ" while the equation writes a
vector b1: b1 and b2 are d-dimensional here (``nn.Linear``'s bias), one per query dimension.

The paper's eq. 19 writes o negated (a score); here o is a distance (lower = better) like MDR's
eq. 11, so MASR's eq. 20 adds like with like. A row with no real member has no attention
distribution: its MASS distance is defined as the song bias b_{s_k} alone (α = 0), which keeps it
finite and ranks by popularity.

Public API:
    MASSConfig(dim=64, dropout=0.2, init_std=None, query_init="reference", dropout_mode="element")
    MASS(config, n_users, n_playlists, n_songs)        (n_playlists unused: MASS has no playlist
                                                        embedding; the playlist is its members)
    MASS.distance(batch, songs (B, C)) -> (B, C)       members are gathered once per row and shared
                                                        by the C candidates (positive + negatives)
    MASS.full_distance(batch, chunk=256) -> (B, V)     GEMM form; rows of the same user share the
                                                        user-dependent query tensors
    MASS.full_distance_from_vectors(u (B, d), u_att (B, d), members (B, L), member_mask (B, L),
                                    chunk=1024) -> (B, V)
        eq. 19 from user *vectors*: u / u_att are user vectors of the output and attention
        tables (a caller may pass mean user vectors for an unknown user); members are song
        indices. The tests use it as the PyTorch reference of the exported graph's fold-in.
        The loop over song chunks depends only on n_songs and chunk (static), never on tensor
        values; B and L are dynamic (tests/test_models_onnx.py traces it with torch.onnx.export).
    MASS.full_distance_grouped(u (G, d), u_att (G, d), members (G, R, L), member_mask (G, R, L),
                               chunk=1024) -> (G, R, V)
        the same for G users with R playlists each (a caller groups rows by user; all-padding
        rows fill the gaps): each user's queries are built once per song chunk.
    MASS.export_weights() -> dict[str, Tensor]
        the named tensors of eqs. 12-19, W1 and W2 already split into their user and song
        halves; ``masr.export`` builds its ONNX graph from these alone.
    masked_softmin, pairwise_mahalanobis_sq, weighted_pairwise_sq: the pieces, module-level.

Initialisation: embeddings N(0, σ²) with σ = init_std or 1/dim; B3 = B4 = 1; song bias 0;
query_init "reference" sets W1 = W2 = [-I | I] and b1 = b2 = 0 (the authors' choice: the query
starts as ReLU(s_k - u), a song-centred query shifted by the user), "default" keeps PyTorch's
nn.Linear init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from masr.errors import MasrError
from masr.models.base import Batch, ModelConfig, Recommender
from masr.models.mdr import (
    check_common,
    dropout_keep,
    dropped_pairwise_sq,
    init_embedding,
    row_dropout_weights,
    weighted_sum,
)
from masr.spectral import SONG_INITS

if TYPE_CHECKING:
    from masr.dataset import PreparedData

QUERY_INITS = ("reference", "default")
#: where the training dropout's masks vary: "element" = every element of every B ⊙ (q - s_t)
#: (the authors' code: a (B, C, L, d) tensor), "shared" = one mask per (row, candidate,
#: dimension) shared by the members, "row" = one mask per (row, dimension) and metric, shared by
#: the row's candidates and members (the GEMM form of the shared-negatives path is kept)
DROPOUT_MODES = ("element", "shared", "row")
#: who personalises the queries of eqs. 12 and 16 (Table 3): the user (MASS_us, the paper's
#: MASS), the playlist (MASS_ps) or both (MASS_ups: [u; p; s_k] and [u^(a); p^(a); s_k^(a)])
MASS_CONTEXTS = ("user", "playlist", "user+playlist")
#: the attention of eqs. 16-18 (Table 4): "mem" = its own memory embeddings U^(a), S^(a) (P^(a)),
#: "nonmem" = the output embeddings U, S (P) reused; "metric" = logits -|B4⊙(q^(a) - s_t^(a))|²,
#: "dot" = logits q^(a)·s_t^(a) (no B4); "none" = equal weights over the members (no W2, b2)
ATTENTIONS = ("mem-metric", "mem-dot", "nonmem-metric", "nonmem-dot", "none")
#: training rows' shared negatives are scored once per playlist (``shared_slot_pool``) when
#: the batch's rows come from at most this share as many distinct playlists. Measured per
#: batch on one core against the compiled per-row path (docs/training.md, "Training rows
#: scored once per playlist"): 0.4-0.85 of its time on the embedded data (shares 0.25-0.68),
#: 0.90 at share 0.49 and 1.10 at 0.76 on AOTM-2011
PLAYLIST_SHARE = 0.75


@dataclass
class MASSConfig(ModelConfig):
    """MASS hyper-parameters."""

    dim: int = 64  # embedding size d
    dropout: float = 0.2  # on every scaled difference B ⊙ (q - s_t) before squaring, train only
    init_std: float | None = None  # std of the embedding init; None = 1 / dim
    query_init: str = "reference"  # W1, W2 init: "reference" = [-I | I], "default" = nn.Linear
    # "element": a dropout mask per element of every B ⊙ (q - s_t) (the reference code);
    # "shared": one mask per (row, candidate, dimension) shared by the members (GEMM form, fast)
    # "row": one mask per (row, dimension) shared by the candidates and members (GEMM form, and
    # shared negatives keep the GEMM form of the full ranking)
    dropout_mode: str = "element"
    context: str = "user"  # MASS_CONTEXTS: "user" (MASS_us), "playlist", "user+playlist"
    attention: str = "mem-metric"  # ATTENTIONS: the paper's memory metric-based attention
    # "random": the song tables start N(0, σ²) as the others; "svd": from the training matrix's
    # truncated SVD (masr.spectral), shifted so that every coordinate is >= 0, users at 0;
    # "svd-split": rank d/2, each factor split into its positive and negative parts (no shift)
    song_init: str = "random"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_common("mass", self.dim, self.dropout, self.init_std)
        for name, value, allowed in (
            ("context", self.context, MASS_CONTEXTS),
            ("attention", self.attention, ATTENTIONS),
            ("song_init", self.song_init, SONG_INITS),
        ):
            if value not in allowed:
                raise MasrError(f"mass {name}: {value!r} is not one of {', '.join(allowed)}")
        if self.dropout_mode not in DROPOUT_MODES:
            raise MasrError(
                f"mass dropout_mode: {self.dropout_mode!r} is not one of {DROPOUT_MODES}"
            )
        if self.query_init not in QUERY_INITS:
            raise MasrError(
                f"mass config query_init: {self.query_init!r} is not one of {QUERY_INITS}"
            )


def masked_softmin(dist: Tensor, mask: Tensor) -> Tensor:
    """Eq. 18: softmin of ``dist`` (..., L) over the slots where ``mask`` (broadcastable, bool) is
    True. Padded slots get exactly 0; a row without any real slot gets all zeros (not NaN)."""
    has_member = mask.any(-1, keepdim=True)  # (..., 1)
    logits = (-dist).masked_fill(~mask, float("-inf"))
    # A row with no real slot would be all -inf (softmax NaN): give it finite logits, then zero it.
    logits = logits.masked_fill(~has_member, 0.0)
    return torch.softmax(logits, dim=-1) * has_member


def pairwise_mahalanobis_sq(q: Tensor, members: Tensor, metric: Tensor) -> Tensor:
    """|B ⊙ (q_c - m_t)|² for queries ``q`` (B, C, d) and members (B, L, d) -> (B, C, L), in GEMM
    form |B⊙q|² - 2 (B²⊙q)·m + |B⊙m|² (no (B, C, L, d) tensor; exact up to rounding)."""
    w = metric.square()  # (d,)
    q_norm = (q.square() @ w).unsqueeze(-1)  # (B, C, 1)
    m_norm = (members.square() @ w).unsqueeze(-2)  # (B, 1, L)
    cross = torch.bmm(q * w, members.transpose(1, 2))  # (B, C, L)
    return (q_norm - 2.0 * cross + m_norm).clamp_min(0.0)


def weighted_pairwise_sq(q: Tensor, members: Tensor, weights: Tensor) -> Tensor:
    """Σ_j w_cj (q_cj - m_tj)² for queries ``q`` (B, C, d), members (B, L, d) and per-candidate
    weights (B, C, d) -> (B, C, L), in GEMM form: |√w⊙q|² + [-2 w⊙q, w]·[m_t, m_t²] (one bmm)."""
    q_norm = (weights * q.square()).sum(-1, keepdim=True)  # (B, C, 1)
    lhs = torch.cat([-2.0 * weights * q, weights], dim=-1)  # (B, C, 2d)
    rhs = torch.cat([members, members.square()], dim=-1)  # (B, L, 2d)
    return (q_norm + torch.bmm(lhs, rhs.transpose(1, 2))).clamp_min(0.0)


def gemm_slots(n_slots: int, device: torch.device) -> int:
    """How many member slots per row ``_member_side`` lays out for ``n_slots`` (L) real ones:
    on a CPU 16 up to 16, then the next multiple of 8; L itself elsewhere and while tracing
    for ONNX (a dynamic L stays dynamic). MKL's batched GEMMs of eqs. 14-18 take about twice
    as long for an odd or small L as for these widths (one core, batch 1024, 129 candidates,
    d = 64: L = 5 21 ms, 15 16 ms, 16 7-8 ms; docs/training.md, Speed); the extra slots are
    closed padding and change no score."""
    tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
    if tracing or torch.device(device).type != "cpu":
        return n_slots
    return 16 if n_slots <= 16 else -(-n_slots // 8) * 8


def pad_slots(m: Tensor, n_rows: int, n_slots: int, width: int) -> Tensor:
    """Member vectors ``m`` (G, R·L, d) of R rows with L = ``n_slots`` slots each, each row's
    slots zero-padded to ``width``: (G, R·width, d)."""
    if width == n_slots:
        return m
    n_groups, _, dim = m.shape
    rows = m.view(n_groups, n_rows, n_slots, dim)
    return F.pad(rows, (0, 0, 0, width - n_slots)).view(n_groups, n_rows * width, dim)


def _pool_parts(*inputs: Tensor, n_rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """``attentive_pool``'s forward on its six tensors (in its order): α and the terms
    (G, Vc, R, L), and their pooled sum."""
    q_att, att_w2, att_norm, q, out_w, out_norm = inputs
    n_groups, n = q.shape[:2]
    # eq. 17 (up to a term constant over t): logits = 2 (B4²⊙q^(a))·s_t^(a) - |B4⊙s_t^(a)|²
    logits = torch.baddbmm(att_norm, q_att, att_w2, beta=-1.0)  # (G, Vc, RL)
    alpha = torch.softmax(logits.view(n_groups, n, n_rows, -1), dim=-1)  # eq. 18
    del logits
    # eqs. 14-15 without |B3⊙q|²: |B3⊙s_t|² - 2 (B3²⊙q)·s_t             (G, Vc, R, L)
    terms = torch.baddbmm(out_norm, q, out_w, alpha=-2.0).view(n_groups, n, n_rows, -1)
    return alpha, terms, (alpha * terms).sum(-1)  # Σ_t α_t d²_t, (G, Vc, R)


def _pool_input_grads(
    need: tuple[bool, ...],
    q_att: Tensor,
    att_w2: Tensor,
    q: Tensor,
    out_w: Tensor,
    g_logits: Tensor,
    g_terms: Tensor,
) -> list[Tensor | None]:
    """The backward of eqs. 14-17's GEMM form, shared by ``attentive_pool`` and
    ``shared_slot_pool``: from the gradients of the attention logits and the output terms
    (G, Vc, S) (S member slots), those of q_att, att_w2, att_norm, q, out_w, out_norm (in that
    order, None where ``need`` says so)."""
    grads: list[Tensor | None] = [None] * 6
    if need[0]:
        grads[0] = torch.bmm(g_logits, att_w2.transpose(1, 2))  # q_att (G, Vc, d)
    if need[1]:
        grads[1] = torch.bmm(q_att.transpose(1, 2), g_logits)  # att_w2 (G, d, S)
    if need[2]:
        grads[2] = g_logits.sum(1, keepdim=True).neg_()  # att_norm (G, 1, S)
    if need[3]:
        grads[3] = torch.bmm(g_terms, out_w.transpose(1, 2)).mul_(-2.0)  # q (G, Vc, d)
    if need[4]:
        grads[4] = torch.bmm(q.transpose(1, 2), g_terms).mul_(-2.0)  # out_w (G, d, S)
    if need[5]:
        grads[5] = g_terms.sum(1, keepdim=True)  # out_norm (G, 1, S)
    return grads


class _AttentivePool(torch.autograd.Function):
    """Eqs. 14-18 in one autograd node with a hand-written backward (``attentive_pool``)."""

    @staticmethod
    def forward(ctx: Any, q_att, att_w2, att_norm, q, out_w, out_norm, n_rows: int):  # noqa: ANN001
        alpha, terms, pooled = _pool_parts(
            q_att, att_w2, att_norm, q, out_w, out_norm, n_rows=n_rows
        )
        ctx.save_for_backward(q_att, att_w2, q, out_w, alpha, terms, pooled)
        return pooled

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor):  # noqa: ANN205
        q_att, att_w2, q, out_w, alpha, terms, pooled = ctx.saved_tensors
        n_groups, n = q.shape[:2]
        need = ctx.needs_input_grad
        # ∂pooled/∂d²_t = α_t;  ∂pooled/∂logit_t = α_t (d²_t - pooled)  (softmax's Jacobian);
        # both formed in place in the saved tensors (used once: once_differentiable)
        g_terms = alpha.mul_(grad.unsqueeze(-1))  # (G, Vc, R, L)
        g_logits = terms.sub_(pooled.unsqueeze(-1)).mul_(g_terms)
        g_terms, g_logits = g_terms.view(n_groups, n, -1), g_logits.view(n_groups, n, -1)
        # the six pooled inputs' gradients; none for n_rows
        return (*_pool_input_grads(need, q_att, att_w2, q, out_w, g_logits, g_terms), None)


def attentive_pool(
    q_att: Tensor,
    att_w2: Tensor,
    att_norm: Tensor,
    q: Tensor,
    out_w: Tensor,
    out_norm: Tensor,
    n_rows: int,
) -> Tensor:
    """Σ_t α_t (|B3⊙s_t|² - 2 (B3²⊙q)·s_t) with α = softmax_t(2 q^(a)·w_t - n_t) over each of
    R rows' L member slots (eqs. 14-18 in GEMM form, without eq. 15's |B3⊙q|²): queries
    ``q_att``, ``q`` (G, Vc, d), member halves ``att_w2``, ``out_w`` (G, d, RL) and
    ``att_norm``, ``out_norm`` (G, 1, RL) (+inf in ``att_norm`` closes a slot) -> (G, Vc, R).

    One autograd node with a hand-written backward: plain autograd keeps and walks several
    (G, Vc, RL) intermediates (logits, softmax, product, and their gradients); this keeps α
    and the terms and reuses their storage for the gradients (the same values up to float
    rounding; tested in float64 against the plain formula)."""
    inputs = (q_att, att_w2, att_norm, q, out_w, out_norm)
    tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs) and not tracing:
        return _AttentivePool.apply(*inputs, n_rows)
    return _pool_parts(*inputs, n_rows=n_rows)[2]  # no gradient wanted (scoring), ONNX tracing


def _shared_slot_parts(
    *inputs: Tensor, group: Tensor, open_slots: Tensor, own: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """``shared_slot_pool``'s forward: α and the terms (B, C, L) of each row (over its open
    slots), and their pooled sum (B, C)."""
    q_att, att_w2, att_norm, q, out_w, out_norm = inputs
    # eqs. 14-17 once per group (as ``_pool_parts``, R = 1)                     (G, Vc, L)
    logits = torch.baddbmm(att_norm, q_att, att_w2, beta=-1.0)
    terms = torch.baddbmm(out_norm, q, out_w, alpha=-2.0)
    if own is None:  # every candidate of the row's group: (B, Vc, L)
        row_logits, row_terms = logits.index_select(0, group), terms.index_select(0, group)
    else:  # one candidate per row, its group's candidate ``own``: (B, 1, L)
        row_logits, row_terms = logits[group, own].unsqueeze(1), terms[group, own].unsqueeze(1)
    del logits, terms
    row_logits.masked_fill_(~open_slots.unsqueeze(1), float("-inf"))  # the row's own slots
    lone = ~open_slots.any(1)  # (B,) rows without an open slot: finite logits, then α = 0
    if lone.any():
        row_logits.masked_fill_(lone.view(-1, 1, 1), 0.0)
    alpha = torch.softmax(row_logits, dim=-1)  # eq. 18                          (B, C, L)
    del row_logits
    if lone.any():
        alpha.masked_fill_(lone.view(-1, 1, 1), 0.0)
    return alpha, row_terms, (alpha * row_terms).sum(-1)  # Σ_t α_t d²_t, (B, C)


class _SquareNorm(torch.autograd.Function):
    """``square_norm`` in one autograd node: plain autograd walks q ⊙ q's product rule (two
    products and their sum) and an outer product g ⊗ w, four (…, d) tensors; this forms one."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, w: Tensor) -> Tensor:  # noqa: ANN001
        squares = q.square()
        ctx.save_for_backward(q, w, squares if w.requires_grad else None)
        return squares @ w

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor):  # noqa: ANN205
        q, w, squares = ctx.saved_tensors
        grad_q = grad_w = None
        if ctx.needs_input_grad[0]:  # ∂/∂q_j = 2 w_j q_j g
            grad_q = q * grad.unsqueeze(-1)
            grad_q.mul_(2.0 * w)
        if ctx.needs_input_grad[1]:  # ∂/∂w_j = Σ q_j² g over every leading index
            grad_w = squares.reshape(-1, squares.shape[-1]).t() @ grad.reshape(-1)
        return grad_q, grad_w


def square_norm(q: Tensor, w: Tensor) -> Tensor:
    """Σ_j w_j q_j² over the last axis of ``q`` (…, d) for one weight vector ``w`` (d,) -> (…):
    |B⊙q|² of eq. 15 with w = B². The same values and gradients as ``weighted_sum(q * q, w)``
    up to float rounding, with a cheaper backward; that formula for per-row weights and while
    tracing for ONNX."""
    tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
    if w.dim() != 1 or tracing or not torch.is_grad_enabled():
        return weighted_sum(q * q, w)
    return _SquareNorm.apply(q, w)


#: the most floats of catalog song halves (V·d, twice with an attention query) that a MASS
#: keeps between full-ranking calls (``MASS._catalog_halves``): 128 MB
CATALOG_HALVES_MAX = 1 << 25

#: below this, the softmin's sum over a row's members (relative to the largest logit of the
#: group, which is the row's own) is taken for an underflow, and the batch pools row by row
LOO_TINY = 1e-30


def _leave_one_out_parts(
    *inputs: Tensor, group: Tensor, own: Tensor, lone: Tensor
) -> tuple[Tensor, ...] | None:
    """``shared_slot_pool`` for rows whose open slots are all their group's slots but their own
    (``loo``): the softmin of eqs. 18-19 over "all but one" from the group's sums, so that no
    (B, C, L) tensor is formed. With m the largest logit of a group and candidate, e_t =
    exp(l_t - m) (1 at the largest slot, t*), Z' = Σ_{t≠t*} e_t and N' = Σ_{t≠t*} e_t d²_t:
    a row whose own slot is o pools (N' + d²_t* - e_o d²_o) / (Z' + 1 - e_o), or N' / Z' when
    o = t*. No cancellation: the first denominator is at least 1 and the second a sum of
    positive terms. Returns (pooled (B, C), and what the backward needs), or None when some
    Z' underflowed (the caller then pools row by row)."""
    q_att, att_w2, att_norm, q, out_w, out_norm = inputs
    logits = torch.baddbmm(att_norm, q_att, att_w2, beta=-1.0)  # eq. 17, (G, C, L)
    terms = torch.baddbmm(out_norm, q, out_w, alpha=-2.0)  # eqs. 14-15, (G, C, L)
    top, at = logits.max(-1, keepdim=True)  # m and t* (G, C, 1)
    e = logits.sub_(top).exp_().scatter_(-1, at, 0.0)  # e_t, 0 at t* and closed slots
    rest, rest_terms = e.sum(-1), torch.linalg.vecdot(e, terms)  # Z', N' (G, C)
    t_top = terms.gather(-1, at).squeeze(-1)  # d²_t* (G, C)
    is_top = at.squeeze(-1).index_select(0, group) == own.unsqueeze(1)  # (B, C)
    e_own, t_own = e[group, :, own], terms[group, :, own]  # (B, C), e_own = 0 where o = t*
    z_rest = rest.index_select(0, group)
    if bool((is_top & (z_rest < LOO_TINY) & ~lone.unsqueeze(1)).any()):
        return None
    z = torch.where(is_top, z_rest, z_rest - e_own + 1.0)
    n = rest_terms.index_select(0, group) + torch.where(
        is_top, 0.0, t_top.index_select(0, group) - e_own * t_own
    )
    inv = torch.where(lone.unsqueeze(1), 0.0, z.reciprocal())  # a lone row pools 0
    pooled = n * inv
    return pooled, e, terms, at, t_top, is_top, inv, e_own, t_own


def _leave_one_out_grads(
    grad: Tensor, pooled: Tensor, e: Tensor, terms: Tensor, at: Tensor, t_top: Tensor,
    is_top: Tensor, inv: Tensor, e_own: Tensor, t_own: Tensor, group: Tensor, own: Tensor,
) -> tuple[Tensor, Tensor]:
    """The gradients of the attention logits and the terms (G, C, L) for
    ``_leave_one_out_parts``: row b's α_t = e_t / Z_b over its slots, so both are e_t times
    per-group sums over the rows (∂/∂d²_t = Σ_b g_b α_t, ∂/∂l_t = Σ_b g_b α_t (d²_t - pooled_b)),
    then the slot t* for the rows that hold it, less each row's own slot. In place in ``e``
    and ``terms`` (used once)."""
    n_groups, n_cand = e.shape[:2]
    g = grad * inv  # g_b / Z_b (B, C)
    gp = g * pooled
    other = (~is_top).to(g.dtype)  # rows for which t* is a member

    def per_group(rows: Tensor) -> Tensor:
        return rows.new_zeros(n_groups, n_cand).index_add_(0, group, rows)

    a_all, p_all = per_group(g), per_group(gp)
    a_top, p_top = per_group(g * other), per_group(gp * other)
    g_logits = terms.mul_(a_all.unsqueeze(-1)).sub_(p_all.unsqueeze(-1)).mul_(e)
    g_terms = e.mul_(a_all.unsqueeze(-1))
    g_terms.scatter_add_(-1, at, a_top.unsqueeze(-1))
    g_logits.scatter_add_(-1, at, (t_top * a_top - p_top).unsqueeze(-1))
    w = g * e_own  # each row's own slot, counted above for its group's other rows only
    n_rows = group.shape[0]
    where = (
        group.unsqueeze(1).expand(n_rows, n_cand),
        torch.arange(n_cand, device=g.device).expand(n_rows, n_cand),
        own.unsqueeze(1).expand(n_rows, n_cand),
    )
    g_terms.index_put_(where, -w, accumulate=True)
    g_logits.index_put_(where, -w * (t_own - pooled), accumulate=True)
    return g_logits, g_terms


class _LeaveOneOutPool(torch.autograd.Function):
    """``shared_slot_pool`` with ``loo`` in one autograd node (``_leave_one_out_parts``)."""

    @staticmethod
    def forward(ctx: Any, q_att, att_w2, att_norm, q, out_w, out_norm, group, own, parts):  # noqa: ANN001
        pooled, *rest = parts
        ctx.save_for_backward(q_att, att_w2, q, out_w, pooled, *rest, group, own)
        return pooled

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor):  # noqa: ANN205
        q_att, att_w2, q, out_w, pooled, *rest, group, own = ctx.saved_tensors
        g_logits, g_terms = _leave_one_out_grads(grad, pooled, *rest, group, own)
        need = ctx.needs_input_grad
        return (*_pool_input_grads(need, q_att, att_w2, q, out_w, g_logits, g_terms),
                None, None, None)


class _SharedSlotPool(torch.autograd.Function):
    """``shared_slot_pool`` in one autograd node with a hand-written backward."""

    @staticmethod
    def forward(ctx: Any, q_att, att_w2, att_norm, q, out_w, out_norm, group, open_slots, own):  # noqa: ANN001
        alpha, terms, pooled = _shared_slot_parts(
            q_att, att_w2, att_norm, q, out_w, out_norm,
            group=group, open_slots=open_slots, own=own,
        )
        ctx.save_for_backward(q_att, att_w2, q, out_w, alpha, terms, pooled, group, own)
        return pooled

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor):  # noqa: ANN205
        q_att, att_w2, q, out_w, alpha, terms, pooled, group, own = ctx.saved_tensors
        need = ctx.needs_input_grad
        # per row as in _AttentivePool (in place in the saved tensors), then summed per group
        g_rows = alpha.mul_(grad.unsqueeze(-1))  # ∂/∂d²_t = α_t                   (B, C, L)
        g_logit_rows = terms.sub_(pooled.unsqueeze(-1)).mul_(g_rows)  # α_t (d²_t - pooled)
        shape = (q.shape[0], q.shape[1], g_rows.shape[2])  # (G, Vc, L)
        if own is None:
            g_terms = g_rows.new_zeros(shape).index_add_(0, group, g_rows)
            g_logits = g_rows.new_zeros(shape).index_add_(0, group, g_logit_rows)
        else:
            at = (group, own)
            g_terms = g_rows.new_zeros(shape).index_put_(at, g_rows.squeeze(1), accumulate=True)
            g_logits = g_rows.new_zeros(shape).index_put_(
                at, g_logit_rows.squeeze(1), accumulate=True
            )
        # the six pooled inputs' gradients; none for group, open_slots, own
        return (*_pool_input_grads(need, q_att, att_w2, q, out_w, g_logits, g_terms),
                None, None, None)


def shared_slot_pool(
    q_att: Tensor,
    att_w2: Tensor,
    att_norm: Tensor,
    q: Tensor,
    out_w: Tensor,
    out_norm: Tensor,
    group: Tensor,
    open_slots: Tensor,
    own: Tensor | None = None,
    loo: Tensor | None = None,
) -> Tensor:
    """``attentive_pool`` (R = 1) for B rows that share G groups' member slots, each row over
    its own subset of them: queries ``q_att``, ``q`` (G, Vc, d) and member halves (G, d, L),
    (G, 1, L) per group; ``group`` (B,) each row's group and ``open_slots`` (B, L) bool the
    slots it pools over (a row with none pools 0) -> (B, Vc) for every candidate of the row's
    group, or with ``own`` (B,) (B, 1) for candidate ``own[b]`` of row b's group alone.

    Training rows of one playlist: each row's members are the playlist's songs less its own
    positive (less any capped or dropped ones), so the queries (eqs. 12, 16) and the batched
    GEMMs of eqs. 14-17 are formed once per playlist, not once per row; only the softmin and
    the sum (eqs. 18-19) are per row. The same values as ``attentive_pool`` on each row's own
    member list, up to float rounding (tested in float64).

    ``loo`` (B,), each row's own slot, says that every row's open slots are all its group's
    real slots but that one (training rows of whole playlists, nothing capped or dropped):
    then every candidate's pooled sum comes from per-group sums (``_leave_one_out_parts``),
    with no per-row (B, C, L) tensor, the same values up to float rounding."""
    inputs = (q_att, att_w2, att_norm, q, out_w, out_norm)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    if loo is not None and own is None:
        lone = ~open_slots.any(1)
        with torch.no_grad():
            parts = _leave_one_out_parts(*inputs, group=group, own=loo, lone=lone)
        if parts is not None:
            if grad:
                return _LeaveOneOutPool.apply(*inputs, group, loo, parts)
            return parts[0]
    if grad:
        return _SharedSlotPool.apply(*inputs, group, open_slots, own)
    return _shared_slot_parts(*inputs, group=group, open_slots=open_slots, own=own)[2]


class MASS(Recommender):
    """Attentive member-song distances with a separate attention memory (eqs. 12-19)."""

    name = "mass"
    config_class = MASSConfig
    uses_members = True

    def __init__(self, config: MASSConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        self._compiled_scores: Any = None  # compile_scores(True): a masr.compiled.Compiled
        # the catalog's song halves of eqs. 12 and 16 between full-ranking calls, and the
        # identity (storage, version) of the weights they were computed from
        self._halves: tuple[Tensor, Tensor | None] | None = None
        self._halves_key: tuple = ()
        d = config.dim
        has_u, has_p = config.context != "playlist", config.context != "user"
        n_ctx = int(has_u) + int(has_p)  # context vectors in the query input [c; s_k]
        memory, attends = config.attention.startswith("mem-"), config.attention != "none"
        # (construction order = RNG order: the default's is the one it always had)
        # output side (eqs. 12, 14, 19)
        self.user_emb = nn.Embedding(n_users, d) if has_u else None  # U
        self.playlist_emb = nn.Embedding(n_playlists, d) if has_p else None  # P (MASS_ps/_ups)
        self.song_emb = nn.Embedding(n_songs, d)  # S (target and member songs)
        self.query = nn.Linear((n_ctx + 1) * d, d)  # W1 (acting on [c; s_k]), b1
        self.metric = nn.Parameter(torch.ones(d))  # B3
        self.song_bias = nn.Embedding(n_songs, 1)  # b_s
        # attention memory (eqs. 16-18); its song bias would cancel in the softmin, so none
        self.att_user_emb = nn.Embedding(n_users, d) if memory and has_u else None  # U^(a)
        self.att_playlist_emb = nn.Embedding(n_playlists, d) if memory and has_p else None  # P^(a)
        self.att_song_emb = nn.Embedding(n_songs, d) if memory else None  # S^(a)
        self.att_query = nn.Linear((n_ctx + 1) * d, d) if attends else None  # W2, b2
        metric = config.attention.endswith("-metric")
        self.att_metric = nn.Parameter(torch.ones(d)) if metric else None  # B4
        for emb in (
            self.user_emb, self.playlist_emb, self.song_emb,
            self.att_user_emb, self.att_playlist_emb, self.att_song_emb,
        ):
            if emb is not None:
                init_embedding(emb, d, config.init_std)
        nn.init.zeros_(self.song_bias.weight)
        if config.query_init == "reference":
            with torch.no_grad():
                for lin in (self.query, self.att_query):
                    if lin is None:
                        continue
                    eye = torch.eye(d)
                    # [-I | I] ([-I/2 | -I/2 | I] for MASS_ups): starts as ReLU(s_k - mean c)
                    lin.weight.copy_(torch.cat([-eye / n_ctx] * n_ctx + [eye], dim=1))
                    lin.bias.zero_()

    def init_from_data(self, data: PreparedData, seed: int = 0) -> None:
        """``song_init="svd"`` or ``"svd-split"``: the song tables (S, and S^(a) of the attention
        memory) start from the training matrix's song factors (``masr.spectral``), made
        non-negative, and the context tables (U, P and their memory twins) at 0. With the
        query's [-I | I] start (eq. 12: q = ReLU(s_k - c)), ReLU is then the identity and every
        distance of eqs. 14-17 starts as the member songs' distance to the candidate in the
        factors' space: an item-based start. How each variant makes the factors non-negative:
        ``masr.spectral.song_start``. "random": nothing."""
        from masr.spectral import song_start

        songs = song_start(data, self.config.dim, self.config.song_init, seed=seed)  # (V, d)
        if songs is None:
            return
        with torch.no_grad():
            for table in (self.song_emb, self.att_song_emb):
                if table is not None:
                    table.weight.copy_(songs.to(table.weight))
            for table in (
                self.user_emb, self.playlist_emb, self.att_user_emb, self.att_playlist_emb
            ):
                if table is not None:
                    table.weight.zero_()

    # -- pieces ---------------------------------------------------------------------------
    @staticmethod
    def _split(lin: nn.Linear) -> tuple[Tensor, Tensor]:
        """W [c; s] = W_c c + W_s s: the halves (d, n_ctx·d) and (d, d) acting on the context
        vector c ([u], [p] or [u; p]) and on the song."""
        d = lin.out_features
        return lin.weight[:, :-d], lin.weight[:, -d:]

    def _context(self, users: Tensor, playlists: Tensor, att: bool = False) -> Tensor:
        """(B, n_ctx·d) context vectors c of eq. 12 ([u], [p] or [u; p]) or, with ``att``, of
        eq. 16 (the memory's U^(a), P^(a); the output tables when the attention is "nonmem")."""
        memory = att and self.att_song_emb is not None
        tables = (
            (self.att_user_emb, self.att_playlist_emb) if memory
            else (self.user_emb, self.playlist_emb)
        )
        parts = [t(ix) for t, ix in zip(tables, (users, playlists), strict=True) if t is not None]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _att_songs(self) -> nn.Embedding:
        """The song table of the attention: S^(a) ("mem"), else the output table S."""
        return self.att_song_emb if self.att_song_emb is not None else self.song_emb

    def _queries(self, lin: nn.Linear, c: Tensor, s: Tensor) -> Tensor:
        """Eqs. 12 / 16: ReLU(W [c; s] + b) for contexts ``c`` (B, k) and songs ``s`` (B, C, d)."""
        w_c, w_s = self._split(lin)
        return F.relu(F.linear(s, w_s, lin.bias) + F.linear(c, w_c).unsqueeze(1))  # (B, C, d)

    def _song_halves(self, s_out: Tensor, s_att: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """W1_s s_k + b1 and W2_s s^(a)_k + b2 (..., d): the song halves of eqs. 12 and 16,
        which do not depend on the context (the second None without an attention query)."""
        _, w1_s = self._split(self.query)
        h_out = F.linear(s_out, w1_s, self.query.bias)
        if self.att_query is None or s_att is None:
            return h_out, None
        _, w2_s = self._split(self.att_query)
        return h_out, F.linear(s_att, w2_s, self.att_query.bias)

    def _catalog_halves(self) -> tuple[Tensor, Tensor | None] | None:
        """``_song_halves`` of every catalog song (V, d), computed once per set of weights and
        kept between full-ranking calls: a validation or ``masr evaluate`` ranks the catalog
        for many batches of cases with the same weights, and the per-chunk products were about
        a tenth of MASS's full ranking on AOTM (docs/training.md, "Evaluation"). Only without
        gradients and outside ONNX tracing, and only up to ``CATALOG_HALVES_MAX`` floats (None
        otherwise: the caller projects chunk by chunk). The weights' storage and version
        counters say when they changed (an optimiser step, APR's perturbation, a load)."""
        tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
        if tracing or torch.is_grad_enabled():
            return None
        att = self.att_query is not None
        if self.n_songs * self.config.dim * (2 if att else 1) > CATALOG_HALVES_MAX:
            return None
        weights = [self.song_emb.weight, self.query.weight, self.query.bias]
        if att:
            assert self.att_query is not None
            weights += [self._att_songs().weight, self.att_query.weight, self.att_query.bias]
        key = tuple((w.data_ptr(), w._version) for w in weights)
        if self._halves is None or key != self._halves_key:
            self._halves = None  # the old tables go before the new ones are made
            s_att = self._att_songs().weight if att else None
            self._halves, self._halves_key = self._song_halves(self.song_emb.weight, s_att), key
        return self._halves

    def train(self, mode: bool = True) -> MASS:
        """nn.Module.train; going back to training drops the catalog's song halves."""
        if mode:
            self._halves, self._halves_key = None, ()
        return super().train(mode)

    def _member_dist(self, q: Tensor, members: Tensor, metric: Tensor) -> Tensor:
        """Eqs. 14-15 / 17: (B, C, L) squared distances, queries (B, C, d) to members (B, L, d)."""
        p_drop = self.config.dropout
        if not (self.training and p_drop > 0):
            return pairwise_mahalanobis_sq(q, members, metric)
        if self.config.dropout_mode == "element":
            # dropout on the scaled difference (reference code): needs the (B, C, L, d) tensor
            # B ⊙ (q - s_t), formed as B⊙q - B⊙s_t in one fused pass (dropped_pairwise_sq)
            return dropped_pairwise_sq(
                (q * metric).unsqueeze(2), (members * metric).unsqueeze(1), p_drop
            )
        if self.config.dropout_mode == "row":
            # one mask per (row, dimension), shared by the C candidates and the L members
            weights = row_dropout_weights(metric, q.shape[0], p_drop)  # (B, d)
            return weighted_pairwise_sq(q, members, weights.unsqueeze(1).expand_as(q))
        # "shared": one dropout mask per (row, candidate, dimension), shared by the L members:
        # Σ_j (m_j/(1-p))² B_j² (q_j - s_tj)², still in GEMM form (no (B, C, L, d) tensor)
        keep, p = dropout_keep(q.shape, p_drop, q.device, q.dtype)  # (B, C, d)
        return weighted_pairwise_sq(q, members, metric.square() * keep / (1.0 - p) ** 2)

    def _row_dropout(self) -> bool:
        return self.training and self.config.dropout > 0 and self.config.dropout_mode == "row"

    def attention(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, C, L) attention weights α (eqs. 16-18) of each candidate over the row's members."""
        mask = batch.member_mask.unsqueeze(1)  # (B, 1, L)
        if self.att_query is None:
            # attention "none": α_t = 1 / |members| for every candidate (FISM-like pooling)
            shape = (*songs.shape, batch.members.shape[1])  # (B, C, L)
            zeros = torch.zeros(shape, dtype=self.metric.dtype, device=songs.device)
            return masked_softmin(zeros, mask)
        table = self._att_songs()
        c_att = self._context(batch.users, batch.playlists, att=True)  # (B, k)
        q_att = self._queries(self.att_query, c_att, table(songs))  # (B, C, d), eq. 16
        m_att = table(batch.members)  # (B, L, d)
        if self.att_metric is not None:
            d_att = self._member_dist(q_att, m_att, self.att_metric)  # eq. 17, (B, C, L)
        else:
            # "dot": logits q^(a)·s_t^(a) in place of eq. 17's -d²a_t (no dropout, no B4)
            d_att = -torch.bmm(q_att, m_att.transpose(1, 2))  # (B, C, L)
        return masked_softmin(d_att, mask)  # eq. 18

    # -- the contract ---------------------------------------------------------------------
    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, C) MASS distances (eq. 19 as a distance) of each row's candidate ``songs``."""
        c = self._context(batch.users, batch.playlists)  # (B, k)
        # eq. 12: personalised query per candidate
        q = self._queries(self.query, c, self.song_emb(songs))  # (B, C, d)
        # eqs. 14-15: distances to the members, gathered once per row for all C candidates
        d_out = self._member_dist(q, self.song_emb(batch.members), self.metric)  # (B, C, L)
        alpha = self.attention(batch, songs)  # (B, C, L), eqs. 16-18
        # eq. 19: o = Σ_t α_t d²(q, s_t) + b_{s_k}
        return (alpha * d_out).sum(-1) + self.song_bias(songs).squeeze(-1)

    def full_distance(self, batch: Batch, chunk: int = 256) -> Tensor:
        """(B, V) eq. 19 against every catalog song, in GEMM form.

        Rows of the same context (user; playlist for MASS_ps/_ups) share the context-dependent
        query tensors (eqs. 12, 16): they are grouped (G contexts, up to R rows each) and
        scored by ``full_distance_grouped``."""
        keys = {
            "user": batch.users,
            "playlist": batch.playlists,
            "user+playlist": batch.users * self.n_playlists + batch.playlists,
        }[self.config.context]
        uniq, group, counts = torch.unique(keys, return_inverse=True, return_counts=True)
        n_groups, n_rows = uniq.numel(), int(counts.max()) if keys.numel() else 1
        if n_groups * n_rows > 2 * keys.numel():  # too uneven: padding would cost more
            group, n_rows = torch.arange(keys.numel(), device=keys.device), 1
            n_groups = keys.numel()
        # slot of each row within its group: rank among the rows of the same context
        order = torch.argsort(group, stable=True)  # rows sorted by group
        starts = torch.searchsorted(group[order], group[order], right=False)  # (B,) first of group
        slot = torch.empty_like(group)
        slot[order] = torch.arange(keys.numel(), device=keys.device) - starts
        rep = torch.empty(n_groups, dtype=torch.long, device=keys.device)
        rep[group] = torch.arange(keys.numel(), device=keys.device)  # a row of each group
        n_slots = batch.members.shape[1]
        members = batch.members.new_zeros(n_groups, n_rows, n_slots)
        mask = batch.member_mask.new_zeros(n_groups, n_rows, n_slots)
        members[group, slot] = batch.members
        mask[group, slot] = batch.member_mask
        users, playlists = batch.users[rep], batch.playlists[rep]  # (G,)
        out = self.full_distance_grouped(
            self._context(users, playlists), self._att_context(users, playlists), members, mask,
            chunk=chunk,
        )  # (G, R, V)
        return out[group, slot]

    def _att_context(self, users: Tensor, playlists: Tensor) -> Tensor | None:
        """Eq. 16's context vectors, None for attention "none" (no query)."""
        return None if self.att_query is None else self._context(users, playlists, att=True)

    def full_distance_from_vectors(
        self,
        u: Tensor,
        u_att: Tensor | None,
        members: Tensor,
        member_mask: Tensor,
        chunk: int = 1024,
    ) -> Tensor:
        """(B, V) eq. 19 for context vectors ``u``, ``u_att`` (B, k) of the output and attention
        tables (user vectors for the paper's MASS), ``members`` (B, L) song indices and
        ``member_mask`` (B, L) bool: one row per context (``full_distance_grouped``, R = 1)."""
        return self.full_distance_grouped(
            u, u_att, members.unsqueeze(1), member_mask.unsqueeze(1), chunk=chunk
        ).squeeze(1)

    def full_distance_grouped(
        self,
        u: Tensor,
        u_att: Tensor | None,
        members: Tensor,
        member_mask: Tensor,
        chunk: int = 1024,
    ) -> Tensor:
        """(G, R, V) eq. 19 for G contexts with R playlists each: context vectors ``u``,
        ``u_att`` (G, k) (user vectors for the paper's MASS; ``u_att`` None for attention
        "none"), ``members`` (G, R, L) song indices, ``member_mask`` (G, R, L) bool (a row with
        no real member is padding, or a member-less playlist: it gets the song bias alone).

        The queries (eqs. 12, 16) depend on the context and the song only, so per song chunk
        they are built once per context, ReLU(W_c c + (S W_s^T + b)) (G, Vc, d), and compared
        with all R·L member slots of that context in one batched GEMM (``_grouped_scores``).
        The chunk loop depends on n_songs and ``chunk`` only (ONNX-traceable with dynamic G, R,
        L)."""
        side = self._member_side(members, member_mask)
        a_out, a_att = self._context_side(u, u_att)
        att_table = self._att_songs().weight if self.att_query is not None else None
        catalog = self._catalog_halves()
        scores = self._scorer()
        out = []
        for start in range(0, self.n_songs, chunk):
            stop = min(start + chunk, self.n_songs)
            if catalog is not None:
                h_out = catalog[0][start:stop]
                h_att = None if catalog[1] is None else catalog[1][start:stop]
            else:
                h_out, h_att = self._song_halves(
                    self.song_emb.weight[start:stop],
                    None if att_table is None else att_table[start:stop],
                )
            out.append(
                scores(side, a_out, a_att, h_out, h_att, self.song_bias.weight[start:stop])
            )  # (G, Vc, R)
        return torch.cat(out, dim=1).transpose(1, 2)  # (G, R, V)

    def distance_shared(self, batch: Batch, songs: Tensor) -> Tensor:
        """(B, N) eq. 19 to songs shared by every row (sampled softmax's negatives).

        Without dropout in training, or with ``dropout_mode="row"``: the GEMM form of
        ``full_distance_grouped`` (one group per row) on the N songs, through the embeddings so
        that gradients stay row-sparse. With other dropout in training: ``distance`` with the
        songs as one (1, N) row, which keeps the dropout law of ``dropout_mode`` (the song
        halves of eqs. 12 and 16 computed once)."""
        if self.training and self.config.dropout > 0 and not self._row_dropout():
            return self.distance(batch, songs.unsqueeze(0))
        rows = self._row_sides(batch)
        return self._songs_scores(rows, songs)  # (B, N)

    def distance_own_shared(self, batch: Batch, own: Tensor, shared: Tensor) -> Tensor:
        """(B, 1 + N) eq. 19 to each row's own song and to N shared songs: both through the
        GEMM form of ``distance_shared``, the member-song halves computed once for the two;
        training rows from few enough playlists once per playlist (``_playlist_scores``).
        With dropout other than "row" in training: ``distance`` and ``distance_shared`` (the
        dropout law)."""
        if self.training and self.config.dropout > 0 and not self._row_dropout():
            return super().distance_own_shared(batch, own, shared)
        by_playlist = self._playlist_groups(batch)
        if by_playlist is not None:
            return self._playlist_scores(batch, by_playlist, own, shared)
        rows = self._row_sides(batch)
        return torch.cat(
            [self._songs_scores(rows, own.unsqueeze(1)), self._songs_scores(rows, shared)], dim=1
        )

    def _playlist_groups(self, batch: Batch) -> tuple[Tensor, ...] | None:
        """For training rows (no distance dropout; attention other than "none") that come from
        few enough playlists (``PLAYLIST_SHARE``), none of them more than twice as long as the
        rows' member lists: the distinct playlists (G,), each row's group (B,), the playlists'
        songs (G, L) and mask (G, L) (the training songs in the index's order), each row's own
        slot (B,) and the slots that hold its members (B, L) (all but its own, unless
        --max-members capped or member dropout dropped some; found by song, as a prepared
        playlist holds each song once). Else None."""
        index, rows = batch.source, batch.rows
        if index is None or rows is None or self.att_query is None:
            return None
        if self.training and self.config.dropout > 0:
            return None
        playlists, group = torch.unique(batch.playlists, return_inverse=True)
        if playlists.numel() > PLAYLIST_SHARE * rows.numel():
            return None
        start, length = index.indptr[playlists], index.lengths(playlists)  # (G,)
        longest = int(length.max())
        if longest > 2 * batch.members.shape[1] + 1:
            # members capped far below the playlist's length (--max-members): the per-row
            # (B, C, L) softmin over all its songs would cost more than the rows' own lists
            return None
        slots = torch.arange(longest, device=rows.device)  # (L,)
        mask = slots < length.unsqueeze(1)  # (G, L)
        flat = (start.unsqueeze(1) + slots).clamp_(max=index.n_rows - 1)
        songs = torch.where(mask, index.song[flat], torch.zeros_like(flat))  # (G, L)
        own = rows - start.index_select(0, group)  # (B,) the positive's slot
        # a slot is open for a row when its song is one of the row's members, never its own
        row_songs, row_mask = songs.index_select(0, group), mask.index_select(0, group)
        is_member = (row_songs.unsqueeze(2) == batch.members.unsqueeze(1)) & (
            batch.member_mask.unsqueeze(1)
        )  # (B, L, L_members)
        open_slots = is_member.any(2) & row_mask
        open_slots.scatter_(1, own.unsqueeze(1), False)
        return playlists, group, songs, mask, own, open_slots

    def _playlist_scores(
        self, batch: Batch, groups: tuple[Tensor, ...], own_songs: Tensor, shared: Tensor
    ) -> Tensor:
        """``distance_own_shared`` for ``_playlist_groups``' rows: the member-song halves and
        the queries (eqs. 12, 16) once per playlist, over all its songs; each row pools over
        its own members among them (``shared_slot_pool``). The positive is one of the
        playlist's songs, so its queries are the playlist's, taken at the row's slot. The same
        values as the per-row path, up to float rounding."""
        index = batch.source
        assert index is not None
        playlists, group, songs, mask, own, open_slots = groups
        side = self._member_side(songs.unsqueeze(1), mask.unsqueeze(1))
        width = side["out_w"].shape[-1]  # the slots as laid out for the GEMMs (gemm_slots)
        open_slots = F.pad(open_slots, (0, width - open_slots.shape[1]))  # (B, width)
        # every row's members are all its playlist's songs but its own (nothing capped or
        # dropped): the shared negatives' softmin from per-playlist sums (shared_slot_pool)
        all_but_own = F.pad(mask, (0, width - mask.shape[1])).index_select(0, group)
        all_but_own.scatter_(1, own.unsqueeze(1), False)
        loo = own if bool((open_slots == all_but_own).all()) else None
        users = index.playlist_user[playlists]
        a_out, a_att = self._context_side(
            self._context(users, playlists), self._att_context(users, playlists)
        )  # (G, 1, d) each
        table = self._att_songs()
        shared_scores = self._slot_scores(
            side, a_out, a_att, self.song_emb(shared), table(shared), group, open_slots, None,
            loo,
        )  # (B, N)
        own_scores = self._slot_scores(
            side, a_out, a_att, self.song_emb(songs), table(songs), group, open_slots, own
        )  # (B, 1)
        bias = self.song_bias(shared).view(1, -1)  # (1, N)
        return torch.cat([own_scores + self.song_bias(own_songs), shared_scores + bias], dim=1)

    def _slot_scores(
        self,
        side: dict[str, Tensor],
        a_out: Tensor,
        a_att: Tensor,
        s_out: Tensor,
        s_att: Tensor,
        group: Tensor,
        open_slots: Tensor,
        own: Tensor | None,
        loo: Tensor | None = None,
    ) -> Tensor:
        """Eq. 19 without the song bias for B rows grouped by playlist (``_playlist_scores``):
        candidate vectors ``s_out``, ``s_att`` (Vc, d) shared by every group -> (B, Vc), or
        with ``own`` (B,) the group's songs (G, L, d), each row taking its own slot's -> (B, 1).
        Eager: compiled, it took longer per step on 2 cores and 35 s more to compile."""
        h_out, h_att = self._song_halves(s_out, s_att)
        assert h_att is not None  # the grouped path is taken with an attention query only
        # eqs. 12 and 16 per playlist and candidate                                 (G, Vc, d)
        q = (a_out + h_out).relu_()
        q_att = (a_att + h_att).relu_()
        q_norm = square_norm(q, side["w_out"])  # (G, Vc)  |B3⊙q|²
        pooled = shared_slot_pool(
            q_att, side["att_w2"], side["att_norm"], q, side["out_w"], side["out_norm"],
            group, open_slots, own, loo,
        )  # eqs. 14-18, (B, C)
        # eq. 19: + |B3⊙q|² for rows with a member
        q_norm = q_norm.index_select(0, group) if own is None else q_norm[group, own, None]
        return pooled + q_norm * open_slots.any(1, keepdim=True).to(q_norm.dtype)

    def _row_sides(self, batch: Batch) -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
        """What does not depend on the candidate, one group per row: ``_member_side`` and
        ``_context_side``. With ``dropout_mode="row"`` in training, each row's metrics carry its
        dropout masks (output first, then attention: ``distance``'s order of draws)."""
        w_out = w_att = None
        if self._row_dropout():
            n_rows = batch.users.shape[0]
            w_out = row_dropout_weights(self.metric, n_rows, self.config.dropout)
            if self.att_metric is not None:
                w_att = row_dropout_weights(self.att_metric, n_rows, self.config.dropout)
        side = self._member_side(
            batch.members.unsqueeze(1), batch.member_mask.unsqueeze(1), w_out, w_att
        )
        a_out, a_att = self._context_side(
            self._context(batch.users, batch.playlists),
            self._att_context(batch.users, batch.playlists),
        )
        return side, a_out, a_att

    def _songs_scores(
        self, rows: tuple[dict[str, Tensor], Tensor, Tensor | None], songs: Tensor
    ) -> Tensor:
        """(B, N) scores of ``songs`` (N,) shared by every row, or (B, 1) of one song per row
        (``songs`` (B, 1)), by ``_grouped_scores`` (compiled where on)."""
        side, a_out, a_att = rows
        s_att = self._att_songs()(songs) if self.att_query is not None else None
        h_out, h_att = self._song_halves(self.song_emb(songs), s_att)
        scores = self._scorer()(
            side, a_out, a_att, h_out, h_att, self.song_bias(songs)
        )  # (B, N, 1)
        return scores.squeeze(-1)

    def _scorer(self) -> Any:
        """``_grouped_scores``, or its compiled version while ``compile_scores`` has it on
        (training steps, their validation, ``masr evaluate``: inductor fuses the softmin,
        product and sum of eqs. 17-19), never while tracing for ONNX. Same values up to float
        rounding."""
        tracing = torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
        if tracing or self._compiled_scores is None:
            return self._grouped_scores
        return self._compiled_scores

    def compile_scores(self, on: bool) -> bool:
        from masr.compiled import Compiled

        self._compiled_scores = Compiled(self._grouped_scores, "MASS scores") if on else None
        return True

    def _member_side(
        self,
        members: Tensor,
        member_mask: Tensor,
        w_out: Tensor | None = None,
        w_att: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """The member-song halves of eqs. 14-15 and 17, for (G, R, L) member slots: what does
        not depend on the candidate song, computed once per batch. ``w_out`` / ``w_att`` (G, d)
        replace B3² / B4² per group (row dropout's masked metrics); None = the metrics."""
        n_groups, n_rows, n_slots = members.shape
        # B3² (d,), or one weight vector per group (G, 1, d)
        w_out3 = self.metric.square() if w_out is None else w_out.unsqueeze(1)
        flat = members.reshape(n_groups, n_rows * n_slots)  # (G, RL)
        has_member = member_mask.any(-1)  # (G, R)
        # slots the batched GEMMs run fastest with; the extra ones are closed padding
        width = gemm_slots(n_slots, members.device)
        mask = member_mask if width == n_slots else F.pad(member_mask, (0, width - n_slots))
        real = mask.reshape(n_groups, 1, n_rows * width)  # (G, 1, RL')
        # a row without members keeps finite logits (its α is then multiplied by zero terms)
        open_slot = real | ~has_member.repeat_interleave(width, dim=1).unsqueeze(1)  # (G, 1, RL')
        m = pad_slots(self.song_emb(flat), n_rows, n_slots, width)  # (G, RL', d)
        zero = torch.zeros((), dtype=m.dtype, device=m.device)
        inf = torch.full((), float("inf"), dtype=m.dtype, device=m.device)
        side = {
            # output side, zero at padded slots: B3²⊙s_t (G, d, RL) and |B3⊙s_t|² (G, 1, RL)
            "out_w": torch.where(real, (m * w_out3).transpose(1, 2), zero),
            "out_norm": torch.where(real, weighted_sum(m.square(), w_out3).unsqueeze(1), zero),
            "w_out": w_out3,  # B3² (d,) or per group (G, 1, d), for |B3⊙q|²
            "has": has_member.to(m.dtype).unsqueeze(1),  # (G, 1, R)
            # attention "none" / "dot": no per-slot term, only +inf at closed slots (G, 1, RL)
            "att_norm": torch.where(open_slot, zero, inf),
        }
        if self.att_query is None:
            return side
        m_att = pad_slots(self._att_songs()(flat), n_rows, n_slots, width)  # (G, RL', d)
        if self.att_metric is None:  # "dot": logits q^(a)·s_t^(a)
            side["att_w2"] = m_att.transpose(1, 2)  # (G, d, RL)
            return side
        w_att3 = self.att_metric.square() if w_att is None else w_att.unsqueeze(1)
        # metric: 2 B4²⊙s_t^(a) (G, d, RL) and |B4⊙s_t^(a)|², +inf at closed slots (G, 1, RL)
        side["att_w2"] = (2.0 * m_att * w_att3).transpose(1, 2)
        side["att_norm"] = torch.where(
            open_slot, weighted_sum(m_att.square(), w_att3).unsqueeze(1), inf
        )
        return side

    def _context_side(self, c: Tensor, c_att: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """W1_c c and W2_c c^(a) of eqs. 12 and 16 for context vectors (G, k): (G, 1, d) each
        (the second None for attention "none")."""
        w1_c, _ = self._split(self.query)
        a_out = F.linear(c, w1_c).unsqueeze(1)
        if self.att_query is None or c_att is None:
            return a_out, None
        w2_c, _ = self._split(self.att_query)
        return a_out, F.linear(c_att, w2_c).unsqueeze(1)

    def _grouped_scores(
        self,
        side: dict[str, Tensor],
        a_out: Tensor,
        a_att: Tensor | None,
        h_out: Tensor,
        h_att: Tensor | None,
        bias: Tensor,
    ) -> Tensor:
        """(G, Vc, R) eq. 19 of Vc candidate songs (their song halves ``h_out``, ``h_att``
        (Vc, d) of eqs. 12 and 16 from ``_song_halves``, biases (Vc, 1)) for the G groups of
        ``_member_side``.

        Expanding eqs. 14-15, d²_t = |B3⊙q|² - 2 (B3²⊙q)·s_t + |B3⊙s_t|²; since Σ_t α_t = 1
        the first term leaves the attention sum, and |B4⊙q^(a)|² is constant over t so it
        cancels in the softmin (eq. 18). Padded slots get -inf attention logits and zero
        output terms, so they never change a score. The Table 4 variants change the logits
        only: "dot" q^(a)·s_t^(a), "none" 0 at every real slot."""
        n_groups, n, n_rows = a_out.shape[0], h_out.shape[-2], side["has"].shape[-1]
        # eq. 12: q = ReLU(W1_c c + W1_s s_k + b1)                       (G, Vc, d)
        q = (a_out + h_out).relu_()
        q_norm = weighted_sum(q * q, side["w_out"])  # (G, Vc)  |B3⊙q|²
        if self.att_query is not None and a_att is not None and h_att is not None:
            # eq. 16: q^(a) = ReLU(W2_c c^(a) + W2_s s^(a) + b2)           (G, Vc, d)
            q_att = (a_att + h_att).relu_()
            # eqs. 14-18 ("dot": logits q^(a)·s_t^(a), the same form)     (G, Vc, R)
            pooled = attentive_pool(
                q_att, side["att_w2"], side["att_norm"], q, side["out_w"], side["out_norm"],
                n_rows,
            )
        else:
            # attention "none": α_t = 1/|members|, the same for every candidate
            logits = (-side["att_norm"]).expand(n_groups, n, -1)  # (G, Vc, RL)
            alpha = torch.softmax(logits.reshape(n_groups, n, n_rows, -1), dim=-1)
            # eqs. 14-15 without |B3⊙q|²: |B3⊙s_t|² - 2 (B3²⊙q)·s_t    (G, Vc, R, L)
            terms = torch.baddbmm(side["out_norm"], q, side["out_w"], alpha=-2.0)
            pooled = (alpha * terms.view(n_groups, n, n_rows, -1)).sum(-1)  # (G, Vc, R)
        # eq. 19: o = Σ_t α_t d²_t + b_{s_k}
        return pooled + q_norm.unsqueeze(-1) * side["has"] + bias  # (G, Vc, R)

    def export_weights(self) -> dict[str, Tensor]:
        """The tensors of eqs. 12-19 by name, detached (the export's only view of this model).
        W [u; s] = W_u u + W_s s, so each query matrix comes as its two (d, d) halves. Only the
        paper's MASS (context "user", attention "mem-metric") exports; the ablations of Tables
        3-4 raise a MasrError.

        output side (eqs. 12, 14-15, 19):
            user              (n_users, d)   U
            song              (V, d)         S, the candidate and member songs
            query_user        (d, d)         W1_u, acting on u in eq. 12
            query_song        (d, d)         W1_s, acting on s_k in eq. 12
            query_bias        (d,)           b1
            metric            (d,)           B3 (eq. 15)
            song_bias         (V,)           b_s (eq. 19)
        attention memory (eqs. 16-18):
            att_user          (n_users, d)   U^(a)
            att_song          (V, d)         S^(a)
            att_query_user    (d, d)         W2_u, acting on u^(a) in eq. 16
            att_query_song    (d, d)         W2_s, acting on s^(a)_k in eq. 16
            att_query_bias    (d,)           b2
            att_metric        (d,)           B4 (eq. 17)
        """
        cfg = self.config
        if (cfg.context, cfg.attention) != ("user", "mem-metric"):
            raise MasrError(
                f"mass context={cfg.context} attention={cfg.attention}: only the paper's MASS "
                "(context=user, attention=mem-metric) exports to ONNX"
            )
        assert self.user_emb is not None and self.att_user_emb is not None
        assert self.att_song_emb is not None and self.att_query is not None
        assert self.att_metric is not None
        w1_u, w1_s = self._split(self.query)
        w2_u, w2_s = self._split(self.att_query)
        tensors = {
            "user": self.user_emb.weight,
            "song": self.song_emb.weight,
            "query_user": w1_u,
            "query_song": w1_s,
            "query_bias": self.query.bias,
            "metric": self.metric,
            "song_bias": self.song_bias.weight.reshape(-1),
            "att_user": self.att_user_emb.weight,
            "att_song": self.att_song_emb.weight,
            "att_query_user": w2_u,
            "att_query_song": w2_s,
            "att_query_bias": self.att_query.bias,
            "att_metric": self.att_metric,
        }
        return {name: t.detach() for name, t in tensors.items()}
