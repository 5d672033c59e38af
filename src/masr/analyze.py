"""The paper's analyses over trained runs (section 5.5): quality against the embedding size
(Figure 5), attention against PMI (Figure 6) and seconds per epoch (Figure 7).

* ``pmi_attentive_scores``: for a held-out song k of a playlist and each member song t,
  PMI(k, t) = log P(k, t) / (P(k) P(t)) over the training playlists (P(x): the share of
  playlists holding x; P(k, t): holding both), then softmax over the members (the paper's
  "PMI attentive scores"). A member never seen with k has PMI -inf (weight 0); a case whose
  members never co-occur with k has no distribution and is skipped.
* ``attention_correlation``: Pearson's ρ between those scores and the attention weights α
  (eq. 18) that a MASS model gives the same members for the same held-out song. Both sides
  sum to 1 over a case's members, so each has the mean 1/|members| within its case, and the
  pooled ρ (the paper's) rewards weights that merely follow the member count: equal weights
  (attention "none") score well on it. ``pearson_within`` is ρ of the deviations from that
  mean (the pooled within-case correlation): whether a model weights *the same members* as
  PMI does; it is undefined (None) for equal weights.
* ``quality_by_dim``: each run's test metrics keyed by its embedding size d, over runs
  directories trained at different ``--dim``; ``embedding_size`` reads d from a run.json.
* ``epoch_seconds``: mean training seconds per epoch of runs, read from their run.json.

Torch is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from masr.config import as_list, check_int
from masr.errors import MasrError

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.models.base import Recommender


@dataclass
class AttentionPairs:
    """Per real member slot of the analysed cases: its PMI attentive score and its weight."""

    label: str
    run: str
    pmi: np.ndarray  # (M,) softmax over each case's members of PMI(k, t)
    weight: np.ndarray  # (M,) the model's α_t for the held-out song k
    cases: int
    case: np.ndarray  # (M,) the case (0 .. cases - 1) each member slot belongs to

    @property
    def pearson(self) -> float:
        """Pearson's ρ over all member slots (the paper's Figure 6)."""
        return _pearson(self.pmi, self.weight)

    @property
    def pearson_within(self) -> float:
        """ρ of each side's deviation from its case's mean (1/|members| for both)."""
        return _pearson(_centred(self.pmi, self.case), _centred(self.weight, self.case))

    @cached_property
    def _case_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """(first slot, slot count) of every case (``case`` is sorted), found once."""
        starts = np.searchsorted(self.case, np.arange(self.cases))
        return starts, np.searchsorted(self.case, np.arange(self.cases), side="right") - starts

    def resampled(self, rng: np.random.Generator) -> AttentionPairs:
        """The same number of cases drawn with replacement, each with all its member slots."""
        starts, sizes = self._case_slots
        pick = rng.integers(0, self.cases, self.cases)
        lengths = sizes[pick]
        # slot index = the picked case's start + the offset within it
        offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        idx = np.repeat(starts[pick], lengths) + offset
        case = np.repeat(np.arange(self.cases), lengths)
        return AttentionPairs(self.label, self.run, self.pmi[idx], self.weight[idx], self.cases,
                              case)

    def standard_errors(self, resamples: int, seed: int = 0) -> tuple[float, float]:
        """Bootstrap standard errors of (pearson, pearson_within) over cases (a case's member
        slots are not independent, so cases are resampled whole); NaN without resamples, or
        with fewer than two cases (every resample would be the one case: no spread to see)."""
        if resamples < 2 or self.cases < 2:
            return float("nan"), float("nan")
        rng = np.random.default_rng(seed)
        draws = np.array([(q.pearson, q.pearson_within)
                          for q in (self.resampled(rng) for _ in range(resamples))])
        with np.errstate(invalid="ignore"):
            return tuple(  # type: ignore[return-value]
                float(np.nanstd(col, ddof=1)) if np.isfinite(col).sum() > 1 else float("nan")
                for col in draws.T
            )

    def summary(self, resamples: int = 0, seed: int = 0) -> dict[str, Any]:
        """The JSON row; with ``resamples``, bootstrap standard errors beside both ρ."""
        row: dict[str, Any] = {
            "run": self.run,
            # None where ρ is undefined (a constant side, e.g. attention "none" on equal lengths)
            "pearson": _rounded(self.pearson),
            "pearson_within": _rounded(self.pearson_within),
            "pairs": int(len(self.pmi)),
            "cases": self.cases,
        }
        if resamples:
            se, se_within = self.standard_errors(resamples, seed)
            row.update(pearson_se=_rounded(se), pearson_within_se=_rounded(se_within),
                       resamples=resamples)
        return row


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """ρ of two sides of weights in [0, 1]; NaN where undefined: fewer than two values, or a
    side constant up to float32 rounding (equal weights 1/L minus their case's mean)."""
    if len(x) < 2:
        return float("nan")
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    sx, sy = np.sqrt((x * x).mean()), np.sqrt((y * y).mean())
    if sx <= 1e-6 or sy <= 1e-6:
        return float("nan")
    return float((x * y).mean() / (sx * sy))


def _centred(values: np.ndarray, case: np.ndarray) -> np.ndarray:
    """Each value (as float64) minus the mean of its case."""
    values = values.astype(np.float64)
    sums = np.bincount(case, weights=values)
    counts = np.bincount(case)
    return values - (sums / np.maximum(counts, 1))[case]


def _rounded(value: float) -> float | None:
    return None if np.isnan(value) else round(value, 6)


def rho_text(row: dict[str, Any], key: str, undefined: str = "—") -> str:
    """A JSON row's ρ (``key``: "pearson", "pearson_within") as "0.1234 ± 0.0200" (with its
    bootstrap standard error when the row has one), ``undefined`` where it has none."""
    if row.get(key) is None:
        return undefined
    se = row.get(f"{key}_se")
    return f"{row[key]:.4f}" + ("" if se is None else f" ± {se:.4f}")


def song_playlists(data: PreparedData) -> list[np.ndarray]:
    """For each catalog song, the sorted training playlists that hold it."""
    order = np.argsort(data.train_song, kind="stable")
    songs, playlists = data.train_song[order], data.train_playlist[order]
    bounds = np.searchsorted(songs, np.arange(data.n_songs + 1))
    return [np.unique(playlists[bounds[s] : bounds[s + 1]]) for s in range(data.n_songs)]


def _check_cases(split: str, max_cases: int) -> None:
    """The split and the case count of the attention analysis, each in one line."""
    from masr.config import SPLITS

    if split not in SPLITS:
        raise MasrError(f"--split must be one of {', '.join(SPLITS)}, not {split!r}")
    check_int(max_cases, "--cases")
    if max_cases < 0:
        raise MasrError(f"--cases {max_cases}: must be >= 0 (0 = every case)")


def pmi_attentive_scores(
    data: PreparedData, split: str = "test", max_cases: int = 500, seed: int = 0
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """(case indices, members per case, PMI attentive scores per case) for up to ``max_cases``
    cases of ``split`` drawn with ``seed`` (0 = every case); see the module docstring."""
    _check_cases(split, max_cases)
    cases = data.test if split == "test" else data.valid
    holders = song_playlists(data)
    n_playlists = float(data.n_playlists)
    pick = np.arange(len(cases))
    if max_cases and len(pick) > max_cases:
        pick = np.sort(np.random.default_rng(seed).choice(pick, max_cases, replace=False))
    kept, members_of, scores_of = [], [], []
    for i in pick:
        p, k = int(cases.playlist[i]), int(cases.song[i])
        if k >= data.n_songs:
            continue
        members = data.train_song[data.indptr[p] : data.indptr[p + 1]]
        if len(members) == 0:
            continue
        with_k = holders[k]
        both = np.array([np.intersect1d(with_k, holders[t]).size for t in members], float)
        if not both.any():
            continue
        single = np.array([holders[t].size for t in members], float)
        # PMI(k, t) = log P(k, t) / (P(k) P(t)), P(x) = playlists holding x / all playlists
        with np.errstate(divide="ignore"):
            pmi = np.log(both * n_playlists / (with_k.size * single))
        top = pmi[np.isfinite(pmi)].max()
        expo = np.where(np.isfinite(pmi), np.exp(pmi - top), 0.0)
        kept.append(int(i))
        members_of.append(members)
        scores_of.append(expo / expo.sum())  # softmax over the members
    return np.asarray(kept, dtype=np.int64), members_of, scores_of


def mass_part(model: Recommender) -> Any:
    """The MASS model inside a run: MASS itself, or the MASS part of a fusion."""
    if model.name == "mass":
        return model
    if model.name == "masr":
        return model.parts()[1]  # type: ignore[attr-defined]
    raise MasrError(f"{model.name} has no attention: analyse a mass, amass or fusion run")


def attention_label(model: Recommender) -> str:
    """"mem-metric", "nonmem-dot" ... and the context when it is not the user's."""
    cfg = mass_part(model).config
    return cfg.attention + ("" if cfg.context == "user" else f" ({cfg.context})")


def attention_correlation(
    data: PreparedData,
    run_dirs: Sequence[str | Path],
    *,
    split: str = "test",
    max_cases: int = 500,
    seed: int = 0,
    device: str = "cpu",
    log: Any = None,
) -> list[AttentionPairs]:
    """Figure 6: for each run directory (``runs/<run>``, a MASS run or a fusion), the PMI
    attentive scores and the model's attention weights of the same member slots. A run given
    twice (the same folder) is analysed once; a run whose run.json is unreadable or not what
    ``masr train`` writes is left out, and an unfinished one analysed, each with a line to
    ``log`` (``masr.runs.store.run_warnings``). Every run is checked before the work."""
    import torch

    from masr.models.base import Batch
    from masr.runs.store import load_run

    _check_cases(split, max_cases)
    run_dirs = as_list(run_dirs, (str, Path))  # one run, not its path's letters
    say = log or (lambda _msg: None)
    models: list[tuple[Path, Recommender]] = []
    seen: set[Path] = set()
    for run_dir in map(Path, run_dirs):
        if run_dir.resolve() in seen:
            continue
        seen.add(run_dir.resolve())
        path = run_dir / "best.pt"
        if not path.is_file():
            raise MasrError(f"--runs {run_dir}: no best.pt (give run directories, runs/<run>)")
        _info, problem = run_info(run_dir)
        if problem is not None:
            say(problem)
            continue
        # its warnings said, its prepared data checked
        model, _ = load_run(run_dir.parent, run_dir.name, data, device, warn=say)
        mass_part(model)  # a model without attention: one error line before the work
        models.append((run_dir, model))
    if not models:
        raise MasrError("--runs: no run left to analyse (see the warnings above)")

    cases, members_of, scores_of = pmi_attentive_scores(data, split, max_cases, seed)
    if len(cases) == 0:
        raise MasrError(f"{split}: no case with a member that co-occurs with its held-out song")
    split_cases = data.test if split == "test" else data.valid
    width = max(len(m) for m in members_of)
    members = np.zeros((len(cases), width), dtype=np.int64)
    mask = np.zeros((len(cases), width), dtype=bool)
    for row, m in enumerate(members_of):
        members[row, : len(m)], mask[row, : len(m)] = m, True
    playlists = split_cases.playlist[cases]
    batch = Batch(
        torch.as_tensor(data.playlist_user[playlists]),
        torch.as_tensor(playlists),
        torch.as_tensor(members),
        torch.as_tensor(mask),
    ).to(device)
    songs = torch.as_tensor(split_cases.song[cases]).unsqueeze(1).to(device)  # (B, 1)
    pmi = np.concatenate(scores_of)
    case = np.repeat(np.arange(len(cases)), mask.sum(axis=1))  # row-major, as alpha[mask]
    out = []
    for run_dir, model in models:
        mass = mass_part(model).eval()
        with torch.no_grad():
            alpha = mass.attention(batch, songs)[:, 0].cpu().numpy()  # (B, L), eq. 18
        out.append(AttentionPairs(attention_label(model), str(run_dir), pmi, alpha[mask],
                                  len(cases), case))
    return out


def run_info(run_dir: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(run.json, None)`` of a run; ``(None, None)`` when it has none (a folder that is no
    run, or a run made elsewhere); ``(None, why)`` when it is unreadable or not what ``masr
    train`` writes: ``why`` is the warning line of a run that the analyses leave out."""
    from masr.runs.store import parse_run_json

    info, why = parse_run_json(run_dir)
    if why is not None:
        return None, f"warning: {Path(run_dir) / 'run.json'}: {why}; {Path(run_dir)} left out"
    return info, None


def epoch_seconds(
    run_dirs: Sequence[str | Path], log: Any = None
) -> dict[str, dict[str, Any]]:
    """Figure 7: {run: {"seconds_per_epoch", "epochs", "model", "procedure", "device",
    "processes"}} from each run.json's history (training time only, validation excluded;
    "processes": torchrun's data-parallel processes, 1 for runs that did not record it); runs
    without a gradient-training history (fitted, fused) are left out, and so are runs whose
    run.json is unreadable or not what ``masr train`` writes (with a line to ``log``). A
    folder that does not exist is a MasrError (a typo, not a run to leave out)."""
    say = log or (lambda _msg: None)
    out: dict[str, dict[str, Any]] = {}
    dirs = [Path(d) for d in as_list(run_dirs, (str, Path))]  # one run, not its path's letters
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise MasrError(f"{', '.join(missing)}: no such run folder")
    for key, run_dir in zip(run_keys(dirs), dirs, strict=True):
        info, problem = run_info(run_dir)
        if problem is not None:
            say(problem)
            continue
        info = info or {}
        # each epoch's processes (recorded since a --resume may change them; the run's own
        # count before that): epoch times are averaged over the latest count's epochs only
        run_count = int(info.get("processes", 1))
        timed = [
            (float(h["train_seconds"]), int(h.get("processes", run_count)))
            for h in info.get("history", [])
            if "train_seconds" in h
        ]
        if not timed:
            continue
        processes = timed[-1][1]
        times = [t for t, n in timed if n == processes]
        if len(times) < len(timed):  # the count named (QA: said "that of the 3 with 2")
            say(
                f"note: {run_dir}: {len(timed) - len(times)} of its epochs trained with another "
                f"process count; its epoch time is the mean of the {len(times)} trained with "
                f"{processes} process{'' if processes == 1 else 'es'}"
            )
        out[key] = {
            "seconds_per_epoch": round(float(np.mean(times)), 4),
            "epochs": len(times),
            "model": info.get("model"),
            "procedure": info.get("procedure"),
            "device": info.get("device"),
            "processes": processes,
        }
    return out


#: what an analysis --out holds, said when it is a file
OUT_WRITES = "analyze writes a folder (JSON and PNG)"


def check_out_folder(out: str | Path) -> None:
    """Refuse (MasrError), before any work, an analysis ``--out`` folder that cannot hold its
    JSON and PNG: a file, a path below a file, a place where nothing can be made
    (``check_output_dir``), or a folder that is or lies inside a prepared data folder, which
    ``masr prep`` replaces whole (``check_outside_prepared``)."""
    from masr.atomic import check_output_dir
    from masr.dataset import check_outside_prepared

    check_output_dir(out, "--out", OUT_WRITES)
    check_outside_prepared(out, "--out")


def run_keys(run_dirs: Sequence[Path]) -> list[str]:
    """A name per run directory: the run's name ("mass"), "<runs>/<run>" where two runs of the
    list share a name (runs/mass, runs-dot/mass), the whole path where even that repeats."""
    names = [d.name for d in run_dirs]
    longer = [f"{d.parent.name}/{d.name}" for d in run_dirs]
    return [
        name if names.count(name) == 1 else two if longer.count(two) == 1 else str(d)
        for d, name, two in zip(run_dirs, names, longer, strict=True)
    ]


def attention_keys(pairs: Sequence[AttentionPairs]) -> list[str]:
    """The keys of ``analyze attention``'s JSON, of one kind within one output: each run's
    attention label ("mem-metric", "mem-dot (user+playlist)") when no two runs share one,
    otherwise each run's name as ``run_keys`` gives it ("mass", "runs-dot/mass", the path)."""
    labels = [p.label for p in pairs]
    if len(set(labels)) == len(labels):
        return labels
    return run_keys([Path(p.run) for p in pairs])


def embedding_size(info: dict[str, Any]) -> int | None:
    """A run's embedding size d from its run.json: the model's ``dim``, or for a fusion the
    ``dim`` its parts share; None for runs without one (popularity, item-kNN) or a fusion of
    parts of different sizes."""
    config = info.get("model_config") or {}
    if not isinstance(config, dict):
        return None
    if "dim" in config:
        return int(config["dim"])
    parts = [part for part in config.values() if isinstance(part, dict) and "dim" in part]
    dims = {int(part["dim"]) for part in parts}
    return dims.pop() if len(dims) == 1 else None


def quality_by_dim(
    data: PreparedData,
    runs: Sequence[str | Path],
    names: Sequence[str] = ("all",),
    *,
    split: str = "test",
    device: str = "auto",
    full_sample: int = 0,
    seed: int = 0,
    log: Any = None,
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """Figure 5: {run: {d: {protocol: metrics}}}, d ascending, for the runs named ``names``
    ("all" = every run) in each entry of ``runs``: a runs directory (e.g. one per ``--dim``)
    or one run directory. Runs without an embedding size are left out (logged); the same run
    at the same d in two entries is an error, since the figure would have to drop one."""
    from masr.report import evaluate_runs, to_jsonable
    from masr.runs.store import available_runs

    say = log or (lambda _msg: None)
    runs, names = as_list(runs, (str, Path)), as_list(names)  # one of each, not its letters
    # every entry is read and checked before anything is evaluated (evaluation is the cost):
    # each run's run.json, and the prepared data its best.pt was trained on
    plan: list[tuple[Path, dict[str, int]]] = []
    placed: dict[tuple[str, int], Path] = {}
    seen: set[str] = set()
    for entry in map(Path, runs):
        runs_dir, found = (
            (entry.parent, [entry.name]) if (entry / "best.pt").is_file()
            else (entry, available_runs(entry))
        )
        if not found:
            raise MasrError(f"--runs {entry}: no trained run (a runs directory or a run's own)")
        seen.update(found)
        sized: dict[str, int] = {}
        for run in found if "all" in names else [n for n in found if n in names]:
            info, problem = run_info(runs_dir / run)
            if problem is not None:
                say(problem)
                continue
            if info is None:
                say(f"{runs_dir / run}: no run.json (its embedding size), left out")
                continue
            d = embedding_size(info)
            if d is None:
                say(f"{runs_dir / run}: no embedding size, left out")
                continue
            if (run, d) in placed:
                raise MasrError(
                    f"{run} at d={d} is in two --runs entries ({placed[run, d]} and "
                    f"{runs_dir / run}); give one runs directory per embedding size"
                )
            # the prepared data it was made on: from its run.json, else from its best.pt
            trained_on = (info.get("signature") or {}).get("data")
            if trained_on is None:
                from masr.checkpoint import load_checkpoint

                trained_on = load_checkpoint(runs_dir / run / "best.pt").get("data_fingerprint")
            if trained_on != data.fingerprint:
                raise MasrError(
                    f"{runs_dir / run / 'best.pt'}: trained on other prepared data (fingerprint "
                    f"{trained_on}, {data.path} has {data.fingerprint}); retrain or pass the "
                    "matching --data"
                )
            placed[run, d] = runs_dir / run
            sized[run] = d
        if sized:
            plan.append((runs_dir, sized))
    missing = [n for n in names if n != "all" and n not in seen]
    if missing:
        raise MasrError(f"--model {', '.join(missing)}: no such trained run in any --runs entry")
    if not plan:
        raise MasrError("no run with an embedding size among --runs (e.g. mdr, mass, masr)")
    table: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for runs_dir, sized in plan:
        results = evaluate_runs(data, runs_dir, list(sized), split=split, device=device,
                                full_sample=full_sample, sample_seed=seed, log=say)
        for run, res in to_jsonable(results).items():
            table.setdefault(run, {})[str(sized[run])] = res
    return {run: dict(sorted(by_dim.items(), key=lambda kv: int(kv[0])))
            for run, by_dim in table.items()}
