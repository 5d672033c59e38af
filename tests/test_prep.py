"""Data preparation: cleaning with known answers, split and negative invariants, round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masr.dataset import fingerprint_of, load_prepared
from masr.errors import MasrError
from masr.prep import (
    PrepConfig,
    _codes,
    first_occurrence,
    kcore,
    outlier_rows,
    prepare,
    sample_negatives,
    split_roles,
)
from masr.synth import SynthConfig, write_synthetic


def _kcore_reference(rows: set[tuple[int, int]], min_songs: int, min_pl: int) -> set:
    """Slow, obvious fixpoint: drop small playlists and rare songs until nothing changes."""
    rows = set(rows)
    while True:
        p_size: dict[int, int] = {}
        s_size: dict[int, int] = {}
        for p, s in rows:
            p_size[p] = p_size.get(p, 0) + 1
            s_size[s] = s_size.get(s, 0) + 1
        keep = {(p, s) for p, s in rows if p_size[p] >= min_songs and s_size[s] >= min_pl}
        if keep == rows:
            return rows
        rows = keep


def test_kcore_known_answer_cascades():
    # playlist 0: songs 0-4 (5 songs); playlist 1: songs 0-3 + 9 (5 songs, 9 is rare);
    # playlist 2: songs 5-7 (too short). With min_song_playlists=2, song 9 (only in playlist 1)
    # goes, which makes playlist 1 too short, which makes song 4 rare... and so on to nothing
    # but what survives mutually.
    rows = (
        [(0, s) for s in range(5)] + [(1, s) for s in (0, 1, 2, 3, 9)] + [(2, s) for s in (5, 6, 7)]
    )
    p = np.array([r[0] for r in rows])
    s = np.array([r[1] for r in rows])
    kept = kcore(p, s, min_songs=5, min_song_playlists=1)
    assert kept.tolist() == [True] * 10 + [False] * 3
    kept = kcore(p, s, min_songs=5, min_song_playlists=2)
    assert not kept.any()  # 9 rare -> playlist 1 short -> 4 rare -> playlist 0 short -> empty
    kept = kcore(p, s, min_songs=4, min_song_playlists=2)
    # 9 and 4 are rare; playlists 0 and 1 keep songs 0-3 (4 each): stable
    assert {(int(a), int(b)) for a, b in zip(p[kept], s[kept], strict=False)} == {
        (q, t) for q in (0, 1) for t in range(4)
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pairs=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 15)), max_size=120),
    min_songs=st.integers(1, 6),
    min_pl=st.integers(1, 4),
)
def test_cleaning_invariants_property(pairs, min_songs, min_pl):
    p = np.array([a for a, _ in pairs], dtype=np.int32)
    s = np.array([b for _, b in pairs], dtype=np.int32)
    first = first_occurrence(p, s) if len(p) else np.zeros(0, dtype=bool)
    # dedupe keeps exactly one row per distinct pair, and the first one
    assert first.sum() == len(set(pairs))
    seen = set()
    for i, pair in enumerate(pairs):
        assert first[i] == (pair not in seen)
        seen.add(pair)
    dp, ds = p[first], s[first]
    kept = kcore(dp, ds, min_songs, min_pl)
    got = {(int(a), int(b)) for a, b in zip(dp[kept], ds[kept], strict=False)}
    # the result is the reference fixpoint: every playlist and song meets its threshold, and no
    # row that could stay was dropped
    assert got == _kcore_reference(set(pairs), min_songs, min_pl)
    for q in {a for a, _ in got}:
        assert sum(1 for a, _ in got if a == q) >= min_songs
    for t in {b for _, b in got}:
        assert sum(1 for _, b in got if b == t) >= min_pl


def test_outliers_drop_long_playlists_and_heavy_users():
    # playlists 0,1,2 of user 0; playlist 3 of user 1 is long
    playlist = np.array([0, 0, 1, 1, 2, 3, 3, 3, 3])
    owner = np.array([0, 0, 0, 1])
    assert outlier_rows(playlist, owner, None, None).sum() == 0
    drop = outlier_rows(playlist, owner, max_playlist_songs=3, max_user_playlists=None)
    assert drop.tolist() == [False] * 5 + [True] * 4
    drop = outlier_rows(playlist, owner, max_playlist_songs=None, max_user_playlists=2)
    assert drop.tolist() == [True] * 5 + [False] * 4


def test_split_rows_are_two_distinct_rows_of_each_playlist():
    indptr = np.array([0, 3, 5, 12, 20])
    for seed in range(20):
        v, t = split_roles(indptr, np.random.default_rng(seed))
        assert np.all(v != t)
        assert np.all((v >= indptr[:-1]) & (v < indptr[1:]))
        assert np.all((t >= indptr[:-1]) & (t < indptr[1:]))


def _excluded(p: np.ndarray, excl_indptr: np.ndarray, excl_song: np.ndarray, c: int) -> set:
    return set(excl_song[excl_indptr[p[c]] : excl_indptr[p[c] + 1]].tolist())


@pytest.mark.parametrize("n_catalog", [30, 150, 1000, 50_000])
def test_negatives_distinct_eligible_and_uniform(n_catalog):
    rng = np.random.default_rng(1)
    n_pl = 40
    sizes = rng.integers(1, min(60, n_catalog - 1), n_pl)
    excl_song = np.concatenate([np.sort(rng.choice(n_catalog, k, replace=False)) for k in sizes])
    excl_indptr = np.concatenate([[0], np.cumsum(sizes)])
    case_pl = np.repeat(np.arange(n_pl), 3)
    negs, cnt = sample_negatives(case_pl, excl_indptr, excl_song, n_catalog, 25, rng)
    assert negs.shape == (len(case_pl), 25) and negs.dtype == np.int32
    for c in range(len(case_pl)):
        row = negs[c][negs[c] >= 0]
        eligible = n_catalog - sizes[case_pl[c]]
        assert len(row) == cnt[c] == min(25, eligible)
        assert len(set(row.tolist())) == len(row)  # distinct
        assert not set(row.tolist()) & _excluded(case_pl, excl_indptr, excl_song, c)
        assert row.min() >= 0 and row.max() < n_catalog
        assert np.all(negs[c][cnt[c] :] == -1)


def test_negatives_are_uniform_over_eligible_songs():
    # one playlist excluding songs 0-9 of a 60-song catalog: each of the 50 others is drawn
    # with probability 10/50 per case
    excl_song, excl_indptr = np.arange(10), np.array([0, 10])
    case_pl = np.zeros(20_000, dtype=np.int64)
    negs, _ = sample_negatives(case_pl, excl_indptr, excl_song, 60, 10, np.random.default_rng(0))
    freq = np.bincount(negs.ravel(), minlength=60) / len(case_pl)
    assert np.all(freq[:10] == 0)
    assert np.allclose(freq[10:], 0.2, atol=0.015)
    # the rejection path (big catalog) too: first songs are not favoured
    excl_song, excl_indptr = np.arange(5), np.array([0, 5])
    negs, _ = sample_negatives(
        case_pl[:5000], excl_indptr, excl_song, 2000, 100, np.random.default_rng(1)
    )
    freq = np.bincount(negs.ravel(), minlength=2000) / 5000
    assert np.all(freq[:5] == 0)
    assert abs(freq[5:1000].mean() - freq[1000:].mean()) < 0.003
    assert np.allclose(freq[5:], 100 / 1995, atol=0.02)


# ---------------------------------------------------------------------------------------------
# the whole pipeline on a small synthetic file


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "small.csv"
    write_synthetic(path, SynthConfig(users=80, seed=5))
    return path


@pytest.fixture(scope="module")
def prepared(small_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "data"
    prepare(small_csv, out, config=PrepConfig(seed=3, negatives=50))
    return out


def test_round_trip_through_load_prepared(prepared, small_csv):
    d = load_prepared(prepared)
    m = json.loads((prepared / "manifest.json").read_text())
    assert m["fingerprint"] == fingerprint_of(m)
    assert m["format_version"] == 1 and m["negatives"] == 50 and m["seed"] == 3
    assert m["input"]["rows"] == pl.read_csv(small_csv).height
    assert len(m["checksum"]) == 64
    assert m["interactions"] == m["train"] + m["valid"] + m["test"] + sum(
        m["dropped_cases"].values()
    )
    # int32 indices on disk, contiguous and 0-based
    for name, cols in {
        "users": ["user_idx"],
        "playlists": ["playlist_idx", "user_idx"],
        "songs": ["song_idx"],
        "train": ["playlist_idx", "song_idx", "position"],
        "valid": ["playlist_idx", "song_idx", "position"],
    }.items():
        df = pl.read_parquet(prepared / f"{name}.parquet")
        for c in cols:
            assert df[c].dtype == pl.Int32, (name, c)
    assert pl.read_parquet(prepared / "valid.parquet")["negatives"].dtype == pl.List(pl.Int32)
    songs = pl.read_parquet(prepared / "songs.parquet")
    assert songs.columns == ["song_idx", "track_id", "track_name", "artist_name"]
    assert songs["song_idx"].to_list() == list(range(m["songs"]))
    # catalog songs first: exactly the songs of train
    assert set(d.train_song.tolist()) == set(range(m["catalog_songs"]))
    assert d.n_songs == m["catalog_songs"] and d.n_users == m["users"]
    assert m["stats"]["interactions"] == m["interactions"]


def test_split_invariants(prepared):
    d = load_prepared(prepared)
    # every playlist and user in train; at most one valid and one test case per playlist
    assert set(d.train_playlist.tolist()) == set(range(d.n_playlists))
    assert set(d.playlist_user.tolist()) == set(range(d.n_users))
    for cases in (d.valid, d.test):
        assert len(set(cases.playlist.tolist())) == len(cases)
        assert np.all(cases.song < d.n_songs)  # held-out songs occur in train
        train_pairs = set(zip(d.train_playlist.tolist(), d.train_song.tolist(), strict=False))
        assert not train_pairs & set(
            zip(cases.playlist.tolist(), cases.song.tolist(), strict=False)
        )
    vt = {(p, s) for p, s in zip(d.valid.playlist.tolist(), d.valid.song.tolist(), strict=False)}
    assert not vt & set(zip(d.test.playlist.tolist(), d.test.song.tolist(), strict=False))
    # negatives: distinct catalog songs, none of the playlist's songs
    members: dict[int, set] = {}
    for p, s in zip(d.train_playlist.tolist(), d.train_song.tolist(), strict=False):
        members.setdefault(p, set()).add(s)
    for cases in (d.valid, d.test):
        for p, s in zip(cases.playlist.tolist(), cases.song.tolist(), strict=False):
            members[p].add(s)
    for cases in (d.valid, d.test):
        assert cases.negatives.shape[1] == 50 and np.all(cases.negatives >= 0)
        for p, negs in zip(cases.playlist.tolist(), cases.negatives, strict=False):
            assert len(set(negs.tolist())) == 50
            assert not members[p] & set(negs.tolist())
            assert negs.max() < d.n_songs


def test_same_seed_same_data_and_row_order_does_not_matter(small_csv, prepared, tmp_path):
    shuffled = tmp_path / "shuffled.csv"
    pl.read_csv(small_csv, infer_schema=False).sample(fraction=1.0, shuffle=True, seed=9).write_csv(
        shuffled
    )
    prepare(shuffled, tmp_path / "again", config=PrepConfig(seed=3, negatives=50))
    for name in ("users", "playlists", "songs", "valid", "test"):
        a = pl.read_parquet(prepared / f"{name}.parquet")
        b = pl.read_parquet(tmp_path / "again" / f"{name}.parquet")
        assert a.equals(b), name
    prepare(small_csv, tmp_path / "other", config=PrepConfig(seed=4, negatives=50))
    a = pl.read_parquet(prepared / "test.parquet")
    b = pl.read_parquet(tmp_path / "other" / "test.parquet")
    assert not a.equals(b)


def test_duplicates_shared_playlists_and_owner(tmp_path):
    # playlist P1 appears with users A (6 rows) and B (2 rows); a repeated track is kept once
    rows = [("A", "P1", f"t{i}") for i in range(6)] + [("B", "P1", "t6"), ("B", "P1", "t7")]
    rows += [("B", "P2", f"t{i}") for i in range(5)] + [("B", "P2", "t0")]
    path = tmp_path / "in.csv"
    pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id"], orient="row").write_csv(path)
    said: list[str] = []
    m = prepare(path, tmp_path / "out", config=PrepConfig(negatives=3), log=said.append).manifest
    assert m["duplicates_dropped"] == 1 and m["playlists_with_several_users"] == 1
    # what each cleaning step removed (QA: only duplicates were counted): P2 has 5 songs left
    assert m["cleaning"] == {"duplicate_rows": 1, "outlier_rows": 0, "kcore_rows": 0,
                             "playlists_in": 2, "playlists_kept": 2}
    assert any(s.startswith("cleaning removed 1 duplicate row(s), 0 over") for s in said)
    # said on stderr too (QA: every user's "Favorites" merged into one playlist in silence)
    assert [s for s in said if "with several users" in s] == [
        "warning: 1 of 2 playlist ids come with several users; a playlist is its id alone (its "
        "rows stay together, owned by its main user). If ids repeat per user (every user's "
        "'Favorites'), give each playlist a unique id first, e.g. user and playlist id joined, "
        "as --playlist-col"
    ]
    assert m["interactions"] == 8 + 5 and m["playlists"] == 2 and m["users"] == 2
    pls = pl.read_parquet(tmp_path / "out" / "playlists.parquet")
    users = pl.read_parquet(tmp_path / "out" / "users.parquet")
    owner = dict(zip(pls["playlist_id"], users["user_id"].gather(pls["user_idx"]), strict=False))
    assert owner == {"P1": "A", "P2": "B"}
    assert "position" not in pl.read_parquet(tmp_path / "out" / "train.parquet").columns


def test_tiny_catalog_takes_all_eligible_negatives(tmp_path):
    # 2 playlists over 8 songs: each has 5 songs, so at most 3 eligible negatives
    rows = [("u", "a", f"s{i}") for i in range(5)] + [("u", "b", f"s{i}") for i in range(3, 8)]
    path = tmp_path / "tiny.csv"
    pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id"], orient="row").write_csv(path)
    said: list[str] = []
    m = prepare(path, tmp_path / "out", log=said.append).manifest
    assert m["short_negative_cases"] == m["valid"] + m["test"] > 0
    assert any(line.startswith(f"warning: {m['short_negative_cases']} case(s) have fewer than")
               for line in said)
    d = load_prepared(tmp_path / "out")
    for cases in (d.valid, d.test):
        for p, negs in zip(cases.playlist.tolist(), cases.negatives, strict=False):
            eligible = set(range(d.n_songs)) - _members(d, p)
            assert set(negs[negs >= 0].tolist()) == eligible  # all of them, fewer than 100


def _members(d, p: int) -> set:
    """Every song of playlist p: training songs and its held-out songs."""
    held = {int(s) for c in (d.valid, d.test) for s in c.song[c.playlist == p]}
    return set(d.playlist_songs(p).tolist()) | held


def test_caps_and_min_song_playlists_are_applied(small_csv, tmp_path):
    m = prepare(
        small_csv,
        tmp_path / "capped",
        config=PrepConfig(max_playlist_songs=15, max_user_playlists=5, min_song_playlists=2),
    ).manifest
    d = load_prepared(tmp_path / "capped")
    lengths = np.bincount(d.train_playlist) + 2
    assert m["stats"]["max_songs_per_playlist"] <= 15 and lengths.max() <= 15
    assert np.bincount(d.playlist_user).max() <= 5
    assert m["max_playlist_songs"] == 15 and m["min_song_playlists"] == 2


def test_embedded_default_is_deterministic(tmp_path):
    a = prepare(None, tmp_path / "a", synth_users=60).manifest
    b = prepare(None, tmp_path / "b", synth_users=60).manifest
    assert a["fingerprint"] == b["fingerprint"]
    assert a["checksum"] == "synthetic:0:60"
    assert pl.read_parquet(tmp_path / "a" / "test.parquet").equals(
        pl.read_parquet(tmp_path / "b" / "test.parquet")
    )


def test_rerun_replaces_output_and_nothing_left_half_written(small_csv, tmp_path):
    out = tmp_path / "data"
    prepare(small_csv, out, config=PrepConfig(negatives=3))
    (out / "stale.txt").write_text("old")  # beside an earlier output: replaced whole
    prepare(small_csv, out, config=PrepConfig(negatives=5))
    assert not (out / "stale.txt").exists()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(MasrError, match="nothing left") as err:
        prepare(small_csv, out, config=PrepConfig(min_songs=500))
    rows = pl.read_csv(small_csv).height  # every row: no duplicate, no outlier, all k-core
    assert f"0 duplicate, 0 outlier and {rows:,} k-core rows removed)" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # old output intact, no temp
    assert (out / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("config", "option"),
    [
        (PrepConfig(min_songs=2), "--min-songs"),
        (PrepConfig(min_song_playlists=0), "--min-song-playlists"),
        (PrepConfig(max_playlist_songs=3), "--max-playlist-songs"),
        (PrepConfig(max_user_playlists=0), "--max-user-playlists"),
        (PrepConfig(negatives=0), "--negatives"),
    ],
)
def test_bad_settings_name_the_option(config, option, tmp_path):
    with pytest.raises(MasrError, match=option):
        prepare(None, tmp_path / "x", config=config, synth_users=10)


def test_prep_path_does_not_import_torch():
    code = (
        "import sys, masr.prep, masr.synth, masr.io, masr_cli.prep, masr_cli.synth; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_codes_rank_by_id_string_even_with_hash_collisions(monkeypatch):
    ids = pl.Series(["b", "a", "c", "a", "10", "9"])
    codes, uniq = _codes(ids)
    assert uniq.to_list() == ["10", "9", "a", "b", "c"]
    assert codes.tolist() == [3, 2, 4, 2, 0, 1]
    # every id hashing alike must not merge different ids
    monkeypatch.setattr(
        pl.Series, "hash", lambda self, seed=0: pl.Series([7] * len(self), dtype=pl.UInt64)
    )
    codes2, uniq2 = _codes(ids)
    assert uniq2.to_list() == uniq.to_list() and codes2.tolist() == codes.tolist()


@pytest.mark.parametrize("digest_rows", [2, 1 << 20])
def test_table_digest_is_of_the_content_not_the_file_bytes(
    tmp_path, monkeypatch, digest_rows
) -> None:
    """Another Parquet writer (here: other compression and row groups, as another polars
    version writes) keeps the digest, so the fingerprint; any changed value changes it; also
    when a column is encoded in several pieces."""
    import masr.prep
    from masr.prep import table_digest

    monkeypatch.setattr(masr.prep, "DIGEST_ROWS", digest_rows)

    df = pl.DataFrame(
        {
            "playlist_idx": pl.Series([0, 1, 2], dtype=pl.Int32),
            "negatives": [[3, 4], [], [5]],
            "name": ["a", None, "ü"],
            "score": [0.5, None, 2.0],
        }
    )
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    df.write_parquet(a, compression="zstd")
    df.write_parquet(b, compression="uncompressed", row_group_size=1, statistics=False)
    assert a.read_bytes() != b.read_bytes()
    assert table_digest(a) == table_digest(b)
    for changed in (
        df.with_columns(pl.Series("negatives", [[3, 4], [5], []])),  # same elements, moved
        df.with_columns(pl.Series("name", ["a", "", "ü"])),  # null is not ""
        df.with_columns(pl.Series("name", ["ab", None, "ü"])),
        df.rename({"score": "other"}),
        df.with_columns(pl.col("score").fill_null(0.0)),
    ):
        changed.write_parquet(b)
        assert table_digest(b) != table_digest(a)


def test_negatives_past_any_catalog_are_one_line():
    import pytest

    from masr.prep import PrepConfig

    with pytest.raises(MasrError, match="--negatives .*at most 2,147,483,647"):
        PrepConfig(negatives=10**20).validate()


@pytest.mark.parametrize("form", ["spaced csv", "float parquet"])
def test_song_names_follow_ids_read_with_cleaning(tmp_path, form):
    """The names are joined to the catalog by the track id as the ids are read: spaces around
    a CSV field stripped, a float id read as the whole number it holds. Before, such ids
    matched no name and every track_name came out null."""
    rng = np.random.default_rng(1)
    p, s = rng.integers(0, 80, 2000), rng.integers(0, 150, 2000)
    if form == "spaced csv":
        path = tmp_path / "in.csv"
        lines = [
            f"u{a % 9}, p{a}, t{b}, Name {b} , Artist{b % 7}" for a, b in zip(p, s, strict=True)
        ]
        path.write_text(
            "user_id, playlist_id, track_id, track_name, artist_name\n" + "\n".join(lines) + "\n"
        )
        key = "t{}"
    else:
        path = tmp_path / "in.parquet"
        pl.DataFrame({
            "user_id": [f"u{a % 9}" for a in p], "playlist_id": [f"p{a}" for a in p],
            "track_id": s.astype(float), "track_name": [f"Name {b}" for b in s],
            "artist_name": [f"Artist{b % 7}" for b in s],
        }).write_parquet(path)
        key = "{}"
    prepare(path, tmp_path / "out")
    songs = pl.read_parquet(tmp_path / "out" / "songs.parquet")
    assert songs["track_name"].null_count() == 0 and songs["artist_name"].null_count() == 0
    for track, name in zip(songs["track_id"], songs["track_name"], strict=True):
        number = int(track[1:] if key == "t{}" else track)
        assert track == key.format(number) and name == f"Name {number}"


def test_the_manifest_counts_what_each_cleaning_step_removed(tmp_path):
    """Outliers first (a 10-song playlist over --max-playlist-songs 8), then the k-core (a
    3-song playlist under --min-songs 5): their rows counted apart, with the playlists kept."""
    rows = [("A", "P1", f"t{i}") for i in range(6)] + [("A", "P4", f"t{i}") for i in range(6)]
    rows += [("B", "P2", f"t{i}") for i in range(3)] + [("C", "P3", f"t{i}") for i in range(10)]
    path = tmp_path / "in.csv"
    pl.DataFrame(rows, schema=["user_id", "playlist_id", "track_id"], orient="row").write_csv(path)
    config = PrepConfig(negatives=3, max_playlist_songs=8)
    m = prepare(path, tmp_path / "out", config=config).manifest
    assert m["cleaning"] == {"duplicate_rows": 0, "outlier_rows": 10, "kcore_rows": 3,
                             "playlists_in": 4, "playlists_kept": 2}
    assert m["playlists"] == 2 and m["interactions"] == 12
