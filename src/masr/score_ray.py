"""``masr score --engine ray``: the local engine's scoring as Ray Data batch inference.

This process (the driver) reads the input and maps its ids with ``masr.score``'s own code
(``_playlist_chunks``, ``_prepare``: the same read chunks, checks and counts) and plans each
chunk's ONNX Runtime calls as the local engine does (``plan_batches``): a playlist's scores can
differ in the last bits with the call it is in, so the same calls give the same bytes. Whole
calls, one row per playlist, go to Ray in blocks; a pool of actors, one per CPU of the cluster
(one per GPU with CUDA) or ``workers``, each loads the exported model once and turns the blocks
it is handed into output rows with ``ExportedModel.recommend`` and ``_rows_out``. The CSV is
written by the driver, each read chunk's rows sorted back into input order (Ray Data keeps the
blocks' order, so a chunk is complete when the next one's rows arrive): byte for byte the local
engine's. ``out_format="parquet"`` has the workers write a directory of Parquet parts instead
(the same rows, in no particular order).

Ray joins the cluster of ``RAY_ADDRESS`` (or one started with ``ray start`` on this machine),
else starts a local one for the run; a cluster this process already joined is used as it is.
The model, and a Parquet ``--out``, must be at a path every node can reach.

Ray and pyarrow (the ``masr[ray]`` extra) are imported inside functions: without them this
module still imports, and ``score_ray`` fails with one line. No torch here either.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

from masr.atomic import atomic_dir
from masr.config import ScoreConfig
from masr.errors import MasrError
from masr.io import one_line
from masr.score import (
    HEADER,
    ExportedModel,
    ScoreSummary,
    _chunk_hint,
    _playlist_chunks,
    _prepare,
    _Prepared,
    _rows_out,
    _two_stage,
    check_paths,
    csv_output,
    fallback_of,
    member_lists,
    plan_batches,
    stdout_bytes,
    unverified_note,
)

NEED_RAY = "--engine ray needs Ray: pip install 'masr[ray]'"
#: blocks per actor in each read chunk: every actor stays busy while the slowest block finishes
BLOCKS_PER_ACTOR = 4


def _import_ray() -> Any:
    """``ray`` with Ray Data, or the one error line naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401  (the ray[data] extra: pyarrow)
    except ImportError:
        raise MasrError(NEED_RAY) from None
    return ray


class Scorer:
    """One Ray actor: the exported model, loaded once, scoring the blocks it is handed."""

    def __init__(
        self,
        model: str,
        device: str,
        candidates: int | None,
        k: int,
        with_order: bool,
    ) -> None:
        # one call at a time on the actor's one CPU (or its GPU); the calls come planned
        self.model = ExportedModel(model, device, workers=1, threads=1)
        if self.model.two_stage:
            self.model.use_candidates(candidates)
        self.k, self.with_order = k, with_order

    def __call__(self, batch: Any) -> Any:
        """A block (``_block``) -> its output rows, call by call as planned, with the
        playlists' ``order`` column when the driver writes the CSV."""
        frame = pl.from_arrow(batch)
        assert isinstance(frame, pl.DataFrame)
        prepared = _Prepared(
            playlist_ids=frame["playlist_id"],
            users=frame["user"].to_numpy().astype(np.int64),
            playlists=frame["playlist"].to_numpy().astype(np.int64),
            members=member_lists(frame["members"]),
        )
        call = frame["call"].to_numpy()
        calls = np.split(np.arange(frame.height), np.flatnonzero(np.diff(call)) + 1)
        songs, scores = self.model.recommend(
            prepared.users, prepared.playlists, prepared.members, self.k, batches=calls
        )
        order = frame["order"].to_numpy() if self.with_order else None
        return _rows_out(prepared, songs, scores, self.model, order).to_arrow()


def _blocks(plan: list[np.ndarray], size: int) -> list[list[np.ndarray]]:
    """Consecutive planned calls grouped into blocks of at least ``size`` playlists (the last
    may hold fewer)."""
    blocks: list[list[np.ndarray]] = []
    held = size  # playlists in the last block (full: the first call opens one)
    for rows in plan:
        if held >= size:
            blocks.append([])
            held = 0
        blocks[-1].append(rows)
        held += len(rows)
    return blocks


def _block(prepared: _Prepared, calls: list[np.ndarray], first: int) -> Any:
    """One block as a pyarrow table, one row per playlist, call after call: the prepared
    playlist, its ``order`` (input position; ``first`` = the chunk's first playlist) and its
    ``call``, named by the order of the call's first playlist (unique even if Ray Data hands
    an actor several blocks at once)."""
    import pyarrow as pa

    rows = np.concatenate(calls)
    members = [prepared.members[r] for r in rows]
    offsets = np.r_[0, np.cumsum([len(m) for m in members])].astype(np.int64)
    return pa.table(
        {
            "playlist_id": prepared.playlist_ids.gather(rows).to_arrow(),
            "user": prepared.users[rows],
            "playlist": prepared.playlists[rows],
            "members": pa.LargeListArray.from_arrays(offsets, np.concatenate(members)),
            "call": np.repeat([first + c[0] for c in calls], [len(c) for c in calls]),
            "order": first + rows,
        }
    )


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A MasrError when ``address`` (RAY_ADDRESS: ``host:port`` or ``ray://host:port``) names a
    cluster that does not answer within ``timeout`` seconds. Ray's own joining retries such an
    address for minutes, deaf to Ctrl-C; "", "auto" and "local" are left to Ray."""
    target = address.strip().removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError)
        reason = f"no answer in {timeout:g} s" if timed_out else exc.strerror or str(exc)
        raise MasrError(
            f"--engine ray: no Ray cluster answers at RAY_ADDRESS={address} ({reason}); start "
            "it, correct RAY_ADDRESS, or unset it for a local cluster"
        ) from None


@contextlib.contextmanager
def _cluster(ray: Any) -> Iterator[dict[str, float]]:
    """This process's Ray cluster, else RAY_ADDRESS's or a local one, shut down after; yields
    its resources (``CPU``, ``GPU``)."""
    started = not ray.is_initialized()
    if started:
        check_reachable(os.environ.get("RAY_ADDRESS", ""))
        try:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        except Exception as exc:
            message = f"--engine ray: cannot start or join a Ray cluster ({one_line(exc)})"
            raise MasrError(message) from None
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-run INFO lines
    try:
        yield ray.cluster_resources()
    finally:
        if started:
            ray.shutdown()


def _actors(config: ScoreConfig, resources: dict[str, float]) -> tuple[int, bool]:
    """(actors, on GPU): one per GPU when CUDA is asked for or ``auto`` finds GPUs, else one
    per CPU; ``workers`` picks fewer."""
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    if config.device == "cuda" and not gpus:
        raise MasrError("--device cuda: the Ray cluster has no GPU; use --device cpu")
    on_gpu = gpus > 0 and config.device != "cpu"
    have = gpus if on_gpu else cpus
    if config.workers is not None and config.workers > have:
        raise MasrError(
            f"--workers {config.workers}: the Ray cluster has {have} {'GPU' if on_gpu else 'CPU'}"
            f"{'s' if have != 1 else ''}, one per actor"
        )
    return config.workers or max(1, have), on_gpu


def _raised_by_masr(exc: BaseException) -> MasrError | None:
    """The MasrError an actor raised (the model missing on a node, CUDA unusable there), read
    from the traceback text Ray hands back (it keeps the text, not always the exception);
    None when the failure is Ray's own."""
    texts = []
    current: BaseException | None = exc
    while current is not None and len(texts) < 10:
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    found = re.findall(r"masr\.errors\.MasrError: ([^\n]+)", "\n".join(texts))
    return MasrError(found[-1].strip()) if found else None


def score_ray(
    input: str | Path,
    model: str | Path,
    out: str | Path | None,
    config: ScoreConfig,
    say: Callable[[str], None],
) -> ScoreSummary:
    """``score_file`` with ``config.engine == "ray"`` (validated there): CSV to ``out`` or stdout
    as the local engine writes it, or Parquet parts in the directory ``out``."""
    started = time.perf_counter()
    ray = _import_ray()
    input, model = Path(input), Path(model)
    lf = check_paths(input, out, config, model)  # --out may not name the model's files
    # the driver's copy maps ids and checks the export; the actors load their own to score
    driver = ExportedModel(model, "cpu", workers=1, threads=1)
    summary = ScoreSummary(fallback=fallback_of(driver.metadata))
    # the first pass over the input (_first_pass: a row without a playlist id, a file that
    # cannot be read to its end) is one error line, before the driver's lines and before a
    # cluster is started or joined
    chunks = _playlist_chunks(lf, input, config.read_rows, summary)
    if not driver.verified:
        say(unverified_note(driver.path))
    _two_stage(driver, config, model, say)
    k = min(config.k, driver.n_songs)
    csv = config.out_format == "csv"
    with _cluster(ray) as resources:
        actors, on_gpu = _actors(config, resources)
        summary.provider, summary.actors = "cuda" if on_gpu else "cpu", actors
        per_call = config.batch_size or (512 if on_gpu else 16)  # the local engine's
        blocks, ends = [], []  # object refs; the order after each read chunk's last playlist
        for frame in chunks:
            prepared = _prepare(frame, driver, summary)
            lengths = np.array([len(m) for m in prepared.members], dtype=np.int64)
            # fewer than K rows exactly where fewer than K non-members are left: the graph
            # excludes members, and a two-stage export proposes N >= K songs (_two_stage)
            summary.short_playlists += int((driver.n_songs - lengths < config.k).sum())
            plan = plan_batches(prepared.users, lengths, per_call, max_cells=driver.max_cells)
            size = math.ceil(len(lengths) / (BLOCKS_PER_ACTOR * actors))
            first = ends[-1] if ends else 0
            for calls in _blocks(plan, size):
                blocks.append(ray.put(_block(prepared, calls, first)))
            ends.append(first + len(lengths))
        say(
            f"Ray Data: {len(blocks)} block(s) of playlists over {actors} "
            f"{'GPU' if on_gpu else 'CPU'} actor(s), each with its own ONNX Runtime session of "
            f"{driver.metadata.get('model')} ({driver.n_songs:,} songs), batches of {per_call}"
        )
        if on_gpu:
            _chunk_hint(driver, say)
        scorer = {
            "model": str(model.resolve()),
            "device": "cuda" if on_gpu else "cpu",
            "candidates": config.candidates,
            "k": k,
            "with_order": csv,
        }
        try:
            with _order_kept(ray, csv):
                dataset = ray.data.from_arrow_refs(blocks).map_batches(
                    Scorer,
                    fn_constructor_kwargs=scorer,
                    batch_size=None,  # whole blocks: the calls as planned
                    batch_format="pyarrow",
                    compute=ray.data.ActorPoolStrategy(size=actors),
                    num_cpus=1,
                    num_gpus=1 if on_gpu else 0,
                )
                if not csv:
                    with atomic_dir(out) as tmp:  # type: ignore[arg-type]  # checked: a dir
                        dataset.write_parquet(str(tmp))
                elif out is None:
                    _write_csv(dataset, stdout_bytes(), ends)
                else:
                    with csv_output(out, say) as fh:
                        _write_csv(dataset, fh, ends)
        except MasrError:
            raise
        except Exception as exc:  # Ray wraps what the actors raised
            raise _raised_by_masr(exc) or MasrError(f"--engine ray: {one_line(exc)}") from None
    summary.seconds = time.perf_counter() - started
    return summary


@contextlib.contextmanager
def _order_kept(ray: Any, keep: bool) -> Iterator[None]:
    """Ray Data yields the blocks in input order inside (``preserve_order``) when ``keep``."""
    options = ray.data.DataContext.get_current().execution_options
    before = options.preserve_order
    options.preserve_order = keep or before
    try:
        yield
    finally:
        options.preserve_order = before


def _write_csv(dataset: Any, fh: IO[bytes], ends: list[int]) -> None:
    """The local engine's CSV: the header, then each read chunk's rows in input order, written
    once the next chunk's rows arrive (``ends``: the order after each chunk's last playlist)."""
    fh.write(HEADER)
    pending: list[pl.DataFrame] = []
    current = 0  # the chunk being collected

    def write(rows: list[pl.DataFrame]) -> None:
        if rows:  # stable sort: a playlist's rows stay in rank order
            done = pl.concat(rows).sort("order", maintain_order=True)
            done.drop("order", "chunk").write_csv(fh, include_header=False)
            fh.flush()

    for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
        rows = pl.from_arrow(batch)
        assert isinstance(rows, pl.DataFrame)
        if rows.height == 0:
            continue
        chunk = np.searchsorted(ends, rows["order"].to_numpy(), side="right")
        if chunk.min() < current:  # Ray Data broke preserve_order: refuse a shuffled file
            raise MasrError("--engine ray: Ray Data returned the blocks out of input order")
        rows = rows.with_columns(chunk=chunk)
        if chunk.max() > current:  # the chunks before this block's last one are complete
            current = int(chunk.max())
            write([*pending, rows.filter(pl.col("chunk") < current)])
            pending = [rows.filter(pl.col("chunk") == current)]
        else:
            pending.append(rows)
    write(pending)


__all__ = ["NEED_RAY", "Scorer", "score_ray"]
