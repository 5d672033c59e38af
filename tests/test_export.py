"""masr export: the ONNX graph against a slow, obvious reference of eqs. 11-20 (known ids, fold-in,
fallbacks), parity with the PyTorch models, and the files written next to the model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from masr.checkpoint import save_checkpoint
from masr.dataset import load_prepared
from masr.errors import MasrError
from masr.export import (
    ExportConfig,
    build_graph,
    export_model,
    mass_weights,
    mdr_weights,
    metadata_of,
    sidecar,
)
from masr.foldin import FoldInMaps, fit_playlist_maps
from masr.models.base import Batch
from masr.models.masr import MASR
from masr.models.mass import MASS, MASSConfig
from masr.models.mdr import MDR, MDRConfig

N_USERS, N_PLAYLISTS, N_SONGS, DIM = 5, 9, 23, 4
ALPHA = 0.3


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    return model.eval()


def make_parts(
    n_users: int = N_USERS, n_playlists: int = N_PLAYLISTS, n_songs: int = N_SONGS, seed: int = 0
) -> tuple[MDR, MASS]:
    torch.manual_seed(seed)
    mdr = MDR(MDRConfig(dim=DIM), n_users, n_playlists, n_songs)
    mass = MASS(MASSConfig(dim=DIM, query_init="default"), n_users, n_playlists, n_songs)
    return perturbed(mdr, seed), perturbed(mass, seed + 1)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def run(sess, users, playlists, members, k: int) -> tuple[np.ndarray, np.ndarray]:
    feed = {
        "users": np.asarray(users, dtype=np.int64),
        "playlists": np.asarray(playlists, dtype=np.int64),
        "members": np.asarray(members, dtype=np.int64).reshape(len(users), -1),
        "k": np.array(k, dtype=np.int64),
    }
    return tuple(sess.run(["songs", "scores"], feed))


def reference(
    mdr: MDR | None,
    mass: MASS | None,
    alpha: float,
    users,
    playlists,
    members,
    unknown_user: str = "members",
    maps: FoldInMaps | None = None,
) -> np.ndarray:
    """(B, V) fused distances, row by row straight from the paper's equations, in float64;
    members +inf. Fold-in and fallbacks as documented in masr.export (a new playlist through
    ``maps`` when given: [mean, u, 1] W_u with a known user, [mean, 1] W_0 without, and a new
    user's u = [mean, 1] W_user); a repeated
    member is two slots, as in the models (masr score removes repeats before the graph)."""
    n_songs = (mdr if mdr is not None else mass).n_songs
    rows = []
    for user, playlist, slots in zip(users, playlists, np.asarray(members).tolist(), strict=True):
        songs = [s for s in slots if s >= 0]
        o = torch.zeros(n_songs, dtype=torch.float64)
        if mdr is not None:
            S = mdr.song_emb.weight.double()  # (V, d)
            mean = S[songs].mean(0) if songs else None
            u = mdr.user_emb.weight[user].double() if user >= 0 else None
            p = mdr.playlist_emb.weight[playlist].double() if playlist >= 0 else mean
            if playlist < 0 and songs and maps is not None:
                if u is not None:
                    p = torch.cat([mean, u, torch.ones(1, dtype=torch.float64)])
                    p = p @ torch.from_numpy(maps.with_user).double()
                else:
                    p = torch.cat([mean, torch.ones(1, dtype=torch.float64)])
                    p = p @ torch.from_numpy(maps.without_user).double()
            if u is None and unknown_user == "members":
                u = mean  # a new user: from the songs, through the user map when there is one
                if songs and maps is not None and maps.user is not None:
                    u = torch.cat([mean, torch.ones(1, dtype=torch.float64)])
                    u = u @ torch.from_numpy(maps.user).double()
            o_mdr = mdr.song_bias.weight.double()[:, 0].clone()  # θ_s
            if u is not None:  # |B1 ⊙ (u - s)|²
                o_mdr += ((mdr.metric_user.double() * (u - S)) ** 2).sum(1)
            if p is not None:  # |B2 ⊙ (p - s)|²
                o_mdr += ((mdr.metric_playlist.double() * (p - S)) ** 2).sum(1)
            o += (alpha if mass is not None else 1.0) * o_mdr
        if mass is not None:
            o_mass = mass.song_bias.weight.double()[:, 0].clone()  # b_s (no member: bias only)
            if songs:
                d_out = memory_distances(mass, "out", user, songs)  # eqs. 12, 14-15
                d_att = memory_distances(mass, "att", user, songs)  # eqs. 16-17
                att = torch.softmax(-d_att, dim=1)  # eq. 18
                o_mass += (att * d_out).sum(1)  # eq. 19
            o += (1.0 - alpha if mdr is not None else 1.0) * o_mass
        o[songs] = float("inf")
        rows.append(o.detach().numpy())
    return np.stack(rows)


def memory_distances(mass: MASS, side: str, user: int, songs: list[int]) -> torch.Tensor:
    """(V, T) |B ⊙ (q_k - s_t)|² of one MASS memory with q_k = ReLU(W [u; s_k] + b); an unknown
    user (-1) is the mean of the memory's user table."""
    if side == "out":
        tables = (mass.user_emb, mass.song_emb, mass.query, mass.metric)
    else:
        tables = (mass.att_user_emb, mass.att_song_emb, mass.att_query, mass.att_metric)
    user_t, song_t, lin, metric = tables
    U, S = user_t.weight.double(), song_t.weight.double()
    u = U[user] if user >= 0 else U.mean(0)
    x = torch.cat([u.expand(S.shape[0], -1), S], dim=1)  # [u; s_k]  (V, 2d)
    q = torch.relu(x @ lin.weight.double().T + lin.bias.double())  # (V, d)
    diff = q[:, None, :] - S[songs][None, :, :]  # (V, T, d)
    return ((metric.double() * diff) ** 2).sum(-1)


def assert_top_k(songs, scores, ref: np.ndarray, k: int) -> None:
    """The graph's K songs are the reference's best K: same scores (float32 vs float64), and the
    reference agrees with each returned score."""
    want = -np.sort(ref, axis=1)[:, :k]
    np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-4)
    got = -np.take_along_axis(ref, songs, axis=1)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], scores[finite], rtol=1e-4, atol=1e-4)


MDR_PART, MASS_PART = make_parts()


def fused_session(
    fold_in: FoldInMaps | None = None, alpha: float = ALPHA, candidates: int | None = None
) -> ort.InferenceSession:
    """The MASR graph of MDR_PART and MASS_PART at ``alpha`` (new playlists by ``fold_in``;
    the two-stage graph with ``candidates``)."""
    return session(
        build_graph(
            mdr_weights(MDR_PART),
            mass_weights(MASS_PART),
            alpha,
            n_users=N_USERS,
            n_playlists=N_PLAYLISTS,
            n_songs=N_SONGS,
            chunk=5,  # several chunks and a padded last one
            candidates=candidates,
            fold_in=fold_in,
        )
    )


FUSED = fused_session()
#: fold-in maps of no particular fit: the graph must apply whatever maps it is given
_maps_rng = np.random.default_rng(5)
MAPS = FoldInMaps(
    with_user=_maps_rng.normal(size=(2 * DIM + 1, DIM)).astype(np.float32),
    without_user=_maps_rng.normal(size=(DIM + 1, DIM)).astype(np.float32),
    playlists=0,
    r2=0.0,
    user=_maps_rng.normal(size=(DIM + 1, DIM)).astype(np.float32),
)
FUSED_MAPS = fused_session(MAPS)


def test_known_ids_match_the_equations_and_the_models_full_distance() -> None:
    users = [0, 0, 3, 1, 3, 0, 4]  # repeated users share their queries in the graph
    playlists = [0, 1, 2, 3, 4, 5, 8]
    members = [[1, 2, 3, -1], [4, -1, -1, -1], [5, 6, 7, 8], [9, 1, -1, -1], [2, 2, 10, -1],
               [11, 12, 13, 14], [0, -1, 15, -1]]  # fmt: skip
    songs, scores = run(FUSED, users, playlists, members, 6)
    ref = reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members)
    assert_top_k(songs, scores, ref, 6)
    # the models' own GEMM path (MASR, eq. 20) ranks the same songs first
    m = torch.tensor(members)
    batch = Batch(torch.tensor(users), torch.tensor(playlists), m.clamp_min(0), m >= 0)
    with torch.no_grad():
        fused = MASR.from_parts(MDR_PART, MASS_PART, alpha=ALPHA).full_distance(batch).double()
    fused[torch.arange(len(users))[:, None].expand_as(m)[m >= 0], m[m >= 0]] = float("inf")
    expected = torch.topk(-fused, 6).indices.numpy()
    assert (songs == expected).all()
    np.testing.assert_allclose(scores, -np.sort(fused.numpy(), 1)[:, :6], rtol=1e-4, atol=1e-4)


def test_fold_in_matches_the_vector_entry_points_of_the_models() -> None:
    """Unknown playlist: mean member vector; unknown user: mean member vector for MDR and each
    memory's mean user vector for MASS (MASR.full_distance_from_vectors with those vectors)."""
    users, playlists = [-1, 2, -1], [-1, -1, 4]
    members = [[3, 7, 11], [5, 1, -1], [2, -1, -1]]
    m = torch.tensor(members)
    mask = m >= 0
    S = MDR_PART.song_emb.weight
    mean = (S[m.clamp_min(0)] * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    u_mdr = torch.where(torch.tensor(users)[:, None] >= 0, MDR_PART.user_emb.weight[2], mean)
    p_mdr = torch.where(
        torch.tensor(playlists)[:, None] >= 0, MDR_PART.playlist_emb.weight[4], mean
    )

    def mass_user(table: torch.nn.Embedding) -> torch.Tensor:
        return torch.stack([table.weight[u] if u >= 0 else table.weight.mean(0) for u in users])

    fused = MASR.from_parts(MDR_PART, MASS_PART, alpha=ALPHA)
    with torch.no_grad():
        want = fused.full_distance_from_vectors(
            u_mdr,
            p_mdr,
            mass_user(MASS_PART.user_emb),
            mass_user(MASS_PART.att_user_emb),
            m.clamp_min(0),
            mask,
        ).double()
    want[torch.arange(3)[:, None].expand_as(m)[mask], m[mask]] = float("inf")
    songs, scores = run(FUSED, users, playlists, members, 5)
    assert (songs == torch.topk(-want, 5).indices.numpy()).all()
    np.testing.assert_allclose(scores, -np.sort(want.numpy(), 1)[:, :5], rtol=1e-4, atol=1e-4)


def test_playlists_without_members_fall_back_to_user_term_then_biases() -> None:
    users, playlists = [2, -1, 1], [-1, -1, 6]
    members = [[-1, -1], [-1, -1], [-1, -1]]
    songs, scores = run(FUSED, users, playlists, members, N_SONGS)
    ref = reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members)
    assert_top_k(songs, scores, ref, N_SONGS)
    # a new user with a new, empty playlist: song biases only, α θ_s + (1-α) b_s
    bias = ALPHA * MDR_PART.song_bias.weight[:, 0] + (1 - ALPHA) * MASS_PART.song_bias.weight[:, 0]
    np.testing.assert_allclose(-scores[1], np.sort(bias.detach().numpy()), rtol=1e-5, atol=1e-5)


def test_members_are_never_recommended_and_k_is_capped() -> None:
    members = [list(range(20)) + [-1], [0, 5, 5] + [-1] * 18]
    songs, scores = run(FUSED, [0, 1], [2, -1], members, N_SONGS + 10)
    assert songs.shape == (2, N_SONGS)  # K larger than the catalog: the catalog
    finite = np.isfinite(scores)
    assert finite.sum(1).tolist() == [N_SONGS - 20, N_SONGS - 2]  # the rest are -inf
    for row, member_row in zip(songs, members, strict=True):
        listed = set(row[: N_SONGS - len({m for m in member_row if m >= 0})].tolist())
        assert not listed & set(member_row)
    for row, keep in zip(scores, finite, strict=True):  # best first
        assert (np.diff(row[keep]) <= 0).all()


def test_padding_and_batch_composition_never_change_a_row() -> None:
    users, playlists = [1, 1, -1, 4], [0, -1, -1, 3]
    members = [[3, 4, -1], [6, -1, -1], [7, 8, 9], [10, -1, -1]]
    songs, scores = run(FUSED, users, playlists, members, 4)
    wide = [row + [-1, -1, -1] for row in members]
    songs_w, scores_w = run(FUSED, users, playlists, wide, 4)
    np.testing.assert_array_equal(songs, songs_w)
    np.testing.assert_allclose(scores, scores_w, rtol=1e-6, atol=1e-6)
    for i in range(4):  # each row alone gives what it gets in the batch
        s1, v1 = run(FUSED, users[i : i + 1], playlists[i : i + 1], members[i : i + 1], 4)
        np.testing.assert_array_equal(s1[0], songs[i])
        np.testing.assert_allclose(v1[0], scores[i], rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda b: st.tuples(
            st.lists(st.integers(-1, N_USERS - 1), min_size=b, max_size=b),
            st.lists(st.integers(-1, N_PLAYLISTS - 1), min_size=b, max_size=b),
            st.integers(1, 5).flatmap(
                lambda n: st.lists(
                    st.lists(st.integers(-1, N_SONGS - 1), min_size=n, max_size=n),
                    min_size=b,
                    max_size=b,
                )
            ),
            st.integers(1, N_SONGS),
        )
    )
)
def test_any_batch_matches_the_reference(case) -> None:
    users, playlists, members, k = case
    songs, scores = run(FUSED, users, playlists, members, k)
    assert_top_k(songs, scores, reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members), k)
    # with fold-in maps: new playlists through them, known playlists as before
    songs, scores = run(FUSED_MAPS, users, playlists, members, k)
    ref = reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members, maps=MAPS)
    assert_top_k(songs, scores, ref, k)


@pytest.mark.parametrize("part", ["mdr", "mass"])
def test_single_part_graphs(part: str) -> None:
    mdr = MDR_PART if part == "mdr" else None
    mass = MASS_PART if part == "mass" else None
    graph = build_graph(
        mdr_weights(mdr) if mdr else None,
        mass_weights(mass) if mass else None,
        0.5,  # ignored with one part
        n_users=N_USERS,
        n_playlists=N_PLAYLISTS,
        n_songs=N_SONGS,
        chunk=7,
    )
    onnx.checker.check_model(graph, full_check=True)
    users, playlists, members = [0, -1, 2], [1, -1, -1], [[1, 2, -1], [3, -1, -1], [-1, -1, -1]]
    songs, scores = run(session(graph), users, playlists, members, 5)
    assert_top_k(songs, scores, reference(mdr, mass, 0.5, users, playlists, members), 5)


def test_unknown_user_drop_mode_leaves_the_user_term_out() -> None:
    graph = build_graph(
        mdr_weights(MDR_PART),
        None,
        1.0,
        n_users=N_USERS,
        n_playlists=N_PLAYLISTS,
        n_songs=N_SONGS,
        unknown_user="drop",
    )
    users, playlists, members = [-1, -1], [-1, 3], [[4, 5], [6, -1]]
    songs, scores = run(session(graph), users, playlists, members, 5)
    ref = reference(MDR_PART, None, 1.0, users, playlists, members, unknown_user="drop")
    assert_top_k(songs, scores, ref, 5)


# -- export_model: from a runs directory to exported/ ---------------------------------------------


def playlist_rows(data, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # noqa: ANN001
    """Every ``step``-th prepared playlist: its ids (R,), users (R,) and training songs (R, L),
    padded with -1, as the exported graph takes them."""
    rows = np.arange(0, data.n_playlists, step)
    lengths = np.diff(data.indptr)[rows]
    members = np.full((len(rows), lengths.max()), -1)
    for i, p in enumerate(rows):
        members[i, : lengths[i]] = data.playlist_songs(p)
    return rows, data.playlist_user[rows], members


def fitted_maps(mdr: MDR, data) -> FoldInMaps:  # noqa: ANN001
    """The fold-in maps ``masr export`` fits for ``mdr`` on ``data``'s training playlists."""
    w = mdr_weights(mdr)
    maps = fit_playlist_maps(
        w.song, w.user, w.playlist, data.playlist_user, data.indptr, data.train_song
    )
    assert maps is not None
    return maps


def make_runs(root: Path, data_dir: Path, runs: tuple[str, ...] = ("amdr", "amass")) -> Path:
    """Checkpoints with random weights (no training needed to test the export), as masr train
    writes them: runs/<run>/best.pt and run.json recording the data path."""
    data = load_prepared(data_dir)
    mdr, mass = make_parts(data.n_users, data.n_playlists, data.n_songs, seed=3)
    models = {"mdr": mdr, "amdr": mdr, "mass": mass, "amass": mass}
    for run_name in runs:
        if run_name in ("masr", "amasr"):
            model = MASR.from_parts(mdr, mass, alpha=0.25, parts=("amdr", "amass"))
        else:
            model = models[run_name]
        run_dir = root / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run_dir / "best.pt", model, data_fingerprint=data.fingerprint, epoch=1)
        info = {"run": run_name, "data": {"path": str(data_dir), "fingerprint": data.fingerprint}}
        (run_dir / "run.json").write_text(json.dumps(info))
    return root


def test_export_writes_a_checked_model_with_metadata_and_id_maps(
    tmp_path: Path, planted_dir: Path
) -> None:
    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass", "amdr", "amass"))
    out = tmp_path / "deep" / "dir" / "masr.onnx"  # parents are created
    result = export_model(runs, out, ExportConfig(chunk=8))
    assert result.path == out and out.is_file()
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    meta = metadata_of(model)  # plain onnx reads it
    assert meta["model"] == "amasr" and meta["alpha"] == 0.5  # AMASR preferred, α default 0.5
    assert meta["dims"] == {"mdr": DIM, "mass": DIM} and meta["opset"] == 18
    assert [s["run"] for s in meta["sources"]] == ["amdr", "amass"]
    assert all(len(s["sha256"]) == 64 for s in meta["sources"])
    manifest = json.loads((planted_dir / "manifest.json").read_text())
    assert meta["data"]["fingerprint"] == manifest["fingerprint"]
    assert meta["data"]["checksum"] == manifest["checksum"]
    assert meta["masr_version"] and meta["export_id"]
    beside = json.loads(sidecar(out, "json").read_text())
    assert beside.pop("model_sha256") == hashlib.sha256(out.read_bytes()).hexdigest()
    assert beside == meta  # the JSON is the model's metadata plus the model file's hash
    songs = pl.read_parquet(sidecar(out, "songs"))
    assert songs["track_id"].to_list() == [f"s{i}" for i in range(48)]
    assert pl.read_parquet(sidecar(out, "playlists")).height == 36
    assert pl.read_parquet(sidecar(out, "users"))["user_id"].to_list()[:2] == ["u0", "u1"]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in result.files)


def test_exported_file_matches_pytorch_on_known_and_new_playlists(
    tmp_path: Path, planted_dir: Path
) -> None:
    """The parity test: ONNX Runtime on the written file vs the PyTorch MASR of the same
    checkpoints, on a sample of real playlists, with their ids and with fresh (unknown) ids."""
    runs = make_runs(tmp_path / "runs", planted_dir, ("amasr",))  # the fusion checkpoint alone
    out = tmp_path / "exported" / "masr.onnx"
    meta = export_model(runs, out).metadata
    assert meta["model"] == "amasr" and meta["alpha"] == 0.25  # the fusion run's α
    data = load_prepared(planted_dir)
    from masr.checkpoint import load_model

    model, _ = load_model(runs / "amasr" / "best.pt")
    # new playlists are folded in through the maps fitted on the training playlists (the
    # default), refitted here from the same tables: the fit is deterministic
    maps = fitted_maps(model.mdr, data)
    assert meta["fold_in"] == {"mode": "map", "playlists": maps.playlists, "r2": round(maps.r2, 4)}
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    rows, users, members = playlist_rows(data, 3)
    m = torch.from_numpy(members)
    batch = Batch(torch.from_numpy(users), torch.from_numpy(rows), m.clamp_min(0), m >= 0)
    with torch.no_grad():
        want = model.full_distance(batch).double()
    want[torch.arange(len(rows))[:, None].expand_as(m)[m >= 0], m[m >= 0]] = float("inf")
    songs, scores = run(sess, users, rows, members, 10)
    assert (songs == torch.topk(-want, 10).indices.numpy()).all()
    np.testing.assert_allclose(scores, -np.sort(want.numpy(), 1)[:, :10], rtol=1e-4, atol=1e-4)
    # the same playlists as new ones: unknown playlist ids, with their known users and without
    unknown = -np.ones_like(rows)
    for user_ids in (users, unknown):
        songs, scores = run(sess, user_ids, unknown, members, 10)
        ref = reference(model.mdr, model.mass, 0.25, user_ids, unknown, members, maps=maps)
        assert_top_k(songs, scores, ref, 10)
    # --fold-in mean: the plain mean of the songs, and nothing fitted
    plain = export_model(runs, tmp_path / "mean.onnx", ExportConfig(fold_in="mean")).metadata
    assert plain["fold_in"] == {"mode": "mean"} and plain["export_id"] != meta["export_id"]
    sess = ort.InferenceSession(str(tmp_path / "mean.onnx"), providers=["CPUExecutionProvider"])
    songs, scores = run(sess, users, unknown, members, 10)
    assert_top_k(songs, scores, reference(model.mdr, model.mass, 0.25, users, unknown, members), 10)


@pytest.mark.parametrize(("alpha", "part"), [(1.0, "mdr"), (0.0, "mass")])
def test_a_fusion_weight_of_one_or_zero_exports_the_weighted_part_alone(
    tmp_path: Path, planted_dir: Path, alpha: float, part: str
) -> None:
    """At α 1 (or 0) eq. 20 is its MDR (MASS) part: the export holds that part's graph alone
    and ranks exactly as the fusion at that weight, known and new playlists alike."""
    runs = make_runs(tmp_path / "runs", planted_dir, ("amdr", "amass"))
    notes: list[str] = []
    meta = export_model(runs, tmp_path / "a.onnx", ExportConfig(alpha=alpha),
                        log=notes.append).metadata
    assert meta["model"] == "amasr" and meta["alpha"] == alpha and meta["dims"] == {part: DIM}
    assert any("gives the" in n and "no weight" in n for n in notes), notes
    both = export_model(runs, tmp_path / "b.onnx", ExportConfig(alpha=0.5)).metadata
    assert set(both["dims"]) == {"mdr", "mass"}
    assert (tmp_path / "a.onnx").stat().st_size < (tmp_path / "b.onnx").stat().st_size
    data = load_prepared(planted_dir)
    from masr.checkpoint import load_model

    mdr, mass = (load_model(runs / r / "best.pt")[0] for r in ("amdr", "amass"))
    sess = ort.InferenceSession(str(tmp_path / "a.onnx"), providers=["CPUExecutionProvider"])
    rows, users, members = playlist_rows(data, 3)
    unknown = -np.ones_like(rows)
    maps = fitted_maps(mdr, data) if part == "mdr" else None  # the MDR part's new playlists
    fold = None if maps is None else {"mode": "map", "playlists": maps.playlists}
    assert meta["fold_in"] == (fold and {**fold, "r2": round(maps.r2, 4)})
    for u, p in ((users, rows), (unknown, unknown), (users, unknown)):
        songs, scores = run(sess, u, p, members, 10)
        assert_top_k(songs, scores, reference(mdr, mass, alpha, u, p, members, maps=maps), 10)
    # a two-stage export keeps both parts (masr score --candidates needs them); at α 1 its
    # re-rank is MDR's own order of the proposals, and the export says so
    notes.clear()
    two = export_model(runs, tmp_path / "c.onnx", ExportConfig(alpha=alpha, candidates=50),
                       log=notes.append).metadata
    assert set(two["dims"]) == {"mdr", "mass"}
    assert any("re-rank keeps MDR's order" in n for n in notes) == (alpha == 1.0), notes


def test_export_chooses_masr_without_adversarial_parts_and_honours_options(
    tmp_path: Path, planted_dir: Path
) -> None:
    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass"))
    meta = export_model(runs, tmp_path / "a.onnx", ExportConfig(alpha=0.7)).metadata
    assert meta["model"] == "masr" and meta["alpha"] == 0.7
    meta = export_model(runs, tmp_path / "b.onnx", ExportConfig(model="mass")).metadata
    assert meta["model"] == "mass" and meta["dims"] == {"mass": DIM} and meta["alpha"] == 0.0
    with pytest.raises(MasrError, match="no trained amasr"):
        export_model(runs, tmp_path / "c.onnx", ExportConfig(model="amasr"))
    with pytest.raises(MasrError, match="--alpha: mdr is one part"):
        export_model(runs, tmp_path / "d.onnx", ExportConfig(model="mdr", alpha=0.3))
    # a fusion's part alone: the refusal names the export that works (QA: it did not)
    (runs / "mass" / "best.pt").unlink()
    with pytest.raises(MasrError, match="it has mdr only; train it first: masr train --model "
                       "amasr, or export mdr alone: masr export --model mdr$"):
        export_model(runs, tmp_path / "e.onnx")


def test_export_finds_the_data_by_fingerprint_or_fails_clearly(
    tmp_path: Path, planted_dir: Path
) -> None:
    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass"))
    moved = tmp_path / "moved"
    planted_dir.rename(moved)
    with pytest.raises(MasrError, match="no prepared data with fingerprint .* --data"):
        export_model(runs, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    assert export_model(runs, tmp_path / "m.onnx", ExportConfig(data=moved)).path.is_file()
    from conftest import write_planted

    other = write_planted(tmp_path / "other", seed=1)
    with pytest.raises(MasrError, match="--data .* not the data the checkpoints"):
        export_model(runs, tmp_path / "n.onnx", ExportConfig(data=other))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (ExportConfig(model="nope"), "--model nope"),
        (ExportConfig(alpha=1.5), "--alpha 1.5"),
    ],
)
def test_export_rejects_bad_options(tmp_path: Path, config: ExportConfig, match: str) -> None:
    with pytest.raises(MasrError, match=match):
        export_model(tmp_path, tmp_path / "m.onnx", config)


def test_export_without_runs_names_what_to_train(tmp_path: Path) -> None:
    with pytest.raises(MasrError, match="--runs .*no such directory"):
        export_model(tmp_path / "nothing", tmp_path / "m.onnx")
    (tmp_path / "runs").mkdir()
    with pytest.raises(MasrError, match="masr train --model amasr"):
        export_model(tmp_path / "runs", tmp_path / "m.onnx")


def test_export_rejects_parts_of_different_data(tmp_path: Path, planted_dir: Path) -> None:
    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass"))
    ckpt = torch.load(runs / "mass" / "best.pt", weights_only=True)
    ckpt["data_fingerprint"] = "0" * 16
    torch.save(ckpt, runs / "mass" / "best.pt")
    with pytest.raises(MasrError, match="different prepared data"):
        export_model(runs, tmp_path / "m.onnx")


class PublicOnly:
    """A model seen only through what the export may read: the model contract's public names and
    the export methods (``export_weights``, ``parts``). Anything else, a private attribute or a
    submodule such as ``song_emb``, raises, so renaming a model's internals cannot break export."""

    ALLOWED = frozenset({"name", "config", "sizes", "n_users", "n_playlists", "n_songs"})

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __getattr__(self, attr: str):  # noqa: ANN204
        if attr == "export_weights":
            return self.model.export_weights
        if attr == "parts":
            return lambda: tuple(PublicOnly(part) for part in self.model.parts())
        if attr not in self.ALLOWED:
            raise AttributeError(f"export read {attr!r} of a {self.model.name} model")
        return getattr(self.model, attr)


@pytest.mark.parametrize("runs", [("amdr", "amass"), ("amasr",)], ids=["parts", "fusion"])
def test_export_reads_models_only_through_their_public_methods(
    tmp_path: Path, planted_dir: Path, monkeypatch: pytest.MonkeyPatch, runs: tuple[str, ...]
) -> None:
    import masr.checkpoint

    root = make_runs(tmp_path / "runs", planted_dir, runs)
    plain = onnx.load(export_model(root, tmp_path / "plain" / "m.onnx").path)
    build_model = masr.checkpoint.build_model
    monkeypatch.setattr(masr.checkpoint, "build_model", lambda c: PublicOnly(build_model(c)))
    guarded = onnx.load(export_model(root, tmp_path / "guarded" / "m.onnx").path)
    assert guarded.graph.SerializeToString() == plain.graph.SerializeToString()
