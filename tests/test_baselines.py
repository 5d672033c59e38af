"""Baselines (issue 5): each on tiny planted data with a known right answer, the closed forms
against slow obvious references, the contract (full_distance == distance, checkpoints), and the
comparison's CLI and JSON shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from masr.checkpoint import load_model, save_checkpoint
from masr.config import RunOptions, TrainConfig
from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.evaluate import evaluate_model, metric_names
from masr.models import BASELINES, model_class, parse_settings
from masr.models.base import Recommender
from masr.report import evaluate_runs
from masr.runs import train_run
from masr.sampling import TrainingIndex, context_batch
from masr_cli.main import app

FITTED = ("pop", "itemknn", "ease", "als")
#: small settings that keep the contract tests fast (the defaults are sized for real catalogs)
SMALL = {
    "als": {"dim": 8, "iterations": 4},
    "mfbpr": {"dim": 8},
    "cml": {"dim": 8},
    "fism": {"dim": 8},
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread avoids OpenMP hand-offs that dominate on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name: str, data: PreparedData, **config) -> Recommender:
    cls = model_class(name)
    return cls(cls.config_class(**config), data.n_users, data.n_playlists, data.n_songs)


def fitted(name: str, data: PreparedData, **config) -> Recommender:
    model = build(name, data, **config)
    if not model.trainable:
        torch.manual_seed(0)
        model.fit(data, torch.device("cpu"))
    return model.eval()


def dense_train(data: PreparedData) -> np.ndarray:
    """(P, V) 0/1 playlist x song matrix of the training split, the obvious way."""
    x = np.zeros((data.n_playlists, data.n_songs))
    x[data.train_playlist, data.train_song] = 1.0
    return x


def all_cases_batch(data: PreparedData):
    """Batch of every test playlist with all its training songs as members."""
    index = TrainingIndex.from_data(data, "cpu")
    playlists = torch.as_tensor(data.test.playlist)
    return context_batch(index, playlists, uses_members=True), playlists


# --- the contract, for every baseline ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_full_distance_equals_distance_over_all_songs(planted: PreparedData, name: str) -> None:
    model = fitted(name, planted, **SMALL.get(name, {}))
    batch, _ = all_cases_batch(planted)
    with torch.no_grad():
        full = model.full_distance(batch)  # (B, V)
        songs = torch.arange(planted.n_songs).expand(batch.users.shape[0], -1)
        direct = model.distance(batch, songs)  # (B, V)
    assert full.shape == (batch.users.shape[0], planted.n_songs)
    torch.testing.assert_close(full, direct, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", FITTED)
def test_fitted_checkpoint_round_trip(planted: PreparedData, tmp_path: Path, name: str) -> None:
    model = fitted(name, planted, **SMALL.get(name, {}))
    path = tmp_path / f"{name}.pt"
    save_checkpoint(path, model, data_fingerprint=planted.fingerprint)
    loaded, ckpt = load_model(path)
    assert ckpt["model"] == name and type(loaded) is type(model)
    batch, _ = all_cases_batch(planted)
    with torch.no_grad():
        torch.testing.assert_close(loaded.full_distance(batch), model.full_distance(batch))


# --- closed forms against slow obvious references ---------------------------------------------


def test_pop_is_the_training_playlist_count(planted: PreparedData) -> None:
    model = fitted("pop", planted)
    counts = np.bincount(planted.train_song, minlength=planted.n_songs)
    batch, _ = all_cases_batch(planted)
    d = model.full_distance(batch)
    np.testing.assert_allclose(d[0].numpy(), -counts)
    # the most popular song is everyone's first choice
    assert int(d.argmin(1)[0]) == int(np.argmax(counts))


def _dense_itemknn(data: PreparedData, alpha: float, shrink: float) -> np.ndarray:
    """sim[m, s] = c_ms / (n_m^alpha n_s^(1-alpha) + shrink), zero diagonal, the obvious way."""
    x = dense_train(data)
    co = x.T @ x  # (V, V) shared playlists
    n = np.diag(co).copy()  # playlists per song
    sim = np.zeros_like(co)
    for m in range(len(n)):
        for s in range(len(n)):
            if m != s and co[m, s] > 0:
                sim[m, s] = co[m, s] / (n[m] ** alpha * n[s] ** (1 - alpha) + shrink)
    return sim


@pytest.mark.parametrize(("alpha", "shrink"), [(0.5, 0.0), (0.75, 10.0), (1.0, 0.0)])
def test_itemknn_matches_a_dense_reference(
    planted: PreparedData, alpha: float, shrink: float
) -> None:
    sim = _dense_itemknn(planted, alpha, shrink)
    model = fitted("itemknn", planted, alpha=alpha, shrink=shrink)
    np.testing.assert_allclose(model.similarity().to_dense().numpy(), sim, rtol=1e-5, atol=1e-7)
    batch, playlists = all_cases_batch(planted)
    expected = -(dense_train(planted)[playlists.numpy()] @ sim)  # (B, V) minus sum over members
    np.testing.assert_allclose(model.full_distance(batch).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_itemknn_keeps_each_candidates_top_neighbours(planted: PreparedData) -> None:
    k = 5
    sim = _dense_itemknn(planted, 0.5, 2.0)
    kept = fitted("itemknn", planted, shrink=2.0, neighbours=k).similarity().to_dense().numpy()
    for s in range(planted.n_songs):  # column s: the members voting for candidate s
        column = kept[:, s]
        assert np.count_nonzero(column) == min(k, np.count_nonzero(sim[:, s]))
        # kept entries are unchanged and are the k largest (ties broken either way)
        np.testing.assert_allclose(column[column > 0], sim[column > 0, s], rtol=1e-5)
        top = np.sort(sim[:, s])[::-1][:k]
        np.testing.assert_allclose(np.sort(column)[::-1][:k], top, rtol=1e-5)


def test_ease_matches_a_direct_dense_solve(planted: PreparedData) -> None:
    reg = 3.0
    x = dense_train(planted)
    p = np.linalg.inv(x.T @ x + reg * np.eye(planted.n_songs))  # float64 reference
    b = np.eye(planted.n_songs) - p / np.diag(p)[None, :]  # B = I - P diagMat(1/diag(P))
    np.testing.assert_allclose(np.diag(b), 0.0, atol=1e-12)
    model = fitted("ease", planted, reg=reg)
    np.testing.assert_allclose(model.weights.numpy(), b, rtol=1e-3, atol=1e-5)


def test_ease_refuses_when_the_song_matrix_does_not_fit(
    planted: PreparedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    import masr.models.ease as ease

    monkeypatch.setattr(ease, "available_memory", lambda device: 1000)
    model = build("ease", planted)
    with pytest.raises(MasrError, match=r"ease: the 48 x 48 song matrix needs 18.0 KiB .* 1000 B"):
        model.fit(planted, torch.device("cpu"))
    assert ease.ease_memory_bytes(64_000) > 30 * 2**30  # AOTM's catalog: two 16 GB copies


def _exact_als_rows(y: np.ndarray, r: np.ndarray, confidence: float, reg: float) -> np.ndarray:
    """Hu et al. eq. 4 solved row by row: x_e = (Y^T C^e Y + reg I)^-1 Y^T C^e p(e)."""
    out = np.zeros((r.shape[0], y.shape[1]))
    for e in range(r.shape[0]):
        c = 1.0 + confidence * r[e]  # (V,)
        p = (r[e] > 0).astype(float)
        a = y.T @ (c[:, None] * y) + reg * np.eye(y.shape[1])
        out[e] = np.linalg.solve(a, y.T @ (c * p))
    return out


def test_als_conjugate_gradient_matches_exact_solves(planted: PreparedData) -> None:
    from masr.models._baseline import interaction_matrix
    from masr.models.als import als_half_step

    d, confidence, reg = 6, 5.0, 0.5
    rng = np.random.default_rng(0)
    y = rng.normal(size=(planted.n_songs, d))
    # user -> song counts (a user's playlists can share songs: r > 1 happens)
    r = np.zeros((planted.n_users, planted.n_songs))
    np.add.at(r, (planted.train_user, planted.train_song), 1.0)
    counts = interaction_matrix(
        planted.train_user,
        planted.train_song,
        planted.n_users,
        planted.n_songs,
        torch.device("cpu"),
        binary=False,
    )
    np.testing.assert_allclose(counts.to_dense().numpy(), r)
    start = torch.zeros(planted.n_users, d, dtype=torch.float64)
    x = als_half_step(start, torch.as_tensor(y), counts.to(torch.float64), confidence, reg, 3 * d)
    np.testing.assert_allclose(x.numpy(), _exact_als_rows(y, r, confidence, reg), rtol=1e-6)


# --- planted structure: the held-out song ranks near the top ----------------------------------


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("itemknn", {}),
        ("ease", {"reg": 100.0}),
        ("als", {"dim": 4, "entity": "playlist", "reg": 1.0}),  # rank 4: one factor per group
        ("als", {"dim": 4, "entity": "user", "reg": 1.0}),
    ],
)
def test_closed_form_models_find_the_planted_groups(
    planted: PreparedData, name: str, config: dict
) -> None:
    hit = evaluate_model(fitted(name, planted, **config), planted, "test", device="cpu")
    pop = evaluate_model(fitted("pop", planted), planted, "test", device="cpu")
    # a song of the playlist's group beats every other group's song: at most the 4 unheld
    # same-group songs can outrank it among the 20 negatives
    assert hit["sampled"]["hit@10"] == 1.0
    assert hit["full"]["hit@10"] > pop["full"]["hit@10"] + 0.3


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("mfbpr", {"dim": 8, "entity": "user"}),
        ("mfbpr", {"dim": 8, "entity": "playlist", "song_bias": True}),
        ("cml", {"dim": 8, "entity": "user"}),
        ("fism", {"dim": 8}),
    ],
)
def test_trained_models_learn_the_planted_groups(
    planted: PreparedData, tmp_path: Path, name: str, settings: dict
) -> None:
    options = RunOptions(
        train=TrainConfig(epochs=30, batch_size=32, lr=0.05, seed=0), model=settings, device="cpu"
    )
    (outcome,) = train_run(name, planted, tmp_path / "runs", options)
    assert outcome.action == "trained"
    results = evaluate_runs(planted, tmp_path / "runs", [name], device="cpu")
    assert results[name]["sampled"]["hit@10"] >= 0.9
    model, ckpt = load_model(tmp_path / "runs" / name / "best.pt")
    assert ckpt["config"]["dim"] == 8
    if name == "cml":  # unit-ball clipping held after every step
        for table in (model.entity_emb.weight, model.song_emb.weight):
            assert float(table.detach().norm(dim=1).max()) <= 1.0 + 1e-5


def test_cml_clips_only_what_a_step_touched() -> None:
    model = model_class("cml")(model_class("cml").config_class(dim=4), 3, 5, 7)
    with torch.no_grad():
        model.song_emb.weight.mul_(10.0)  # every song outside the ball
    model.train()
    batch = context_batch_stub(playlists=[1, 2])
    model.distance(batch, torch.tensor([[0, 1], [1, 2]]))
    model.after_step()
    norms = model.song_emb.weight.norm(dim=1)
    assert torch.all(norms[:3] <= 1.0 + 1e-6) and torch.all(norms[3:] > 1.0)


def context_batch_stub(playlists: list[int]):
    from masr.models.base import Batch

    p = torch.tensor(playlists)
    return Batch(p, p, torch.zeros(len(p), 1, dtype=torch.long), torch.zeros(len(p), 1, dtype=bool))


def test_fism_leaves_the_target_out_of_its_own_members() -> None:
    from masr.models.base import Batch

    cls = model_class("fism")
    model = cls(cls.config_class(dim=3, alpha=1.0), 1, 1, 4).eval()
    members = torch.tensor([[0, 1, 2]])
    batch = Batch(torch.tensor([0]), torch.tensor([0]), members, torch.ones(1, 3, dtype=bool))
    p, q = model.member_emb.weight, model.target_emb.weight
    b = model.song_bias.weight[:, 0]
    with torch.no_grad():
        d = model.distance(batch, torch.tensor([[1, 3]]))
        # song 1 is a member: its score uses members {0, 2} only, normalised by 2^-1
        expected_1 = b[1] + (p[0] + p[2]) @ q[1] / 2
        expected_3 = b[3] + (p[0] + p[1] + p[2]) @ q[3] / 3
    torch.testing.assert_close(d[0], -torch.stack([expected_1, expected_3]))


# --- settings and CLI --------------------------------------------------------------------------


def test_parse_settings_types_and_errors() -> None:
    assert parse_settings(["itemknn"], ["shrink=10", "alpha=0.75", "neighbours=50"]) == {
        "shrink": 10.0,
        "alpha": 0.75,
        "neighbours": 50,
    }
    assert parse_settings(["mfbpr"], ["song_bias=yes"]) == {"song_bias": True}
    with pytest.raises(MasrError, match="--set bogus=1: expected NAME=VALUE"):
        parse_settings(["itemknn"], ["bogus=1"])
    with pytest.raises(MasrError, match="'x' is not a valid int"):
        parse_settings(["itemknn"], ["neighbours=x"])
    # the paper's symbol for a field is accepted too: Caser's L is its window
    assert parse_settings(["caser"], ["L=6"]) == {"window": 6}
    assert parse_settings(["caser"], ["caser.L=8"]) == {"caser.window": 8}
    with pytest.raises(MasrError, match="expected NAME=VALUE"):
        parse_settings(["itemknn"], ["L=6"])


def test_bad_settings_are_one_line_errors(planted: PreparedData) -> None:
    with pytest.raises(MasrError, match="--entity must be 'user' or 'playlist'"):
        build("mfbpr", planted, entity="song")
    with pytest.raises(MasrError, match="itemknn: alpha must lie in"):
        build("itemknn", planted, alpha=2.0)
    with pytest.raises(MasrError, match="ease: --reg must be > 0"):
        build("ease", planted, reg=0.0)


runner = CliRunner()


def test_cli_baselines_and_comparison_json(planted_dir: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = ["--data", str(planted_dir), "--runs", str(runs), "--device", "cpu"]
    for args in (
        ["--model", "pop"],
        ["--model", "itemknn", "--set", "shrink=1"],
        ["--model", "ease", "--reg", "2"],
        ["--model", "mfbpr", "--entity", "user", "--epochs", "2", "--dim", "4"],
    ):
        result = runner.invoke(app, ["train", *args, *common])
        assert result.exit_code == 0, result.output
    info = json.loads((runs / "ease" / "run.json").read_text())
    assert info["model_config"] == {"reg": 2.0}
    info = json.loads((runs / "itemknn" / "run.json").read_text())
    assert info["model_config"]["shrink"] == 1.0
    info = json.loads((runs / "mfbpr" / "run.json").read_text())
    assert info["model_config"]["entity"] == "user" and info["model_config"]["dim"] == 4

    result = runner.invoke(
        app,
        [
            "evaluate",
            "--model",
            "all",
            "--json",
            "-",
            "--data",
            str(planted_dir),
            "--runs",
            str(runs),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert list(payload) == ["mfbpr", "pop", "itemknn", "ease"]  # the table's order
    for run in payload.values():
        assert set(run) == {"sampled", "full"}
        for metrics in run.values():
            assert list(metrics) == metric_names()
            assert all(0.0 <= v <= 1.0 for v in metrics.values())


def test_cli_ease_refusal_is_one_line(
    planted_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import masr.models.ease as ease

    monkeypatch.setattr(ease, "available_memory", lambda device: 1000)
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            "ease",
            "--data",
            str(planted_dir),
            "--runs",
            str(tmp_path / "runs"),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith("masr: error: ease: the 48 x 48 song matrix needs 18.0 KiB")
