"""hit@N and ndcg@N (N = 1..10) under two protocols, for any ``Recommender``.

* ``sampled`` (the paper's protocol, Sec. 5.3): each held-out song against the negatives stored
  with its case (padding ``-1`` ignored).
* ``full``: the held-out song against every catalog song that is not among the playlist's
  training songs.

In both, the rank of the held-out song is the number of competing songs whose distance is
``<=`` its own, so ties count against it (a constant model scores hit@N = 0, not 1). NaN
distances count as +inf. hit@N = [rank < N]; ndcg@N = [rank < N] / log2(rank + 2).

Also here: the comparison table in the layout of the paper's Table 2 (``comparison_rows``) and
the hit@N plot (``plot_hit_curves``, needs matplotlib).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from masr.errors import MasrError

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from masr.dataset import Cases, PreparedData
    from masr.models.base import Recommender
    from masr.sampling import TrainingIndex

CUTOFFS = tuple(range(1, 11))
PROTOCOLS = ("sampled", "full")
SPLITS = ("test", "valid")
#: a batch holds at most this many (row, candidate, member) triples (bounds evaluation memory)
_BUDGET = 1 << 22


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


def _by_length(model: Recommender, cases: Cases, index: TrainingIndex) -> np.ndarray:
    """Case order for batching: by playlist length for member-reading models (a batch pads its
    member lists to its longest playlist, so similar lengths waste less), else as stored."""
    if not model.uses_members:
        return np.arange(len(cases))
    indptr = index.indptr.cpu().numpy()
    lengths = indptr[cases.playlist + 1] - indptr[cases.playlist]
    return np.argsort(lengths, kind="stable")


def _unsort(parts: list, order: np.ndarray) -> np.ndarray:
    """Ranks computed in ``order`` put back in case order."""
    ranks = np.zeros(len(order), dtype=np.int64)
    if parts:
        import torch

        ranks[order] = torch.cat(parts).numpy()
    return ranks


def sampled_ranks(
    model: Recommender, cases: Cases, index: TrainingIndex, batch_size: int | None = None
) -> np.ndarray:
    """(C,) rank of each held-out song among its stored negatives (ties against it)."""
    import torch

    from masr.sampling import context_batch

    device = index.device
    n_cases, k = cases.negatives.shape[0], cases.negatives.shape[1]
    width = 1 + k
    if batch_size is None:
        members = min(index.max_length, 10_000) if model.uses_members else 1
        batch_size = max(1, min(4096, _BUDGET // (width * members)))
    order = _by_length(model, cases, index)
    playlists_all = torch.as_tensor(cases.playlist[order], dtype=torch.long)
    songs_all = torch.as_tensor(cases.song[order], dtype=torch.long)
    negs_all = torch.as_tensor(cases.negatives[order], dtype=torch.long)
    out = []
    with torch.no_grad():
        for start in range(0, n_cases, batch_size):
            sl = slice(start, start + batch_size)
            playlists = playlists_all[sl].to(device)  # (B,)
            negs = negs_all[sl].to(device)  # (B, K), -1 = padding
            valid = negs >= 0  # (B, K)
            cand = torch.cat([songs_all[sl].to(device).unsqueeze(1), negs.clamp(min=0)], 1)
            batch = context_batch(index, playlists, uses_members=model.uses_members)
            d = _clean(model.distance(batch, cand))  # (B, 1+K)
            rank = ((d[:, 1:] <= d[:, :1]) & valid).sum(1)  # (B,)
            out.append(rank.cpu())
    return _unsort(out, order)


def full_ranks(
    model: Recommender, cases: Cases, index: TrainingIndex, batch_size: int | None = None
) -> np.ndarray:
    """(C,) rank of each held-out song among all catalog songs outside the playlist's training
    songs (ties against it), from ``model.full_distance``."""
    import torch

    from masr.sampling import context_batch

    device = index.device
    v = index.n_songs
    if batch_size is None:
        batch_size = max(1, min(1024, (_BUDGET * 4) // v))
    order = _by_length(model, cases, index)
    playlists_all = torch.as_tensor(cases.playlist[order], dtype=torch.long)
    songs_all = torch.as_tensor(cases.song[order], dtype=torch.long)
    out = []
    with torch.no_grad():
        for start in range(0, len(cases), batch_size):
            playlists = playlists_all[start : start + batch_size].to(device)  # (B,)
            target = songs_all[start : start + batch_size].to(device).unsqueeze(1)  # (B, 1)
            b = playlists.shape[0]
            batch = context_batch(index, playlists, uses_members=model.uses_members)
            d = _clean(model.full_distance(batch))  # (B, V)
            excluded = torch.zeros((b, v), dtype=torch.bool, device=device)  # (B, V)
            lengths = index.lengths(playlists)  # (B,)
            row = torch.repeat_interleave(torch.arange(b, device=device), lengths)  # (T,)
            first = torch.repeat_interleave(index.indptr[playlists], lengths)  # (T,)
            offset = torch.arange(row.shape[0], device=device) - torch.repeat_interleave(
                torch.cumsum(lengths, 0) - lengths, lengths
            )
            excluded[row, index.song[first + offset]] = True  # the playlist's training songs
            excluded.scatter_(1, target, True)  # the held-out song does not compete with itself
            d_target = d.gather(1, target)  # (B, 1)
            rank = ((d <= d_target) & ~excluded).sum(1)  # (B,)
            out.append(rank.cpu())
    return _unsort(out, order)


def evaluate_model(
    model: Recommender,
    data: PreparedData,
    split: str = "test",
    *,
    device: torch.device | str | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    index: TrainingIndex | None = None,
    full_sample: int = 0,
    sample_seed: int = 0,
) -> dict[str, dict[str, float]]:
    """``{"sampled": {hit@1.., ndcg@1..}, "full": {...}}`` for ``split`` ("test" or "valid").

    ``full_sample`` > 0 ranks only that many cases, drawn without replacement with
    ``sample_seed``, under the full protocol (for large catalogs); the sampled protocol always
    uses every case."""
    import torch

    from masr.sampling import TrainingIndex

    if split not in SPLITS:
        raise MasrError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown:
        raise ValueError(f"unknown protocol(s) {sorted(unknown)}")
    if index is None:
        dev = torch.device(device) if device is not None else next(_devices(model), "cpu")
        index = TrainingIndex.from_data(data, dev)
    cases = data.test if split == "test" else data.valid
    was_training = model.training
    model.to(index.device).eval()
    try:
        result = {}
        if "sampled" in protocols:
            result["sampled"] = metrics_from_ranks(sampled_ranks(model, cases, index))
        if "full" in protocols:
            full_cases = subsample_cases(cases, full_sample, sample_seed)
            result["full"] = metrics_from_ranks(full_ranks(model, full_cases, index))
    finally:
        model.train(was_training)
    return result


def subsample_cases(cases: Cases, n: int, seed: int = 0) -> Cases:
    """``n`` of ``cases`` drawn without replacement with ``seed`` (kept in case order); all of
    them when ``n`` is 0 or at least their number. The same draw for every model."""
    from masr.dataset import Cases

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


# --- the comparison table (paper's Table 2 layout) -------------------------------------------

#: the paper's baselines (a)-(h) in its order, then the other baselines masr ships
PAPER_BASELINES = (
    ("mfbpr", "MF-BPR"),
    ("cml", "CML"),
    ("neumf", "NeuMF++"),
    ("fism", "FISM"),
    ("cmn", "CMN++"),
    ("prme", "PRME"),
    ("transrec", "TransRec"),
    ("caser", "Caser"),
)
#: the paper's baselines masr does not implement yet: listed as "not yet run" (none left)
NOT_YET_RUN: tuple[str, ...] = ()
EXTRA_BASELINES = (
    ("pop", "Popularity"),
    ("itemknn", "item-kNN"),
    ("ease", "EASE"),
    ("als", "ALS"),
)
OURS = (
    ("mdr", "MDR"),
    ("mass", "MASS"),
    ("masr", "MASR"),
    ("amdr", "AMDR"),
    ("amass", "AMASS"),
    ("amasr", "AMASR"),
)
IMPROVED = ("masr", "amasr")
#: the table's four columns: (protocol, metric)
COLUMNS = (("sampled", "hit@10"), ("sampled", "ndcg@10"), ("full", "hit@10"), ("full", "ndcg@10"))


@dataclass
class TableRow:
    """One line of the comparison table. ``values`` is None for a model not yet run."""

    group: str  # "baseline", "ours" or "improvement"
    run: str  # run name ("" for rows without one)
    label: str  # what the paper calls it
    values: list[float | None] | None  # one per COLUMNS entry
    note: str = ""


def run_order(names: Sequence[str]) -> list[str]:
    """Run names in table order: paper baselines, other baselines, unknown names, ours."""
    known = [n for n, _ in PAPER_BASELINES + EXTRA_BASELINES]
    ours = [n for n, _ in OURS]
    rank = {n: i for i, n in enumerate(known)}
    first = sorted((n for n in names if n in rank), key=rank.__getitem__)
    middle = sorted(n for n in names if n not in rank and n not in ours)
    last = [n for n in ours if n in names]
    return first + middle + last


def comparison_rows(results: dict[str, dict[str, dict[str, float]]]) -> list[TableRow]:
    """The rows of the paper's Table 2 for ``results`` ({run: {protocol: metrics}}): baselines
    (the unimplemented paper baselines as "not yet run"), our models, then the relative
    improvement (%) of MASR and AMASR over the best baseline in each column."""
    labels = dict(PAPER_BASELINES + EXTRA_BASELINES + OURS)
    ours = {n for n, _ in OURS}

    def values(run: str) -> list[float | None]:
        res = results[run]
        return [res.get(p, {}).get(m) for p, m in COLUMNS]

    rows: list[TableRow] = []
    for run in run_order([*results, *NOT_YET_RUN]):
        if run in ours:
            continue
        if run in results:
            rows.append(TableRow("baseline", run, labels.get(run, run), values(run)))
        else:
            rows.append(TableRow("baseline", run, labels[run], None, "not yet run"))
    for run, label in OURS:
        if run in results:
            rows.append(TableRow("ours", run, label, values(run)))
    baselines = [r for r in rows if r.group == "baseline" and r.values is not None]
    if baselines:
        best: list[float | None] = []
        for col in range(len(COLUMNS)):
            present = [r.values[col] for r in baselines if r.values[col] is not None]  # type: ignore[index]
            best.append(max(present) if present else None)
        for run in IMPROVED:
            if run not in results:
                continue
            mine = values(run)
            imp = [
                100.0 * (m - b) / b if m is not None and b is not None and b > 0 else None
                for m, b in zip(mine, best, strict=True)
            ]
            rows.append(TableRow("improvement", run, labels[run], imp, "vs best baseline"))
    return rows


def plot_hit_curves(
    results: dict[str, dict[str, dict[str, float]]], path: str | Path, *, title: str = ""
) -> Path:
    """A PNG of hit@N against N (1..10), one line per run, one panel per protocol."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MasrError(
            "--plot needs matplotlib; install it with `pip install 'masr[plot]'`"
        ) from None
    from masr.atomic import atomic_path

    path = Path(path)
    protocols = [p for p in PROTOCOLS if any(p in r for r in results.values())]
    fig, axes = plt.subplots(1, max(1, len(protocols)), figsize=(5 * max(1, len(protocols)), 4))
    axes = np.atleast_1d(axes)
    for ax, protocol in zip(axes, protocols, strict=False):
        for run in run_order(list(results)):
            metrics = results[run].get(protocol)
            if metrics:
                ax.plot(CUTOFFS, [metrics[f"hit@{n}"] for n in CUTOFFS], marker="o", label=run)
        ax.set_title(f"{protocol} ranking" + (f" ({title})" if title else ""))
        ax.set_xlabel("N")
        ax.set_ylabel("hit@N")
        ax.set_xticks(CUTOFFS)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120)
    except OSError as exc:
        raise MasrError(f"--plot {path}: cannot write ({exc.strerror})") from None
    finally:
        plt.close(fig)
    return path


def to_jsonable(results: dict[str, Any]) -> dict[str, Any]:
    """Round floats for the JSON output (6 decimals keeps every reported digit)."""
    return {
        run: {p: {k: round(float(v), 6) for k, v in m.items()} for p, m in res.items()}
        for run, res in results.items()
    }
