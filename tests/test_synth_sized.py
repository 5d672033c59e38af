"""`masr synth --playlists ...`: MPD-shaped data of any size, streamed in bounded memory."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import masr.synth as synth
from masr.config import Columns
from masr.errors import MasrError
from masr.io import read_interactions
from masr.prep import encode, prepare
from masr.synth import SynthConfig, synthesize, write_synthetic
from masr_cli.main import app


@pytest.fixture(scope="module")
def mpd_like() -> pl.DataFrame:
    return synthesize(SynthConfig.sized(3000, seed=1, names=False))


def test_sized_world_has_mpd_shape(mpd_like):
    sizes = mpd_like.group_by("playlist_id").len()["len"]
    assert mpd_like["playlist_id"].n_unique() == 3000  # one user each: exactly this many
    assert mpd_like["user_id"].n_unique() == 3000
    assert sizes.min() >= 5 and sizes.max() <= 250
    assert 58 <= sizes.mean() <= 72 and 40 <= sizes.median() <= 58  # MPD: 66.3 and 49
    counts = np.sort(mpd_like.group_by("track_id").len()["len"].to_numpy())[::-1]
    assert counts[0] > 20 * np.median(counts)  # a power law: hits and a long tail
    assert counts[0] < 0.5 * 3000
    assert mpd_like.select("playlist_id", "track_id").is_duplicated().sum() == 0


def test_songs_and_users_options():
    cfg = SynthConfig.sized(2000, songs=1500, users=400, mean_length=20, names=False)
    df = synthesize(cfg)
    assert cfg.n_songs == 1500 and df["track_id"].n_unique() <= 1500
    assert df["user_id"].n_unique() == 400
    assert 1700 <= df["playlist_id"].n_unique() <= 2300  # 1 + Poisson per user: about 2000
    assert 15 <= df.group_by("playlist_id").len()["len"].mean() <= 24
    with pytest.raises(MasrError, match="cannot exceed"):
        SynthConfig.sized(10, users=20)
    with pytest.raises(MasrError, match="--songs"):
        synthesize(SynthConfig.sized(10, songs=3))


def test_streamed_parquet_equals_the_whole_table(tmp_path, monkeypatch):
    cfg = SynthConfig.sized(2500, seed=4)
    monkeypatch.setattr(synth, "WHOLE_PARQUET_ROWS", 0)  # force the streaming path
    monkeypatch.setattr(synth, "CHUNK_ROWS", 1000)  # several chunks
    rows = write_synthetic(tmp_path / "m.parquet", cfg)
    back = pl.read_parquet(tmp_path / "m.parquet")
    assert rows == back.height and back.equals(synthesize(cfg))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.parquet"]  # parts removed


def test_cli_synth_playlists_then_prep_with_playlist_as_user(tmp_path):
    """MPD has no users: --user-col names the playlist column, each playlist its own user."""
    runner = CliRunner()
    src = tmp_path / "mpd.csv"
    args = ["synth", "--out", str(src), "--playlists", "300", "--songs", "900", "--no-names"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    df = pl.read_csv(src, infer_schema=False)
    assert df.columns == ["user_id", "playlist_id", "track_id", "position"]
    out = tmp_path / "data"
    result = runner.invoke(app, ["prep", str(src), "--user-col", "playlist_id", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["users"] == m["playlists"] == 300
    assert m["columns"]["user"] == m["columns"]["playlist"] == "playlist_id"
    users = pl.read_parquet(out / "users.parquet")
    pls = pl.read_parquet(out / "playlists.parquet")
    assert (users["user_id"].gather(pls["user_idx"]) == pls["playlist_id"]).all()


def test_playlist_as_user_without_a_user_column(tmp_path):
    src = tmp_path / "p.csv"
    pl.DataFrame(
        {"pid": [str(i // 6) for i in range(36)], "track": [f"t{i % 9}" for i in range(36)]}
    ).write_csv(src)

    m = prepare(src, tmp_path / "o", columns=Columns("pid", "pid", "track")).manifest
    assert m["users"] == m["playlists"] == 6 and m["playlists_with_several_users"] == 0


def test_extras_read_apart_give_the_same_songs_table(tmp_path):
    """prep reads track/artist names once per track (first row wins), not on every row."""
    src = tmp_path / "x.csv"
    pl.DataFrame(
        {
            "user_id": ["u"] * 12,
            "playlist_id": ["a"] * 6 + ["b"] * 6,
            "track_id": [f"t{i}" for i in (5, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6)],
            "track_name": [f"n{i}" for i in range(12)],  # t1..t5 renamed in playlist b
            "artist_name": ["x"] * 12,
        }
    ).write_csv(src)
    apart = read_interactions(src, extras_apart=True)
    whole = read_interactions(src)
    assert "track_name" not in apart.frame.columns and apart.song_extras.height == 7
    a = encode(apart.frame, apart.song_extras).song_extras
    b = encode(whole.frame).song_extras
    assert a.equals(b) and a["track_name"].to_list()[:2] == ["n5", "n1"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"playlists": 0}, "--playlists must be at least 1 (got 0)"),
        ({"playlists": 5, "users": 0}, "--users must be at least 1 (got 0)"),
        ({"playlists": 5, "mean_length": -1}, "--mean-length -1: must lie between 5"),
    ],
)
def test_each_bad_size_is_named_alone(kwargs: dict, message: str) -> None:
    with pytest.raises(MasrError) as err:
        SynthConfig.sized(**kwargs).validate()
    assert message in str(err.value)
