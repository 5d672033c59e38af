"""The embedded synthetic dataset: deterministic, realistic in shape, and learnable."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from masr.errors import MasrError
from masr.synth import COLUMNS, SynthConfig, iter_synthesize, synthesize, write_synthetic


@pytest.fixture(scope="module")
def small() -> pl.DataFrame:
    return synthesize(SynthConfig(users=300, seed=3))


def test_same_seed_same_rows_other_seed_other_rows(small):
    assert synthesize(SynthConfig(users=300, seed=3)).equals(small)
    other = synthesize(SynthConfig(users=300, seed=4))
    assert not other.equals(small)


def test_chunking_does_not_change_the_rows():
    cfg = SynthConfig(users=2500, seed=1, names=False)
    whole = pl.concat(list(iter_synthesize(cfg, chunk_users=10_000)))
    chunked = pl.concat(list(iter_synthesize(cfg, chunk_users=1000)))
    assert whole.equals(chunked)


def test_columns_and_shape(small):
    assert tuple(small.columns) == COLUMNS
    assert small["user_id"].n_unique() == 300
    sizes = small.group_by("playlist_id").len()["len"]
    assert (sizes < 5).mean() < 0.02 and sizes.max() <= 60  # a few short ones: prep drops them
    assert 10 <= sizes.mean() <= 18
    per_user = small.group_by("user_id").agg(pl.col("playlist_id").n_unique())["playlist_id"]
    assert 4 <= per_user.mean() <= 6
    # no duplicate (playlist, track) pairs, positions 0..len-1
    assert small.select("playlist_id", "track_id").is_duplicated().sum() == 0
    pos = small.group_by("playlist_id").agg(pl.col("position").max() + 1 == pl.len())
    assert pos["position"].all()
    # each playlist id belongs to one user; each track has one name and one artist
    assert (small.group_by("playlist_id").agg(pl.col("user_id").n_unique())["user_id"] == 1).all()
    names = small.group_by("track_id").agg(pl.col("track_name", "artist_name").n_unique())
    assert (names["track_name"] == 1).all() and (names["artist_name"] == 1).all()


def test_popularity_is_a_power_law(small):
    counts = np.sort(small.group_by("track_id").len()["len"].to_numpy())[::-1]
    top = counts[: max(1, len(counts) // 10)].sum() / counts.sum()
    assert top > 0.3  # the top 10% of songs hold a large share of the rows
    assert counts[0] > 10 * np.median(counts)


def _hit_at_10(small: pl.DataFrame) -> tuple[float, float]:
    """Leave one song out per playlist; rank all songs by popularity vs. item co-occurrence."""
    p = small["playlist_id"].rank("dense").to_numpy().astype(np.int64) - 1
    s = small["track_id"].rank("dense").to_numpy().astype(np.int64) - 1
    n_p, n_s = p.max() + 1, s.max() + 1
    rng = np.random.default_rng(0)
    order = np.lexsort((rng.random(len(p)), p))
    first = np.ones(len(p), dtype=bool)
    first[1:] = p[order][1:] != p[order][:-1]
    held = order[first]  # one random row per playlist
    train = np.ones(len(p), dtype=bool)
    train[held] = False
    x = np.zeros((n_p, n_s))
    x[p[train], s[train]] = 1.0
    pop = x.sum(0)
    co = x.T @ x  # (S, S) co-occurrence
    np.fill_diagonal(co, 0)
    score_knn = x @ co  # (P, S): item-kNN with raw co-occurrence
    score_pop = np.broadcast_to(pop, x.shape).copy()
    hits = []
    for score in (score_pop, score_knn):
        score = np.where(x > 0, -np.inf, score)
        target = score[p[held], s[held]]
        rank = (score[p[held]] > target[:, None]).sum(1)
        hits.append(float((rank < 10).mean()))
    return hits[0], hits[1]


def test_item_cooccurrence_clearly_beats_popularity(small):
    pop, knn = _hit_at_10(small)
    assert knn > 2 * pop and knn > 0.2, (pop, knn)


@pytest.mark.parametrize("name", ["s.csv", "s.tsv", "s.csv.gz", "s.parquet"])
def test_write_synthetic_round_trips(tmp_path, name):
    cfg = SynthConfig(users=40, seed=2)
    left = tmp_path / f".{name}.abcd1234.tmp"  # what a killed `masr synth --out` left
    left.write_text("half")
    said: list[str] = []
    rows = write_synthetic(tmp_path / name, cfg, said.append)
    assert not left.exists() and "removed the temporary files of an earlier, killed" in said[0]
    path = tmp_path / name
    if name.endswith(".parquet"):
        back = pl.read_parquet(path)
    else:
        back = pl.read_csv(path, separator="\t" if ".tsv" in name else ",", infer_schema=False)
        back = back.with_columns(pl.col("position").cast(pl.Int32))
    assert rows == back.height
    assert back.equals(synthesize(cfg))
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_out_inside_prepared_data_is_refused(tmp_path):
    """masr prep replaces its folder whole: a synth file written there would go with it."""
    from masr.errors import MasrError
    from masr.prep import prepare

    prepare(None, tmp_path / "data", synth_users=60)
    with pytest.raises(MasrError, match="inside the prepared data folder"):
        write_synthetic(tmp_path / "data" / "x.csv", SynthConfig(users=40))
    assert not (tmp_path / "data" / "x.csv").exists()


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(MasrError, match="--users"):
        synthesize(SynthConfig(users=0))
    with pytest.raises(MasrError, match="is a directory"):
        write_synthetic(tmp_path, SynthConfig(users=5))


def test_sizes_past_the_generator_are_one_line() -> None:
    """Sizes numpy cannot allocate (or a machine could not hold) are refused before any work,
    naming the option given."""
    import pytest

    from masr.errors import MasrError
    from masr.synth import SYNTH_MAX, SynthConfig

    with pytest.raises(MasrError, match="--playlists"):
        SynthConfig.sized(SYNTH_MAX + 1)
    for kwargs, option in (({"users": 10**19}, "--users"), ({"songs": 10**23}, "--songs")):
        with pytest.raises(MasrError, match=option):
            SynthConfig(**kwargs).validate()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": "5"}, "--users '5': is not an integer"),
        ({"seed": -1}, "--seed must be in [0, 2^63 - 1] (got -1)"),
        ({"seed": 1.5}, "--seed 1.5: is not an integer"),
        ({"favourite_artists": 0}, "favourite_artists must be at least 1 with share_favourite"),
        ({"favourite_artists": -1, "share_favourite": 0.0}, "favourite_artists must be at least"),
        ({"draws_per_song": 0}, "draws_per_song must be at least 1 (got 0)"),
        ({"songs_per_artist": 0.0}, "songs_per_artist must be positive (got 0)"),
        ({"playlists_per_user": float("nan")}, "playlists_per_user nan: must be a finite number"),
        ({"share_noise": float("nan")}, "share_noise nan: must be a finite number"),
        ({"length_shape": float("nan")}, "length_shape nan: must be a finite number"),
    ],
)
def test_library_settings_are_checked_before_numpy_sees_them(kwargs: dict, message: str) -> None:
    """SynthConfig built in Python (QA: TypeError, ZeroDivisionError or numpy's ValueError from
    deep inside the generator, or NaN shares generating a table)."""
    import re

    with pytest.raises(MasrError, match=f"^{re.escape(message)}"):
        synthesize(SynthConfig(**{"users": 20, **kwargs}))


def test_no_favourite_artists_is_fine_when_none_is_drawn() -> None:
    """Review: favourite_artists=0 generated a table with share_favourite=0 before the checks
    came, and still does."""
    table = synthesize(SynthConfig(users=20, favourite_artists=0, share_favourite=0.0))
    assert table.height > 0


def test_a_dict_for_the_config_is_one_line(tmp_path) -> None:
    with pytest.raises(MasrError, match="^cfg: expected SynthConfig, not dict"):
        synthesize({"users": 5})
    with pytest.raises(MasrError, match="^cfg: expected SynthConfig, not dict"):
        write_synthetic(tmp_path / "x.csv", {"users": 5})
    assert not list(tmp_path.iterdir())
