"""Export MDR, MASS or their fusion MASR / AMASR (eq. 20) to one self-contained ONNX file.

The graph scores the whole catalog for a batch of playlists and returns the K best songs:

    inputs   users (B,) int64, playlists (B,) int64   -1 = unknown (fold-in, below)
             members (B, L) int64                    the playlist's songs, -1 = padding
             k () int64                              how many songs to return (<= catalog size)
    outputs  songs (B, K) int64                      catalog song indices, best first
             scores (B, K) float32                   -(fused distance): higher is better;
                                                     -inf only when fewer than K songs remain

    o = α o_MDR + (1 - α) o_MASS                      (eq. 20; α = 1 for MDR, 0 for MASS)

Member songs are never returned (their distance is set to +inf before the top-K).

Fold-in (users and playlists the model never saw):
* unknown playlist: p = mean of its members' MDR song vectors, the exact minimiser of
  Σ_t |B2 ⊙ (p - s_t)|² (the playlist term of eq. 11 summed over its songs);
* unknown user, MDR: by default the same mean over the playlist's members (``unknown_user =
  "members"``, the minimiser of Σ_t |B1 ⊙ (u - s_t)|²); ``"drop"`` leaves the user term out.
  exported/README.md reports the measurement behind the default;
* unknown user, MASS: the mean of each memory's user table (eqs. 12 and 16 are affine in u, so
  this is the mean of the per-user query offsets);
* no usable member: the MDR terms that have no vector are dropped (a new playlist keeps its
  user term, an unknown user with no song has none), and MASS falls back to its song bias b_s
  (eq. 19 with no attention), so such a playlist ranks by user taste, then by popularity.

Speed (GEMM form, everything that does not depend on the playlist precomputed as constants):
* MDR (eq. 11): |B1⊙(u-s)|² + |B2⊙(p-s)|² + θ_s = [B1²⊙u + B2²⊙p, 1, 1, 1] · [-2s; |B1⊙s|²;
  |B2⊙s|²; θ_s] + |B1⊙u|² + |B2⊙p|²: one (B, d+3) x (d+3, V) product.
* MASS (eqs. 12-19): the queries depend on the user and the candidate only,
  q_k = ReLU(W1_u u + (W1_s s_k + b1)), so (S W1_s^T + b1) is a constant and the rows of the
  batch are grouped by user: each user's queries are built once per song chunk and compared
  with all member slots of all its playlists in one batched GEMM. With |B3| folded into the
  constants (ReLU(x)|B3| = ReLU(|B3| x)) and a constant 1 appended to every query:
      d²_kt = |B3⊙q_k|² + q̃_k · [-2|B3|⊙s_t; |B3⊙s_t|²]              (eqs. 14-15)
      logit_kt = q̃^(a)_k · [2|B4|⊙s^(a)_t; -|B4⊙s^(a)_t|²]           (eqs. 17-18, the
                 per-k term |B4⊙q^(a)_k|² cancels in the softmin; padded slots get -inf)
      o_k = |B3⊙q_k|² + Σ_t α_kt (d²_kt - |B3⊙q_k|²) + b_k            (eq. 19, Σ_t α_kt = 1)
  The catalog is walked in cache-sized chunks by an ONNX Loop, so no (B, V, d) tensor exists.

This module needs torch (it reads checkpoints); scoring (``masr.score``) does not.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import polars as pl
from onnx import TensorProto, helper, numpy_helper

from masr import __version__
from masr.atomic import atomic_file, atomic_path
from masr.errors import MasrError

if TYPE_CHECKING:
    from torch import Tensor

    from masr.models.base import Recommender

#: ONNX opset of the graph (ReduceSum/ReduceSumSquare take axes as inputs from opset 18).
OPSET = 18
#: IR version 8 keeps the file loadable by ONNX Runtime >= 1.14 (newer onnx writes IR 10+).
IR_VERSION = 8
#: Index meaning "not in the model" for users and playlists, and padding for members.
UNKNOWN = -1
FORMAT = "masr-onnx"
FORMAT_VERSION = 1
#: --model choices: the fusions first, then single parts.
KINDS = ("amasr", "masr", "mdr", "mass", "amdr", "amass")
UNKNOWN_USER_MODES = ("members", "drop")
#: What each kind is made of: (MDR-like run, MASS-like run, fusion run).
_KIND_RUNS: dict[str, tuple[str | None, str | None, str | None]] = {
    "amasr": ("amdr", "amass", "amasr"),
    "masr": ("mdr", "mass", "masr"),
    "mdr": ("mdr", None, None),
    "mass": (None, "mass", None),
    "amdr": ("amdr", None, None),
    "amass": (None, "amass", None),
}
ID_MAPS = ("songs", "playlists", "users")


@dataclass
class ExportConfig:
    """What ``masr export`` builds (the CLI fills it from its options)."""

    model: str | None = None  # one of KINDS; None: amasr when its parts exist, else masr
    alpha: float | None = None  # eq. 20's MDR weight; None: the fusion run's, else 0.5
    chunk: int = 256  # catalog songs per MASS step: cache-sized (fastest measured on CPU)
    unknown_user: str = "members"  # MDR user term of an unknown user: "members" or "drop"
    data: Path | None = None  # prepared data for the id maps; None: found through run.json

    def validate(self) -> None:
        if self.model is not None and self.model not in KINDS:
            raise MasrError(f"--model {self.model}: choose one of {', '.join(KINDS)}")
        if self.alpha is not None and not (0.0 <= self.alpha <= 1.0):
            raise MasrError(f"--alpha {self.alpha}: must be between 0 and 1")
        if self.chunk < 1:
            raise MasrError(f"--chunk {self.chunk}: must be >= 1")
        if self.unknown_user not in UNKNOWN_USER_MODES:
            raise MasrError(
                f"unknown_user {self.unknown_user!r}: choose one of {UNKNOWN_USER_MODES}"
            )


# -- weights as NumPy arrays (the graph builder never sees torch) -----------------------------


@dataclass
class MDRWeights:
    """MDR's tensors (eq. 11), float32."""

    user: np.ndarray  # (n_users, d) u
    playlist: np.ndarray  # (n_playlists, d) p
    song: np.ndarray  # (V, d) s
    song_bias: np.ndarray  # (V,) θ_s
    metric_user: np.ndarray  # (d,) B1
    metric_playlist: np.ndarray  # (d,) B2


@dataclass
class MASSWeights:
    """MASS's tensors (eqs. 12-19), float32; ``att_*`` is the attention memory."""

    user: np.ndarray  # (n_users, d) U
    song: np.ndarray  # (V, d) S
    query_weight: np.ndarray  # (d, 2d) W1 acting on [u; s]
    query_bias: np.ndarray  # (d,) b1
    metric: np.ndarray  # (d,) B3
    song_bias: np.ndarray  # (V,) b_s
    att_user: np.ndarray  # (n_users, d) U^(a)
    att_song: np.ndarray  # (V, d) S^(a)
    att_query_weight: np.ndarray  # (d, 2d) W2
    att_query_bias: np.ndarray  # (d,) b2
    att_metric: np.ndarray  # (d,) B4


def _np(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu").float().numpy().copy()


def mdr_weights(model: Recommender) -> MDRWeights:
    """The tensors of an ``masr.models.mdr.MDR``."""
    return MDRWeights(
        user=_np(model.user_emb.weight),
        playlist=_np(model.playlist_emb.weight),
        song=_np(model.song_emb.weight),
        song_bias=_np(model.song_bias.weight).reshape(-1),
        metric_user=_np(model.metric_user),
        metric_playlist=_np(model.metric_playlist),
    )


def mass_weights(model: Recommender) -> MASSWeights:
    """The tensors of an ``masr.models.mass.MASS``."""
    return MASSWeights(
        user=_np(model.user_emb.weight),
        song=_np(model.song_emb.weight),
        query_weight=_np(model.query.weight),
        query_bias=_np(model.query.bias),
        metric=_np(model.metric),
        song_bias=_np(model.song_bias.weight).reshape(-1),
        att_user=_np(model.att_user_emb.weight),
        att_song=_np(model.att_song_emb.weight),
        att_query_weight=_np(model.att_query.weight),
        att_query_bias=_np(model.att_query.bias),
        att_metric=_np(model.att_metric),
    )


# -- graph building -----------------------------------------------------------------------------


class _Graph:
    """A small builder over ``onnx.helper``: unique names, constants, one call per node."""

    def __init__(self, prefix: str = "", shared: _Graph | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._prefix = prefix
        self._count = 0
        self._ints: dict[tuple, str] = {}
        self._outer = shared  # a Loop body puts its constants in the outer graph

    def ints(self, *values: int) -> str:
        """A shared int64 constant: ``ints(1)`` is [1] (axes, shapes), ``ints()`` is scalar 0."""
        if self._outer is not None:
            return self._outer.ints(*values)
        key = values
        if key not in self._ints:
            value = np.array(values, dtype=np.int64) if values else np.array(0, dtype=np.int64)
            self._ints[key] = self.const("i" + "_".join(str(v) for v in values), value)
        return self._ints[key]

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self._prefix}{hint}_{self._count}"

    def const(self, hint: str, value: Any, dtype: Any = None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.name(hint)
        # copy(order="C"), not ascontiguousarray: that would turn a scalar into shape (1,)
        self.initializers.append(numpy_helper.from_array(array.copy(order="C"), name))
        return name

    def op(self, op_type: str, *inputs: str, n_out: int = 1, hint: str | None = None, **attrs: Any):
        outputs = [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs[0] if n_out == 1 else outputs


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def build_graph(
    mdr: MDRWeights | None,
    mass: MASSWeights | None,
    alpha: float,
    *,
    n_users: int,
    n_playlists: int,
    n_songs: int,
    chunk: int = 256,
    unknown_user: str = "members",
) -> onnx.ModelProto:
    """The scoring graph (module docstring) for the given parts; at least one part is needed.

    With both parts the distance is eq. 20's α o_MDR + (1-α) o_MASS; with one part, that part's."""
    if mdr is None and mass is None:
        raise ValueError("build_graph needs MDR weights, MASS weights or both")
    w_mdr = alpha if mass is not None else 1.0
    w_mass = (1.0 - alpha) if mdr is not None else 1.0
    V = n_songs
    g = _Graph()
    i64 = np.int64

    users, playlists, members, k = "users", "playlists", "members", "k"
    zero_i, ax1, ax2 = g.ints(), g.ints(1), g.ints(2)

    # member slots: real (B, L) bool, safe indices (padding -> 0), counts (B, 1)
    real = g.op("GreaterOrEqual", members, zero_i, hint="real")
    safe = g.op("Where", real, members, zero_i, hint="safe_members")
    real_f = g.op("Cast", real, to=TensorProto.FLOAT)
    n_real = g.op("ReduceSum", real_f, ax1, keepdims=1, hint="n_members")  # (B, 1)
    has_members = g.op("Greater", n_real, g.const("zero_f", 0.0, np.float32))  # (B, 1)
    # a padding column V (dropped before the top-K) receives the padded slots' exclusion
    pad_cols = 1
    distance = None  # (B, V + pad) fused distance

    if mdr is not None:
        d = mdr.song.shape[1]
        b1sq = _f32(np.square(mdr.metric_user))  # (d,) B1²
        b2sq = _f32(np.square(mdr.metric_playlist))  # (d,) B2²
        # constants of eq. 11 in GEMM form, times α: [-2s; |B1⊙s|²; |B2⊙s|²; θ_s] (d+3, V+pad)
        song = mdr.song.astype(np.float64)
        rhs = np.zeros((d + 3, V + pad_cols), dtype=np.float64)
        rhs[:d, :V] = -2.0 * song.T
        rhs[d, :V] = np.square(song) @ b1sq
        rhs[d + 1, :V] = np.square(song) @ b2sq
        rhs[d + 2, :V] = mdr.song_bias
        rhs *= w_mdr
        song_c = g.const("mdr_song", _f32(mdr.song))
        # fold-in vector: mean of the members' song vectors (B, d); zero when there is none
        s_members = g.op("Gather", song_c, safe, axis=0)  # (B, L, d)
        s_members = g.op("Mul", s_members, g.op("Unsqueeze", real_f, ax2))
        s_sum = g.op("ReduceSum", s_members, ax1, keepdims=0)  # (B, d)
        s_mean = g.op("Div", s_sum, g.op("Max", n_real, g.const("one_f", 1.0, np.float32)))

        def lookup(table: np.ndarray, index: str, hint: str) -> tuple[str, str]:
            known = g.op("GreaterOrEqual", index, zero_i, hint=f"known_{hint}")  # (B,)
            row = g.op("Where", known, index, zero_i)
            vec = g.op("Gather", g.const(f"mdr_{hint}", _f32(table)), row, axis=0)  # (B, d)
            return g.op("Unsqueeze", known, ax1), vec  # (B, 1) bool, (B, d)

        known_u, u_vec = lookup(mdr.user, users, "user")
        known_p, p_vec = lookup(mdr.playlist, playlists, "playlist")
        # unknown playlist: p = mean of the members (minimises Σ_t |B2⊙(p - s_t)|²)
        p_vec = g.op("Where", known_p, p_vec, s_mean, hint="p")
        has_p = g.op("Or", known_p, has_members)
        if unknown_user == "members":  # same minimiser for Σ_t |B1⊙(u - s_t)|²
            u_vec = g.op("Where", known_u, u_vec, s_mean, hint="u")
            has_u = g.op("Or", known_u, has_members)
        else:  # "drop": an unknown user contributes no term
            has_u = known_u
        f_u = g.op("Cast", has_u, to=TensorProto.FLOAT)  # (B, 1) 1 where the term exists
        f_p = g.op("Cast", has_p, to=TensorProto.FLOAT)
        b1sq_c, b2sq_c = g.const("b1sq", b1sq), g.const("b2sq", b2sq)
        wu = g.op("Mul", g.op("Mul", u_vec, b1sq_c), f_u)  # (B, d) f_u B1²⊙u
        wp = g.op("Mul", g.op("Mul", p_vec, b2sq_c), f_p)  # (B, d) f_p B2²⊙p
        ones = g.op("Expand", g.const("ones", [[1.0]], np.float32), g.op("Shape", f_u))
        lhs = g.op("Concat", g.op("Add", wu, wp), f_u, f_p, ones, axis=1)  # (B, d+3)
        # row constant α (f_u |B1⊙u|² + f_p |B2⊙p|²)  (B, 1)
        u_norm = g.op("MatMul", g.op("Mul", u_vec, u_vec), g.const("b1sq_col", b1sq[:, None]))
        p_norm = g.op("MatMul", g.op("Mul", p_vec, p_vec), g.const("b2sq_col", b2sq[:, None]))
        row = g.op("Add", g.op("Mul", u_norm, f_u), g.op("Mul", p_norm, f_p))
        row = g.op("Mul", row, g.const("w_mdr", w_mdr, np.float32))
        # eq. 11 (times α) for every song: (B, V+pad)
        distance = g.op(
            "Add", g.op("MatMul", lhs, g.const("mdr_rhs", _f32(rhs))), row, hint="o_mdr"
        )

    if mass is not None:
        o_mass = _mass_subgraph(g, mass, users, members, n_users, V, chunk, pad_cols)
        o_mass = g.op("Mul", o_mass, g.const("w_mass", w_mass, np.float32), hint="o_mass")
        distance = o_mass if distance is None else g.op("Add", distance, o_mass, hint="o")

    # members are never recommended: +inf distance (padding slots hit the dropped column V)
    slot_cols = g.op("Where", real, members, g.const("pad_col", V, i64))
    inf = g.op("Expand", g.const("inf", np.inf, np.float32), g.op("Shape", slot_cols))
    distance = g.op("ScatterElements", distance, slot_cols, inf, axis=1, hint="excluded")
    distance = g.op("Slice", distance, g.ints(0), g.ints(V), ax1)  # (B, V)
    k_eff = g.op("Min", g.op("Reshape", k, g.ints(1)), g.ints(V))
    best, songs = g.op("TopK", distance, k_eff, axis=1, largest=0, sorted=1, n_out=2)
    g.nodes.append(helper.make_node("Neg", [best], ["scores"]))
    g.nodes.append(helper.make_node("Identity", [songs], ["songs"]))

    graph = helper.make_graph(
        g.nodes,
        "masr_top_k",
        [
            helper.make_tensor_value_info(users, TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info(playlists, TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info(members, TensorProto.INT64, ["batch", "members"]),
            helper.make_tensor_value_info(k, TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("songs", TensorProto.INT64, ["batch", "k"]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "k"]),
        ],
        _used(g),
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="masr",
        producer_version=__version__,
        doc_string="masr playlist continuation: top-K songs per playlist (see the metadata)",
    )
    return model


def _used(g: _Graph) -> list[onnx.TensorProto]:
    """Initializers some node (or Loop body) reads."""
    used: set[str] = set()

    def visit(nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            used.update(node.input)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(list(attr.g.node))

    visit(g.nodes)
    return [t for t in g.initializers if t.name in used]


def _mass_subgraph(
    g: _Graph,
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

    def memory(
        user: np.ndarray, song: np.ndarray, weight: np.ndarray, bias: np.ndarray, metric: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-user offsets |B|⊙(W_u u) with the unknown user's mean appended (n_users+1, d+1),
        per-song query constants [|B|⊙(W_s s + b), 1], transposed by chunk (n_chunks, d+1,
        chunk), and |B|⊙s (V, d)."""
        scale = np.abs(metric.astype(np.float64))  # |B|: ReLU(x)|B| = ReLU(|B| x)
        w_u, w_s = weight[:, :d].astype(np.float64), weight[:, d:].astype(np.float64)
        offsets = (user.astype(np.float64) @ w_u.T) * scale  # (n_users, d)
        offsets = np.vstack([offsets, offsets.mean(axis=0, keepdims=True)])  # row n_users: unknown
        offsets = np.hstack([offsets, np.zeros((n_users + 1, 1))])  # the appended 1 stays 1
        queries = np.zeros((v_pad, d + 1))
        queries[:V, :d] = (song.astype(np.float64) @ w_s.T + bias) * scale
        queries[:, d] = 1.0
        by_chunk = queries.reshape(n_chunks, chunk, d + 1).transpose(0, 2, 1)
        return offsets, by_chunk, song.astype(np.float64) * scale

    out_off, out_q, out_s = memory(
        mass.user, mass.song, mass.query_weight, mass.query_bias, mass.metric
    )
    att_off, att_q, att_s = memory(
        mass.att_user, mass.att_song, mass.att_query_weight, mass.att_query_bias, mass.att_metric
    )
    # member-side factors: output [-2|B3|⊙s_t; |B3⊙s_t|²], attention [2|B4|⊙s_t; -|B4⊙s_t|²]
    out_m = np.hstack([-2.0 * out_s, np.square(out_s).sum(1, keepdims=True)])  # (V, d+1)
    att_m = np.hstack([2.0 * att_s, -np.square(att_s).sum(1, keepdims=True)])  # (V, d+1)
    bias = np.zeros(v_pad)
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
        rows = g.op("Gather", g.const(hint, _f32(table)), g_safe, axis=0)  # (U, R, L, d+1)
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
        rows = g.op("Gather", g.const(hint, _f32(table)), user_rows, axis=0)  # (U, d+1)
        return g.op("Unsqueeze", rows, ax2, hint=f"{hint}_u")  # (U, d+1, 1)

    a_out, a_att = offsets(out_off, "mass_user"), offsets(att_off, "mass_att_user")
    # (U, R, 1) 1 where the row has a member (else only the song bias remains)
    has_f = g.op("Cast", g_has, to=TensorProto.FLOAT)
    slots_shape = g.op("Concat", n_groups, n_rows, n_slots, g.ints(chunk), axis=0)
    out_q_c, att_q_c, bias_c = (
        g.const("mass_queries", _f32(out_q)),
        g.const("mass_att_queries", _f32(att_q)),
        g.const("mass_bias", _f32(bias)),
    )

    # the loop body: one chunk of C = `chunk` songs (i is the chunk number). Queries are kept
    # transposed, (U, d+1, C), so every product and reduction below runs along contiguous song
    # vectors and the GEMMs give (U, RL, C) directly (a softmax over rows of L ~ 10 is slow).
    b = _Graph(prefix="chunk_", shared=g)
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


# -- from the runs directory to exported/ ---------------------------------------------------------


@dataclass
class Source:
    """One checkpoint the export reads."""

    role: str  # "mdr", "mass" or "fusion"
    run: str
    path: Path

    def describe(self, ckpt: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": self.role,
            "run": self.run,
            "path": str(self.path),
            "sha256": _sha256(self.path),
            "model": ckpt.get("model"),
            "config": ckpt.get("config"),
            "epoch": ckpt.get("epoch"),
            "valid": ckpt.get("valid"),
            "masr_version": ckpt.get("masr_version"),
        }


@dataclass
class ExportResult:
    """What ``export_model`` wrote."""

    path: Path
    metadata: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def sidecar(model_path: str | Path, what: str) -> Path:
    """The file next to the model: ``json`` or an id map (``songs``, ``playlists``, ``users``)."""
    model_path = Path(model_path)
    suffix = ".json" if what == "json" else f".{what}.parquet"
    return model_path.with_name(model_path.name + suffix)


def resolve_sources(runs_dir: str | Path, kind: str | None) -> tuple[str, list[Source]]:
    """(kind, checkpoints) to export: the parts' best checkpoints, else the fusion run's.

    Without ``kind``: AMASR when its parts (or its fusion run) exist, else MASR."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise MasrError(f"--runs {runs_dir}: no such directory; train first (masr train)")
    looked: list[str] = []
    for candidate in [kind] if kind else ["amasr", "masr"]:
        mdr_run, mass_run, fusion_run = _KIND_RUNS[candidate]
        parts = [(role, run) for role, run in (("mdr", mdr_run), ("mass", mass_run)) if run]
        paths = [(role, run, runs_dir / run / "best.pt") for role, run in parts]
        looked += [str(p) for _, _, p in paths]
        if all(p.is_file() for _, _, p in paths):
            return candidate, [Source(role, run, p) for role, run, p in paths]
        if fusion_run is not None:
            fused = runs_dir / fusion_run / "best.pt"
            looked.append(str(fused))
            if fused.is_file():
                return candidate, [Source("fusion", fusion_run, fused)]
    what = kind or "AMASR or MASR"
    raise MasrError(
        f"--runs {runs_dir}: no trained {what} (looked for {', '.join(looked)}); "
        f"train it first: masr train --model {kind or 'amasr'}"
    )


def load_sources(
    sources: list[Source],
) -> tuple[Recommender | None, Recommender | None, float | None, list[dict[str, Any]], str]:
    """(MDR part, MASS part, the fusion run's α or None, source descriptions, data fingerprint)."""
    from masr.checkpoint import build_model, load_checkpoint

    mdr = mass = None
    alpha: float | None = None
    described, fingerprints = [], set()
    for source in sources:
        ckpt = load_checkpoint(source.path)
        described.append(source.describe(ckpt))
        fingerprints.add(str(ckpt.get("data_fingerprint")))
        model = build_model(ckpt)
        expected = {"mdr": "mdr", "mass": "mass", "fusion": "masr"}[source.role]
        if model.name != expected:
            raise MasrError(f"{source.path}: holds a {model.name} model, expected {expected}")
        if source.role == "mdr":
            mdr = model
        elif source.role == "mass":
            mass = model
        else:
            mdr, mass = model.mdr, model.mass
            alpha = float(model.config.alpha)
    if len(fingerprints) > 1:
        paths = ", ".join(str(s.path) for s in sources)
        raise MasrError(f"{paths}: trained on different prepared data (fingerprints differ)")
    if mdr is not None and mass is not None:
        if (mdr.n_users, mdr.n_songs) != (mass.n_users, mass.n_songs):
            raise MasrError("the MDR and MASS checkpoints have different user or song counts")
    return mdr, mass, alpha, described, fingerprints.pop()


def locate_data(
    runs_dir: Path, sources: list[Source], fingerprint: str, override: Path | None
) -> Path:
    """The prepared-data directory the checkpoints were trained on (for the id maps).

    ``override`` (``--data``) when given; else the path each run recorded in run.json (as
    written, then relative to the runs directory's parent), then ``data/``. The manifest's
    fingerprint must equal the checkpoints'."""
    from masr.runs import read_run_json

    if override is not None:
        candidates = [Path(override)]
    else:
        candidates = []
        for source in sources:
            info = read_run_json(runs_dir / source.run) or {}
            recorded = (info.get("data") or {}).get("path")
            if recorded:
                candidates += [Path(recorded), runs_dir.resolve().parent / recorded]
        candidates.append(Path("data"))
    seen: list[str] = []
    for path in candidates:
        manifest = path / "manifest.json"
        if str(path) in seen or not manifest.is_file():
            seen.append(str(path))
            continue
        seen.append(str(path))
        try:
            found = json.loads(manifest.read_text()).get("fingerprint")
        except (OSError, ValueError):
            continue
        if found == fingerprint:
            return path
        if override is not None:
            raise MasrError(
                f"--data {path}: prepared data {found} is not the data the checkpoints were "
                f"trained on ({fingerprint})"
            )
    raise MasrError(
        f"no prepared data with fingerprint {fingerprint} (looked in {', '.join(seen)}); "
        "point to it with --data DIR"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _id_maps(data_dir: Path, n_songs: int) -> dict[str, pl.DataFrame]:
    """Index -> original id tables of the prepared data, restricted to the model's catalog."""
    try:
        songs = pl.read_parquet(data_dir / "songs.parquet")
        playlists = pl.read_parquet(data_dir / "playlists.parquet")
        users = pl.read_parquet(data_dir / "users.parquet")
    except Exception as exc:  # polars raises several types for missing or corrupt files
        raise MasrError(f"{data_dir}: cannot read the id tables ({exc})") from None
    songs = songs.filter(pl.col("song_idx") < n_songs).sort("song_idx")
    if songs.height != n_songs:
        raise MasrError(
            f"{data_dir}: songs.parquet has {songs.height} catalog songs, the model {n_songs}"
        )
    return {
        "songs": songs,
        "playlists": playlists.select("playlist_idx", "playlist_id", "user_idx").sort(
            "playlist_idx"
        ),
        "users": users.select("user_idx", "user_id").sort("user_idx"),
    }


def export_model(
    runs_dir: str | Path = "runs",
    out: str | Path = "exported/masr.onnx",
    config: ExportConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> ExportResult:
    """Export the runs' MDR/MASS parts to ``out`` plus its metadata JSON and id maps.

    Every file is written aside and renamed; parent folders are created."""
    config = config or ExportConfig()
    config.validate()
    say = log or (lambda _msg: None)
    runs_dir, out = Path(runs_dir), Path(out)
    if out.exists() and out.is_dir():
        raise MasrError(f"--out {out}: is a directory; give a file name (e.g. {out}/masr.onnx)")
    kind, sources = resolve_sources(runs_dir, config.model)
    say(f"exporting {kind} from {', '.join(str(s.path) for s in sources)}")
    mdr, mass, fused_alpha, described, fingerprint = load_sources(sources)
    if mdr is not None and mass is not None:
        alpha = next(a for a in (config.alpha, fused_alpha, 0.5) if a is not None)
    elif config.alpha is not None:
        raise MasrError(f"--alpha: {kind} is one part; α weights the parts of amasr/masr only")
    else:
        alpha = 1.0 if mass is None else 0.0
    part = mdr if mdr is not None else mass
    sizes = part.sizes()
    data_dir = locate_data(runs_dir, sources, fingerprint, config.data)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    maps = _id_maps(data_dir, sizes["n_songs"])
    for name, frame, expected in (
        ("playlists", maps["playlists"], sizes["n_playlists"]),
        ("users", maps["users"], sizes["n_users"]),
    ):
        if frame.height != expected:
            raise MasrError(
                f"{data_dir}: {name}.parquet has {frame.height} rows, the model {expected}"
            )

    graph = build_graph(
        mdr_weights(mdr) if mdr is not None else None,
        mass_weights(mass) if mass is not None else None,
        alpha,
        chunk=config.chunk,
        unknown_user=config.unknown_user,
        **sizes,
    )
    files: list[Path] = []
    id_maps: dict[str, dict[str, Any]] = {}
    for name in ID_MAPS:
        path = sidecar(out, name)
        with atomic_path(path) as tmp:
            maps[name].write_parquet(tmp)
            id_maps[name] = {"file": path.name, "rows": maps[name].height, "sha256": _sha256(tmp)}
        files.append(path)

    dims = {}
    if mdr is not None:
        dims["mdr"] = int(mdr.config.dim)
    if mass is not None:
        dims["mass"] = int(mass.config.dim)
    metadata: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": kind,
        "alpha": alpha,
        "dims": dims,
        "sizes": sizes,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "chunk": config.chunk,
        "unknown_user": config.unknown_user,
        "unknown_index": UNKNOWN,
        "inputs": {
            "users": "int64 (B,) user index, -1 = unknown",
            "playlists": "int64 (B,) playlist index, -1 = unknown (fold-in)",
            "members": "int64 (B, L) member song indices, -1 = padding",
            "k": "int64 scalar, songs per playlist",
        },
        "outputs": {
            "songs": "int64 (B, K) song indices, best first",
            "scores": "float32 (B, K) negated fused distance, higher is better",
        },
        "sources": described,
        "data": {
            "fingerprint": fingerprint,
            "checksum": manifest.get("checksum"),
            "path": str(data_dir),
            "input": manifest.get("input"),
        },
        "id_maps": id_maps,
        "masr_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    identity = json.dumps(
        [metadata["sources"], alpha, config.chunk, config.unknown_user, id_maps], sort_keys=True
    )
    metadata["export_id"] = hashlib.sha256(identity.encode()).hexdigest()[:16]
    for key, value in metadata.items():  # every value JSON-encoded (strings quoted)
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.checker.check_model(graph, full_check=True)

    with atomic_path(out) as tmp:
        onnx.save_model(graph, tmp)
    files.insert(0, out)
    meta_path = sidecar(out, "json")
    with atomic_file(meta_path, "w") as fh:
        json.dump(metadata, fh, indent=2)
        fh.write("\n")
    files.insert(1, meta_path)
    size_mb = os.path.getsize(out) / 1e6
    say(f"wrote {out} ({size_mb:.1f} MB), {meta_path.name} and the id maps")
    return ExportResult(path=out, metadata=metadata, files=files)


def metadata_of(model: onnx.ModelProto) -> dict[str, Any]:
    """The masr metadata stored in an ONNX model's ``metadata_props`` (values JSON-decoded)."""
    return {entry.key: json.loads(entry.value) for entry in model.metadata_props}


__all__ = [
    "KINDS",
    "ExportConfig",
    "ExportResult",
    "build_graph",
    "export_model",
    "mass_weights",
    "mdr_weights",
    "metadata_of",
    "sidecar",
]
