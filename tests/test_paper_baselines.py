"""The paper's other baselines (issue 12): NeuMF++, CMN++, PRME, TransRec and Caser.

Each learns a planted structure that popularity cannot see (groups for the two collaborative
ones, a song-to-song chain for the three sequential ones), keeps the model contract, and runs
through the CLI. Also the song order they read: position, or the input's row order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from conftest import write_planted
from typer.testing import CliRunner

from masr.config import RunOptions, TrainConfig
from masr.dataset import FORMAT_VERSION, PreparedData, fingerprint_of, load_prepared
from masr.errors import MasrError
from masr.models import model_class
from masr.models.base import Recommender
from masr.prep import PrepConfig, prepare
from masr.report import evaluate_runs
from masr.runs import train_run
from masr.sampling import (
    TrainingIndex,
    context_batch,
    previous_songs,
    song_holders,
    training_batch,
)
from masr_cli.main import app

NEW = ("neumf", "cmn", "prme", "transrec", "caser")
SEQUENTIAL = ("prme", "transrec", "caser")
runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name: str, data: PreparedData, **config) -> Recommender:
    cls = model_class(name)
    return cls(cls.config_class(**config), data.n_users, data.n_playlists, data.n_songs)


def write_chain(path: Path, *, n_songs: int = 60, n_playlists: int = 120, length: int = 8) -> Path:
    """Prepared data where every playlist walks a planted song graph: each song has two
    successors (two random permutations, so every song is equally popular) and each step takes
    one of them at random. The validation and test songs are the two successors of the
    playlist's last training song, so only the order tells them apart from other songs."""
    rng = np.random.default_rng(1)
    while True:
        succ = np.stack([rng.permutation(n_songs), rng.permutation(n_songs)], 1)  # (V, 2)
        if (succ[:, 0] != succ[:, 1]).all() and (succ != np.arange(n_songs)[:, None]).all():
            break
    train, valid, test = [], [], []
    p = 0
    while p < n_playlists:
        songs = [int(rng.integers(n_songs))]
        for _ in range(length - 1):
            songs.append(int(succ[songs[-1], rng.integers(2)]))
        held = [int(x) for x in rng.permutation(succ[songs[-1]])]
        if len(set(songs + held)) < length + 2:
            continue  # the walk came back on itself: draw again
        others = np.setdiff1d(np.arange(n_songs), songs + held)
        for song, cases in zip(held, (valid, test), strict=True):
            neg = [int(x) for x in rng.choice(others, size=20, replace=False)]
            cases.append((p, song, neg, length))
        train += [(p, s, k) for k, s in enumerate(songs)]
        p += 1
    rng.shuffle(train)  # file order must not matter when positions are given
    i32 = pl.Int32
    n_users = n_playlists // 2
    path.mkdir(parents=True)
    pl.DataFrame(
        {"user_idx": range(n_users), "user_id": [f"u{u}" for u in range(n_users)]},
        schema={"user_idx": i32, "user_id": pl.String},
    ).write_parquet(path / "users.parquet")
    pl.DataFrame(
        {
            "playlist_idx": range(n_playlists),
            "playlist_id": [f"p{p}" for p in range(n_playlists)],
            "user_idx": [p // 2 for p in range(n_playlists)],
        },
        schema={"playlist_idx": i32, "playlist_id": pl.String, "user_idx": i32},
    ).write_parquet(path / "playlists.parquet")
    pl.DataFrame(
        {"song_idx": range(n_songs), "track_id": [f"s{s}" for s in range(n_songs)]},
        schema={"song_idx": i32, "track_id": pl.String},
    ).write_parquet(path / "songs.parquet")
    schema = {"playlist_idx": i32, "song_idx": i32, "position": i32}
    train_df = pl.DataFrame(train, schema=schema, orient="row")
    train_df.sort(["playlist_idx", "position"]).write_parquet(path / "train.parquet")
    cases = {"playlist_idx": i32, "song_idx": i32, "negatives": pl.List(i32), "position": i32}
    pl.DataFrame(valid, schema=cases, orient="row").write_parquet(path / "valid.parquet")
    pl.DataFrame(test, schema=cases, orient="row").write_parquet(path / "test.parquet")
    manifest = {
        "format_version": FORMAT_VERSION,
        "users": n_users,
        "playlists": n_playlists,
        "songs": n_songs,
        "catalog_songs": n_songs,
        "train": len(train),
        "valid": len(valid),
        "test": len(test),
        "negatives": 20,
        "checksum": "chain:1",
        "sequence": "position",
    }
    manifest["fingerprint"] = fingerprint_of(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    return load_prepared(write_chain(tmp_path_factory.mktemp("chain") / "data"))


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    return load_prepared(write_planted(tmp_path_factory.mktemp("groups") / "data"))


def learn(
    name: str, data: PreparedData, runs: Path, settings: dict, epochs: int = 30, lr: float = 0.05
) -> dict:
    options = RunOptions(
        train=TrainConfig(epochs=epochs, batch_size=32, lr=lr, seed=0, patience=0),
        model=settings,
        device="cpu",
    )
    train_run(name, data, runs, options)
    return evaluate_runs(data, runs, [name], device="cpu")[name]


# --- the song order ---------------------------------------------------------------------------


def test_previous_songs_follow_position(chain: PreparedData) -> None:
    index = TrainingIndex.from_data(chain)
    train = pl.read_parquet(chain.path / "train.parquet")
    order = {
        p: g.sort("position")["song_idx"].to_list()
        for (p,), g in train.group_by(["playlist_idx"])
    }
    rows = torch.arange(index.n_rows)
    batch = training_batch(index, rows, uses_members=False, max_members=1)
    songs, mask = previous_songs(batch, 3)  # (N, 3)
    for r in range(0, index.n_rows, 7):
        seq = order[int(index.playlist[r])]
        k = seq.index(int(index.song[r]))
        expected = seq[max(0, k - 3) : k]
        assert songs[r][mask[r]].tolist() == expected
        assert mask[r].tolist() == [False] * (3 - len(expected)) + [True] * len(expected)
    # scoring a playlist: its last training songs
    ctx = context_batch(index, torch.tensor([0, 5]), uses_members=False)
    songs, mask = previous_songs(ctx, 2)
    assert songs.tolist() == [order[0][-2:], order[5][-2:]] and mask.all()
    assert chain.sequence_source == "position"


def test_prep_keeps_the_input_row_order_without_positions(tmp_path: Path) -> None:
    order = [7, 2, 9, 0, 5, 3, 8, 1]
    rows = [("u", "a", f"s{i}") for i in order] + [("u", "b", f"s{i}") for i in range(6)]
    path = tmp_path / "in.csv"
    pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id"], orient="row").write_csv(path)
    manifest = prepare(path, tmp_path / "out", config=PrepConfig(negatives=3)).manifest
    assert manifest["sequence"] == "input order"
    data = load_prepared(tmp_path / "out")
    tracks = pl.read_parquet(tmp_path / "out" / "songs.parquet")["track_id"].to_list()
    a = pl.read_parquet(tmp_path / "out" / "playlists.parquet")["playlist_id"].to_list().index("a")
    lo, hi = data.indptr[a], data.indptr[a + 1]
    ranked = sorted(zip(data.train_rank[lo:hi], data.train_song[lo:hi], strict=True))
    by_rank = [tracks[s] for _, s in ranked]
    kept = [f"s{i}" for i in order if f"s{i}" in by_rank]
    assert by_rank == kept and len(kept) == 6  # two of the eight are valid/test


def test_prep_orders_by_the_position_col(tmp_path: Path) -> None:
    """`masr prep --position-col ts`: a playlist's training order is its timestamps', not the
    rows' (here the reverse), and the manifest names the column."""
    order = [7, 2, 9, 0, 5, 3, 8, 1]
    rows = [("u", "a", f"s{i}", f"2024-01-01T00:{59 - k:02d}:00") for k, i in enumerate(order)]
    rows += [("u", "b", f"s{i}", f"2024-01-02T00:00:{i:02d}") for i in range(6)]
    path = tmp_path / "in.csv"
    pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id", "ts"], orient="row").write_csv(
        path
    )
    out = tmp_path / "out"
    args = ["prep", str(path), "--out", str(out), "--position-col", "ts", "--negatives", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sequence"] == "position" and manifest["position_col"] == "ts"
    data = load_prepared(out)
    tracks = pl.read_parquet(out / "songs.parquet")["track_id"].to_list()
    a = pl.read_parquet(out / "playlists.parquet")["playlist_id"].to_list().index("a")
    lo, hi = data.indptr[a], data.indptr[a + 1]
    ranked = sorted(zip(data.train_rank[lo:hi], data.train_song[lo:hi], strict=True))
    by_rank = [tracks[s] for _, s in ranked]
    assert by_rank == [f"s{i}" for i in reversed(order) if f"s{i}" in by_rank]
    assert len(by_rank) == 6


# --- the contract -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_shapes_training_mode_and_checkpoint(chain: PreparedData, name: str, tmp_path) -> None:
    from masr.checkpoint import load_model, save_checkpoint

    model = build(name, chain, dim=8)
    index = TrainingIndex.from_data(chain)
    batch = training_batch(index, torch.arange(6), uses_members=False, max_members=1)
    model.train()
    d = model.distance(batch, torch.randint(0, chain.n_songs, (6, 4)))
    assert d.shape == (6, 4) and torch.isfinite(d).all()
    d.sum().backward()
    model.after_step()
    model.eval()
    ctx = context_batch(index, torch.arange(chain.n_playlists), uses_members=False)
    with torch.no_grad():
        full = model.full_distance(ctx, chunk=7)
        direct = model.distance(ctx, torch.arange(chain.n_songs).expand(chain.n_playlists, -1))
    assert full.shape == (chain.n_playlists, chain.n_songs)
    torch.testing.assert_close(full, direct, rtol=1e-4, atol=1e-5)
    save_checkpoint(tmp_path / "m.pt", model, data_fingerprint=chain.fingerprint)
    loaded, _ = load_model(tmp_path / "m.pt")
    with torch.no_grad():
        torch.testing.assert_close(loaded.full_distance(ctx), full)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("neumf", {"layers": 4}),
        ("neumf", {"branch": "both"}),
        ("cmn", {"hops": 5}),
        ("prme", {"alpha": 1.5}),
        ("caser", {"window": 0}),
        ("transrec", {"entity": "song"}),
    ],
)
def test_bad_settings_are_masr_errors(chain: PreparedData, name: str, bad: dict) -> None:
    with pytest.raises(MasrError, match=name):
        build(name, chain, **bad)


def test_neumf_from_branches_fuses_the_pretrained_scores(groups: PreparedData) -> None:
    torch.manual_seed(0)
    gmf = build("neumf", groups, dim=8, branch="gmf")
    mlp = build("neumf", groups, dim=8, branch="mlp", layers=3)
    neumf = model_class("neumf")  # imported lazily, as the registry does
    fused = neumf.from_branches(gmf, mlp, alpha=0.3)
    assert fused.config.branch == "fused" and fused.config.layers == 3
    batch = context_batch(TrainingIndex.from_data(groups), torch.arange(5), uses_members=False)
    with torch.no_grad():
        expected = 0.3 * gmf.full_distance(batch) + 0.7 * mlp.full_distance(batch)
        torch.testing.assert_close(fused.full_distance(batch), expected)
    with pytest.raises(MasrError, match="branch"):
        neumf.from_branches(mlp, gmf)


def test_neumf_trains_its_branches_first_and_starts_from_them(
    groups: PreparedData, tmp_path: Path
) -> None:
    """masr train --model neumf: GMF and MLP trained alone (runs neumf_gmf, neumf_mlp), then
    the fused model from their best checkpoints (NCF section 3.4.1)."""
    from masr.checkpoint import load_model
    from masr.runs import plan

    assert plan("neumf") == ["neumf_gmf", "neumf_mlp", "neumf"]
    runs = tmp_path / "runs"
    settings = {"dim": 8, "layers": 2, "entity": "user"}
    learn("neumf", groups, runs, settings, epochs=2)
    gmf, _ = load_model(runs / "neumf_gmf" / "best.pt")
    mlp, _ = load_model(runs / "neumf_mlp" / "best.pt")
    assert (gmf.config.branch, mlp.config.branch) == ("gmf", "mlp")
    info = json.loads((runs / "neumf" / "run.json").read_text())
    assert info["procedure"] == "pretrained" and info["start_from"] == ["neumf_gmf", "neumf_mlp"]
    # a fine-tuning step too small to move anything: the fused model is the branches' fusion
    again = RunOptions(
        train=TrainConfig(epochs=1, batch_size=32, lr=1e-12, seed=0, patience=0),
        model=settings,
        device="cpu",
    )
    train_run("neumf", groups, runs, again)  # its branches are made again with this lr too
    fused, _ = load_model(runs / "neumf" / "best.pt")
    gmf, _ = load_model(runs / "neumf_gmf" / "best.pt")
    torch.testing.assert_close(fused.gmf_song.weight, gmf.gmf_song.weight, atol=1e-8, rtol=0)
    # with the branches' own options changed, the fused run is made again: its signature
    # holds theirs
    from masr.runs.registry import signature

    sig = signature("neumf", again, groups.fingerprint)
    assert [p["run"] for p in sig["parts"]] == ["neumf_gmf", "neumf_mlp"]


def test_cmn_neighbourhoods_are_holders_without_the_row_itself(groups: PreparedData) -> None:
    index = TrainingIndex.from_data(groups)
    model = build("cmn", groups, dim=4, neighbours=3)
    batch = context_batch(index, torch.arange(4), uses_members=False)
    table = model.neighbourhoods(batch)  # (V, 3)
    indptr, holders = song_holders(index, "playlist")
    for s in range(groups.n_songs):
        held = set(groups.train_playlist[groups.train_song == s].tolist())
        assert set(holders[indptr[s] : indptr[s + 1]].tolist()) == held
        picked = [p for p in table[s].tolist() if p >= 0]
        assert len(picked) == min(3, len(held)) and set(picked) <= held
    assert model.neighbourhoods(batch) is table  # built once per index


# --- they learn -------------------------------------------------------------------------------


def test_popularity_is_blind_to_both_plantings(chain: PreparedData, groups, tmp_path) -> None:
    for data, name in ((chain, "chain"), (groups, "groups")):
        res = learn("pop", data, tmp_path / name, {})
        assert res["sampled"]["hit@10"] <= 0.6, name  # 10 of 21 at random: about 0.48


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("neumf", {"dim": 8, "layers": 2, "entity": "user"}),
        ("cmn", {"dim": 8, "hops": 2, "entity": "user"}),
    ],
)
def test_collaborative_ones_learn_the_planted_groups(
    groups: PreparedData, tmp_path: Path, name: str, settings: dict
) -> None:
    res = learn(name, groups, tmp_path / "runs", settings)
    assert res["sampled"]["hit@10"] >= 0.9  # popularity: about 0.14 (test above)


@pytest.mark.parametrize(
    ("name", "settings", "lr"),
    [
        ("prme", {"dim": 8}, 0.05),
        ("transrec", {"dim": 8}, 0.05),
        # convolutions want a lower lr; with d = 8 the default init (0.05) leaves z's few ReLU
        # units dead on some seeds (measured: 2 of 4 seeds learnt), 0.3 learns on all 4
        ("caser", {"dim": 8, "window": 4, "dropout": 0.2, "init_std": 0.3}, 0.003),
    ],
)
def test_sequential_ones_learn_the_planted_chain(
    chain: PreparedData, tmp_path: Path, name: str, settings: dict, lr: float
) -> None:
    res = learn(name, chain, tmp_path / "runs", settings, lr=lr)
    # the test song follows the last training song; popularity: about 0.43 (test above)
    assert res["sampled"]["hit@10"] >= 0.9, res["sampled"]
    # TransRec's translations cannot give a song two distinct successors (it would have to
    # place both at gamma_s + T_e): its hit@1 stays lower on this graph than PRME's and Caser's
    assert res["sampled"]["hit@1"] >= (0.3 if name == "transrec" else 0.5), res["sampled"]


def test_cli_trains_and_evaluates_each(chain: PreparedData, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = ["--data", str(chain.path), "--runs", str(runs), "--device", "cpu"]
    for name in NEW:
        args = ["train", "--model", name, "--epochs", "1", "--dim", "4", *common]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["evaluate", "--model", "all", "--json", "-", *common])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {*NEW, "neumf_gmf", "neumf_mlp"}  # NeuMF++'s pre-trained branches
    for run in payload.values():
        assert set(run) == {"sampled", "full"}
