"""masr.spectral and MASS's song_init="svd": the training matrix's truncated SVD as a start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.models.mass import MASS, MASSConfig
from masr.spectral import POPULARITY_DAMPING, split_signs, training_factors
from masr_cli.main import app


def _dense_matrix(data: PreparedData, beta: float) -> torch.Tensor:
    """The damped training matrix, written out (the slow reference)."""
    x = torch.zeros(data.n_playlists, data.n_songs, dtype=torch.float64)
    counts = torch.zeros(data.n_songs, dtype=torch.float64)
    for s in data.train_song.tolist():
        counts[s] += 1
    for p, s in zip(data.train_playlist.tolist(), data.train_song.tolist(), strict=True):
        x[p, s] = counts[s] ** -beta
    return x


def test_factors_are_the_truncated_svd(planted: PreparedData) -> None:
    k = 4
    playlists, songs = training_factors(planted, k)
    assert playlists.shape == (planted.n_playlists, k) and songs.shape == (planted.n_songs, k)
    assert playlists.dtype == songs.dtype == torch.float32
    x = _dense_matrix(planted, POPULARITY_DAMPING)
    u, sigma, vt = torch.linalg.svd(x, full_matrices=False)
    best = (u[:, :k] * sigma[:k]) @ vt[:k]  # the optimal rank-k approximation
    ours = playlists.double() @ songs.double().T  # U diag(σ)^½ (V diag(σ)^½)ᵀ
    assert torch.allclose(ours, best, atol=2e-3)  # float32, randomised: near, not exact
    # each song factor's column has the norm of its singular value's square root
    assert torch.allclose(songs.double().norm(dim=0), sigma[:k].sqrt(), atol=1e-3)


def test_factors_are_deterministic_and_leave_no_rank_unfilled(planted: PreparedData) -> None:
    a, b = training_factors(planted, 3, seed=5), training_factors(planted, 3, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    before = torch.rand(3)  # the global generator is not touched
    torch.manual_seed(0)
    first = torch.rand(3)
    torch.manual_seed(0)
    training_factors(planted, 3)
    assert torch.equal(torch.rand(3), first) and before.shape == first.shape
    too_many = planted.n_songs + 5  # past the matrix's rank: zero columns
    playlists, songs = training_factors(planted, too_many)
    assert songs.shape == (planted.n_songs, too_many)
    assert torch.count_nonzero(songs[:, min(planted.n_songs, planted.n_playlists):]) == 0


def test_mass_svd_start_is_item_based(planted: PreparedData) -> None:
    torch.manual_seed(0)
    model = MASS(MASSConfig(dim=8, song_init="svd"), planted.n_users, planted.n_playlists,
                 planted.n_songs)
    model.init_from_data(planted)
    songs = model.song_emb.weight.detach()
    _, factors = training_factors(planted, 8)
    assert torch.allclose(songs, factors - factors.min(0).values)
    assert bool((songs >= 0).all()) and torch.equal(model.att_song_emb.weight, songs)
    assert not model.user_emb.weight.any() and not model.att_user_emb.weight.any()
    # eq. 12 with [-I | I] and u = 0: the query is the candidate song's own vector
    users = torch.tensor([0, 1])
    s = songs[:5].unsqueeze(0).expand(2, 5, 8)
    q = model._queries(model.query, model._context(users, users), s)
    assert torch.allclose(q, s)


def test_split_signs_against_a_loop() -> None:
    torch.manual_seed(3)
    f = torch.randn(6, 3)
    out = split_signs(f, 7)
    assert out.shape == (6, 7) and bool((out >= 0).all())
    for i in range(6):
        for j in range(3):
            x = float(f[i, j])
            assert float(out[i, j]) == (x if x > 0 else 0.0)
            assert float(out[i, 3 + j]) == (-x if x < 0 else 0.0)
        assert float(out[i, 6]) == 0.0  # the padding
    # no offset: each row keeps its factors' norm
    assert torch.allclose(out.norm(dim=1), f.norm(dim=1))
    # distances: |f_a - f_b|² less 2|f_a||f_b| where the signs differ, never more
    for a in range(6):
        for b in range(6):
            exact = float((f[a] - f[b]).square().sum())
            cross = sum(2 * abs(float(f[a, j] * f[b, j]))
                        for j in range(3) if float(f[a, j] * f[b, j]) < 0)
            assert float((out[a] - out[b]).square().sum()) == pytest.approx(exact - cross, abs=1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        split_signs(f, 5)


def test_mass_svd_split_start_has_no_offset(planted: PreparedData) -> None:
    torch.manual_seed(0)
    model = MASS(MASSConfig(dim=8, song_init="svd-split"), planted.n_users,
                 planted.n_playlists, planted.n_songs)
    model.init_from_data(planted)
    songs = model.song_emb.weight.detach()
    _, factors = training_factors(planted, 4)
    assert torch.equal(songs, split_signs(factors, 8))
    assert torch.equal(model.att_song_emb.weight, songs)
    assert not model.user_emb.weight.any() and not model.att_user_emb.weight.any()
    # the song rows are as long as the factors' rows: nothing added to every song
    assert torch.allclose(songs.norm(dim=1), factors.norm(dim=1), atol=1e-6)
    users = torch.tensor([0, 1])
    s = songs[:5].unsqueeze(0).expand(2, 5, 8)
    q = model._queries(model.query, model._context(users, users), s)
    assert torch.allclose(q, s)  # eq. 12 starts as the identity, as with "svd"


def test_random_start_is_left_alone(planted: PreparedData) -> None:
    torch.manual_seed(0)
    model = MASS(MASSConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.init_from_data(planted)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(MasrError, match="song_init"):
        MASSConfig(song_init="pca")


@pytest.mark.parametrize("init", ["svd", "svd-split"])
def test_train_cli_starts_mass_from_the_svd(planted_dir: Path, tmp_path: Path, init: str) -> None:
    runs = tmp_path / "runs"
    args = ["train", "--model", "amass", "--data", str(planted_dir), "--runs", str(runs),
            "--epochs", "1", "--adv-epochs", "1", "--neg", "16", "--batch-size", "32",
            "--threads", "1", "--set", f"mass.song_init={init}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    info = json.loads((runs / "mass" / "run.json").read_text())
    assert info["model_config"]["song_init"] == init
    ckpt = torch.load(runs / "mass" / "best.pt", weights_only=True)
    assert ckpt["config"]["song_init"] == init
    amass = json.loads((runs / "amass" / "run.json").read_text())
    assert amass["status"] == "finished"
    # the same command again resumes nothing and replaces nothing: the runs are reused
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
