"""MASS's part of the scoring graph (eqs. 12-19): the distance of every song for every row.

The queries depend on the user and the candidate only, q_k = ReLU(W1_u u + (W1_s s_k + b1)), so
(S W1_s^T + b1) is a constant and the rows of the batch are grouped by user: each user's queries
are built once per song chunk and compared with all member slots of all its playlists in one
batched GEMM. With |B3| folded into the constants (ReLU(x)|B3| = ReLU(|B3| x)) and a constant 1
appended to every query:

    d²_kt    = |B3⊙q_k|² + q̃_k · [-2|B3|⊙s_t; |B3⊙s_t|²]                  (eqs. 14-15)
    logit_kt = q̃^(a)_k · [2|B4|⊙s^(a)_t; -|B4⊙s^(a)_t|²]                (eqs. 17-18; the per-k
               term |B4⊙q^(a)_k|² cancels in the softmin; padded slots get -inf)
    o_k      = |B3⊙q_k|² + Σ_t α_kt (d²_kt - |B3⊙q_k|²) + b_k             (eq. 19, Σ_t α_kt = 1)

The catalog is walked in cache-sized chunks by an ONNX Loop, so no (B, V, d) tensor exists.
Fold-in: an unknown user gets the mean of each memory's user table (eqs. 12 and 16 are affine in
u, so this is the mean of the per-user query offsets); a row with no usable member falls back to
the song bias b_s (eq. 19 with no attention).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from onnx import TensorProto, helper

from masr.export.onnx_builder import Graph, f32
from masr.export.weights import MASSWeights
from masr.onnx_format import UNKNOWN


class MemoryTables(NamedTuple):
    """MASS's constants in GEMM form (module docstring), for both memories: per-user offsets
    |B|⊙(W_u u) with the unknown user's mean appended and a 0 column (n_users+1, d+1); per-song
    query constants [|B|⊙(W_s s + b), 1] (V, d+1); member-side factors (V, d+1), output
    [-2|B3|⊙s_t; |B3⊙s_t|²] and attention [2|B4|⊙s_t; -|B4⊙s_t|²]. Computed in float64,
    stored float32 (what the graph holds), ``ROW_BLOCK`` rows at a time so that a catalog of
    millions of songs never has a float64 copy of its tables."""

    out_offsets: np.ndarray
    out_queries: np.ndarray
    out_members: np.ndarray
    att_offsets: np.ndarray
    att_queries: np.ndarray
    att_members: np.ndarray


#: Rows of a table computed at once in float64 (bounds the export's temporary memory).
ROW_BLOCK = 1 << 16


def row_blocks(n: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of at most ``ROW_BLOCK`` rows covering ``n`` rows."""
    return [(lo, min(lo + ROW_BLOCK, n)) for lo in range(0, n, ROW_BLOCK)]


def memory_tables(mass: MASSWeights, n_users: int) -> MemoryTables:
    """The constants of eq. 12's output memory and eq. 16's attention memory (``MemoryTables``),
    shared by the exact graph (walked by chunk) and the two-stage one (``two_stage``)."""

    def memory(user, song, w_user, w_song, bias, metric, sign):
        scale = np.abs(metric.astype(np.float64))  # |B|: ReLU(x)|B| = ReLU(|B| x)
        w_u, w_s = w_user.astype(np.float64).T, w_song.astype(np.float64).T  # (d, d) each
        d = len(scale)
        offsets = np.zeros((n_users + 1, d + 1), np.float32)  # the appended 1 stays 1: 0 here
        total = np.zeros(d)
        for lo, hi in row_blocks(n_users):
            block = (user[lo:hi].astype(np.float64) @ w_u) * scale  # (rows, d)
            offsets[lo:hi, :d] = block
            total += block.sum(axis=0)
        offsets[n_users, :d] = total / max(n_users, 1)  # row n_users: the unknown user's mean
        queries = np.ones((len(song), d + 1), np.float32)
        members = np.empty((len(song), d + 1), np.float32)
        for lo, hi in row_blocks(len(song)):
            s = song[lo:hi].astype(np.float64)
            queries[lo:hi, :d] = (s @ w_s + bias) * scale
            s *= scale
            members[lo:hi, :d] = sign * 2.0 * s
            members[lo:hi, d] = -sign * np.square(s).sum(axis=1)
        return offsets, queries, members

    out = memory(
        mass.user, mass.song, mass.query_user, mass.query_song, mass.query_bias, mass.metric, -1.0
    )
    att = memory(
        mass.att_user,
        mass.att_song,
        mass.att_query_user,
        mass.att_query_song,
        mass.att_query_bias,
        mass.att_metric,
        1.0,
    )
    return MemoryTables(*out, *att)


def mass_distance(
    g: Graph,
    mass: MASSWeights,
    users: str,
    members: str,
    n_users: int,
    V: int,
    chunk: int,
    pad_cols: int,
) -> str:
    """MASS distances (eq. 19) of every song for every row: (B, V + pad) (module docstring)."""
    i64 = np.int64
    d = mass.song.shape[1]
    chunk = max(1, min(chunk, V + pad_cols))
    n_chunks = math.ceil((V + pad_cols) / chunk)
    v_pad = n_chunks * chunk
    zero_i, ax1, ax2, ax3 = g.ints(), g.ints(1), g.ints(2), g.ints(3)

    t = memory_tables(mass, n_users)

    def by_chunk(queries: np.ndarray) -> np.ndarray:
        """(V, d+1) per-song query constants, padded to whole chunks and transposed by chunk
        (n_chunks, d+1, chunk), written straight into that layout (no padded copy); the
        appended 1 stays 1 in the padding too."""
        out = np.zeros((n_chunks, d + 1, chunk), np.float32)
        rows = out.transpose(0, 2, 1)  # (n_chunks, chunk, d+1): a view of out
        full = V // chunk
        rows[:full] = queries[: full * chunk].reshape(full, chunk, d + 1)
        if V > full * chunk:
            rows[full, : V - full * chunk] = queries[full * chunk :]
        out[:, d, :] = 1.0
        return out

    out_off, out_q, out_m = t.out_offsets, by_chunk(t.out_queries), t.out_members
    att_off, att_q, att_m = t.att_offsets, by_chunk(t.att_queries), t.att_members
    bias = np.zeros(v_pad, np.float32)
    bias[:V] = mass.song_bias
    bias = bias.reshape(n_chunks, 1, chunk)

    # group the rows by user: each user's queries are built once (unknown users share the mean)
    uniq, _, inverse, counts = g.op("Unique", users, sorted=1, n_out=4)  # (U,), (B,), (U,)
    n_groups = g.op("Shape", uniq)  # [U]
    inv_col = g.op("Unsqueeze", inverse, ax1)  # (B, 1)
    group_ids = g.op("Range", zero_i, g.op("Squeeze", n_groups), g.const("step", 1, i64))
    group_ids = g.op("Unsqueeze", group_ids, g.ints(0))  # (1, U)
    onehot = g.op("Cast", g.op("Equal", inv_col, group_ids), to=TensorProto.INT64)  # (B, U)
    rank = g.op("GatherElements", g.op("CumSum", onehot, zero_i), inv_col, axis=1)  # (B, 1)
    slot = g.op("Sub", rank, g.const("one", 1, i64))  # (B, 1) position within its user group
    where = g.op("Concat", inv_col, slot, axis=1, hint="group_slot")  # (B, 2)
    n_rows = g.op("ReduceMax", counts, keepdims=1)  # [R] most playlists of one user
    n_slots = g.op("Slice", g.op("Shape", members), g.ints(1), g.ints(2))  # [L]
    grid_shape = g.op("Concat", n_groups, n_rows, n_slots, axis=0)  # [U, R, L]
    grid = g.op("Expand", g.const("minus_one", UNKNOWN, i64), grid_shape)
    grouped = g.op("ScatterND", grid, where, members, hint="grouped_members")  # (U, R, L)
    g_real = g.op("GreaterOrEqual", grouped, zero_i)  # (U, R, L)
    g_safe = g.op("Where", g_real, grouped, zero_i)
    g_real_f = g.op("Cast", g_real, to=TensorProto.FLOAT)
    g_has = g.op("Cast", g.op("ReduceMax", g_real_f, ax2, keepdims=1), to=TensorProto.BOOL)
    # slots of a row without any member stay open (uniform, harmless) so no softmax sees only -inf
    g_open = g.op("Or", g_real, g.op("Not", g_has))  # (U, R, L)
    flat_shape = g.ints(0, -1, d + 1)

    def member_factors(table: np.ndarray, hint: str, attention: bool) -> str:
        rows = g.op("Gather", g.const(hint, f32(table)), g_safe, axis=0)  # (U, R, L, d+1)
        if attention:  # closed slots: logit -inf
            closed = np.zeros(d + 1, dtype=np.float32)
            closed[d] = -np.inf
            keep = g.op("Unsqueeze", g_open, ax3)
            rows = g.op("Where", keep, rows, g.const(f"{hint}_closed", closed))
        else:  # padded slots contribute nothing
            rows = g.op("Mul", rows, g.op("Unsqueeze", g_real_f, ax3))
        return g.op("Reshape", rows, flat_shape, hint=f"{hint}_flat")  # (U, RL, d+1)

    m_out = member_factors(out_m, "mass_member", attention=False)
    m_att = member_factors(att_m, "mass_att_member", attention=True)
    known = g.op("GreaterOrEqual", uniq, zero_i)
    user_rows = g.op("Where", known, uniq, g.const("unknown_row", n_users, i64))  # (U,)

    def offsets(table: np.ndarray, hint: str) -> str:
        rows = g.op("Gather", g.const(hint, f32(table)), user_rows, axis=0)  # (U, d+1)
        return g.op("Unsqueeze", rows, ax2, hint=f"{hint}_u")  # (U, d+1, 1)

    a_out, a_att = offsets(out_off, "mass_user"), offsets(att_off, "mass_att_user")
    # (U, R, 1) 1 where the row has a member (else only the song bias remains)
    has_f = g.op("Cast", g_has, to=TensorProto.FLOAT)
    slots_shape = g.op("Concat", n_groups, n_rows, n_slots, g.ints(chunk), axis=0)
    out_q_c, att_q_c, bias_c = (
        g.const("mass_queries", f32(out_q)),
        g.const("mass_att_queries", f32(att_q)),
        g.const("mass_bias", f32(bias)),
    )

    # the loop body: one chunk of C = `chunk` songs (i is the chunk number). Queries are kept
    # transposed, (U, d+1, C), so every product and reduction below runs along contiguous song
    # vectors and the GEMMs give (U, RL, C) directly (a softmax over rows of L ~ 10 is slow).
    b = Graph(prefix="chunk_", shared=g)
    i = "i"
    norm_row = np.ones((1, d + 1), dtype=np.float32)
    norm_row[0, d] = 0.0  # the appended 1 is not part of the query
    norm_row_c = g.const("norm_row", norm_row)
    q = b.op("Relu", b.op("Add", b.op("Gather", out_q_c, i, axis=0), a_out), hint="q")  # eq. 12
    q_norm = b.op("MatMul", norm_row_c, b.op("Mul", q, q))  # (U, 1, C) |B3⊙q|²
    d_out = b.op("Reshape", b.op("MatMul", m_out, q), slots_shape, hint="d_out")  # eqs. 14-15
    q_att = b.op("Relu", b.op("Add", b.op("Gather", att_q_c, i, axis=0), a_att))  # eq. 16
    # -eq. 17 plus a per-song constant (cancels in the softmin)  (U, R, L, C)
    logits = b.op("Reshape", b.op("MatMul", m_att, q_att), slots_shape, hint="logits")
    # eq. 18: α = softmax over the member slots (axis 2), shifted by the max for stability
    shifted = b.op("Sub", logits, b.op("ReduceMax", logits, g.ints(2), keepdims=1))
    weights = b.op("Exp", shifted)  # (U, R, L, C)
    total = b.op("ReduceSum", weights, g.ints(2), keepdims=0)  # (U, R, C)
    pooled = b.op("ReduceSum", b.op("Mul", weights, d_out), g.ints(2), keepdims=0)
    pooled = b.op("Div", pooled, total)  # Σ_t α_t (d²_t - |B3⊙q|²)
    o_chunk = b.op("Add", b.op("Mul", q_norm, has_f), pooled)  # (U, R, C)
    o_chunk = b.op("Add", o_chunk, b.op("Gather", bias_c, i, axis=0))  # eq. 19: + b_k
    b.nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    b.nodes.append(helper.make_node("Identity", [o_chunk], ["o_chunk"]))
    body = helper.make_graph(
        b.nodes,
        "chunk",
        [
            helper.make_tensor_value_info(i, TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("o_chunk", TensorProto.FLOAT, None),
        ],
    )
    stacked = g.op(
        "Loop", g.const("n_chunks", n_chunks, i64), g.const("true", True, np.bool_), body=body
    )  # (n_chunks, U, R, C)
    per_row = g.op("Transpose", stacked, perm=[1, 2, 0, 3])  # (U, R, n_chunks, C)
    per_row = g.op("Reshape", per_row, g.ints(0, 0, -1))  # (U, R, V_pad)
    o = g.op("GatherND", per_row, where)  # (B, V_pad) back to the input rows
    return g.op("Slice", o, g.ints(0), g.ints(V + pad_cols), ax1)  # (B, V + pad)
