"""The two-stage graph's second stage: MASS (eqs. 12-19) on each row's N candidate songs only.

Exact scoring costs catalog x member slots per playlist in MASS, which at Million Playlist size
(2.26M songs) is a few playlists per second. ``masr export --candidates N`` builds a graph in
which MDR's one GEMM (eq. 11, ``graph``) ranks the whole catalog, its N best non-member songs
become the row's candidates, and the fusion (eq. 20) re-ranks those N alone. This module scores
the candidates: the same constants as ``mass_graph`` (``memory_tables``), but the queries are
gathered per row and candidate, (B, N, d+1), so rows are not grouped by user (two rows of one
user have different candidates) and no Loop over the catalog is needed.

With N >= the catalog every song is a candidate and the scores are the exact graph's.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from masr.export.mass_graph import memory_tables
from masr.export.onnx_builder import Graph, f32
from masr.export.weights import MASSWeights


def mass_on_candidates(
    g: Graph, mass: MASSWeights, users: str, members: str, n_users: int, candidates: str
) -> str:
    """MASS distances (eq. 19) of each row's candidates: (B, N) for ``candidates`` (B, N)
    int64 song indices. Fold-in as in ``mass_graph``: an unknown user takes the mean user row,
    a row without members keeps only the song bias."""
    i64 = np.int64
    t = memory_tables(mass, n_users)
    d = t.out_queries.shape[1] - 1
    zero_i, ax1, ax2 = g.ints(), g.ints(1), g.ints(2)
    real = g.op("GreaterOrEqual", members, zero_i)  # (B, L)
    safe = g.op("Where", real, members, zero_i)
    real_f = g.op("Cast", real, to=TensorProto.FLOAT)
    has = g.op("Cast", g.op("ReduceMax", real_f, ax1, keepdims=1), to=TensorProto.BOOL)  # (B, 1)
    # slots of a row without any member stay open (uniform, harmless): no softmax of only -inf
    open_ = g.op("Or", real, g.op("Not", has))  # (B, L)

    # member factors, transposed for the GEMMs: (B, d+1, L)
    m_out = g.op("Gather", g.const("cand_member", f32(t.out_members)), safe, axis=0)
    m_out = g.op("Mul", m_out, g.op("Unsqueeze", real_f, ax2))  # padded slots: nothing
    closed = np.zeros(d + 1, dtype=np.float32)
    closed[d] = -np.inf  # a closed slot's logit
    m_att = g.op("Gather", g.const("cand_att_member", f32(t.att_members)), safe, axis=0)
    m_att = g.op("Where", g.op("Unsqueeze", open_, ax2), m_att, g.const("cand_closed", closed))
    m_out_t = g.op("Transpose", m_out, perm=[0, 2, 1])
    m_att_t = g.op("Transpose", m_att, perm=[0, 2, 1])

    known = g.op("GreaterOrEqual", users, zero_i)
    user_rows = g.op("Where", known, users, g.const("cand_unknown_row", n_users, i64))  # (B,)

    def queries(offsets: np.ndarray, songs: np.ndarray, hint: str) -> str:
        """ReLU(|B|⊙(W_u u) + |B|⊙(W_s s_k + b)) with the appended 1: (B, N, d+1)."""
        a = g.op("Gather", g.const(f"{hint}_user", f32(offsets)), user_rows, axis=0)  # (B, d+1)
        s = g.op("Gather", g.const(f"{hint}_queries", f32(songs)), candidates, axis=0)
        return g.op("Relu", g.op("Add", s, g.op("Unsqueeze", a, ax1)), hint=hint)

    q = queries(t.out_offsets, t.out_queries, "cand_q")  # eq. 12
    norm_col = np.ones((d + 1, 1), dtype=np.float32)
    norm_col[d] = 0.0  # the appended 1 is not part of the query
    q_norm = g.op("MatMul", g.op("Mul", q, q), g.const("cand_norm_col", norm_col))  # (B, N, 1)
    q_norm = g.op("Squeeze", q_norm, ax2)  # (B, N) |B3⊙q|²
    d_out = g.op("MatMul", q, m_out_t, hint="cand_d_out")  # (B, N, L) eqs. 14-15 less |B3⊙q|²
    q_att = queries(t.att_offsets, t.att_queries, "cand_q_att")  # eq. 16
    logits = g.op("MatMul", q_att, m_att_t, hint="cand_logits")  # (B, N, L) -eq. 17 + const
    # eq. 18: α = softmax over the member slots, shifted by the max for stability
    shifted = g.op("Sub", logits, g.op("ReduceMax", logits, ax2, keepdims=1))
    weights = g.op("Exp", shifted)
    total = g.op("ReduceSum", weights, ax2, keepdims=0)  # (B, N)
    pooled = g.op("ReduceSum", g.op("Mul", weights, d_out), ax2, keepdims=0)
    pooled = g.op("Div", pooled, total)  # Σ_t α_t (d²_t - |B3⊙q|²)
    o = g.op("Add", g.op("Mul", q_norm, g.op("Cast", has, to=TensorProto.FLOAT)), pooled)
    bias = g.op("Gather", g.const("cand_bias", f32(mass.song_bias)), candidates, axis=0)
    return g.op("Add", o, bias, hint="cand_o_mass")  # eq. 19: + b_k
