"""The scoring graph: inputs, MDR's eq. 11, eq. 20's fusion with MASS, member exclusion, top-K.

MDR (eq. 11) in GEMM form, everything that does not depend on the playlist a constant:

    |B1⊙(u-s)|² + |B2⊙(p-s)|² + θ_s = [B1²⊙u + B2²⊙p, 1, 1, 1] · [-2s; |B1⊙s|²; |B2⊙s|²; θ_s]
                                      + |B1⊙u|² + |B2⊙p|²

one (B, d+3) x (d+3, V) product. Fold-in of what the model never saw:
* unknown playlist: with the fitted maps of ``masr.foldin`` (``masr export``'s default),
  p = [m, u, 1] · W_u for a known user u and [m, 1] · W_0 otherwise, m the mean of its members'
  song vectors; without them (``--fold-in mean``), p = m, the exact minimiser of
  Σ_t |B2 ⊙ (p - s_t)|² (the playlist term of eq. 11 summed over its songs);
* unknown user: by default from the same songs (``unknown_user = "members"``): with the maps,
  u = [m, 1] · W_user; without them u = m, the minimiser of Σ_t |B1 ⊙ (u - s_t)|²; ``"drop"``
  leaves the user term out. exported/README.md reports the measurements behind the defaults;
* no usable member: the terms that have no vector are dropped (a new playlist keeps its user
  term, an unknown user with no song has none).

MASS's part lives in ``mass_graph``; both write into one ``onnx_builder.Graph``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from masr import __version__
from masr.config import EXPORT_CHUNK
from masr.export.external import embed
from masr.export.mass_graph import mass_distance, row_blocks
from masr.export.onnx_builder import Graph, f32
from masr.export.two_stage import mass_on_candidates
from masr.export.weights import MASSWeights, MDRWeights
from masr.foldin import FoldInMaps
from masr.onnx_format import CANDIDATES, INPUTS, IR_VERSION, OPSET, OUTPUTS, UNKNOWN


def build_graph(*args: Any, **kwargs: Any) -> onnx.ModelProto:
    """The scoring graph (``masr.export``'s docstring), every tensor inside the returned model:
    ``graph_and_arrays`` with the same arguments, its arrays then embedded."""
    model, arrays = graph_and_arrays(*args, **kwargs)
    embed(model, arrays)
    return model


def graph_and_arrays(
    mdr: MDRWeights | None,
    mass: MASSWeights | None,
    alpha: float,
    *,
    n_users: int,
    n_playlists: int,
    n_songs: int,
    chunk: int = EXPORT_CHUNK,
    unknown_user: str = "members",
    candidates: int | None = None,
    fold_in: FoldInMaps | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The scoring graph for the given parts (at least one), its constants' initializers as
    shells, and their data by name: ``masr.export.external`` then embeds them (``embed``, what
    ``build_graph`` does) or writes them to a weights file (``write_arrays``) without ever
    holding a second copy of the tables.

    With both parts the distance is eq. 20's α o_MDR + (1-α) o_MASS; with one part, that part's.
    ``candidates`` N (both parts needed) builds the two-stage graph instead (``two_stage``): MDR
    proposes N songs per row, the fusion re-ranks them; N is the default of an extra input.
    ``fold_in``: the maps that fold a new playlist into MDR (None: the mean of its songs)."""
    if mdr is None and mass is None:
        raise ValueError("build_graph needs MDR weights, MASS weights or both")
    w_mdr = alpha if mass is not None else 1.0
    w_mass = (1.0 - alpha) if mdr is not None else 1.0
    V = n_songs
    g = Graph()
    users, playlists, members_input, k = INPUTS

    zero_i, ax1 = g.ints(), g.ints(1)
    g.ints(2)  # made first, as before (names follow the order things are made)
    members = _one_slot_at_least(g, members_input)  # (B, max(L, 1))
    # member slots: real (B, max(L, 1)) bool, safe indices (padding -> 0), counts (B, 1)
    real = g.op("GreaterOrEqual", members, zero_i, hint="real")
    safe = g.op("Where", real, members, zero_i, hint="safe_members")
    real_f = g.op("Cast", real, to=TensorProto.FLOAT)
    n_real = g.op("ReduceSum", real_f, ax1, keepdims=1, hint="n_members")  # (B, 1)
    has_members = g.op("Greater", n_real, g.const("zero_f", 0.0, np.float32))  # (B, 1)
    members_in = _Members(safe, real_f, n_real, has_members)
    # a padding column V (dropped before the top-K) receives the padded slots' exclusion
    pad_cols = 1
    distance = None  # (B, V + pad) fused distance

    inputs = [
        helper.make_tensor_value_info(users, TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info(playlists, TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info(members_input, TensorProto.INT64, ["batch", "members"]),
        helper.make_tensor_value_info(k, TensorProto.INT64, []),
    ]
    if candidates is not None:
        if mdr is None or mass is None:
            raise ValueError("a two-stage graph needs both parts (MDR proposes, MASR re-ranks)")
        best, songs = _two_stage(
            g, mdr, mass, alpha, members, members_in, real, n_users, V, unknown_user, fold_in
        )
        # the optional input: an initializer of the same name is its default (the export's N)
        (name,) = CANDIDATES
        inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, []))
        g.initializers.append(numpy_helper.from_array(np.array(candidates, np.int64), name))
    else:
        if mdr is not None:
            distance = _mdr_distance(
                g, mdr, w_mdr, members_in, V + pad_cols, unknown_user, fold_in
            )

        if mass is not None:
            o_mass = mass_distance(g, mass, users, members, n_users, V, chunk, pad_cols)
            o_mass = g.op("Mul", o_mass, g.const("w_mass", w_mass, np.float32), hint="o_mass")
            # eq. 20: o = α o_MDR + (1 - α) o_MASS (the weights are folded in above)
            distance = o_mass if distance is None else g.op("Add", distance, o_mass, hint="o")

        distance = _exclude_members(g, distance, members, real, V)  # (B, V)
        k_eff = g.op("Min", g.op("Reshape", k, g.ints(1)), g.ints(V))
        best, songs = g.op("TopK", distance, k_eff, axis=1, largest=0, sorted=1, n_out=2)
    out_songs, out_scores = OUTPUTS
    g.nodes.append(helper.make_node("Neg", [best], [out_scores]))
    g.nodes.append(helper.make_node("Identity", [songs], [out_songs]))

    graph = helper.make_graph(
        g.nodes,
        "masr_top_k",
        inputs,
        [
            helper.make_tensor_value_info(out_songs, TensorProto.INT64, ["batch", "k"]),
            helper.make_tensor_value_info(out_scores, TensorProto.FLOAT, ["batch", "k"]),
        ],
        g.used_initializers(),
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="masr",
        producer_version=__version__,
        doc_string="masr playlist continuation: top-K songs per playlist (see the metadata)",
    )
    return model, g.arrays


def _one_slot_at_least(g: Graph, members: str) -> str:
    """The members input (B, L) with one padding column added when L is 0 (a batch of
    playlists without a known song, as a consumer may build it): every later shape assumes a
    slot, and (B, 0) made a Reshape fail or the two-stage scores NaN. (B, L) as it is else."""
    width = g.op("Slice", g.op("Shape", members), g.ints(1), g.ints(2))  # [L]
    short = g.op("Max", g.op("Sub", g.ints(1), width), g.ints(0))  # [max(0, 1 - L)]
    pads = g.op("Concat", g.ints(0, 0, 0), short, axis=0)  # before B, L; after B, L
    return g.op(
        "Pad", members, pads, g.const("pad_slot", UNKNOWN, np.int64), mode="constant",
        hint="member_slots",
    )


def _exclude_members(g: Graph, distance: str, members: str, real: str, V: int) -> str:
    """Members are never recommended: +inf distance (padding slots hit the padding column V,
    then dropped): (B, V + 1) -> (B, V)."""
    slot_cols = g.op("Where", real, members, g.const("pad_col", V, np.int64))
    inf = g.op("Expand", g.const("inf", np.inf, np.float32), g.op("Shape", slot_cols))
    distance = g.op("ScatterElements", distance, slot_cols, inf, axis=1, hint="excluded")
    return g.op("Slice", distance, g.ints(0), g.ints(V), g.ints(1))  # (B, V)


def _two_stage(
    g: Graph,
    mdr: MDRWeights,
    mass: MASSWeights,
    alpha: float,
    members: str,
    m: _Members,
    real: str,
    n_users: int,
    V: int,
    unknown_user: str,
    fold_in: FoldInMaps | None,
) -> tuple[str, str]:
    """(best distances, songs) of the two-stage graph (``two_stage``): MDR's eq. 11 over the
    catalog, its N best non-members (N = the ``candidates`` input, at most V), then eq. 20 on
    those N and the top-K of them. The first stage is MDR unweighted, so that α = 0 still
    proposes by MDR."""
    users, _, _, k = INPUTS
    (n_input,) = CANDIDATES
    cheap = _mdr_distance(g, mdr, 1.0, m, V + 1, unknown_user, fold_in)
    cheap = _exclude_members(g, cheap, members, real, V)  # (B, V)
    n_eff = g.op("Min", g.op("Reshape", n_input, g.ints(1)), g.ints(V))
    o_mdr, cand = g.op("TopK", cheap, n_eff, axis=1, largest=0, sorted=1, n_out=2)  # (B, N)
    o_mass = mass_on_candidates(g, mass, users, members, n_users, cand)
    fused = g.op(
        "Add",
        g.op("Mul", o_mdr, g.const("w_mdr_cand", alpha, np.float32)),
        g.op("Mul", o_mass, g.const("w_mass_cand", 1.0 - alpha, np.float32)),
        hint="o_cand",
    )  # eq. 20
    fused = g.op("Where", g.op("IsInf", o_mdr), o_mdr, fused)  # members stay +inf (0·inf: NaN)
    k_eff = g.op("Min", g.op("Reshape", k, g.ints(1)), n_eff)
    best, pos = g.op("TopK", fused, k_eff, axis=1, largest=0, sorted=1, n_out=2)
    return best, g.op("GatherElements", cand, pos, axis=1, hint="cand_songs")


class _Members(NamedTuple):
    """Graph values about the member slots that the MDR part reads."""

    safe: str  # (B, L) int64, padding -> 0
    real_f: str  # (B, L) float, 1 at real slots
    n_real: str  # (B, 1) float, number of real members
    has_members: str  # (B, 1) bool


def _mdr_distance(
    g: Graph,
    mdr: MDRWeights,
    w_mdr: float,
    m: _Members,
    n_cols: int,
    unknown_user: str,
    fold_in: FoldInMaps | None,
) -> str:
    """α · eq. 11 of every song for every row, with fold-in (module docstring): (B, n_cols),
    the columns past the catalog zero."""
    users, playlists, _, _ = INPUTS
    zero_i, ax1, ax2 = g.ints(), g.ints(1), g.ints(2)
    V, d = mdr.song.shape
    b1sq = f32(np.square(mdr.metric_user))  # (d,) B1²
    b2sq = f32(np.square(mdr.metric_playlist))  # (d,) B2²
    # constants of eq. 11 in GEMM form, times α: [-2s; |B1⊙s|²; |B2⊙s|²; θ_s] (d+3, n_cols)
    # (computed in float64 a block of songs at a time, stored float32: no float64 copy of S)
    rhs = np.zeros((d + 3, n_cols), dtype=np.float32)
    for lo, hi in row_blocks(V):
        song = mdr.song[lo:hi].astype(np.float64)
        rhs[:d, lo:hi] = (-2.0 * song.T) * w_mdr
        rhs[d, lo:hi] = (np.square(song) @ b1sq) * w_mdr
        rhs[d + 1, lo:hi] = (np.square(song) @ b2sq) * w_mdr
        rhs[d + 2, lo:hi] = mdr.song_bias[lo:hi] * np.float64(w_mdr)
    song_c = g.const("mdr_song", f32(mdr.song))
    # fold-in vector: mean of the members' song vectors (B, d); zero when there is none
    s_members = g.op("Gather", song_c, m.safe, axis=0)  # (B, L, d)
    s_members = g.op("Mul", s_members, g.op("Unsqueeze", m.real_f, ax2))
    s_sum = g.op("ReduceSum", s_members, ax1, keepdims=0)  # (B, d)
    s_mean = g.op("Div", s_sum, g.op("Max", m.n_real, g.const("one_f", 1.0, np.float32)))

    def lookup(table: np.ndarray, index: str, hint: str) -> tuple[str, str]:
        known = g.op("GreaterOrEqual", index, zero_i, hint=f"known_{hint}")  # (B,)
        row = g.op("Where", known, index, zero_i)
        vec = g.op("Gather", g.const(f"mdr_{hint}", f32(table)), row, axis=0)  # (B, d)
        return g.op("Unsqueeze", known, ax1), vec  # (B, 1) bool, (B, d)

    known_u, u_vec = lookup(mdr.user, users, "user")
    known_p, p_vec = lookup(mdr.playlist, playlists, "playlist")
    # unknown playlist: the fitted maps of masr.foldin, [m, u, 1] W_u for a known user and
    # [m, 1] W_0 otherwise; without them the mean m (minimises Σ_t |B2⊙(p - s_t)|²)
    p_new, u_new = s_mean, s_mean
    if fold_in is not None:
        one_col = g.op("Expand", g.const("one_col", [[1.0]], np.float32), g.op("Shape", known_u))
        by_songs = g.op("Concat", s_mean, one_col, axis=1)  # (B, d+1)
        if unknown_user == "members":  # a new user: [m, 1] W_user
            u_new = g.op("MatMul", by_songs, g.const("fold_u", f32(fold_in.user)), hint="u_folded")
        with_user = g.op("Concat", s_mean, u_vec, one_col, axis=1)  # (B, 2d+1)
        p_no_user = g.op("MatMul", by_songs, g.const("fold_p", f32(fold_in.without_user)))
        p_user = g.op("MatMul", with_user, g.const("fold_p_user", f32(fold_in.with_user)))
        p_new = g.op("Where", known_u, p_user, p_no_user, hint="p_folded")
    p_vec = g.op("Where", known_p, p_vec, p_new, hint="p")
    has_p = g.op("Or", known_p, m.has_members)
    if unknown_user == "members":  # the map's u, or the mean (minimises Σ_t |B1⊙(u - s_t)|²)
        u_vec = g.op("Where", known_u, u_vec, u_new, hint="u")
        has_u = g.op("Or", known_u, m.has_members)
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
    # eq. 11 (times α) for every song: (B, n_cols)
    return g.op("Add", g.op("MatMul", lhs, g.const("mdr_rhs", f32(rhs))), row, hint="o_mdr")
