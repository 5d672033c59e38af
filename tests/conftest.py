"""Shared fixtures: tiny prepared datasets with a planted structure and a known right answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

# compiling costs seconds per process and shape: tests train eagerly unless one asks
os.environ.setdefault("MASR_COMPILE", "0")

from masr.dataset import FORMAT_VERSION, PreparedData, fingerprint_of, load_prepared


def write_planted(
    path: Path,
    *,
    n_groups: int = 4,
    songs_per_group: int = 12,
    users_per_group: int = 3,
    playlists_per_user: int = 3,
    playlist_len: int = 8,
    n_negatives: int = 20,
    seed: int = 0,
) -> Path:
    """Write a prepared-data directory (docs/design.md format) where every user and playlist
    draws its songs from one group: a model that learns the groups ranks held-out songs first."""
    rng = np.random.default_rng(seed)
    n_songs = n_groups * songs_per_group
    users, playlists, rows = [], [], []
    p = 0
    for g in range(n_groups):
        group = np.arange(g * songs_per_group, (g + 1) * songs_per_group)
        for _ in range(users_per_group):
            u = len(users)
            users.append(u)
            for _ in range(playlists_per_user):
                songs = rng.choice(group, size=playlist_len, replace=False)
                playlists.append((p, u))
                rows += [(p, int(s), i) for i, s in enumerate(songs)]
                p += 1
    inter = pl.DataFrame(rows, schema=["playlist_idx", "song_idx", "position"], orient="row")
    train, valid, test = [], [], []
    for (pid,), grp in inter.group_by(["playlist_idx"], maintain_order=True):
        songs = grp["song_idx"].to_numpy()
        v, t = rng.choice(len(songs), size=2, replace=False)
        others = np.setdiff1d(np.arange(n_songs), songs)
        for idx, target in ((v, valid), (t, test)):
            neg = rng.choice(others, size=min(n_negatives, len(others)), replace=False)
            target.append(
                (pid, int(songs[idx]), [int(x) for x in neg], int(grp["position"][int(idx)]))
            )
        keep = np.setdiff1d(np.arange(len(songs)), [v, t])
        train += [(pid, int(songs[i]), int(grp["position"][int(i)])) for i in keep]
    path.mkdir(parents=True, exist_ok=True)
    i32 = pl.Int32
    pl.DataFrame(
        {"user_idx": users, "user_id": [f"u{u}" for u in users]},
        schema={"user_idx": i32, "user_id": pl.String},
    ).write_parquet(path / "users.parquet")
    pl.DataFrame(
        {
            "playlist_idx": [a for a, _ in playlists],
            "playlist_id": [f"p{a}" for a, _ in playlists],
            "user_idx": [b for _, b in playlists],
        },
        schema={"playlist_idx": i32, "playlist_id": pl.String, "user_idx": i32},
    ).write_parquet(path / "playlists.parquet")
    pl.DataFrame(
        {"song_idx": list(range(n_songs)), "track_id": [f"s{s}" for s in range(n_songs)]},
        schema={"song_idx": i32, "track_id": pl.String},
    ).write_parquet(path / "songs.parquet")
    pl.DataFrame(
        train, schema={"playlist_idx": i32, "song_idx": i32, "position": i32}, orient="row"
    ).write_parquet(path / "train.parquet")
    case_schema = {"playlist_idx": i32, "song_idx": i32, "negatives": pl.List(i32), "position": i32}
    pl.DataFrame(valid, schema=case_schema, orient="row").write_parquet(path / "valid.parquet")
    pl.DataFrame(test, schema=case_schema, orient="row").write_parquet(path / "test.parquet")
    n_train_songs = len({s for _, s, _ in train})
    assert n_train_songs == n_songs, "planted data must keep every song in training"
    manifest = {
        "format_version": FORMAT_VERSION,
        "users": len(users),
        "playlists": len(playlists),
        "songs": n_songs,
        "interactions": len(rows),
        "catalog_songs": n_songs,
        "train": len(train),
        "valid": len(valid),
        "test": len(test),
        "dropped_cases": {"valid": 0, "test": 0},
        "seed": seed,
        "min_songs": 5,
        "min_song_playlists": 1,
        "max_playlist_songs": None,
        "max_user_playlists": None,
        "negatives": n_negatives,
        "short_negative_cases": 0,
        "input": {"path": "planted", "format": "synthetic", "rows": len(rows)},
        "checksum": f"planted:{seed}",
        "columns": {"user": "user_id", "playlist": "playlist_id", "track": "track_id"},
    }
    manifest["fingerprint"] = fingerprint_of(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return path


@pytest.fixture
def planted_dir(tmp_path: Path) -> Path:
    return write_planted(tmp_path / "data")


@pytest.fixture
def planted(planted_dir: Path) -> PreparedData:
    return load_prepared(planted_dir)


def load_benchmark(name: str):
    """A script of benchmarks/ imported as a module (they are scripts, not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
