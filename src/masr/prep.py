"""Data preparation: read interactions, clean them (k-core), split, draw negatives, write.

The steps follow the paper (section 5.1) and docs/design.md ("Prepared data"):

1. **Encode.** Ids become int32 codes, ranked by their id string (so the result does not depend
   on the order of the input rows). A playlist is keyed by its ``playlist_id`` alone; when one
   playlist id appears with several users, its owner is the user with most rows in it (ties: the
   smallest user id) and all its rows stay with the playlist (counted in the manifest as
   ``playlists_with_several_users``).
2. **Clean.** Duplicate (playlist, song) rows are dropped, keeping the first. Outliers go next,
   judged on the deduplicated data: playlists with more than ``max_playlist_songs`` songs and
   users with more than ``max_user_playlists`` playlists. Then, repeated until nothing changes
   (the k-core fixpoint): drop playlists with fewer than ``min_songs`` songs and songs in fewer
   than ``min_song_playlists`` playlists.
3. **Split.** Per playlist one random song for validation and another for test (seeded); the rest
   train. A validation/test case whose song never occurs in training is dropped and counted.
4. **Negatives.** Per kept case, ``negatives`` distinct catalog songs drawn uniformly from those
   not in the playlist (none of its train/valid/test songs); all eligible ones when fewer.
5. **Write** the tables and ``manifest.json`` into a directory that replaces ``out`` whole.

Everything after reading is NumPy / Polars on integer arrays: no Python object per row.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from masr.atomic import atomic_dir, check_parents, check_replaceable_dir, sole_writer
from masr.config import MAX_SONG_COUNT, check_kinds
from masr.dataset import FORMAT_VERSION, MANIFEST, check_outside_prepared, fingerprint_of
from masr.errors import MasrError, check_instance
from masr.io import POSITION, SONG_EXTRAS, Columns, RawInput, check_file, read_interactions
from masr.seed import check_seed

Log = Callable[[str], None]


@dataclass(frozen=True)
class PrepConfig:
    """Cleaning, split and negative-sampling settings (the ``masr prep`` options)."""

    min_songs: int = 5
    min_song_playlists: int = 1
    max_playlist_songs: int | None = None
    max_user_playlists: int | None = None
    seed: int = 0
    negatives: int = 100

    def validate(self) -> None:
        check_kinds(self)  # "5" for min_songs: one line, not a TypeError
        if self.min_songs < 3:
            raise MasrError(
                f"--min-songs must be at least 3 (got {self.min_songs}): each playlist needs a "
                "validation song, a test song and a training song"
            )
        if self.min_song_playlists < 1:
            raise MasrError(
                f"--min-song-playlists must be at least 1 (got {self.min_song_playlists})"
            )
        if self.max_playlist_songs is not None and self.max_playlist_songs < self.min_songs:
            raise MasrError(
                f"--max-playlist-songs ({self.max_playlist_songs}) must be at least "
                f"--min-songs ({self.min_songs})"
            )
        if self.max_user_playlists is not None and self.max_user_playlists < 1:
            raise MasrError(
                f"--max-user-playlists must be at least 1 (got {self.max_user_playlists})"
            )
        if self.negatives < 1:
            raise MasrError(f"--negatives must be at least 1 (got {self.negatives})")
        if self.negatives > MAX_SONG_COUNT:  # past any catalog; numpy cannot size the draw
            raise MasrError(f"--negatives {self.negatives}: at most {MAX_SONG_COUNT:,}")
        check_seed(self.seed)


@dataclass
class Encoded:
    """Interactions as int32 codes into sorted id tables (one entry per input row)."""

    playlist: np.ndarray  # (N,) int32 code into playlist_ids
    song: np.ndarray  # (N,) int32 code into track_ids
    playlist_owner: np.ndarray  # (P0,) int32 code into user_ids
    user_ids: pl.Series  # (U0,) String, sorted
    playlist_ids: pl.Series  # (P0,) String, sorted
    track_ids: pl.Series  # (S0,) String, sorted
    position: pl.Series | None  # (N,) Int64 (nulls allowed)
    song_extras: pl.DataFrame | None  # (S0, extras) first value seen per track
    shared_playlists: int  # playlist ids seen with more than one user


# ----------------------------------------------------------------------------------------------
# 1. encode


def _codes(ids: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """(N,) int32 codes of ``ids`` ranked by id string, and the sorted unique ids.

    Rows are grouped by a 64-bit hash of the id (cheap to sort); a hash collision is caught by
    comparing every id with its group's id, and then the ids themselves are grouped instead.
    """
    h = ids.hash(seed=0)
    order = h.arg_sort().to_numpy()  # (N,)
    hs = h.to_numpy()[order]
    new = np.empty(len(hs), dtype=bool)
    new[:1] = True
    np.not_equal(hs[1:], hs[:-1], out=new[1:])
    code = np.empty(len(hs), dtype=np.int32)
    code[order] = np.cumsum(new, dtype=np.int32) - 1  # (N,) group of each row
    uniq = ids.gather(order[new])  # (U,) one id per group
    if not (uniq.gather(code) == ids).all():  # a collision: two ids share a hash
        phys = ids.cast(pl.Categorical).to_physical()
        pairs = pl.DataFrame({"code": phys, "id": ids}).unique("code")
        code = np.zeros(int(pairs["code"].max()) + 1, dtype=np.int32)
        code[pairs["code"].to_numpy()] = np.arange(pairs.height, dtype=np.int32)
        code, uniq = code[phys.to_numpy()], pairs["id"]
    rank = uniq.arg_sort().to_numpy()  # unique ids in string order
    lookup = np.empty(len(uniq), dtype=np.int32)
    lookup[rank] = np.arange(len(uniq), dtype=np.int32)
    return lookup[code], uniq.gather(rank)


def encode(frame: pl.DataFrame, song_extras: pl.DataFrame | None = None) -> Encoded:
    """Integer-encode a frame with columns user, playlist, track (+ position, extras).

    ``song_extras``: the extras apart, one row per track (``track`` + extras), as read by
    ``read_interactions(..., extras_apart=True)``; then the frame has none."""
    playlist, playlist_ids = _codes(frame["playlist"])
    song, track_ids = _codes(frame["track"])
    # the usual case, one user per playlist id: only each playlist's first user is encoded
    order = np.argsort(playlist, kind="stable")
    starts = np.flatnonzero(np.r_[True, playlist[order][1:] != playlist[order][:-1]])
    first_row = order[starts]  # (P0,) first row of each playlist, in playlist code order
    users = frame["user"]
    if (users.gather(first_row[playlist]) == users).all():
        owner, user_ids = _codes(users.gather(first_row))
        shared = 0
    else:
        user, user_ids = _codes(users)
        owner, shared = _owners(playlist, user, len(playlist_ids))
    extras = [c for c in SONG_EXTRAS if c in frame.columns]
    if song_extras is not None:  # one row per track already: put them in code order
        song_extras = (
            pl.DataFrame({"track": track_ids})
            .join(song_extras, on="track", how="left", maintain_order="left")
            .drop("track")
        )
    elif extras:
        first = pl.Series(song).is_first_distinct().to_numpy()
        song_extras = (
            frame.select(extras)
            .filter(first)
            .with_columns(pl.Series("code", song[first]))
            .sort("code")
            .drop("code")
        )
    return Encoded(
        playlist=playlist,
        song=song,
        playlist_owner=owner,
        user_ids=user_ids,
        playlist_ids=playlist_ids,
        track_ids=track_ids,
        position=frame[POSITION] if POSITION in frame.columns else None,
        song_extras=song_extras,
        shared_playlists=shared,
    )


def _owners(playlist: np.ndarray, user: np.ndarray, n_playlists: int) -> tuple[np.ndarray, int]:
    """Owner of each playlist: the user with most rows in it, ties to the smallest user code."""
    pairs = pl.DataFrame({"p": playlist, "u": user}).group_by("p", "u").len()
    owner = np.zeros(n_playlists, dtype=np.int32)
    if pairs.height == n_playlists:  # the usual case: one user per playlist id
        owner[pairs["p"].to_numpy()] = pairs["u"].to_numpy()
        return owner, 0
    best = pairs.sort(["p", "len", "u"], descending=[False, True, False]).unique(
        "p", keep="first", maintain_order=True
    )
    owner[best["p"].to_numpy()] = best["u"].to_numpy()
    return owner, int((pairs.group_by("p").len()["len"] > 1).sum())


# ----------------------------------------------------------------------------------------------
# 2. clean


def grouped_first_rows(playlist: np.ndarray, song: np.ndarray) -> np.ndarray:
    """Row indices sorted by (playlist, song), one per distinct pair: the pair's first row.

    A stable sort keeps equal pairs in input order, so the first of them is the one kept.
    """
    n_songs = int(song.max()) + 1 if len(song) else 1
    key = playlist.astype(np.int64) * n_songs + song  # (N,)
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    return order[first]


def first_occurrence(playlist: np.ndarray, song: np.ndarray) -> np.ndarray:
    """(N,) bool: True for the first row of each (playlist, song) pair (duplicates dropped)."""
    mask = np.zeros(len(playlist), dtype=bool)
    mask[grouped_first_rows(playlist, song)] = True
    return mask


def outlier_rows(
    playlist: np.ndarray,
    owner: np.ndarray,
    max_playlist_songs: int | None,
    max_user_playlists: int | None,
) -> np.ndarray:
    """(N,) bool: rows of playlists longer than the cap or of users with too many playlists.

    ``playlist`` (N,) holds deduplicated rows; ``owner`` (P0,) the user code of each playlist.
    """
    drop = np.zeros(len(playlist), dtype=bool)
    size = np.bincount(playlist, minlength=len(owner))
    if max_playlist_songs is not None:
        drop |= size[playlist] > max_playlist_songs
    if max_user_playlists is not None:
        per_user = np.bincount(owner[size > 0], minlength=int(owner.max()) + 1 if len(owner) else 0)
        drop |= per_user[owner[playlist]] > max_user_playlists
    return drop


def kcore(
    playlist: np.ndarray, song: np.ndarray, min_songs: int, min_song_playlists: int
) -> np.ndarray:
    """(N,) bool rows kept at the fixpoint: every kept playlist has >= min_songs kept songs and
    every kept song lies in >= min_song_playlists kept playlists (rows must be deduplicated)."""
    keep = np.arange(len(playlist))
    n_pl = int(playlist.max()) + 1 if len(playlist) else 0
    n_songs = int(song.max()) + 1 if len(song) else 0
    while len(keep):
        p, s = playlist[keep], song[keep]
        ok = np.bincount(p, minlength=n_pl)[p] >= min_songs
        if min_song_playlists > 1:
            ok &= np.bincount(s, minlength=n_songs)[s] >= min_song_playlists
        if ok.all():
            break
        keep = keep[ok]
    mask = np.zeros(len(playlist), dtype=bool)
    mask[keep] = True
    return mask


# ----------------------------------------------------------------------------------------------
# 3. split


def split_roles(indptr: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows (in playlist-grouped order, CSR ``indptr``) held out per playlist.

    Returns (valid_row (P,), test_row (P,)): two distinct random rows of each playlist, which
    must hold at least 2 rows.
    """
    n = np.diff(indptr)  # (P,)
    i = np.floor(rng.random(len(n)) * n).astype(np.int64)
    j = np.floor(rng.random(len(n)) * (n - 1)).astype(np.int64)
    j += j >= i  # a second, different row
    return indptr[:-1] + i, indptr[:-1] + j


# ----------------------------------------------------------------------------------------------
# 4. negatives


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(lo[i], hi[i])``: (owner i of each entry, the entries)."""
    n = hi - lo
    owner = np.repeat(np.arange(len(lo)), n)
    return owner, np.arange(len(owner)) + np.repeat(lo - (np.cumsum(n) - n), n)


def sample_negatives(
    case_playlist: np.ndarray,
    excl_indptr: np.ndarray,
    excl_song: np.ndarray,
    n_catalog: int,
    k: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``k`` distinct songs in ``[0, n_catalog)`` per case, uniformly among those not in
    its playlist: playlist p excludes ``excl_song[excl_indptr[p]:excl_indptr[p+1]]``.

    Returns (negatives (C, k) int32 padded with -1, count (C,) int64); a case gets fewer than
    ``k`` only when fewer are eligible (then all of them).

    Rejection sampling: draw ``k`` songs with replacement and accept the row when they are
    distinct and none is in the playlist; by symmetry an accepted row is a uniform k-subset of
    the eligible songs. Rows are redrawn until accepted, all rows of a round at once. Cases
    whose acceptance rate would be low (small catalog, huge playlist) draw densely instead:
    random keys over the whole catalog, excluded songs last, the k smallest.
    """
    n_cases = len(case_playlist)
    out = np.full((n_cases, k), -1, dtype=np.int32)
    n_excl = np.diff(excl_indptr)[case_playlist]  # (C,)
    eligible = n_catalog - n_excl
    count = np.maximum(np.minimum(eligible, k), 0).astype(np.int64)
    # log P(accept) = log P(k draws distinct) + log P(all eligible), roughly
    with np.errstate(divide="ignore", invalid="ignore"):
        log_accept = -k * (k - 1) / (2 * eligible) + k * np.log(eligible / n_catalog)
    dense = (eligible <= k) | ~(log_accept > np.log(0.05))

    pending = np.flatnonzero(~dense)
    rows_per_chunk = max(1, (1 << 22) // k)
    for _ in range(200):  # acceptance >= 5%: the pending set shrinks geometrically
        if not len(pending):
            break
        failed = []
        for start in range(0, len(pending), rows_per_chunk):
            rows = pending[start : start + rows_per_chunk]
            cand = np.sort(rng.integers(0, n_catalog, (len(rows), k), dtype=np.int32), axis=1)
            bad = (cand[:, 1:] == cand[:, :-1]).any(axis=1)  # (R,) a repeated draw
            # which excluded songs of each row's playlist were drawn: a merge of sorted keys
            hay = (np.arange(len(rows), dtype=np.int64)[:, None] * n_catalog + cand).ravel()
            p = case_playlist[rows]
            r_idx, e_idx = _ranges(excl_indptr[p], excl_indptr[p + 1])
            query = r_idx * n_catalog + excl_song[e_idx]
            pos = np.minimum(np.searchsorted(hay, query), len(hay) - 1)
            bad[r_idx[hay[pos] == query]] = True
            out[rows[~bad]] = cand[~bad]
            failed.append(rows[bad])
        pending = np.concatenate(failed)
    dense[pending] = True  # (never in practice) finish the stragglers densely

    d_rows = np.flatnonzero(dense)
    per_chunk = max(1, (1 << 23) // max(n_catalog, 1))
    take = min(k, n_catalog)
    for start in range(0, len(d_rows), per_chunk):
        rows = d_rows[start : start + per_chunk]
        keys = rng.random((len(rows), n_catalog))  # (R, V) a random order of the catalog
        p = case_playlist[rows]
        r_idx, e_idx = _ranges(excl_indptr[p], excl_indptr[p + 1])
        keys[r_idx, excl_song[e_idx]] = 2.0  # excluded songs sort last
        if take < n_catalog:
            part = np.argpartition(keys, take - 1, axis=1)[:, :take]
        else:
            part = np.broadcast_to(np.arange(n_catalog), keys.shape)
        vals = np.take_along_axis(keys, part, axis=1)
        order = np.argsort(vals, axis=1)
        part, vals = np.take_along_axis(part, order, 1), np.take_along_axis(vals, order, 1)
        out[rows, :take] = np.where(vals < 2.0, part, -1)
    return out, count


# ----------------------------------------------------------------------------------------------
# 5. the whole pipeline


@dataclass
class PrepResult:
    manifest: dict
    out: Path


def table1(users: int, playlists: int, songs: int, interactions: int, max_len: int) -> dict:
    """The paper's Table 1 figures."""
    return {
        "users": users,
        "playlists": playlists,
        "songs": songs,
        "interactions": interactions,
        "avg_playlists_per_user": round(playlists / users, 2) if users else 0.0,
        "avg_songs_per_playlist": round(interactions / playlists, 2) if playlists else 0.0,
        "max_songs_per_playlist": max_len,
        "density": interactions / (playlists * songs) if playlists and songs else 0.0,
    }


def prepare(
    input_path: str | Path | None,
    out: str | Path,
    *,
    columns: Columns | None = None,
    config: PrepConfig | None = None,
    synth_users: int | None = None,
    log: Log | None = None,
) -> PrepResult:
    """Run the whole preparation (module docstring) and write ``out``; returns a ``PrepResult``
    (the manifest and the folder written).

    ``input_path=None`` uses the embedded synthetic dataset (``synth_users`` users). The lock
    ``<out>.lock`` (``masr.lock``) keeps a second ``masr prep --out`` off the same folder.
    """
    for name, value, kind in (("columns", columns, Columns), ("config", config, PrepConfig)):
        if value is not None:  # a dict: one line, not later
            check_instance(value, kind, f"prepare({name}=...)")
    check_parents(out, "--out")  # before the lock beside it is made
    # a link to the folder: the folder it names is the output (locked, cleaned, replaced)
    with sole_writer(out, "masr prep", log):
        return _prepare(input_path, out, columns, config, synth_users, log)


def _prepare(
    input_path: str | Path | None,
    out: str | Path,
    columns: Columns | None,
    config: PrepConfig | None,
    synth_users: int | None,
    log: Log | None,
) -> PrepResult:
    config = PrepConfig() if config is None else config
    config.validate()
    columns = columns or Columns()
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    out = Path(out)
    head = None  # the input's start, read once
    if input_path is not None:  # what is wrong with the input first (not a folder of parts...)
        if str(input_path) == "-":  # as masr score reads standard input
            raise MasrError("INPUT -: masr prep reads a file, not standard input; save it first")
        head = check_file(Path(input_path))
    check_replaceable_dir(out, MANIFEST, inputs=() if input_path is None else (input_path,))
    check_outside_prepared(out, "--out", itself=False)  # a prep of that folder would remove it
    if input_path is None:
        named = [f"--{k}-col" for k, v in vars(columns).items() if v != getattr(Columns(), k)]
        if named:  # the embedded dataset has its own columns: a name given means an INPUT
            raise MasrError(
                f"{', '.join(named)} name columns of an INPUT file; the embedded dataset has "
                "its own (give the INPUT, or drop them)"
            )
        raw = _synthetic_input(config.seed, synth_users)
        source = "the embedded dataset"
    else:
        if synth_users is not None:
            raise MasrError("--users applies to the embedded dataset only; drop it or the INPUT")
        raw = read_interactions(input_path, columns, extras_apart=True, head=head)
        source = str(input_path)
    say(f"read {raw.rows:,} rows from {source} in {time.perf_counter() - t0:.2f}s")

    enc = encode(raw.frame, raw.song_extras)
    raw.frame, raw.song_extras = pl.DataFrame(), None  # free the strings
    if enc.shared_playlists:
        say(
            f"warning: {enc.shared_playlists:,} of {len(enc.playlist_ids):,} playlist ids come "
            "with several users; a playlist is its id alone (its rows stay together, owned by "
            "its main user). If ids repeat per user (every user's 'Favorites'), give each "
            "playlist a unique id first, e.g. user and playlist id joined, as --playlist-col"
        )
    n_rows = len(enc.playlist)

    # 2. clean: dedupe, outliers, k-core fixpoint
    rows = grouped_first_rows(enc.playlist, enc.song)  # grouped by playlist from here on
    duplicates = n_rows - len(rows)
    drop = outlier_rows(
        enc.playlist[rows], enc.playlist_owner, config.max_playlist_songs, config.max_user_playlists
    )
    rows = rows[~drop]
    before_kcore = len(rows)
    rows = rows[
        kcore(enc.playlist[rows], enc.song[rows], config.min_songs, config.min_song_playlists)
    ]
    # what each cleaning step removed, for the manifest and a line (QA: only duplicates were
    # counted, so a user could not tell what the minimum length took from their data)
    cleaning = {
        "duplicate_rows": duplicates,
        "outlier_rows": int(drop.sum()),
        "kcore_rows": before_kcore - len(rows),
    }
    if not len(rows):
        raise MasrError(  # with what each step took (review: the breakdown came after it)
            f"{source}: nothing left after cleaning ({_settings(config)}: "
            f"{cleaning['duplicate_rows']:,} duplicate, {cleaning['outlier_rows']:,} outlier "
            f"and {cleaning['kcore_rows']:,} k-core rows removed); lower the thresholds or "
            "check the columns"
        )

    # compact ids (order kept: sorted by id string)
    p_code, s_code = enc.playlist[rows], enc.song[rows]
    enc.playlist = enc.song = np.empty(0, dtype=np.int32)  # per-row arrays: keep few alive
    p_keep = np.flatnonzero(np.bincount(p_code, minlength=len(enc.playlist_ids)))
    p_new = np.full(len(enc.playlist_ids), -1, dtype=np.int32)  # int32: half the memory
    p_new[p_keep] = np.arange(len(p_keep))
    u_code = enc.playlist_owner[p_keep]
    u_keep = np.flatnonzero(np.bincount(u_code, minlength=len(enc.user_ids)))
    u_new = np.full(len(enc.user_ids), -1, dtype=np.int64)
    u_new[u_keep] = np.arange(len(u_keep))
    playlist = p_new[p_code]  # (N,) new playlist index
    n_playlists, n_users = len(p_keep), len(u_keep)
    cleaning["playlists_in"] = len(enc.playlist_ids)
    cleaning["playlists_kept"] = n_playlists
    say(
        f"cleaning removed {cleaning['duplicate_rows']:,} duplicate row(s), "
        f"{cleaning['outlier_rows']:,} over --max-playlist-songs / --max-user-playlists and "
        f"{cleaning['kcore_rows']:,} by the "
        f"k-core (--min-songs {config.min_songs}, --min-song-playlists "
        f"{config.min_song_playlists}): {n_playlists:,} of {len(enc.playlist_ids):,} playlists "
        "kept"
    )

    # 3. split (rows are sorted by playlist, then song: input row order does not matter)
    indptr = np.zeros(n_playlists + 1, dtype=np.int64)
    np.cumsum(np.bincount(playlist, minlength=n_playlists), out=indptr[1:])
    valid_row, test_row = split_roles(indptr, np.random.default_rng([config.seed, 0]))
    role = np.zeros(len(rows), dtype=np.int8)  # 0 train, 1 valid, 2 test
    role[valid_row], role[test_row] = 1, 2

    # catalog = songs in train, indexed first; other surviving songs after them
    s_keep = np.flatnonzero(np.bincount(s_code, minlength=len(enc.track_ids)))
    in_train = np.bincount(s_code[role == 0], minlength=len(enc.track_ids)) > 0
    catalog, rest = s_keep[in_train[s_keep]], s_keep[~in_train[s_keep]]
    s_new = np.full(len(enc.track_ids), -1, dtype=np.int32)
    s_new[catalog] = np.arange(len(catalog))
    s_new[rest] = len(catalog) + np.arange(len(rest))
    song = s_new[s_code]  # (N,)
    del p_code, s_code
    n_catalog = len(catalog)

    # 4. negatives: exclude every catalog song of the playlist
    in_cat = song < n_catalog
    excl_indptr = np.zeros(n_playlists + 1, dtype=np.int64)
    np.cumsum(np.bincount(playlist[in_cat], minlength=n_playlists), out=excl_indptr[1:])
    excl_song = song[in_cat]
    held = {}
    dropped = {}
    for name, rows_held in (("valid", valid_row), ("test", test_row)):
        ok = song[rows_held] < n_catalog  # a held-out song absent from training: dropped
        held[name] = rows_held[ok]
        dropped[name] = int((~ok).sum())
    say(f"cleaned and split in {time.perf_counter() - t0:.2f}s")
    empty = [name for name in ("valid", "test") if not len(held[name])]
    why = (  # said of the held-out songs of both splits, or of the one without cases
        "every {} song of the " + f"{n_playlists:,} playlist(s) kept is in no other playlist's "
        "training songs"
    )
    if len(empty) == 2:
        raise MasrError(
            f"{source}: no validation and no test case left: {why.format('held-out')}, so no "
            "model could be validated or tested; give more playlists, with songs in common"
        )
    if empty:  # e.g. a tiny input: preparing it is fine, say what it lacks
        split = "validation" if empty[0] == "valid" else "test"
        say(f"warning: no {empty[0]} case left ({why.format(split)}): "
            + ("`masr train` refuses data without validation cases (it validates every run "
               "on them); try another --seed or give more playlists" if empty[0] == "valid"
               else "`masr evaluate` has no test case to score (--split valid has some)"))
    if n_catalog < 2 or n_playlists < 2:
        raise MasrError(
            f"{n_playlists:,} playlist(s) and {n_catalog:,} catalog song(s) after cleaning: too "
            "few to train or to sample negatives from; give more playlists"
        )

    position = None
    if enc.position is not None:
        position = enc.position.gather(pl.Series(rows))
        if position.null_count() == len(position):  # a column with no position in it
            say(
                f"warning: song-order column {columns.position or POSITION!r} is empty in every "
                "row kept; the songs keep the input's row order"
            )
            position = None
        enc.position = None
    if position is not None:
        low, high = position.min(), position.max()
        if low is None or (low >= -(2**31) and high < 2**31):  # else Int64 (e.g. timestamps)
            position = position.cast(pl.Int32)

    # 5. write
    lengths = np.diff(indptr)
    n_inter = len(rows)
    stats = table1(n_users, n_playlists, len(s_keep), n_inter, int(lengths.max()))
    manifest = {
        "format_version": FORMAT_VERSION,
        "users": n_users,
        "playlists": n_playlists,
        "songs": len(s_keep),
        "interactions": n_inter,
        "catalog_songs": n_catalog,
        "train": int((role == 0).sum()),
        "valid": len(held["valid"]),
        "test": len(held["test"]),
        "dropped_cases": dropped,
        "seed": config.seed,
        "min_songs": config.min_songs,
        "min_song_playlists": config.min_song_playlists,
        "max_playlist_songs": config.max_playlist_songs,
        "max_user_playlists": config.max_user_playlists,
        "negatives": config.negatives,
        "short_negative_cases": 0,  # counted below
        "input": {"path": raw.path, "format": raw.format, "rows": raw.rows},
        "checksum": raw.checksum,
        "columns": columns.as_dict(),
        "duplicates_dropped": duplicates,
        "cleaning": cleaning,
        "playlists_with_several_users": enc.shared_playlists,
        "sequence": "position" if position is not None else "input order",
        # the input column the order came from (``--position-col``; "position" by default)
        "position_col": (columns.position or POSITION) if position is not None else None,
        "stats": stats,
        "masr_version": _version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    with atomic_dir(out) as tmp:
        pl.DataFrame(
            {"user_idx": np.arange(n_users, dtype=np.int32), "user_id": enc.user_ids.gather(u_keep)}
        ).pipe(_write, tmp / "users.parquet")
        pl.DataFrame(
            {
                "playlist_idx": np.arange(n_playlists, dtype=np.int32),
                "playlist_id": enc.playlist_ids.gather(p_keep),
                "user_idx": u_new[enc.playlist_owner[p_keep]].astype(np.int32),
            }
        ).pipe(_write, tmp / "playlists.parquet")
        song_order = np.concatenate([catalog, rest])
        songs = pl.DataFrame(
            {
                "song_idx": np.arange(len(song_order), dtype=np.int32),
                "track_id": enc.track_ids.gather(song_order),
            }
        )
        if enc.song_extras is not None:
            songs = pl.concat([songs, enc.song_extras[song_order]], how="horizontal")
        _write(songs, tmp / "songs.parquet")

        train = role == 0
        tr = pl.DataFrame(
            {
                "playlist_idx": playlist[train].astype(np.int32),
                "song_idx": song[train].astype(np.int32),
            }
        )
        # each playlist's songs in sequence order (the sequential baselines read it): by
        # position when the input has it, else in the input's row order
        if position is not None:
            tr = tr.with_columns(position.filter(pl.Series(train)).alias(POSITION))
            tr = tr.sort(["playlist_idx", POSITION], nulls_last=True, maintain_order=True)
        else:
            tr = tr.with_columns(pl.Series("_row", rows[train])).sort(["playlist_idx", "_row"])
            tr = tr.drop("_row")
        _write(tr, tmp / "train.parquet")
        # negatives, drawn per split in chunks (bounded memory) from one seeded stream
        rng = np.random.default_rng([config.seed, 1])
        for name, rows_held in held.items():
            negs, short = _negative_lists(
                playlist[rows_held], excl_indptr, excl_song, n_catalog, config.negatives, rng
            )
            manifest["short_negative_cases"] += short
            df = pl.DataFrame(
                {
                    "playlist_idx": playlist[rows_held].astype(np.int32),
                    "song_idx": song[rows_held].astype(np.int32),
                    "negatives": negs,
                }
            )
            del negs
            if position is not None:
                df = df.with_columns(position.gather(pl.Series(rows_held)).alias(POSITION))
            _write(df, tmp / f"{name}.parquet")
            del df
        say(f"sampled negatives in {time.perf_counter() - t0:.2f}s")
        if manifest["short_negative_cases"]:  # a catalog too small for --negatives
            say(
                f"warning: {manifest['short_negative_cases']:,} case(s) have fewer than "
                f"{config.negatives} negatives: the catalog has too few songs outside their "
                "playlists; they keep every such song (the sampled protocol ranks against "
                "fewer, so it is easier there)"
            )
        manifest["seconds"] = round(time.perf_counter() - t0, 3)
        manifest["tables"] = {f.name: table_digest(f) for f in sorted(tmp.glob("*.parquet"))}
        manifest["fingerprint"] = fingerprint_of(manifest)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out} in {time.perf_counter() - t0:.2f}s")
    return PrepResult(manifest=manifest, out=out)


#: rows of a column encoded at a time by ``table_digest`` (part of the digest's definition)
DIGEST_ROWS = 1 << 20


def table_digest(path: Path) -> str:
    """The sha256 of a Parquet table's content: its column names, kinds and values, not its
    file's bytes, which change with the Parquet writer (polars 2 writes other bytes than
    polars 1 for the same table), so the same data prepared by another version keeps its
    fingerprint. Read one column at a time and encoded ``DIGEST_ROWS`` rows at a time (a table
    may be gigabytes)."""
    digest = hashlib.sha256()
    for name, dtype in pl.read_parquet_schema(path).items():
        column = pl.read_parquet(path, columns=[name]).to_series()
        digest.update(f"{name}\0{_kind(dtype)}\0{len(column)}\0".encode())
        for start in range(0, len(column), DIGEST_ROWS):
            _digest_values(digest.update, column.slice(start, DIGEST_ROWS))
    return digest.hexdigest()


def _kind(dtype: pl.DataType) -> str:
    """A version-independent name of a column's kind: int, float, bool, str or list[...]."""
    if isinstance(dtype, pl.List):
        return f"list[{_kind(dtype.inner)}]"
    if dtype.is_integer():
        return "int"
    if dtype.is_float():
        return "float"
    if dtype == pl.Boolean:
        return "bool"
    return "str"


def _digest_values(update: Callable[[bytes], None], column: pl.Series) -> None:
    """Feed ``column``'s values to a digest's ``update``: nulls as a mask, numbers as little-endian
    64-bit, text as UTF-8 with lengths, lists as their lengths and then their elements."""
    nulls = column.is_null()
    if nulls.any():
        update(b"nulls" + np.packbits(nulls.to_numpy()).tobytes())
    if isinstance(column.dtype, pl.List):
        update(column.list.len().fill_null(0).cast(pl.Int64).to_numpy().astype("<i8").tobytes())
        _digest_values(update, column.explode().drop_nulls())  # elements are never null here
    elif column.dtype.is_integer() or column.dtype == pl.Boolean:
        update(column.cast(pl.Int64).fill_null(0).to_numpy().astype("<i8").tobytes())
    elif column.dtype.is_float():
        update(column.cast(pl.Float64).fill_null(0).to_numpy().astype("<f8").tobytes())
    else:
        text = column.cast(pl.String).fill_null("")
        update(text.str.len_bytes().cast(pl.Int64).to_numpy().astype("<i8").tobytes())
        update("".join(text.to_list()).encode())


def _negative_lists(
    case_playlist: np.ndarray,
    excl_indptr: np.ndarray,
    excl_song: np.ndarray,
    n_catalog: int,
    k: int,
    rng: np.random.Generator,
    chunk: int = 1 << 18,
) -> tuple[pl.Series, int]:
    """:func:`sample_negatives` in chunks of cases, as a list[int32] column; and how many cases
    got fewer than ``k``. The chunk size is fixed: the draws depend on it."""
    parts, short = [], 0
    for start in range(0, len(case_playlist), chunk):
        negs, cnt = sample_negatives(
            case_playlist[start : start + chunk], excl_indptr, excl_song, n_catalog, k, rng
        )
        col = pl.Series("negatives", negs).cast(pl.List(pl.Int32))
        if (cnt < k).any():
            col = pl.select(col.list.head(pl.lit(pl.Series(cnt)))).to_series()
            short += int((cnt < k).sum())
        parts.append(col)
    if not parts:
        return pl.Series("negatives", [], dtype=pl.List(pl.Int32)), 0
    return pl.concat(parts, rechunk=False).alias("negatives"), short


def _settings(config: PrepConfig) -> str:
    """The cleaning options in force, as the user would type them."""
    parts = [f"--min-songs {config.min_songs}", f"--min-song-playlists {config.min_song_playlists}"]
    if config.max_playlist_songs is not None:
        parts.append(f"--max-playlist-songs {config.max_playlist_songs}")
    if config.max_user_playlists is not None:
        parts.append(f"--max-user-playlists {config.max_user_playlists}")
    return ", ".join(parts)


def _write(df: pl.DataFrame, path: Path) -> None:
    # zstd level 1: as small as the default level on these integer tables, several times faster
    df.write_parquet(path, compression="zstd", compression_level=1)


def _synthetic_input(seed: int, users: int | None) -> RawInput:
    from masr.synth import SynthConfig, synthesize

    cfg = SynthConfig(seed=seed) if users is None else SynthConfig(seed=seed, users=users)
    frame = synthesize(cfg).rename(
        {"user_id": "user", "playlist_id": "playlist", "track_id": "track"}
    )
    return RawInput(
        frame=frame,
        path="<embedded>",
        format="synthetic",
        rows=frame.height,
        checksum=f"synthetic:{seed}:{cfg.users}",
    )


def _version() -> str:
    from masr import __version__

    return __version__
