"""The embedded dataset: a deterministic, realistic synthetic playlist generator.

The world it simulates:

* a catalog of songs by artists; each artist plays one *theme* (a genre or mood), and song
  popularity follows a power law (a few hits, a long tail);
* users with one to three favourite themes and a handful of favourite artists;
* playlists that follow one of their user's themes, often around two "focus" artists, with some
  noise (songs from anywhere in the catalog, drawn by popularity).

So a playlist's held-out song is predictable from its other songs (same theme, same artists),
from its user (favourite artists) and, weakly, from popularity alone: a good model clearly beats
popularity, as on real playlist data. Everything is vectorised over playlists and generated in
chunks of users, so the 30M-row benchmark input is made in bounded memory.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO

import numpy as np
import polars as pl

from masr.atomic import atomic_path, gzip_writer, sole_writer
from masr.config import check_kinds
from masr.errors import MasrError, check_instance
from masr.seed import check_seed

#: Columns of the generated table, in order.
COLUMNS = ("user_id", "playlist_id", "track_id", "position", "track_name", "artist_name")


#: MPD's catalog per playlist (2.26M songs over 1M playlists): ``SynthConfig.sized``'s default
MPD_SONGS_PER_PLAYLIST = 2.26
#: the largest --users, --playlists or --songs ``masr synth`` makes
SYNTH_MAX = 100_000_000


@dataclass(frozen=True)
class SynthConfig:
    """Size and shape of the synthetic world. Defaults give the embedded dataset."""

    users: int = 1000
    seed: int = 0
    playlists_per_user: float = 5.0  # mean; each user has 1 + Poisson(mean - 1)
    songs_per_playlist: float = 14.0  # mean playlist length (5 + negative binomial), before dedup
    max_playlist_songs: int = 60
    songs_per_user: float = 2.5  # catalog size = users * songs_per_user (at least 200 songs)
    songs_per_artist: float = 10.0
    themes: int | None = None  # default: about 0.63 * sqrt(users), at least 4
    popularity_exponent: float = 0.9  # song weight ~ rank ** -exponent
    favourite_artists: int = 4  # per user
    share_favourite: float = 0.25  # song from one of the user's favourite artists
    share_focus: float = 0.30  # song from one of the playlist's two focus artists
    share_noise: float = 0.08  # song from anywhere (by popularity); the rest: the theme
    names: bool = True  # add track_name / artist_name columns
    songs: int | None = None  # catalog size; None: users * songs_per_user
    length_shape: float = 2.0  # negative binomial shape of the lengths: smaller, more skewed
    draws_per_song: int = 2  # candidate draws per wanted song (repeats are dropped)

    @classmethod
    def sized(
        cls,
        playlists: int,
        *,
        songs: int | None = None,
        users: int | None = None,
        mean_length: float = 66.0,
        max_length: int = 250,
        popularity_exponent: float = 0.7,
        seed: int = 0,
        names: bool = True,
    ) -> SynthConfig:
        """A Million-Playlist-Dataset-shaped world of about ``playlists`` playlists.

        MPD's ratios are the defaults: 2.26 songs per playlist in the catalog, lengths 5..250
        with mean 66 and median about 49 (shape 1.2), and a flatter popularity power law than
        the embedded set's (exponent 0.7: at 0.9 the top song sits in a third of the playlists,
        MPD's top track in under 5%). MPD has no users, so by default each
        playlist is its own user (exactly ``playlists`` playlists); with ``users`` the
        playlists are spread over them (1 + Poisson per user, so about ``playlists``).
        """
        if playlists < 1:
            raise MasrError(f"--playlists must be at least 1 (got {playlists})")
        if playlists > SYNTH_MAX:
            raise MasrError(f"--playlists {playlists}: at most {SYNTH_MAX:,}")
        users = playlists if users is None else users
        if users < 1:
            raise MasrError(f"--users must be at least 1 (got {users})")
        if users > playlists:
            raise MasrError(f"--users ({users}) cannot exceed --playlists ({playlists})")
        return cls(
            users=users,
            seed=seed,
            playlists_per_user=playlists / users,
            songs_per_playlist=mean_length,
            max_playlist_songs=max_length,
            songs=max(200, round(MPD_SONGS_PER_PLAYLIST * playlists)) if songs is None else songs,
            length_shape=1.2,
            draws_per_song=4,  # long playlists exhaust their artists' songs: draw more
            popularity_exponent=popularity_exponent,
            names=names,
        )

    def validate(self) -> None:
        check_kinds(self, {"songs_per_playlist": "--mean-length"})  # "5" for users: one line
        check_seed(self.seed)
        finite = [  # songs_per_playlist (--mean-length): its range check below refuses NaN
            f.name for f in fields(self) if f.type == "float" and f.name != "songs_per_playlist"
        ]
        for name in finite:  # NaN passes every comparison below, then breaks numpy
            if not math.isfinite(getattr(self, name)):
                raise MasrError(f"{name} {getattr(self, name)}: must be a finite number")
        if self.users < 1:
            raise MasrError(f"--users must be at least 1 (got {self.users})")
        # a hundred times MPD's million playlists: past it, the generator's arrays do not fit
        # a machine (numpy would fail in an opaque way)
        for option, value in (
            ("--users", self.users),
            ("--playlists", round(self.users * self.playlists_per_user)),
            ("--songs", self.songs or 0),
        ):
            if value > SYNTH_MAX:
                raise MasrError(f"{option} {value}: at most {SYNTH_MAX:,}")
        if self.playlists_per_user < 1:
            raise MasrError("playlists_per_user must be at least 1")
        if not 5 <= self.songs_per_playlist <= self.max_playlist_songs:
            raise MasrError(
                f"--mean-length {self.songs_per_playlist:g}: must lie between 5 and the "
                f"maximum length ({self.max_playlist_songs})"
            )
        if self.songs is not None and self.songs < 10:
            raise MasrError(f"--songs must be at least 10 (got {self.songs})")
        if self.length_shape <= 0:
            raise MasrError("length_shape must be positive")
        if self.songs_per_user < 0:
            raise MasrError(f"songs_per_user must be >= 0 (got {self.songs_per_user:g})")
        if self.songs_per_artist <= 0:
            raise MasrError(f"songs_per_artist must be positive (got {self.songs_per_artist:g})")
        if self.draws_per_song < 1:
            raise MasrError(f"draws_per_song must be at least 1 (got {self.draws_per_song})")
        # none is fine when no song is drawn from favourites (share_favourite 0)
        if self.favourite_artists < (1 if self.share_favourite > 0 else 0):
            raise MasrError(
                f"favourite_artists must be at least 1 with share_favourite > 0, and never "
                f"negative (got {self.favourite_artists})"
            )
        shares = self.share_favourite + self.share_focus + self.share_noise
        if min(self.share_favourite, self.share_focus, self.share_noise) < 0 or shares > 1:
            raise MasrError("song source shares must be non-negative and sum to at most 1")

    @property
    def n_songs(self) -> int:
        if self.songs is not None:
            return self.songs
        return max(200, round(self.users * self.songs_per_user))

    @property
    def n_artists(self) -> int:
        return max(8, round(self.n_songs / self.songs_per_artist))

    @property
    def n_themes(self) -> int:
        if self.themes is not None:
            return max(1, self.themes)
        return max(4, round(0.63 * math.sqrt(self.users)))


@dataclass(frozen=True)
class _Segments:
    """Weighted sampling inside groups: group g's items own the interval [g, g+1)."""

    order: np.ndarray  # (n,) item ids sorted by group
    cum: np.ndarray  # (n,) group + cumulative normalised weight, increasing
    size: np.ndarray  # (G,) items per group

    @classmethod
    def build(cls, group: np.ndarray, weight: np.ndarray, n_groups: int) -> _Segments:
        order = np.argsort(group, kind="stable")
        g = group[order]
        w = weight[order].astype(np.float64)
        total = np.bincount(g, weights=w, minlength=n_groups)
        start = np.zeros(n_groups + 1, dtype=np.int64)
        np.cumsum(np.bincount(g, minlength=n_groups), out=start[1:])
        cw = np.cumsum(w)
        before = np.concatenate([[0.0], cw])[start[:-1]]  # (G,) weight before each group
        within = (cw - before[g]) / np.where(total[g] > 0, total[g], 1.0)
        return cls(order=order, cum=g + np.minimum(within, 1.0), size=np.diff(start))

    def sample(self, groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One item per entry of ``groups`` (any shape), drawn by weight within that group."""
        u = groups + rng.random(groups.shape) * (1 - 1e-12)
        idx = np.searchsorted(self.cum, u.ravel(), side="right")
        return self.order[np.minimum(idx, len(self.order) - 1)].reshape(groups.shape)


@dataclass(frozen=True)
class _World:
    song_artist: np.ndarray  # (V,) artist of each song
    artist_theme: np.ndarray  # (A,) theme of each artist
    theme_weight: np.ndarray  # (T,) how many users like each theme
    songs_by_theme: _Segments
    songs_anywhere: _Segments
    songs_by_artist: _Segments
    artists_by_theme: _Segments
    song_weight: np.ndarray  # (V,)


def _world(cfg: SynthConfig, rng: np.random.Generator) -> _World:
    n_songs, n_artists, n_themes = cfg.n_songs, cfg.n_artists, cfg.n_themes
    artist_theme = rng.integers(0, n_themes, n_artists)
    artist_theme[:n_themes] = np.arange(min(n_themes, n_artists))  # every theme has an artist
    # artists' catalog sizes vary (geometric-ish); every artist has at least one song
    song_artist = np.concatenate(
        [
            np.arange(n_artists),
            rng.choice(n_artists, n_songs - n_artists, p=_zipf(n_artists, 0.5, rng)),
        ]
    )
    song_artist = song_artist[rng.permutation(n_songs)]
    song_weight = _zipf(n_songs, cfg.popularity_exponent, rng)  # power-law popularity
    artist_weight = np.bincount(song_artist, weights=song_weight, minlength=n_artists)
    return _World(
        song_artist=song_artist,
        artist_theme=artist_theme,
        theme_weight=_zipf(n_themes, 0.5, rng),
        songs_by_theme=_Segments.build(artist_theme[song_artist], song_weight, n_themes),
        songs_anywhere=_Segments.build(np.zeros(n_songs, dtype=np.int64), song_weight, 1),
        songs_by_artist=_Segments.build(song_artist, song_weight, n_artists),
        artists_by_theme=_Segments.build(artist_theme, artist_weight, n_themes),
        song_weight=song_weight,
    )


def _zipf(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """(n,) probabilities ~ rank ** -exponent over a random ranking."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    w = w[rng.permutation(n)]
    return w / w.sum()


def _users_chunk(
    cfg: SynthConfig, world: _World, first_user: int, n_users: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Playlists of users first_user .. first_user+n_users-1 as flat (row,) arrays."""
    n_themes = len(world.theme_weight)
    # users: up to three taste themes with decreasing weight, 1 + Binomial(2, 0.4) of them
    slots = rng.choice(n_themes, (n_users, 3), p=world.theme_weight)  # (U, 3)
    n_slots = 1 + rng.binomial(2, 0.4, n_users)
    slot_w = np.array([1.0, 0.5, 0.3])[None, :] * (np.arange(3)[None, :] < n_slots[:, None])
    slot_p = slot_w / slot_w.sum(axis=1, keepdims=True)
    fav_slot = (rng.random((n_users, cfg.favourite_artists, 1)) > slot_p.cumsum(1)[:, None, :]).sum(
        -1
    )
    fav_slot = np.minimum(fav_slot, 2)
    favourites = world.artists_by_theme.sample(
        np.take_along_axis(slots, fav_slot, 1), rng
    )  # (U, F)

    # playlists: 1 + Poisson(mean - 1) per user, each on one of its user's themes
    n_pl = 1 + rng.poisson(cfg.playlists_per_user - 1, n_users)
    owner = np.repeat(np.arange(n_users), n_pl)  # (P,) local user index
    n_playlists = len(owner)
    pick = (rng.random((n_playlists, 1)) > slot_p[owner].cumsum(1)).sum(1)
    theme = slots[owner, np.minimum(pick, 2)]  # (P,)
    focus = world.artists_by_theme.sample(np.stack([theme, theme], 1), rng)  # (P, 2)
    extra = cfg.songs_per_playlist - 5
    r = cfg.length_shape
    length = 5 + rng.negative_binomial(r, r / (r + extra), n_playlists)  # mean songs_per_playlist
    length = np.minimum(length, cfg.max_playlist_songs)

    # candidate songs, ~1.5x the length per playlist, flat (M,): each comes from one source;
    # then each playlist keeps its first `length` distinct candidates, in draw order
    n_cand = cfg.draws_per_song * length + 4  # (P,)
    row = np.repeat(np.arange(n_playlists), n_cand)  # (M,) playlist of each candidate
    src = rng.random(len(row))
    cut = np.cumsum([cfg.share_favourite, cfg.share_focus, cfg.share_noise])
    song = np.empty(len(row), dtype=np.int64)
    fav, focus_pick = src < cut[0], (src >= cut[0]) & (src < cut[1])
    noise, from_theme = (src >= cut[1]) & (src < cut[2]), src >= cut[2]
    artist = favourites[owner[row[fav]], rng.integers(0, cfg.favourite_artists, fav.sum())]
    song[fav] = world.songs_by_artist.sample(artist, rng)
    artist = focus[row[focus_pick], rng.integers(0, 2, focus_pick.sum())]
    song[focus_pick] = world.songs_by_artist.sample(artist, rng)
    song[noise] = world.songs_anywhere.sample(np.zeros(noise.sum(), dtype=np.int64), rng)
    song[from_theme] = world.songs_by_theme.sample(theme[row[from_theme]], rng)

    key = row * len(world.song_weight) + song
    order = np.argsort(key, kind="stable")  # equal keys keep draw order
    dup = np.empty(len(key), dtype=bool)
    dup[order] = np.r_[False, key[order][1:] == key[order][:-1]]  # a later copy of a draw
    fresh = ~dup
    ends = np.cumsum(n_cand)
    seen = np.cumsum(fresh)  # (M,) fresh candidates up to here, counted from the start
    before = np.r_[0, seen[ends[:-1] - 1]]  # (P,) fresh candidates in earlier playlists
    rank = seen - np.repeat(before, n_cand)  # 1-based rank of a fresh candidate in its row
    keep = fresh & (rank <= length[row])
    rows, song, position = row[keep], song[keep], rank[keep] - 1
    return {
        "user": first_user + owner[rows],
        "playlist_local": rows,
        "n_playlists": np.array([n_playlists]),
        "song": song,
        "position": position,
    }


_ARTIST_A = np.array(
    [
        "The",
        "Velvet",
        "Neon",
        "Paper",
        "Silver",
        "Midnight",
        "Golden",
        "Electric",
        "Lonely",
        "Crimson",
        "Hollow",
        "Wild",
        "Quiet",
        "Broken",
        "Café",
        "Northern",
        "Little",
        "Glass",
    ]
)
_ARTIST_B = np.array(
    [
        "Owls",
        "Rivers",
        "Machines",
        "Hearts",
        "Foxes",
        "Signals",
        "Saints",
        "Tigers",
        "Lights",
        "Ghosts",
        "Pilots",
        "Sisters",
        "Wolves",
        "Dreamers",
        "Øresund",
        "Harbours",
        "Kids",
        "Echoes",
    ]
)
_TRACK_A = np.array(
    [
        "Summer",
        "Falling",
        "Blue",
        "Last",
        "Running",
        "Golden",
        "Slow",
        "Burning",
        "Empty",
        "Sweet",
        "Cold",
        "Electric",
        "Silent",
        "Lost",
        "Señorita",
        "Heavy",
        "Tender",
        "Wild",
    ]
)
_TRACK_B = np.array(
    [
        "Love",
        "Night",
        "Road",
        "Heart",
        "Rain",
        "Fire",
        "Dance",
        "Home",
        "Light",
        "Train",
        "Song",
        "Dreams",
        "Days",
        "City",
        "Ocean",
        "Stars",
        "Waves",
        "Sky",
    ]
)
_TRACK_C = np.array(["", "", "", "", "", " (Live)", ", Pt. 2", ' "Remastered"', " - Radio Edit"])


def _song_table(cfg: SynthConfig, world: _World) -> pl.DataFrame:
    """track_id, track_name, artist_name for every song of the catalog (deterministic)."""
    rng = np.random.default_rng([cfg.seed, 7])
    n_songs, n_artists = len(world.song_artist), len(world.artist_theme)
    width = len(str(n_songs))
    artist = (
        pl.Series(_ARTIST_A[rng.integers(0, len(_ARTIST_A), n_artists)])
        + " "
        + pl.Series(_ARTIST_B[rng.integers(0, len(_ARTIST_B), n_artists)])
        + " "
        + pl.Series(np.arange(n_artists)).cast(pl.String)
    )
    track = (
        pl.Series(_TRACK_A[rng.integers(0, len(_TRACK_A), n_songs)])
        + " "
        + pl.Series(_TRACK_B[rng.integers(0, len(_TRACK_B), n_songs)])
        + pl.Series(_TRACK_C[rng.integers(0, len(_TRACK_C), n_songs)])
    )
    return pl.DataFrame(
        {
            "track_id": pl.Series(np.arange(n_songs)).cast(pl.String).str.zfill(width),
            "track_name": track,
            "artist_name": artist.gather(world.song_artist),
        }
    ).with_columns(("t" + pl.col("track_id")).alias("track_id"))


def iter_synthesize(cfg: SynthConfig, chunk_users: int = 50_000) -> Iterator[pl.DataFrame]:
    """The synthetic table in chunks of users (same rows as :func:`synthesize`, for any chunk
    size given the same config). Columns: :data:`COLUMNS` (names only when ``cfg.names``)."""
    check_instance(cfg, SynthConfig, "cfg")  # a dict: one line, not an AttributeError
    cfg.validate()
    world = _world(cfg, np.random.default_rng([cfg.seed, 1]))
    songs = _song_table(cfg, world) if cfg.names else None
    u_width, p_width = len(str(cfg.users)), len(str(int(cfg.users * cfg.playlists_per_user * 2)))
    first_playlist = 0
    block = 1000  # users per random stream: the output does not depend on chunk_users
    chunk_users = max(block, chunk_users // block * block)
    for first in range(0, cfg.users, chunk_users):
        parts = []
        for b in range(first, min(first + chunk_users, cfg.users), block):
            n = min(block, cfg.users - b)
            part = _users_chunk(cfg, world, b, n, np.random.default_rng([cfg.seed, 2, b]))
            parts.append(
                pl.DataFrame(
                    {
                        "user": part["user"].astype(np.int64),
                        "playlist": (first_playlist + part["playlist_local"]).astype(np.int64),
                        "song": part["song"].astype(np.int64),
                        "position": part["position"].astype(np.int32),
                    }
                )
            )
            first_playlist += int(part["n_playlists"][0])
        df = pl.concat(parts)
        out = df.select(
            ("u" + pl.col("user").cast(pl.String).str.zfill(u_width)).alias("user_id"),
            ("p" + pl.col("playlist").cast(pl.String).str.zfill(p_width)).alias("playlist_id"),
            pl.col("song"),
            pl.col("position"),
        )
        if songs is not None:
            out = out.with_columns(
                songs["track_id"].gather(out["song"]).alias("track_id"),
                songs["track_name"].gather(out["song"]).alias("track_name"),
                songs["artist_name"].gather(out["song"]).alias("artist_name"),
            )
        else:
            width = len(str(len(world.song_artist)))
            out = out.with_columns(
                ("t" + pl.col("song").cast(pl.String).str.zfill(width)).alias("track_id")
            )
        yield out.select([c for c in COLUMNS if c in out.columns])


def synthesize(cfg: SynthConfig | None = None) -> pl.DataFrame:
    """The whole synthetic table (see the module docstring) as one DataFrame."""
    return pl.concat(list(iter_synthesize(SynthConfig() if cfg is None else cfg)))


#: Expected rows up to which a Parquet file is written in one piece (as it always was, so the
#: embedded dataset's file stays byte-for-byte the same); larger tables stream in chunks.
WHOLE_PARQUET_ROWS = 4_000_000
#: Rows per generated chunk when streaming (about 0.3-0.5 GB of working memory with names).
CHUNK_ROWS = 1_000_000


def expected_rows(cfg: SynthConfig) -> float:
    """About how many rows ``cfg`` generates (before the deduplication shortens a few)."""
    return cfg.users * cfg.playlists_per_user * cfg.songs_per_playlist


def write_synthetic(
    path: str | Path, cfg: SynthConfig | None = None, log: Callable[[str], None] | None = None
) -> int:
    """Write the synthetic table to ``path`` (Parquet for .parquet/.pq, TSV for .tsv, gzip
    for a .gz suffix, CSV otherwise), atomically. Returns the number of rows.

    Memory stays bounded at any size: chunks of about :data:`CHUNK_ROWS` rows are generated
    and written one at a time (for Parquet, as part files merged by Polars' streaming sink).
    """
    cfg = SynthConfig() if cfg is None else cfg
    check_instance(cfg, SynthConfig, "cfg")  # a dict: one line, not an AttributeError
    cfg.validate()
    if str(path) == "-":  # CSV on stdout
        return _write_csv_stream(sys.stdout.buffer, cfg)
    path = Path(path)
    if path.is_dir():
        raise MasrError(f"{path}: is a directory; --out needs a file name such as playlists.csv")
    from masr.dataset import check_outside_prepared

    check_outside_prepared(path, "--out")  # masr prep replaces its folder whole, the file too
    suffixes = [s.lower() for s in path.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    kind = suffixes[-2] if gz and len(suffixes) > 1 else (suffixes[-1] if suffixes else ".csv")
    if kind not in (".csv", ".tsv", ".tab", ".parquet", ".pq"):
        raise MasrError(
            f"{path}: unknown file type {kind!r}; --out takes .csv, .tsv or .parquet "
            "(.csv.gz and .tsv.gz gzipped), or - for CSV on stdout"
        )
    rows_per_user = max(1.0, cfg.playlists_per_user * cfg.songs_per_playlist)
    chunk_users = max(1000, int(CHUNK_ROWS / rows_per_user))
    rows = 0
    # one writer per --out; what a killed one left beside it is removed first (said to log)
    with sole_writer(path, "masr synth", log), atomic_path(path) as tmp:
        if kind in (".parquet", ".pq"):
            if gz:
                raise MasrError(f"{path}: Parquet is compressed already; drop the .gz suffix")
            if expected_rows(cfg) <= WHOLE_PARQUET_ROWS:
                df = synthesize(cfg)
                df.write_parquet(tmp)
                return df.height
            return _stream_parquet(tmp, iter_synthesize(cfg, chunk_users), path.name)
        sep = "\t" if kind in (".tsv", ".tab") else ","
        with open(tmp, "wb") as raw, gzip_writer(raw) if gz else contextlib.nullcontext(raw) as fh:
            rows = _write_csv_stream(fh, cfg, sep)
    return rows


def _write_csv_stream(fh: IO[bytes], cfg: SynthConfig, sep: str = ",") -> int:
    """The synthetic table as CSV (``sep``-separated) into ``fh``, chunk by chunk; its rows."""
    rows_per_user = max(1.0, cfg.playlists_per_user * cfg.songs_per_playlist)
    chunk_users = max(1000, int(CHUNK_ROWS / rows_per_user))
    rows, header = 0, True
    for chunk in iter_synthesize(cfg, chunk_users):
        chunk.write_csv(fh, separator=sep, include_header=header)
        header = False
        rows += chunk.height
    return rows


def _stream_parquet(tmp: Path, chunks: Iterator[pl.DataFrame], name: str) -> int:
    """Write ``chunks`` as one Parquet file at ``tmp`` (for the file ``name``) without holding
    them all: each chunk goes to a part file in a private folder beside ``tmp``, then a
    streaming scan of the parts, in order, is sunk into ``tmp`` and the folder removed."""
    import shutil
    import tempfile

    # named as atomic's temporary entries of --out (.NAME.xxxxxxxx.tmp), so that the next
    # writer of NAME removes what a killed one left (atomic.sole_writer)
    parts_dir = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=tmp.parent))
    try:
        parts, rows = [], 0
        for i, chunk in enumerate(chunks):
            part = parts_dir / f"part-{i:06d}.parquet"
            chunk.write_parquet(part, compression="zstd", compression_level=1)
            parts.append(part)
            rows += chunk.height
        pl.scan_parquet(parts).sink_parquet(tmp, maintain_order=True, engine="streaming")
        return rows
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
