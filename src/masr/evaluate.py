"""hit@N and ndcg@N (N = 1..10) under two protocols, for any ``Recommender``.

* ``sampled`` (the paper's protocol, Sec. 5.3): each held-out song against the negatives stored
  with its case (padding ``-1`` ignored).
* ``full``: the held-out song against every catalog song that is not among the playlist's
  training songs (the playlist's other held-out song competes: the model never saw it).

In both, the rank of the held-out song is the number of competing songs whose distance is
``<=`` its own, so ties count against it (a constant model scores hit@N = 0, not 1). NaN
distances rank after everything, +inf included; ±inf rank as the float range's ends, so +inf
ties with the largest float (``_clean``). hit@N = [rank < N]; ndcg@N = [rank < N] / log2(rank + 2).

The comparison table, the plot and the JSON of ``masr evaluate`` are ``masr.report``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from masr.config import PROTOCOLS, SPLITS, check_int
from masr.errors import MasrError, check_instance
from masr.system import poll_threads

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from masr.dataset import Cases, PreparedData
    from masr.models.base import Batch, Recommender
    from masr.sampling import TrainingIndex

CUTOFFS = tuple(range(1, 11))
#: a batch holds at most this many (row, candidate, member) triples (bounds evaluation memory)
_BUDGET = 1 << 22
#: member-reading models on a CPU: at most this many cases per batch. Cases are batched in order
#: of playlist length and a batch pads to its longest list, so smaller batches pad less (MASS,
#: embedded data, 2,000 validation cases, one core: full ranking 10.5 -> 5.7 s and the sampled
#: protocol 1.6 -> 1.0 s against batches of 1,024 and 830; docs/training.md). Not applied on a
#: GPU, where more, smaller batches mean more kernel launches (not measured there)
_MEMBER_BATCH = 256
#: ... and in full ranking, at most this many (case, catalog song) pairs a batch, but never
#: fewer than ``_MEMBER_FULL_MIN`` cases: on a large catalog a batch's (cases, songs, members)
#: blocks then stay in the CPU's caches. Measured (MASS, one core, eager; 2026-11-29,
#: twenty-second session; docs/training.md "Evaluation"): 1,000 AOTM validation cases (64,077
#: songs) 21.8 s at 256 cases a batch, 16.8 s at 32, 12.6 s at 16, 13.4 s at 8; 500 cases of a
#: 107,589-song catalog 47.9 s at 156, 27.2 s at 32, 17.5-18.1 s at 8-16. On the embedded data
#: (2,473 songs: 256 cases a batch either way) 16 cases a batch made the README's job's
#: validation slower (49 -> 61-68 s in all, 2 threads)
_MEMBER_FULL_PAIRS = 1 << 20
_MEMBER_FULL_MIN = 16


def _capped(
    batch_size: int, model: Recommender, index: TrainingIndex, protocol: str = "sampled"
) -> int:
    """``batch_size``, at most ``_MEMBER_BATCH`` for a member-reading model on a CPU, and in
    full ranking (``protocol`` "full") at most ``_MEMBER_FULL_PAIRS`` case-song pairs (never
    fewer than ``_MEMBER_FULL_MIN`` cases)."""
    if model.uses_members and index.device.type == "cpu":
        cap = _MEMBER_BATCH
        if protocol == "full":
            cap = min(cap, max(_MEMBER_FULL_MIN, _MEMBER_FULL_PAIRS // index.n_songs))
        return min(batch_size, cap)
    return batch_size


def metric_names() -> list[str]:
    """``hit@1 .. hit@10, ndcg@1 .. ndcg@10``, the key order of every metrics dict."""
    return [f"hit@{n}" for n in CUTOFFS] + [f"ndcg@{n}" for n in CUTOFFS]


def metrics_from_ranks(ranks: np.ndarray) -> dict[str, float]:
    """hit@N and ndcg@N for N = 1..10 from 0-based ranks (C,); zeros when there are no cases."""
    ranks = np.asarray(ranks, dtype=np.int64)
    out: dict[str, float] = {}
    if ranks.size == 0:
        return dict.fromkeys(metric_names(), 0.0)
    gain = 1.0 / np.log2(ranks + 2.0)  # (C,)
    for n in CUTOFFS:
        out[f"hit@{n}"] = float(np.mean(ranks < n))
    for n in CUTOFFS:
        out[f"ndcg@{n}"] = float(np.mean(np.where(ranks < n, gain, 0.0)))
    return out


def better(a: dict[str, float], b: dict[str, float]) -> bool:
    """Model selection order: higher hit@10, then higher ndcg@10."""
    return (a["hit@10"], a["ndcg@10"]) > (b["hit@10"], b["ndcg@10"])


def _clean(d: Tensor) -> Tensor:
    import torch

    return torch.nan_to_num(d, nan=math.inf)


def _count_at_or_below(d: Tensor, t: Tensor) -> Tensor:
    """(B,) int64: how many of each row's ``d`` (B, V) are <= its target ``t`` (B, 1, already
    through ``_clean``) in ``_clean``'s order (NaN after +inf, ±inf at the float range's ends),
    without a cleaning pass over ``d``. A NaN target (+inf once cleaned) has every entry at or
    below it; a target at the top of the range (+inf or the largest float, both the largest
    float once cleaned) every entry but the NaN ones, which is what comparing the raw ``d``
    with +inf counts; for any other target the raw comparison already agrees (a NaN entry
    compares False, as the +inf it stands for would). The comparison is written into float32
    and summed there, about twice as fast on a CPU as summing a bool tensor (exact below 2**24
    entries a row)."""
    import torch

    top = t >= torch.finfo(t.dtype).max  # NaN (now +inf) or +inf / the largest float
    t_cmp = torch.where(top, math.inf, t)
    if d.shape[1] < 2**24:
        out = torch.empty(d.shape, dtype=torch.float32, device=d.device)
        n = torch.le(d, t_cmp, out=out).sum(1).long()  # (B,)
    else:
        n = (d <= t_cmp).sum(1)
    return torch.where(torch.isposinf(t[:, 0]), d.shape[1], n)


def _by_length(model: Recommender, cases: Cases, index: TrainingIndex) -> np.ndarray:
    """Case order for batching: by playlist length for member-reading models (a batch pads its
    member lists to its longest playlist, so similar lengths waste less), else as stored."""
    if not model.uses_members:
        return np.arange(len(cases))
    return np.argsort(_case_lengths(cases, index), kind="stable")


def _case_lengths(cases: Cases, index: TrainingIndex) -> np.ndarray:
    """(C,) training songs of each case's playlist."""
    indptr = index.indptr.cpu().numpy()
    return indptr[cases.playlist + 1] - indptr[cases.playlist]


def sampled_batch_size(model: Recommender, cases: Cases, index: TrainingIndex) -> int:
    """Cases per batch of ``sampled_ranks`` when it is not given one."""
    members = min(index.max_length, 10_000) if model.uses_members else 1
    batch_size = max(1, min(4096, _BUDGET // ((1 + cases.negatives.shape[1]) * members)))
    return _capped(batch_size, model, index)


def full_batch_size(model: Recommender, index: TrainingIndex) -> int:
    """Cases per batch of ``full_ranks`` when it is not given one."""
    return _capped(max(1, min(1024, (_BUDGET * 4) // index.n_songs)), model, index, "full")


def padded_slots(cases: Cases, index: TrainingIndex, batch_size: int) -> int:
    """The member slots a member-reading model's ranking fills for ``cases`` in batches of
    ``batch_size`` (in order of playlist length, each batch padded to its longest playlist):
    what its time grows with (``masr.train.estimate_validation``)."""
    lengths = np.sort(np.maximum(_case_lengths(cases, index), 1))
    if not len(lengths):
        return 0
    starts = np.arange(0, len(lengths), batch_size)
    longest = np.maximum.reduceat(lengths, starts)  # each batch's last = longest
    return int((longest * np.diff(starts, append=len(lengths))).sum())


def _batches(
    order: np.ndarray, cases: Cases, index: TrainingIndex, batch_size: int
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """The cases in ``order``, ``batch_size`` at a time: (slice of ``order``, (B,) playlists,
    (B, 1) held-out songs), on the index's device."""
    import torch

    playlists_all = torch.as_tensor(cases.playlist[order], dtype=torch.long)
    songs_all = torch.as_tensor(cases.song[order], dtype=torch.long)
    for start in range(0, len(order), batch_size):
        poll_threads()  # --threads 0: leave cores that other work has taken since
        sl = slice(start, start + batch_size)
        yield sl, playlists_all[sl].to(index.device), songs_all[sl].to(index.device).unsqueeze(1)


def _unsort(parts: list, order: np.ndarray) -> np.ndarray:
    """Ranks computed in ``order`` put back in case order."""
    ranks = np.zeros(len(order), dtype=np.int64)
    if parts:
        import torch

        ranks[order] = torch.cat(parts).numpy()
    return ranks


class OnTop(Protocol):
    """Distances derived from another model's (``evaluate_model``'s ``on_top``): a fusion of a
    MASS run with its MDR part, scored from that run's distances instead of computing them
    again (``MASR.fuse``)."""

    def distance(self, batch: Batch, songs: Tensor, base: Tensor) -> Tensor: ...

    def full_distance(self, batch: Batch, base: Tensor) -> Tensor: ...


def sampled_ranks(
    model: Recommender, cases: Cases, index: TrainingIndex, batch_size: int | None = None
) -> np.ndarray:
    """(C,) rank of each held-out song among its stored negatives (ties against it)."""
    return _sampled_ranks_many(model, cases, index, batch_size, {})[""]


def _sampled_ranks_many(
    model: Recommender,
    cases: Cases,
    index: TrainingIndex,
    batch_size: int | None,
    on_top: dict[str, OnTop],
) -> dict[str, np.ndarray]:
    """``sampled_ranks`` of ``model`` (key "") and of each ``on_top`` entry, from one pass:
    the same batches, ``model``'s distances computed once."""
    import torch

    from masr.sampling import context_batch

    device = index.device
    if batch_size is None:
        batch_size = sampled_batch_size(model, cases, index)
    order = _by_length(model, cases, index)
    negs_all = torch.as_tensor(cases.negatives[order], dtype=torch.long)
    out: dict[str, list] = {name: [] for name in ("", *on_top)}
    with torch.no_grad():
        for sl, playlists, target in _batches(order, cases, index, batch_size):
            negs = negs_all[sl].to(device)  # (B, K), -1 = padding
            valid = negs >= 0  # (B, K)
            cand = torch.cat([target, negs.clamp(min=0)], 1)  # (B, 1+K)
            batch = context_batch(index, playlists, uses_members=model.uses_members)
            base = model.distance(batch, cand)  # (B, 1+K)
            for name in out:
                d = base if not name else on_top[name].distance(batch, cand, base)
                d = _clean(d)
                out[name].append(((d[:, 1:] <= d[:, :1]) & valid).sum(1).cpu())  # (B,) ranks
    return {name: _unsort(parts, order) for name, parts in out.items()}


def full_ranks(
    model: Recommender, cases: Cases, index: TrainingIndex, batch_size: int | None = None
) -> np.ndarray:
    """(C,) rank of each held-out song among all catalog songs outside the playlist's training
    songs (ties against it), from ``model.full_distance``."""
    return _full_ranks_many(model, cases, index, batch_size, {})[""]


def _full_ranks_many(
    model: Recommender,
    cases: Cases,
    index: TrainingIndex,
    batch_size: int | None,
    on_top: dict[str, OnTop],
) -> dict[str, np.ndarray]:
    """``full_ranks`` of ``model`` (key "") and of each ``on_top`` entry, from one pass."""
    import torch

    from masr.sampling import context_batch, playlist_members

    if batch_size is None:
        batch_size = full_batch_size(model, index)
    order = _by_length(model, cases, index)
    out: dict[str, list] = {name: [] for name in ("", *on_top)}
    with torch.no_grad():
        for _, playlists, target in _batches(order, cases, index, batch_size):
            batch = context_batch(index, playlists, uses_members=model.uses_members)
            songs, real = playlist_members(index, playlists)  # (B, L)
            real &= songs != target
            base = model.full_distance(batch)  # (B, V); NaN ranks as +inf (_clean's order)
            for name in out:
                d = base if not name else on_top[name].full_distance(batch, base)
                d_target = _clean(d.gather(1, target))  # (B, 1)
                # every song at or below the held-out one, then less the ones that do not
                # compete: the held-out song itself and the playlist's training songs (distinct:
                # TrainingIndex.keys is strictly ascending), counted on their (B, L) list rather
                # than through a (B, V) mask
                rank = _count_at_or_below(d, d_target) - 1  # (B,)
                rank -= ((_clean(d.gather(1, songs)) <= d_target) & real).sum(1)
                out[name].append(rank.cpu())
    return {name: _unsort(parts, order) for name, parts in out.items()}


def two_stage_ranks(
    model: Recommender,
    proposer: Recommender,
    cases: Cases,
    index: TrainingIndex,
    n: int,
    batch_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Full ranking in two stages: ``proposer.full_distance`` (MDR's one GEMM) proposes the
    ``n`` nearest songs outside each playlist's training songs, and ``model.distance`` ranks
    the held-out song among them only, so the exact cost over the catalog becomes a cost over
    ``n`` songs. Returns ((C,) ranks, (C,) bool: the held-out song was proposed); a song not
    proposed ranks past the catalog (a miss at every cutoff). With ``n`` >= the catalog every
    eligible song is proposed and the ranks are :func:`full_ranks`' (ties against the song)."""
    import torch

    from masr.sampling import context_batch

    if n < 1:
        raise MasrError(f"--candidates {n}: must be >= 1")
    v = index.n_songs
    k = min(n, v)
    if batch_size is None:
        members = min(index.max_length, 10_000) if model.uses_members else 1
        batch_size = max(1, min(1024, (_BUDGET * 4) // v, _BUDGET // (k * members)))
    order = _by_length(model, cases, index)
    ranks, hits = [], []
    with torch.no_grad():
        for _, playlists, target in _batches(order, cases, index, batch_size):
            ctx = context_batch(index, playlists, uses_members=proposer.uses_members)
            d = _clean(proposer.full_distance(ctx))  # (B, V)
            excluded = _training_songs(index, playlists, v)  # (B, V)
            d = d.masked_fill(excluded, math.inf)
            cand = torch.topk(d, k, dim=1, largest=False, sorted=False).indices  # (B, k)
            eligible = ~excluded.gather(1, cand)  # fewer than k eligible songs: pad entries
            is_target = (cand == target) & eligible
            proposed = is_target.any(1)  # (B,)
            batch = context_batch(index, playlists, uses_members=model.uses_members)
            dc = _clean(model.distance(batch, cand))  # (B, k)
            dt = _clean(model.distance(batch, target))  # (B, 1)
            rank = ((dc <= dt) & eligible & ~is_target).sum(1)
            ranks.append(torch.where(proposed, rank, torch.full_like(rank, v)).cpu())
            hits.append(proposed.cpu())
    return _unsort(ranks, order), _unsort(hits, order).astype(bool)


def _training_songs(index: TrainingIndex, playlists: Tensor, v: int) -> Tensor:
    """(B, V) bool: the training songs of each playlist of the batch."""
    import torch

    device = index.device
    b = playlists.shape[0]
    mask = torch.zeros((b, v), dtype=torch.bool, device=device)
    lengths = index.lengths(playlists)  # (B,)
    row = torch.repeat_interleave(torch.arange(b, device=device), lengths)  # (T,)
    first = torch.repeat_interleave(index.indptr[playlists], lengths)  # (T,)
    offset = torch.arange(row.shape[0], device=device) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths
    )
    mask[row, index.song[first + offset]] = True
    return mask


def evaluate_model(
    model: Recommender, data: PreparedData, split: str = "test", **options: Any
) -> dict[str, dict[str, float]]:
    """``{"sampled": {hit@1.., ndcg@1..}, "full": {...}}`` for ``split`` ("test" or "valid");
    ``options`` are ``evaluate_model_and``'s keywords (device, protocols, index, full_sample,
    sample_seed, compile)."""
    return evaluate_model_and(model, {}, data, split, **options)[""]


def evaluate_model_and(
    model: Recommender,
    on_top: dict[str, OnTop],
    data: PreparedData,
    split: str = "test",
    *,
    device: torch.device | str | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    index: TrainingIndex | None = None,
    full_sample: int = 0,
    sample_seed: int = 0,
    compile: bool = False,
    ranks_out: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{name: {"sampled": metrics, "full": metrics}}`` of ``model`` (name "") and of every
    ``on_top`` entry (its key), in one pass over the cases: ``model``'s distances are computed
    once per batch and each entry derives its own from them (a MASS run and the fusions holding
    it). The entries must be on ``model``'s device, in eval mode. ``ranks_out``, when given,
    also gets every name's per-case 0-based ranks, ``{name: {protocol: (C,) ranks}}`` (the
    paired comparisons of ``masr.significance`` need them).

    ``full_sample`` > 0 ranks only that many cases, drawn without replacement with
    ``sample_seed``, under the full protocol (for large catalogs); the sampled protocol always
    uses every case. ``compile``: on a CPU, the model's full-ranking scores through
    ``torch.compile`` where it has them (MASS and the fusions; ``masr.compiled``): the same
    ranks up to float rounding. Training's validation leaves it False: the training run has
    already switched them on."""
    import torch

    from masr.dataset import check_prepared
    from masr.models.base import Recommender
    from masr.sampling import TrainingIndex

    check_prepared(data)
    check_instance(model, Recommender, "model",
                   "a trained model, masr.runs.load_run(runs, name, data)[0]")
    if split not in SPLITS:
        raise MasrError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")
    if isinstance(protocols, str):
        protocols = (protocols,)
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown:
        raise MasrError(
            f"--protocol must be among {', '.join(PROTOCOLS)}, not {', '.join(sorted(unknown))}"
        )
    check_int(full_sample, "--full-sample")
    if full_sample < 0:
        raise MasrError(f"--full-sample {full_sample}: must be >= 0 (0 = every case)")
    sizes = {"n_users": data.n_users, "n_playlists": data.n_playlists, "n_songs": data.n_songs}
    if model.sizes() != sizes:
        raise MasrError(
            f"{model.name}: trained on data of another size ({model.sizes()}) than "
            f"{data.path} ({sizes}); evaluate it on the prepared data it was trained on"
        )
    # of the same size but other data (a re-split of the same playlists: its test songs were
    # training songs), told by the fingerprint a model rebuilt from its checkpoint keeps
    trained_on = getattr(model, "data_fingerprint", None)  # any scorer, not only ours
    if trained_on is not None and trained_on != data.fingerprint:
        raise MasrError(
            f"{model.name}: trained on other prepared data (fingerprint {trained_on}, "
            f"{data.path} has {data.fingerprint}); evaluate it on the prepared data it was "
            "trained on"
        )
    if index is None:
        from masr.train import resolve_device

        default = next(_devices(model), torch.device("cpu"))  # where the model's weights are
        dev = default if device is None else resolve_device(device)
        index = TrainingIndex.from_data(data, dev)
    cases = data.test if split == "test" else data.valid
    if len(cases) == 0:  # metrics of no case would read as 0.0: refused instead
        other = "valid" if split == "test" else "test"
        has_other = len(data.valid if split == "test" else data.test) > 0
        raise MasrError(
            f"{data.path}: no {split} cases to rank ({data.no_cases()})"
            + ("" if not data.cases_loaded else f"; --split {other} has some" if has_other
               else "; prepare more playlists")
        )
    from masr.compiled import compile_scores

    was_training = model.training
    home = next(_devices(model), index.device)  # a library caller's model goes back there
    model.to(index.device).eval()
    compiled = compile_scores(model, compile, index.device)
    try:
        result: dict[str, dict[str, dict[str, float]]] = {name: {} for name in ("", *on_top)}
        if "sampled" in protocols:
            for name, ranks in _sampled_ranks_many(model, cases, index, None, on_top).items():
                result[name]["sampled"] = metrics_from_ranks(ranks)
                if ranks_out is not None:
                    ranks_out.setdefault(name, {})["sampled"] = np.asarray(ranks)
        if "full" in protocols:
            full_cases = subsample_cases(cases, full_sample, sample_seed)
            for name, ranks in _full_ranks_many(model, full_cases, index, None, on_top).items():
                result[name]["full"] = metrics_from_ranks(ranks)
                if ranks_out is not None:
                    ranks_out.setdefault(name, {})["full"] = np.asarray(ranks)
    finally:
        model.train(was_training)
        if compiled:
            model.compile_scores(False)
        if home != index.device:
            model.to(home)
    return result


def subsample_cases(cases: Cases, n: int, seed: int = 0) -> Cases:
    """``n`` of ``cases`` drawn without replacement with ``seed`` (kept in case order); all of
    them when ``n`` is 0 or at least their number. The same draw for every model."""
    from masr.dataset import Cases
    from masr.seed import check_seed

    check_seed(seed, "--sample-seed")
    if n <= 0 or n >= len(cases):
        return cases
    pick = np.sort(np.random.default_rng(seed).choice(len(cases), size=n, replace=False))
    return Cases(
        playlist=cases.playlist[pick],
        user=cases.user[pick],
        song=cases.song[pick],
        negatives=cases.negatives[pick],
    )


def _devices(model: Recommender):
    for t in list(model.parameters()) + list(model.buffers()):
        yield t.device
