"""Load a prepared data directory (the output of ``masr prep``) into NumPy arrays.

The on-disk format is documented in ``docs/design.md`` ("Prepared data"). This module is
torch-free; training code moves the arrays it needs to its device itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from masr.errors import MasrError, check_instance

FORMAT_VERSION = 1
#: the file that makes a folder a ``masr prep`` output
MANIFEST = "manifest.json"
TABLES = ("users", "playlists", "songs", "train", "valid", "test")


@dataclass(frozen=True)
class Cases:
    """Validation or test cases: one held-out song per playlist with its stored negatives."""

    playlist: np.ndarray  # (C,) int64 playlist index
    user: np.ndarray  # (C,) int64 user index of that playlist
    song: np.ndarray  # (C,) int64 held-out song index
    negatives: np.ndarray  # (C, K) int64 sampled negative songs, padded with -1 when fewer

    def __len__(self) -> int:
        return int(self.playlist.shape[0])


@dataclass
class PreparedData:
    """Everything training and evaluation need, as contiguous integer arrays.

    Song indices ``0 .. n_songs-1`` are the catalog: the songs that occur in training. Every
    validation/test song and every negative lies inside the catalog.
    """

    path: Path
    manifest: dict
    n_users: int
    n_playlists: int
    n_songs: int
    playlist_user: np.ndarray  # (P,) int64 owner of each playlist
    train_playlist: np.ndarray  # (N,) int64, sorted by playlist
    train_song: np.ndarray  # (N,) int64
    indptr: (
        np.ndarray
    )  # (P+1,) int64 CSR offsets: playlist p's songs are train_song[indptr[p]:indptr[p+1]]
    valid: Cases
    test: Cases
    #: (N,) int64 rank of each training row in its playlist's *sequence* (0 = first song), aligned
    #: with ``train_song``: ``position`` order when train.parquet has it, else the file's row
    #: order (prep writes the input's row order then). None: no order known (song order is used).
    train_rank: np.ndarray | None = None
    #: False: read by ``load_prepared(path, cases=False)``, ``valid`` and ``test`` left empty
    cases_loaded: bool = True
    _tables: dict = field(default_factory=dict, repr=False)

    def no_cases(self) -> str:
        """Why a split has no cases, for the line that refuses the work."""
        if not self.cases_loaded:
            return "load_prepared(path, cases=False) left them out; load it without cases=False"
        return "masr prep kept none, as its warning said"

    @property
    def train_user(self) -> np.ndarray:
        """(N,) int64 user of each training interaction."""
        return self.playlist_user[self.train_playlist]

    @property
    def sequence_source(self) -> str:
        """Where the song order of the sequential baselines comes from (stated in the manifest
        by ``masr prep``; older prepared data: ``position`` when train.parquet has it)."""
        if "sequence" in self.manifest:
            return str(self.manifest["sequence"])
        columns = pl.read_parquet_schema(self.path / "train.parquet")
        return "position" if "position" in columns else "song index"

    @property
    def fingerprint(self) -> str:
        """Identifies the prepared data: checkpoints made on other data are never reused."""
        return str(self.manifest["fingerprint"])

    def playlist_songs(self, p: int) -> np.ndarray:
        return self.train_song[self.indptr[p] : self.indptr[p + 1]]

    @cached_property
    def song_popularity(self) -> np.ndarray:
        """(V,) int64 number of training playlists holding each song."""
        return np.bincount(self.train_song, minlength=self.n_songs).astype(np.int64)

    def table(self, name: str) -> pl.DataFrame:
        """One of the Parquet tables (users, playlists, songs, train, valid, test)."""
        if name not in self._tables:
            self._tables[name] = pl.read_parquet(self.path / f"{name}.parquet")
        return self._tables[name]


def fingerprint_of(manifest: dict) -> str:
    """A stable hash of the prepared data: of its tables (``manifest["tables"]``: the sha256 of
    each one's content, ``masr.prep.table_digest``, since 2026-11-29 (twenty-second session);
    of each one's file bytes before, which the Parquet writer's version changed) and the format
    version, so the same data prepared from another path, a renamed copy, the synthetic file
    or the embedded generator, or by another polars version, has one fingerprint; for older
    manifests, of the manifest's content fields (all but timings)."""
    if "tables" in manifest:
        body = {"format_version": manifest.get("format_version"), "tables": manifest["tables"]}
    else:
        body = {
            k: v for k, v in manifest.items() if k not in {"fingerprint", "created", "seconds"}
        }
    blob = json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _cases(df: pl.DataFrame, playlist_user: np.ndarray) -> Cases:
    playlist = df["playlist_idx"].to_numpy().astype(np.int64)
    song = df["song_idx"].to_numpy().astype(np.int64)
    neg_lists = df["negatives"]
    k = int(neg_lists.list.len().max() or 0) if len(df) else 0
    negatives = np.full((len(df), k), -1, dtype=np.int64)
    if k:
        lengths = neg_lists.list.len().to_numpy().astype(np.int64)
        flat = neg_lists.explode().drop_nulls().to_numpy().astype(np.int64)
        rows = np.repeat(np.arange(len(df)), lengths)
        cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        negatives[rows, cols] = flat
    return Cases(playlist=playlist, user=playlist_user[playlist], song=song, negatives=negatives)


#: the counts every reader of a ``masr prep`` manifest takes (the fingerprint is checked apart)
_MANIFEST_COUNTS = ("users", "playlists", "catalog_songs")


def check_prepared(data: object, what: str = "data") -> None:
    """Refuse (MasrError) anything but a ``PreparedData`` where the library needs one: the
    likely mistake is the folder's path, which ``load_prepared`` reads."""
    check_instance(data, PreparedData, what, "prepared data, masr.dataset.load_prepared(path)")


def check_outside_prepared(path: str | Path, option: str, *, itself: bool = True) -> None:
    """Refuse (MasrError) an output folder that is or lies inside a ``masr prep`` folder (one
    holding masr prep's manifest.json: another program's file of that name does not count),
    which ``masr prep`` replaces whole, the output with it. ``itself=False``: only a folder
    above it counts (``masr prep --out`` may name an earlier prep folder, not one inside one)."""
    from masr.atomic import check_not_inside, resolved

    target = resolved(path, option)
    for folder in (target, *target.parents) if itself else target.parents:
        manifest = folder / MANIFEST
        if not manifest.is_file():
            continue
        try:
            _check_manifest(json.loads(manifest.read_text()), manifest)
        except (OSError, ValueError, MasrError):
            continue  # not masr prep's
        check_not_inside(path, folder, option)


def _check_manifest(manifest: object, path: Path) -> None:
    """One error line for a manifest.json that is JSON but not ``masr prep``'s (another
    program's file, or a file written over it): a JSON object with whole counts of users,
    playlists and catalog songs and a fingerprint."""
    problem = None
    if not isinstance(manifest, dict):
        problem = "not a JSON object"
    else:
        for key in _MANIFEST_COUNTS:
            value = manifest.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problem = f"no count of {key.replace('_', ' ')}"
                break
        else:
            if not isinstance(manifest.get("fingerprint"), str):
                problem = "no fingerprint"
    if problem:
        raise MasrError(
            f"{path}: not a `masr prep` manifest ({problem}); rerun `masr prep` for this folder"
        )


def _check_indices(path: Path, manifest: dict[str, Any], **tables: pl.DataFrame) -> None:
    """MasrError when a table's indices go past the sizes manifest.json gives (QA: a table
    from another `masr prep`, or one read while `masr prep` replaced the folder, was an
    IndexError traceback)."""
    bounds = {
        "playlist_idx": int(manifest["playlists"]),
        "user_idx": int(manifest["users"]),
        "song_idx": int(manifest["catalog_songs"]),
        "negatives": int(manifest["catalog_songs"]),
    }
    for name, frame in tables.items():
        for column, bound in bounds.items():
            if column not in frame.columns or frame.height == 0:
                continue
            values = frame[column]
            if column == "negatives":  # per case, then over them (no case: null, passed over)
                low, high, missing = values.list.min().min(), values.list.max().max(), 0
                if low is None:
                    continue
            else:
                low, high, missing = values.min(), values.max(), values.null_count()
            if missing or low is None or low < 0 or high >= bound:
                raise MasrError(
                    f"{path}: {name}.parquet does not match manifest.json ({column} outside 0.."
                    f"{bound - 1:,} or missing); the tables come from different `masr prep` "
                    "runs: rerun `masr prep`"
                )


def load_prepared(path: str | Path, cases: bool = True) -> PreparedData:
    """Read a ``masr prep`` output directory; a clear MasrError when it is missing or broken.
    ``cases=False`` leaves the validation and test cases out (empty): what needs only the
    training interactions reads less (``masr export``'s fold-in maps)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if path.is_file():
        raise MasrError(
            f"{path}: a file, not prepared data; `masr prep {path} --out data` prepares it "
            "(then --data data)"
        )
    if not manifest_path.is_file():
        raise MasrError(
            f"{path}: no prepared data here (missing manifest.json); "
            f"run `masr prep --out {path}` first"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise MasrError(f"{manifest_path}: unreadable manifest ({exc})") from None
    _check_manifest(manifest, manifest_path)
    for name in TABLES:
        if not (path / f"{name}.parquet").is_file():
            raise MasrError(
                f"{path}: prepared data is incomplete (missing {name}.parquet); rerun `masr prep`"
            )
    try:
        playlists = pl.read_parquet(
            path / "playlists.parquet", columns=["playlist_idx", "user_idx"]
        )
        train = pl.read_parquet(path / "train.parquet", columns=["playlist_idx", "song_idx"])
        # the file lists each playlist's songs in sequence order (docs/design.md)
        train = train.with_row_index("_row").with_columns(
            (pl.col("_row").rank("ordinal").over("playlist_idx") - 1).alias("_rank")
        )
        n_rows = None if cases else 0
        valid = pl.read_parquet(
            path / "valid.parquet", columns=["playlist_idx", "song_idx", "negatives"],
            n_rows=n_rows,
        )
        test = pl.read_parquet(
            path / "test.parquet", columns=["playlist_idx", "song_idx", "negatives"],
            n_rows=n_rows,
        )
    except Exception as exc:  # polars raises several types for corrupt files
        raise MasrError(f"{path}: cannot read prepared tables ({exc})") from None
    try:  # a `masr prep` that replaced the folder while it was read: tables of two preps
        changed = json.loads(manifest_path.read_text()) != manifest
    except (OSError, ValueError):
        changed = True
    if changed:
        raise MasrError(
            f"{path}: replaced while it was read (a `masr prep --out {path}` running?); run "
            "the command again once it has finished"
        )
    _check_indices(path, manifest, playlists=playlists, train=train, valid=valid, test=test)

    n_playlists = int(manifest["playlists"])
    playlist_user = np.zeros(n_playlists, dtype=np.int64)
    playlist_user[playlists["playlist_idx"].to_numpy()] = playlists["user_idx"].to_numpy()
    train = train.sort(["playlist_idx", "song_idx"])
    train_playlist = train["playlist_idx"].to_numpy().astype(np.int64)
    train_song = train["song_idx"].to_numpy().astype(np.int64)
    counts = np.bincount(train_playlist, minlength=n_playlists)
    indptr = np.zeros(n_playlists + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return PreparedData(
        path=path,
        manifest=manifest,
        n_users=int(manifest["users"]),
        n_playlists=n_playlists,
        n_songs=int(manifest["catalog_songs"]),
        playlist_user=playlist_user,
        train_playlist=train_playlist,
        train_song=train_song,
        indptr=indptr,
        valid=_cases(valid, playlist_user),
        test=_cases(test, playlist_user),
        train_rank=train["_rank"].to_numpy().astype(np.int64),
        cases_loaded=cases,
    )
