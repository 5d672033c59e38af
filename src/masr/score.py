"""Bulk, offline playlist continuation with an exported model and ONNX Runtime (no torch).

``score_file(input, model)`` reads a playlist file in the ``masr prep`` input format (one row per
member song: user id, playlist id, track id; CSV, TSV or Parquet, optionally gzipped) in chunks,
groups the rows by playlist, maps the original ids to the model's indices (``-1`` = unknown: the
graph folds the playlist / user in, see ``masr.export``), scores batches of playlists in the
ONNX graph and writes, for each playlist in input order, K rows
``playlist_id,rank,track_id,score`` (rank 1 best, score = negated fused distance, higher is
better). Member songs are never recommended (the graph excludes them).

Streaming: memory holds the model, one read chunk and the batches in flight (and polars'
reader buffers, which grow slowly with the input: exported/README.md), when each playlist's rows
are adjacent (as a file sorted or grouped by playlist has them)
or the input is one read chunk (``read_rows``). An input larger than that whose playlists'
rows are scattered is regrouped in memory first (said in the summary line).

Counted and reported in the summary: member rows whose track is not in the catalog (ignored),
duplicate member rows (ignored), new playlists and users (folded in), and playlists with no
usable member, which fall back to the user term of MDR and then to song popularity (biases).

``ScoreConfig(engine="ray")`` hands the same work to ``masr.score_ray`` (Ray Data batch
inference over a cluster), imported only then: the local engine never imports Ray.

Only numpy, polars and ONNX Runtime (imported when a model is loaded) are used here: this module
and everything it imports never import torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

from masr.atomic import (
    atomic_file,
    check_output_file,
    check_replaceable_dir,
    gzip_writer,
    sole_writer,
)
from masr.config import ScoreConfig
from masr.dataset import check_outside_prepared
from masr.errors import MasrError, check_instance
from masr.io import (
    NULL_MARK,
    Columns,
    check_file,
    detect_format,
    id_columns,
    one_row_per_song,
    scan,
    unreadable,
)
from masr.onnx_format import (
    FORMAT,
    ID_MAP_SIZES,
    INPUTS,
    MODEL_SHA256,
    OUTPUTS,
    UNKNOWN,
    WEIGHTS,
    read_json_object,
    read_metadata,
    sha256_file,
    sidecar,
    sidecars,
)

#: Floats in one of the graph's largest tensors (grid x chunk, ``plan_batches``) per call: 1 GiB.
MAX_GRID_FLOATS = 1 << 28
HEADER = b"playlist_id,rank,track_id,score\n"
#: Output rows made into one frame and written at a time (``_write_all``).
WRITE_ROWS = 1 << 18


@dataclass
class ScoreSummary:
    """Counts for the summary line."""

    playlists: int = 0
    rows: int = 0
    new_playlists: int = 0  # playlist id not in the model: folded in from its members
    new_user_playlists: int = 0  # playlists whose user is not in the model
    unknown_song_rows: int = 0  # member rows whose track is not in the catalog (ignored)
    duplicate_rows: int = 0  # repeated (playlist, track) rows (ignored)
    #: rows without a track id in a playlist that has tracks (ignored; a playlist of such rows
    #: only, as in MPD's challenge set, is an empty playlist to continue)
    trackless_rows: int = 0
    fallback_playlists: int = 0  # no usable member: user term, then song popularity
    #: playlists the model was trained on with no usable member in the input: an export with
    #: MDR still ranks them by their trained playlist vector (eq. 11), not by the fallback
    known_songless_playlists: int = 0
    #: how those are ranked (``fallback_of``): MDR's user term, then the song biases; an export
    #: without an MDR part (α 0, or MASS alone) has only MASS's song biases
    fallback: str = "user taste, then popularity"
    short_playlists: int = 0  # fewer than K songs left to recommend
    regrouped: bool = False  # playlists' rows not adjacent: the input regrouped in memory
    provider: str = "cpu"
    actors: int = 0  # Ray actors that scored (the ray engine); 0: this process (local)
    seconds: float = 0.0

    def line(self) -> str:
        """The one summary line printed on stderr."""
        where = self.provider.upper() + (f", {_n(self.actors, 'Ray actor')}" if self.actors else "")
        parts = [
            f"scored {_n(self.playlists, 'playlist')} ({_n(self.rows, 'row')}) in "
            f"{self.seconds:.1f} s on {where}",
            f"{_n(self.new_playlists, 'new playlist')} and "
            f"{_n(self.new_user_playlists, 'playlist')} of new users folded in",
            f"{_n(self.unknown_song_rows, 'row')} with unknown songs ignored",
        ]
        if self.duplicate_rows:
            parts.append(f"{_n(self.duplicate_rows, 'duplicate row')} ignored")
        if self.trackless_rows:
            parts.append(f"{_n(self.trackless_rows, 'row')} without a track id ignored")
        parts.append(
            f"{_n(self.fallback_playlists, 'playlist')} without a known song "
            f"(ranked by {self.fallback})"
        )
        if self.known_songless_playlists:
            parts.append(
                f"{_n(self.known_songless_playlists, 'known playlist')} without a known song "
                "(each ranked by its trained playlist vector)"
            )
        if self.short_playlists:
            parts.append(f"{_n(self.short_playlists, 'playlist')} with fewer than K songs left")
        if self.regrouped:
            parts.append("rows regrouped by playlist in memory (not adjacent in the input)")
        return " · ".join(parts)

    def warning(self) -> str | None:
        """A line for input none of whose songs the model knows (QA: exit 0 and the counts
        only, every playlist ranked by the fallback, or a known one by its trained vector),
        else None."""
        songless = self.fallback_playlists + self.known_songless_playlists
        if not (self.playlists and self.unknown_song_rows and songless == self.playlists):
            return None
        how = f"every playlist was ranked by {self.fallback}"
        if self.known_songless_playlists:  # QA: said of known playlists too, which MDR ranks
            others = f", the others by {self.fallback}" if self.fallback_playlists else ""
            how = ("no playlist was ranked from its songs (the known playlists by their "
                   f"trained vectors{others})")
        return (
            f"warning: none of the input's songs is in the model's catalog, so {how}; are its "
            "track ids the ones the model was trained on (the column masr prep read, e.g. "
            "'000384' and not 384)?"
        )


def has_mdr(metadata: dict[str, Any]) -> bool:
    """Whether an export has an MDR part, from its metadata's parts (``dims``)."""
    dims = metadata.get("dims")
    return not (isinstance(dims, dict) and "mdr" not in dims)


def fallback_of(metadata: dict[str, Any]) -> str:
    """``ScoreSummary.fallback`` of an export, from its metadata's parts (``dims``)."""
    if not has_mdr(metadata):
        return "MASS's song biases alone: this export has no MDR part"
    return ScoreSummary.fallback


def unverified_note(model: Path) -> str:
    """The warning for a model whose file could not be checked against its recorded SHA-256."""
    side = sidecar(model, "json")
    what = "is missing" if not side.is_file() else "records no SHA-256 (an older export)"
    return (
        f"warning: {side} {what}: {model.name} cannot be checked for damage; "
        "`masr export` again to restore it"
    )


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# -- the exported model -------------------------------------------------------------------------


def _quiet_onnxruntime() -> Any:
    """Import ONNX Runtime with its C++ logger silenced (no CUDA load errors on stderr)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # FATAL only
    return ort


def _cuda_usable(ort: Any) -> bool:
    """Whether the CUDA provider is in this build; its libraries are preloaded when the
    ``onnxruntime-gpu[cuda,cudnn]`` wheels provide them (preload prints on stdout: captured)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            preload()
    return True


class Engine:
    """An ONNX Runtime session of a masr graph (any ``.onnx`` from ``masr.export``), batching and
    concurrent calls. On CPU, ``workers`` single-threaded calls run side by side (they scale
    better than intra-op threads); on CUDA one call at a time. ``threads``: intra-op threads of
    one call (None: 1 when several workers share the cores, else every core)."""

    #: a two-stage graph's songs proposed per playlist, fed at run time; None: the graph's default
    candidates: int | None = None

    def __init__(
        self,
        path: str | Path,
        device: str = "auto",
        workers: int | None = None,
        batch_size: int | None = None,
        threads: int | None = None,
    ) -> None:
        path = check_model_path(path)
        self.path = path
        ort = _quiet_onnxruntime()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cores = max(1, cores or 1)
        workers = workers or cores
        threads = threads or (1 if workers > 1 else cores)
        self.session, self.provider = self._session(ort, device, threads)
        self.workers = 1 if self.provider == "cuda" else workers
        self.batch_size = batch_size or (512 if self.provider == "cuda" else 16)
        raw = self.session.get_modelmeta().custom_metadata_map
        try:  # every value is JSON in a masr export; anything else: no metadata
            self.metadata: dict[str, Any] = {key: json.loads(value) for key, value in raw.items()}
        except ValueError:
            self.metadata = {}
        self.chunk = self._graph_chunk()
        self.max_cells = MAX_GRID_FLOATS // self.chunk if self.chunk else None
        self._pool: ThreadPoolExecutor | None = None
        self._loaded()

    def _loaded(self) -> None:
        """Called at the end of ``__init__``, once the session and its metadata are in place:
        a subclass reads what else it needs here (``ExportedModel``). Default: nothing."""

    def _graph_chunk(self) -> int | None:
        """The songs per MASS loop step of the graph (the export's chunk, at most the catalog
        plus its one padding column), from the model's metadata; None if it is not there."""
        try:
            chunk = int(self.metadata["chunk"])
            songs = int(self.metadata.get("sizes", {}).get("n_songs", chunk))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return min(chunk, songs + 1) if chunk > 0 else None

    def _session(self, ort: Any, device: str, threads: int) -> tuple[Any, str]:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        options.intra_op_num_threads = threads
        providers: list[Any] = ["CPUExecutionProvider"]
        if device != "cpu" and _cuda_usable(ort):
            # exact float32 products (no TF32), so CPU and CUDA agree
            providers.insert(0, ("CUDAExecutionProvider", {"use_tf32": "0"}))
        try:
            session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:
            text = " ".join(str(exc).split())
            if "xternal data" in text or "xternal initializer" in text:
                weights = sidecar(self.path, WEIGHTS)
                raise MasrError(
                    f"{weights}: weights file missing or incomplete next to {self.path.name}; "
                    "export again"
                ) from None
            raise MasrError(
                f"--model {self.path}: not a readable ONNX model ({text[:200]})"
            ) from None
        provider = "cuda" if "CUDAExecutionProvider" in session.get_providers() else "cpu"
        if device == "cuda" and provider != "cuda":
            raise MasrError(
                "--device cuda: ONNX Runtime cannot use CUDA here (no GPU, or CUDA/cuDNN "
                "libraries missing: pip install 'onnxruntime-gpu[cuda,cudnn]'); "
                "use --device cpu"
            )
        names = {i.name for i in session.get_inputs()} | {o.name for o in session.get_outputs()}
        if not {*INPUTS, *OUTPUTS} <= names:
            raise MasrError(f"--model {self.path}: not a masr graph (inputs/outputs {names})")
        return session, provider

    def top_k(
        self, users: np.ndarray, playlists: np.ndarray, members: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(songs (B, K) int64, scores (B, K) float32) for one batch. In the inputs -1 is an
        unknown user or playlist, or a padded member slot; in the outputs a slot past a
        playlist's eligible songs (K above the catalog less its members) has score -inf and a
        meaningless song index (``masr score`` drops such rows)."""
        songs, scores = self.session.run(
            ["songs", "scores"],
            {
                "users": np.ascontiguousarray(users, dtype=np.int64),
                "playlists": np.ascontiguousarray(playlists, dtype=np.int64),
                "members": np.ascontiguousarray(members, dtype=np.int64),
                "k": np.array(k, dtype=np.int64),
                **({} if self.candidates is None else {"candidates": np.array(self.candidates)}),
            },
        )
        return songs, scores

    def recommend(
        self,
        users: np.ndarray,
        playlists: np.ndarray,
        members: list[np.ndarray],
        k: int,
        batches: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-K for n playlists given as index arrays and member lists: (songs (n, K), scores
        (n, K)), in the given order. Batches group each user's playlists (see ``plan_batches``;
        ``batches``: the rows of each call, planned elsewhere) and run ``workers`` at a time.
        A playlist's scores may differ in the last bits with the batch it is in (the graph's
        products change shape), so the same batches give the same output bytes."""
        n = len(users)
        if batches is None:
            lengths = np.array([len(m) for m in members], dtype=np.int64)
            batches = plan_batches(users, lengths, self.batch_size, max_cells=self.max_cells)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers)
        futures = [
            self._pool.submit(self.top_k, users[rows], playlists[rows], pad(members, rows), k)
            for rows in batches
        ]
        songs = np.zeros((n, k), dtype=np.int64)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        for rows, future in zip(batches, futures, strict=True):
            batch_songs, batch_scores = future.result()
            width = batch_songs.shape[1]  # < k only when k exceeds the catalog
            songs[rows, :width], scores[rows, :width] = batch_songs, batch_scores
        return songs, scores

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class ExportedModel(Engine):
    """An exported model ready to score: the engine plus its metadata and id maps."""

    #: False when the model file could not be checked against its recorded SHA-256 (no
    #: metadata JSON file beside it, or one from before 2026-11-29 without it)
    verified: bool = False

    def _loaded(self) -> None:
        """Check the metadata, then read the id maps it lists."""
        self._check_metadata()
        sizes = self.metadata["sizes"]
        self.n_songs = int(sizes["n_songs"])
        maps = self._id_maps(sizes)
        self.songs = maps["songs"].select(
            pl.col("track_id").cast(pl.String), pl.col("song_idx").cast(pl.Int64)
        )
        self.track_ids = self.songs.sort("song_idx")["track_id"]  # (V,) index -> track id
        playlists = maps["playlists"]
        # each training playlist's user (exports since the playlists map carried it), for an
        # input row of a known playlist that names no user
        owner = pl.col("user_idx") if "user_idx" in playlists.columns else pl.lit(None)
        self.playlists = playlists.select(
            pl.col("playlist_id").cast(pl.String),
            pl.col("playlist_idx").cast(pl.Int64),
            owner.cast(pl.Int64).alias("trained_user_idx"),
        )
        self.users = maps["users"].select(
            pl.col("user_id").cast(pl.String), pl.col("user_idx").cast(pl.Int64)
        )
        self.two_stage = self.metadata.get("candidates") is not None
        if self.two_stage:
            self.use_candidates(None)

    def use_candidates(self, n: int | None) -> None:
        """Score a two-stage export (``masr export --candidates``) with ``n`` candidates per
        playlist (None: the export's). Its largest tensors span the candidates, not the MASS
        loop's chunk: the calls are bounded by them."""
        self.candidates = n
        span = min(n or int(self.metadata["candidates"]), self.n_songs)
        self.max_cells = MAX_GRID_FLOATS // max(1, span)

    def _check_metadata(self) -> None:
        """A masr export, whose metadata JSON file (if present) is this export's and whose
        file has the SHA-256 recorded there (sets ``verified``)."""
        meta = self.metadata
        if meta.get("format") != FORMAT:
            raise MasrError(f"--model {self.path}: not a masr export (no masr metadata)")
        side = sidecar(self.path, "json")
        if side.is_file():
            beside = _sidecar_json(side)
            _check_same_export(side, beside, self.path, meta)
            digest = beside.get(MODEL_SHA256)  # exports before 2026-11-29 lack it
            if digest and sha256_file(self.path) != digest:
                raise MasrError(
                    f"{self.path}: damaged (its SHA-256 is not the one {side.name} recorded); "
                    "export again"
                )
            self.verified = bool(digest)
        weights = meta.get("weights")
        if weights:  # the tensors live beside the model (masr.export.external)
            path = self.path.with_name(weights["file"])
            if sha256_file(path) != weights["sha256"]:
                raise MasrError(f"{path}: does not belong to {self.path.name}; export again")

    def _id_maps(self, sizes: dict[str, int]) -> dict[str, pl.DataFrame]:
        maps = {}
        for name, entry in self.metadata.get("id_maps", {}).items():
            path = self.path.with_name(entry["file"])
            if not path.is_file():
                raise MasrError(f"{path}: id map missing next to {self.path.name}; export again")
            if sha256_file(path) != entry["sha256"]:
                raise MasrError(f"{path}: does not belong to {self.path.name}; export again")
            try:
                maps[name] = pl.read_parquet(path)
            except Exception as exc:
                raise MasrError(f"{path}: unreadable id map ({type(exc).__name__})") from None
            if maps[name].height != int(sizes[ID_MAP_SIZES[name]]):
                raise MasrError(f"{path}: {maps[name].height} rows, the model expects more")
        missing = sorted(set(ID_MAP_SIZES) - set(maps))
        if missing:
            raise MasrError(f"--model {self.path}: metadata lists no {', '.join(missing)} id map")
        return maps


# -- reading the input --------------------------------------------------------------------------


def _scan(path: Path, columns: Columns) -> pl.LazyFrame:
    """A lazy frame with String columns ``user, playlist, track`` (missing columns: one line)."""
    head = check_file(path)
    lf = scan(path, *detect_format(path, head), empty_playlists=True)
    try:
        schema = lf.collect_schema()
    except pl.exceptions.NoDataError:
        raise MasrError(f"{path}: empty file (no header or data)") from None
    except Exception as exc:
        raise unreadable(path, exc, "unreadable file") from None
    lf, schema = one_row_per_song(lf, schema, path, columns.as_dict())
    lf = lf.select(id_columns(path, schema, columns.as_dict()))
    # a blank id ("" or spaces, quoted as a database's CSV writes an empty string) is a missing
    # one, as an empty field is (QA: `u,"",t` scored a playlist with the id "", a user "" made a
    # training playlist a new user's, a track "" counted as an unknown song); so is \N, a
    # database export's NULL (QA: the rows of several playlists scored as one playlist '\N')
    lf = lf.with_columns(
        pl.when((pl.col(c) != "") & (pl.col(c) != NULL_MARK)).then(pl.col(c)).alias(c)
        for c in ("user", "playlist", "track")
    )
    try:
        empty = lf.head(1).collect().height == 0
    except Exception as exc:  # polars raises several error types for malformed files
        raise unreadable(path, exc, "unreadable or malformed file") from None
    if empty:
        raise MasrError(f"{path}: no data rows (only a header)")
    return lf


def _playlist_chunks(
    lf: pl.LazyFrame, path: Path, read_rows: int, summary: ScoreSummary | None = None
) -> Iterator[pl.DataFrame]:
    """Chunks of input rows that hold complete playlists (the last playlist of a read chunk
    waits for the next one), streamed when each playlist's rows are adjacent (or the input is
    one read chunk). Otherwise (a database export in no particular order) the input is read
    whole and regrouped in memory, playlists in the order of their first row, which
    ``summary.regrouped`` records. ``lf``: the input ``path`` as ``check_paths`` scanned it.
    A first pass over the whole input (``_first_pass``) refuses it, before any chunk, when it
    cannot be read to its end or a row has no playlist id."""
    if _first_pass(lf, path, read_rows):
        batches: Iterable[pl.DataFrame] = lf.collect_batches(chunk_size=read_rows)
    else:
        if summary is not None:
            summary.regrouped = True
        batches = _regrouped(lf, path, read_rows)
    return _complete_playlists(batches, path)


def _first_pass(lf: pl.LazyFrame, path: Path, read_rows: int) -> bool:
    """Whether every playlist's rows are adjacent, within and across read chunks; raises
    (MasrError) for an input that cannot be read to its end or a row without a playlist id.
    One pass over the id columns (user, playlist, track), streamed, before anything is
    written: those are one error line here, not after the output of the playlists before."""
    done = np.empty(0, dtype=np.uint64)
    last = None
    adjacent = True
    null_ids, first_null, rows_read = 0, 0, 0
    try:  # every id column: a Parquet file damaged in the track column fails here too
        for frame in lf.collect_batches(chunk_size=read_rows):
            if frame.height == 0:
                continue
            ids = frame["playlist"]
            if not null_ids and ids.null_count():  # the first one's data row, as prep says it
                first_null = rows_read + int(ids.is_null().arg_true()[0])
            null_ids += ids.null_count()
            rows_read += frame.height
            if not adjacent:
                continue  # read on: the rest of the file must be readable too
            first, tail = ids[0], ids[-1]
            runs = 1 + int(ids.slice(1).ne_missing(ids.slice(0, ids.len() - 1)).sum())
            if runs != ids.n_unique():  # a playlist's rows apart within this chunk
                adjacent = False
                continue
            if last is not None and first == last:
                ids = ids.filter(ids != last)  # the previous chunk's last playlist goes on
            _, hashes, again = _seen(ids, done)
            if again.any():
                adjacent = False
                continue
            done = _with(done, hashes)
            last = tail
    except Exception as exc:  # polars raises several error types for malformed files
        raise unreadable(path, exc, "unreadable or malformed file") from None
    if null_ids:
        raise MasrError(
            f"{path}: {null_ids} row(s) have no playlist id (empty or {NULL_MARK}; first at data "
            f"row {first_null + 1})"
        )
    return adjacent


def _regrouped(lf: pl.LazyFrame, path: Path, read_rows: int) -> Iterator[pl.DataFrame]:
    """The whole input with each playlist's rows together, playlists in the order of their
    first row, rows in input order within a playlist, in slices of ``read_rows``."""
    try:
        frame = lf.collect()
    except Exception as exc:  # polars raises several error types for malformed files
        raise unreadable(path, exc, "unreadable or malformed file") from None
    frame = frame.with_row_index("_row")
    first = pl.col("_row").min().over("playlist").alias("_first")
    frame = frame.with_columns(first).sort("_first", maintain_order=True).drop("_row", "_first")
    for start in range(0, frame.height, read_rows):
        yield frame.slice(start, read_rows)


def _complete_playlists(batches: Iterable[pl.DataFrame], path: Path) -> Iterator[pl.DataFrame]:
    """``_playlist_chunks``' frames cut at playlist boundaries. A playlist met again after it
    was scored, or a row without a playlist id, is an error (not expected after
    ``_first_pass``: a file changed while read)."""
    carry: pl.DataFrame | None = None
    done = np.empty(0, dtype=np.uint64)  # hashes of the playlists already scored
    any_rows = False
    try:
        for frame in batches:
            if frame.height == 0:
                continue
            any_rows = True
            nulls = frame["playlist"].is_null()
            if nulls.any():
                raise MasrError(
                    f"{path}: {int(nulls.sum())} row(s) have no playlist id (empty or {NULL_MARK})"
                )
            if carry is not None:
                frame = pl.concat([carry, frame])
            last = frame["playlist"][-1]
            tail = frame["playlist"] == last
            # the carry rechunked (it is small): else it gains a polars chunk per read chunk,
            # and each step slows with the rows read (QA: --read-rows 7, quadratic time)
            carry, ready = frame.filter(tail).rechunk(), frame.filter(~tail)
            if ready.height:
                done = _check_new(ready, done, path)
                yield ready
    except MasrError:
        raise
    except Exception as exc:  # polars raises several error types for malformed files
        raise unreadable(path, exc, "unreadable or malformed file") from None
    if not any_rows:
        raise MasrError(f"{path}: no data rows (only a header)")
    if carry is not None and carry.height:
        _check_new(carry, done, path)
        yield carry


def _seen(ids: pl.Series, done: np.ndarray) -> tuple[pl.Series, np.ndarray, np.ndarray]:
    """The distinct playlist ``ids``, their hashes, and which of them ``done`` (the sorted
    hashes of the playlists met before, ``_with``) already holds: a binary search per id, and
    ``_with``'s one copy of ``done`` per chunk, instead of sorting and merging every playlist
    met so far at each chunk (QA: ``np.isin`` and ``np.union1d`` took 14 of 47 s on 400,000
    playlists; 1.5 s now)."""
    distinct = ids.unique()
    hashes = distinct.hash(seed=0).to_numpy()
    if not len(done):
        return distinct, hashes, np.zeros(len(hashes), dtype=bool)
    at = np.minimum(np.searchsorted(done, hashes), len(done) - 1)
    return distinct, hashes, done[at] == hashes


def _with(done: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """The sorted hashes ``done`` with ``hashes`` added, still sorted (``_seen`` searches them):
    one insertion (a copy), not a sort or a set union of everything met so far."""
    new = np.sort(hashes)
    return np.insert(done, np.searchsorted(done, new), new)


def _check_new(frame: pl.DataFrame, done: np.ndarray, path: Path) -> np.ndarray:
    ids, hashes, again = _seen(frame["playlist"], done)
    if again.any():
        pid = ids.filter(pl.Series(again))[0]
        raise MasrError(
            f"{path}: the rows of playlist {pid!r} are not adjacent; group the input by "
            "playlist (e.g. sort it by the playlist column) to score it in chunks"
        )
    return _with(done, hashes)


# -- scoring --------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """One chunk's playlists, mapped to indices, in input order."""

    playlist_ids: pl.Series  # (n,) original ids
    users: np.ndarray  # (n,) int64, -1 unknown
    playlists: np.ndarray  # (n,) int64, -1 unknown
    members: list[np.ndarray]  # n arrays of catalog song indices (unique, input order)


def _prepare(frame: pl.DataFrame, model: ExportedModel, summary: ScoreSummary) -> _Prepared:
    """Map ids, group rows into playlists and count. A playlist's user is, as in
    ``masr prep``, the user with most of its rows (ties: the smallest id); a known playlist
    whose rows name no user keeps its training user."""
    frame = (
        frame.with_row_index("row")
        .join(model.songs, left_on="track", right_on="track_id", how="left")
        .sort("row")
    )
    summary.rows += frame.height
    # a row without a track (an empty playlist to continue) is not an unknown song
    unknown = frame["song_idx"].is_null() & frame["track"].is_not_null()
    summary.unknown_song_rows += int(unknown.sum())
    track = pl.col("track")
    trackless = track.is_null() & track.is_not_null().any().over("playlist")
    summary.trackless_rows += int(frame.select(trackless.sum()).item())
    owners = (
        frame.group_by("playlist", "user")
        .len()
        .sort(["len", "user"], descending=[True, False], nulls_last=True)
        .unique("playlist", keep="first")
        .select("playlist", pl.col("user").alias("owner"))
    )
    grouped = (
        frame.group_by("playlist", maintain_order=True)
        .agg(
            pl.col("song_idx").drop_nulls().unique(maintain_order=True).alias("members"),
            pl.col("song_idx").drop_nulls().len().alias("known_rows"),
        )
        .with_row_index("order")
        .join(owners, on="playlist", how="left")
        .join(model.users, left_on="owner", right_on="user_id", how="left")
        .join(model.playlists, left_on="playlist", right_on="playlist_id", how="left")
        .sort("order")
        # a known playlist whose rows name no user keeps the user it was trained with
        .with_columns(
            pl.when(pl.col("owner").is_null())
            .then(pl.col("trained_user_idx"))
            .otherwise(pl.col("user_idx"))
            .alias("user_idx")
        )
        .with_columns(pl.col("user_idx", "playlist_idx").fill_null(UNKNOWN))
    )
    n_members = grouped["members"].list.len().to_numpy().astype(np.int64)
    summary.duplicate_rows += int(grouped["known_rows"].sum() - n_members.sum())
    users = grouped["user_idx"].to_numpy().astype(np.int64)
    playlists = grouped["playlist_idx"].to_numpy().astype(np.int64)
    summary.playlists += grouped.height
    summary.new_playlists += int((playlists == UNKNOWN).sum())
    summary.new_user_playlists += int((users == UNKNOWN).sum())
    songless = n_members == 0
    # a known playlist keeps its trained MDR vector (eq. 11): only MASS, which has no playlist
    # vector, falls back for it (QA: counted and warned about as ranked by user taste alone)
    known = songless & (playlists != UNKNOWN) & has_mdr(model.metadata)
    summary.known_songless_playlists += int(known.sum())
    summary.fallback_playlists += int((songless & ~known).sum())
    return _Prepared(
        playlist_ids=grouped["playlist"],
        users=users,
        playlists=playlists,
        members=member_lists(grouped["members"]),
    )


def member_lists(lists: pl.Series) -> list[np.ndarray]:
    """A list column of song indices as one int64 array per row (empty lists: empty arrays)."""
    lengths = lists.list.len().to_numpy().astype(np.int64)
    flat = lists.explode().drop_nulls().to_numpy().astype(np.int64)
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def grid_cells(users: np.ndarray, n_members: np.ndarray) -> int:
    """Member slots of the graph's padded grid for one call of these playlists: users x most
    playlists of one user x most members of one playlist (unknown users, -1, are one user)."""
    _, per_user = np.unique(users, return_counts=True)
    return len(per_user) * int(per_user.max()) * max(1, int(n_members.max()))


def plan_batches(
    users: np.ndarray,
    n_members: np.ndarray,
    batch_size: int,
    group_cap: int = 8,
    max_cells: int | None = None,
) -> list[np.ndarray]:
    """Row positions of each ONNX call.

    The graph builds each user's queries once per call and pads the call to (users x most
    playlists of one user x most members of one playlist). A user's query costs about as much
    as 20 member slots, so sharing it pays while padding stays small: each known user's
    playlists are split by member count into octaves (1, 2-3, 4-7, ... songs) and cut into
    pieces of at most ``group_cap``; pieces of equal size and similar member counts then fill
    the calls, biggest first. Unknown users (-1) share one query (the mean user): all their
    playlists form one piece, in calls of their own. On AOTM (81,591 playlists, calls of 32)
    this pads 1.2x the real member slots with 3 playlists per user query (sorted by user only:
    2.4x and 5).

    ``max_cells`` bounds a call's grid (``grid_cells``): a call over it is halved until it fits
    or holds one playlist. The graph's largest tensors hold grid x chunk floats, so the engine
    sets it from the export's chunk (a big chunk, faster on CUDA, with calls of 512 would
    otherwise pass cuDNN's 2^31-element limit and the GPU's memory)."""
    if len(users) == 0:
        return []
    octave = np.floor(np.log2(n_members + 1)).astype(np.int64)
    octave[users == UNKNOWN] = 0
    order = np.lexsort((n_members, octave, users))  # by user, octave, member count
    by_user, by_octave = users[order], octave[order]
    change = np.r_[True, (np.diff(by_user) != 0) | (np.diff(by_octave) != 0)]
    starts = np.flatnonzero(change)
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    new_piece = change | ((rank % max(1, group_cap) == 0) & (by_user != UNKNOWN))
    piece = np.cumsum(new_piece) - 1  # (n,) piece of each sorted row
    size = np.bincount(piece)
    longest = np.maximum.reduceat(n_members[order], np.flatnonzero(new_piece))
    piece_rank = np.empty(len(size), dtype=np.int64)
    piece_rank[np.lexsort((longest, -size))] = np.arange(len(size))  # big pieces first
    final = order[np.argsort(piece_rank[piece], kind="stable")]
    # the unknown users' piece in calls of its own (before, the rest of its last call held
    # known users, each padded to the new users' playlist count; QA: --batch-size 512, half of
    # 20,000 playlists of new users, 5.9 GB peak RSS)
    unknown = users[final] == UNKNOWN
    batches = [
        part[i : i + batch_size]
        for part in (final[unknown], final[~unknown])
        for i in range(0, len(part), batch_size)
    ]
    if max_cells is None:
        return batches
    fitted: list[np.ndarray] = []
    todo = batches[::-1]  # a stack: the next call on top, order kept
    while todo:
        rows = todo.pop()
        if len(rows) > 1 and grid_cells(users[rows], n_members[rows]) > max_cells:
            half = len(rows) // 2
            todo += [rows[half:], rows[:half]]
        else:
            fitted.append(rows)
    return fitted


def pad(members: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """(B, L) member indices of ``rows``, padded with -1 (L >= 1)."""
    lengths = np.array([len(members[r]) for r in rows], dtype=np.int64)
    out = np.full((len(rows), max(1, int(lengths.max(initial=0)))), UNKNOWN, dtype=np.int64)
    if lengths.sum():
        flat = np.concatenate([members[r] for r in rows])
        row_of = np.repeat(np.arange(len(rows)), lengths)
        col_of = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[row_of, col_of] = flat
    return out


def _rows_out(
    prepared: _Prepared,
    songs: np.ndarray,
    scores: np.ndarray,
    model: ExportedModel,
    order: np.ndarray | None = None,
) -> pl.DataFrame:
    """The output rows of one chunk (input order, rank 1 first; -inf scores dropped); with
    ``order`` (each playlist's input position), an ``order`` column after the four."""
    n, k = songs.shape
    frame = pl.DataFrame(
        {
            "playlist_id": prepared.playlist_ids.gather(np.repeat(np.arange(n), k)),
            "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), n),
            "track_id": model.track_ids.gather(songs.reshape(-1)),
            "score": scores.reshape(-1),
        }
    )
    if order is not None:
        frame = frame.with_columns(order=np.repeat(np.asarray(order, dtype=np.int64), k))
    return frame.filter(pl.col("score").is_finite())


def stdout_bytes() -> Any:
    """Where CSV bytes for stdout go: its binary buffer, or for a text stream without one (a
    notebook's, ``io.StringIO``) a writer that hands the bytes on as text."""
    return getattr(sys.stdout, "buffer", None) or _TextBytes(sys.stdout)


class _TextBytes(io.RawIOBase):
    """The bytes ``_write_all`` writes (UTF-8 CSV), passed on to a text stream as text."""

    def __init__(self, text: Any) -> None:
        self.text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.text.write(bytes(data).decode("utf-8"))
        return len(data)

    def flush(self) -> None:
        self.text.flush()


def score_file(
    input: str | Path,
    model: str | Path = "exported/masr.onnx",
    out: str | Path | None = None,
    config: ScoreConfig | None = None,
    log: Callable[[str], None] | None = None,
    *,
    metadata: dict[str, Any] | None = None,
) -> ScoreSummary:
    """Score every playlist of ``input`` with the exported ``model``; CSV to ``out`` (written
    aside, renamed when complete) or to stdout. Returns the counts of the summary line.
    ``config.engine == "ray"``: the same rows from Ray actors (``masr.score_ray.score_ray``),
    also as Parquet parts in the directory ``out`` (``config.out_format``). ``metadata``: the
    model's ``export_metadata``, when the caller read it and ran ``check_candidates`` on it
    already (``masr score``; not read and checked again)."""
    config = ScoreConfig() if config is None else config
    check_instance(config, ScoreConfig, "score_file(config=...)")  # a dict: one line
    config.validate()
    say = log or (lambda _msg: None)
    if out is not None and str(out) == "-":  # stdout, as `masr score --out -` reads it
        out = None
    # the export's metadata, read once without the graph: options it cannot serve are refused
    # before anything is said, the input read or the model loaded
    if metadata is None:
        metadata = export_metadata(check_model_path(model))
        check_candidates(metadata, config, model)
    if config.columns is None:  # the input's column names come from the same metadata
        config = replace(config, columns=input_columns(model, say=say, metadata=metadata))
    if str(input) == "-" or _is_pipe(Path(input)):
        return _score_spooled(input, model, out, config, say, metadata)
    if config.engine == "ray":  # Ray is imported there, never on this engine's path
        from masr.score_ray import score_ray

        return score_ray(input, model, out, config, say)
    started = time.perf_counter()
    input = Path(input)
    lf = check_paths(input, out, config, model)
    # the model first (a damaged export, --device cuda without CUDA: said at once, as on the
    # Ray engine), then the first pass over the input (a row without a playlist id, a file
    # that cannot be read to its end), then the model's lines: a refusal is one line alone
    exported = ExportedModel(model, config.device, config.workers, config.batch_size)
    try:  # the model closed however this ends
        summary = ScoreSummary(provider=exported.provider, fallback=fallback_of(exported.metadata))
        chunks = _playlist_chunks(lf, input, config.read_rows, summary)
        say(
            f"ONNX Runtime on {exported.provider.upper()}: {exported.metadata.get('model')} "
            f"({exported.n_songs:,} songs), {exported.workers} worker(s), "
            f"batches of {exported.batch_size}"
        )
        if not exported.verified:
            say(unverified_note(exported.path))
        _two_stage(exported, config, model, say)
        if exported.provider == "cuda":
            _chunk_hint(exported, say)
        if out is None:
            _write_all(chunks, exported, stdout_bytes(), config, summary)
        else:
            with csv_output(out, say) as fh:
                _write_all(chunks, exported, fh, config, summary)
    finally:
        exported.close()
    summary.seconds = time.perf_counter() - started
    return summary


@contextlib.contextmanager
def csv_output(out: str | Path, say: Callable[[str], None]) -> Iterator[IO[bytes]]:
    """The CSV ``--out``: written aside and renamed when complete (``atomic_file``), gzipped
    when its name ends in ``.gz``, by its one writer (``sole_writer``: a killed score's
    temporary file is removed first). A device or a pipe is written in place."""
    out = Path(out)
    with sole_writer(out, "masr score", say), atomic_file(out, "wb") as fh:
        if not out.name.lower().endswith(".gz"):
            yield fh
            return
        with gzip_writer(fh) as packed:
            yield packed  # type: ignore[misc]


def _is_pipe(path: Path) -> bool:
    """A named pipe, e.g. ``<(zcat playlists.csv.gz)``: read once, so spooled as ``-`` is."""
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


def _score_spooled(
    input: str | Path,
    model: str | Path,
    out: str | Path | None,
    config: ScoreConfig,
    say: Callable[[str], None],
    metadata: dict[str, Any],
) -> ScoreSummary:
    """INPUT ``-`` (standard input) or a named pipe: spooled to a private temporary file (the
    reader needs a file it can scan twice and tell the format of: CSV, TSV, Parquet, gzipped
    or not), scored by ``score_file`` (with the export's ``metadata``, checked already),
    removed after."""
    import shutil
    import tempfile

    stdin = str(input) == "-"
    name = "standard input" if stdin else str(input)
    if config.engine != "local":
        raise MasrError(f"INPUT {input}: read here, once; --engine ray needs a file")
    if stdin and sys.stdin.isatty():
        raise MasrError("INPUT -: standard input is a terminal; pipe a file in: masr score - < F")
    source = getattr(sys.stdin, "buffer", None) if stdin else None
    if stdin and source is None:
        raise MasrError("INPUT -: standard input is not a byte stream here; give a file")
    with tempfile.TemporaryDirectory(prefix="masr-stdin-") as tmp:
        path = Path(tmp) / "stdin"
        with open(path, "wb") as fh, \
                (contextlib.nullcontext(source) if stdin else open(input, "rb")) as src:
            shutil.copyfileobj(src, fh, 1 << 20)  # standard input is left open
        try:
            return score_file(path, model, out, config, log=say, metadata=metadata)
        except MasrError as exc:  # name the input as the user gave it, not the spool file
            raise MasrError(str(exc).replace(str(path), name)) from None


def check_model_path(path: str | Path) -> Path:
    """``path`` as a Path when it names a file (one error line otherwise)."""
    path = Path(path)
    if not path.exists():
        raise MasrError(f"--model {path}: no such file; export one first (masr export)")
    if path.is_dir():
        raise MasrError(f"--model {path}: is a directory, expected an .onnx file")
    return path


def input_columns(
    model: str | Path,
    given: dict[str, str | None] | None = None,
    say: Callable[[str], None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Columns:
    """The id columns to read a playlists file with: each name in ``given`` (``--user-col``
    ...) when not None, else the one of the data the model was trained on (``masr prep``'s
    columns, which ``masr export`` records in its metadata), else the default name
    (``user_id``, ``playlist_id``, ``track_id``). The metadata is ``export_metadata``'s (the
    JSON file next to the model when it is this export's, else the model's own entries); an
    unreadable file or model, or another export's JSON file, is one error line here, before
    the input is read with the wrong names. ``metadata``: that metadata, read already."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    recorded: dict[str, str] = {}
    if len(given) < 3:
        meta = export_metadata(Path(model)) if metadata is None else metadata
        data = meta.get("data")
        columns = data.get("columns") if isinstance(data, dict) else None
        if isinstance(columns, dict):
            recorded = {
                k: v for k, v in columns.items()
                if k in ("user", "playlist", "track") and isinstance(v, str)
            }
    defaults = Columns().as_dict()
    from_export = {k: v for k, v in recorded.items() if k not in given}
    if say is not None and any(v != defaults[k] for k, v in from_export.items()):
        say(
            "input columns as in the model's training data: "
            + ", ".join(f"{k} = {v}" for k, v in from_export.items())
        )
    return Columns(**{**defaults, **from_export, **given})


def export_metadata(model: Path) -> dict[str, Any]:
    """A masr export's metadata: its JSON file when it belongs to the model (the same
    ``export_id``), else the model's own metadata entries (the same keys, each value JSON),
    read without loading the graph (``read_metadata``). One error line for an unreadable
    file, a file that is not an ONNX model, an ONNX model that is not a masr export, or a JSON
    file of another export (read before the input, whose column names it may give). With no
    model file, the JSON file as it is, or {} (loading the model says what is missing)."""
    side = sidecar(model, "json")
    beside = _sidecar_json(side) if side.is_file() else None
    if not model.is_file():
        return beside or {}  # no model at all: loading it says so
    try:
        meta = read_metadata(model)
    except (OSError, ValueError) as exc:
        raise MasrError(f"--model {model}: not a readable ONNX model ({exc})") from None
    if meta.get("format") != FORMAT:
        raise MasrError(f"--model {model}: not a masr export (no masr metadata)")
    if beside is not None:
        _check_same_export(side, beside, model, meta)
        return beside
    return meta


def _sidecar_json(side: Path) -> dict[str, Any]:
    """The metadata JSON file next to a model: a JSON object, else one error line."""
    beside = read_json_object(side)
    if beside is None:
        raise MasrError(f"{side}: unreadable metadata file (not a JSON object)")
    return beside


def _check_same_export(
    side: Path, beside: dict[str, Any], model: Path, meta: dict[str, Any]
) -> None:
    """One error line when the metadata JSON ``beside`` is not the one of ``model``'s export."""
    if beside.get("export_id") != meta.get("export_id"):
        raise MasrError(f"{side}: belongs to another export than {model.name}; export again")


def check_paths(
    input: Path, out: str | Path | None, config: ScoreConfig, model: str | Path | None = None
) -> pl.LazyFrame:
    """Input problems first, before loading the model; then an ``--out`` that cannot be
    written in the chosen format or that names the input or one of the ``model``'s files
    (one line each). Returns the input's frame (``_scan``), which
    ``_playlist_chunks`` reads: scanned once (MPD JSON is parsed whole when scanned)."""
    lf = _scan(input, config.columns)
    if out is not None:  # masr prep replaces its folder whole, a file put there with it
        check_outside_prepared(out, "--out")
    if config.out_format == "parquet":
        if out is None:
            raise MasrError("--format parquet: needs --out DIR (a directory of Parquet files)")
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise MasrError(f"--out {out}: is a file; --format parquet writes a directory")
        check_replaceable_dir(out, None, inputs=(input,))  # replaced whole: not the input's
        if out.is_dir() and any(not p.name.endswith(".parquet") for p in out.iterdir()):
            raise MasrError(
                f"--out {out}: holds other files than Parquet parts; give a new directory"
            )
    elif out is not None:
        from masr.runs.store import check_not_run_file  # torch-free

        check_output_file(out, "--out")  # a directory, or a path below a file
        check_not_run_file(out, "--out")  # runs/mdr/best.pt: a checkpoint lost to the CSV
        # the output is written aside and renamed over its path: what it names would be lost
        model_files = [] if model is None else [
            Path(model), *sidecars(model)
        ]
        for part, what in ((input, "the input"), *((p, f"the model's file {p}")
                                                    for p in model_files)):
            if Path(out).exists() and part.exists() and Path(out).samefile(part):
                raise MasrError(f"--out {out}: is {what}; give another file name")
        if Path(out).suffix.lower() in (".parquet", ".pq"):
            raise MasrError(
                f"--out {out}: masr score writes CSV (playlist_id,rank,track_id,score); name it "
                ".csv, or .csv.gz for gzip (--engine ray --format parquet --out DIR writes "
                "Parquet parts)"
            )
    return lf


def _chunk_hint(model: ExportedModel, say: Callable[[str], None]) -> None:
    """On CUDA: one line when the export walks the catalog in the CPU-sized default step (a
    whole-catalog step was 3.3x faster on an H200)."""
    if not model.two_stage and model.chunk and model.chunk <= model.n_songs:
        say(
            f"hint: this export walks the catalog {model.chunk} songs at a time (the CPU's "
            f"best); for CUDA, masr export --chunk {model.n_songs + 1} scores faster"
        )


def check_candidates(metadata: dict[str, Any], config: ScoreConfig, path: str | Path) -> None:
    """``--candidates`` and ``--k`` against an export's ``metadata`` (``export_metadata``),
    before its sessions are opened (at MPD size, gigabytes of weights): an exact export has
    no first stage to size, and a two-stage one proposes N songs per playlist, so --k above
    N is refused; one line naming the option to change. Nothing to check without metadata
    (loading the model then says what is wrong with it)."""
    if not metadata:
        return
    if metadata.get("candidates") is None:
        if config.candidates is not None:
            kind = str(metadata.get("model", ""))
            if kind not in ("masr", "amasr"):  # one part: nothing to re-rank with
                raise MasrError(
                    f"--candidates {config.candidates}: {path} is a one-part export ({kind}), "
                    "which scores every song; two stages need a fusion: masr export --model "
                    f"amasr --candidates {config.candidates}"
                )
            alpha = metadata.get("alpha")
            part = {0.0: "MASS alone", 1.0: "MDR alone"}.get(alpha)  # eq. 20 at its ends
            scorer = f"{kind} at α {alpha:g} is {part}, which" if part else "the fusion"
            raise MasrError(
                f"--candidates {config.candidates}: {path} is an exact export ({scorer} scores "
                "every song); export a two-stage model with masr export --candidates "
                f"{config.candidates}"
            )
        return
    try:
        n = config.candidates or int(metadata["candidates"])
        k = min(config.k, int(metadata["sizes"]["n_songs"]))
    except (KeyError, TypeError, ValueError):
        return  # metadata without them: loading the model says what is wrong
    if n < k:
        whose = "asked for (--candidates)" if config.candidates else "of this two-stage export"
        raise MasrError(
            f"--k {config.k}: more than the {n:,} candidates per playlist {whose}; pass "
            f"--candidates {k} or more, or a smaller --k"
        )


def _two_stage(
    model: ExportedModel, config: ScoreConfig, path: str | Path, say: Callable[[str], None]
) -> None:
    """``--candidates``: the run-time N of a two-stage export (``score_file`` refused what the
    export cannot serve, ``check_candidates``, before the model was loaded)."""
    if not model.two_stage:
        return
    n = config.candidates or int(model.metadata["candidates"])
    model.use_candidates(config.candidates)
    proposed = min(n, model.n_songs)
    say(
        f"two-stage: MDR proposes {proposed:,} song{'' if proposed == 1 else 's'} per "
        "playlist, the fusion re-ranks them (exact: an export without --candidates)"
    )


def _write_all(
    chunks: Iterable[pl.DataFrame],
    model: ExportedModel,
    fh: IO[bytes],
    config: ScoreConfig,
    summary: ScoreSummary,
) -> None:
    """Read (``chunks``: ``_playlist_chunks``'), score and write chunk by chunk."""
    k = min(config.k, model.n_songs)
    step = max(1, WRITE_ROWS // k)  # playlists whose rows are written at a time
    header = HEADER  # written with the first rows: an input refused at once writes nothing
    for frame in chunks:
        prepared = _prepare(frame, model, summary)
        songs, scores = model.recommend(prepared.users, prepared.playlists, prepared.members, k)
        # fewer than the --k asked for (k itself is at most the catalog)
        summary.short_playlists += int((np.isfinite(scores).sum(1) < config.k).sum())
        fh.write(header)
        header = b""
        # written WRITE_ROWS rows at a time: a read chunk's whole output as one frame held
        # about 130 bytes a row (QA: 1.1 GB at --k 749 for 25,000 playlists of 17 songs)
        for lo in range(0, len(songs), step):
            part = replace(prepared, playlist_ids=prepared.playlist_ids.slice(lo, step))
            rows = _rows_out(part, songs[lo : lo + step], scores[lo : lo + step], model)
            rows.write_csv(fh, include_header=False)
        fh.flush()
    fh.write(header)  # no playlist to score: the header alone


__all__ = [
    "Engine",
    "ExportedModel",
    "ScoreConfig",
    "ScoreSummary",
    "pad",
    "grid_cells",
    "plan_batches",
    "score_file",
]
