"""Reports over trained runs: evaluating a runs directory, the paper's Table 2 rows, the hit@N
plot and the JSON of ``masr evaluate``.

The metrics and the two protocols themselves are ``masr.evaluate``; the Table 2 labels and run
order are ``masr.runs.registry`` (shared with the store, which lists runs in that order).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masr.atomic import check_output_dir
from masr.config import PROTOCOLS, as_list, check_alpha, check_int
from masr.errors import MasrError
from masr.evaluate import CUTOFFS
from masr.runs.registry import (
    ABLATIONS,
    EXTRA_BASELINES,
    IMPROVED,
    NOT_YET_RUN,
    OURS,
    PAPER_BASELINES,
    RUNS,
    run_order,
)
from masr.runs.store import available_runs, load_run

if TYPE_CHECKING:
    from masr.dataset import PreparedData


def evaluate_runs(
    data: PreparedData,
    runs_dir: str | Path,
    names: Sequence[str] = ("all",),
    *,
    split: str = "test",
    device: str = "auto",
    protocols: Sequence[str] = ("sampled", "full"),
    full_sample: int = 0,
    sample_seed: int = 0,
    alphas: Sequence[float] = (),
    candidates: int = 0,
    log: Callable[[str], None] | None = None,
    compile: bool = False,
    ranks_out: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{run: {"sampled": metrics, "full": metrics}}`` for the named runs (``all`` = every
    run in ``runs_dir``), in table order; ``full_sample``: see ``evaluate_model_and``. Each fusion
    run (masr, amasr) is also evaluated with its parts re-weighted by every α in ``alphas``
    (eq. 20), as ``<run>@α=<a>``: what another fusion weight would give, without retraining.

    ``candidates`` > 0 adds ``"two_stage"`` to every run (on the same full-protocol cases):
    the metrics when MDR proposes that many songs and the run ranks only those
    (``evaluate.two_stage_ranks``), with ``candidates`` and ``proposed`` (the share of held-out
    songs MDR proposed). MDR is a fusion run's own part, else the run named ``mdr``.
    ``compile``, ``ranks_out`` (keyed by run): see ``evaluate_model_and``. A fusion named
    beside its MASS run (and holding that run's weights) is scored from the MASS run's
    distances, computed once per batch for both (``evaluate.evaluate_model_and``): the same
    figures, about half the work."""
    from masr.dataset import check_prepared
    from masr.evaluate import evaluate_model_and
    from masr.sampling import TrainingIndex
    from masr.train import resolve_device

    log = log or (lambda _msg: None)
    check_prepared(data)  # the folder's path instead: one line, not an AttributeError later
    names = as_list(names)  # one run's name, not its letters
    alphas = [check_alpha(a) for a in as_list(alphas, (numbers.Real, str))]  # before any work
    check_int(full_sample, "--full-sample")
    check_int(candidates, "--candidates")
    if full_sample < 0:
        raise MasrError("--full-sample must be >= 0 (0 = every case)")
    runs_dir = Path(runs_dir)
    check_output_dir(runs_dir, "--runs", creatable=False)  # a file, or below one: one line
    wanted: list[str] = []
    for n in names:
        if n == "all":
            found = available_runs(runs_dir)
            if not found:
                data_opt = "" if Path(data.path) == Path("data") else f" --data {data.path}"
                raise MasrError(
                    f"{runs_dir}: no trained runs; run `masr train --model amasr{data_opt} "
                    f"--runs {runs_dir}`"
                )
            wanted += [r for r in found if r not in wanted]
            continue
        # QA: --model ../runs/mass was read from another folder, and shown as a baseline
        if "/" in n.rstrip("/") or "\\" in n or n.strip("/") in ("", ".", ".."):
            raise MasrError(f"--model {n}: a run's name in {runs_dir} (e.g. mdr), not a path")
        n = n.rstrip("/")  # a shell's completion of the folder name: mdr/
        if n not in wanted:
            wanted.append(n)
    if candidates < 0:
        raise MasrError(f"--candidates {candidates}: must be >= 0 (0 = exact only)")
    from masr.runs.store import checkpoint_damage

    for run in wanted:  # a damaged checkpoint: one line before any work (QA: after the others'
        path = runs_dir / run / "best.pt"  # evaluation; load_checkpoint reads it again)
        damage = checkpoint_damage(path) if path.is_file() else None
        if damage is not None:
            raise MasrError(f"{path}: damaged ({damage}); train {run} again, or leave it out")
    fusions = [r for r in wanted if r in RUNS and RUNS[r].procedure == "fuse"]
    if candidates and set(wanted) - set(fusions):  # before any work (QA: said after the
        _check_proposer(runs_dir)  # other runs' evaluation)
    if alphas and not fusions:
        log(f"note: --alpha re-weighs fusion runs (masr, amasr); none among {', '.join(wanted)}")
    dev = resolve_device(device)
    index = TrainingIndex.from_data(data, dev)
    results = {}
    shared_mdr: list = []  # the `mdr` run, loaded once when a non-fusion run needs it

    def evaluate(
        model: Any, on_top: Any = None, run: str = ""
    ) -> dict[str, dict[str, dict[str, float]]]:
        """{"": the model's metrics, and each ``on_top`` entry's}; their ranks into
        ``ranks_out`` under ``run`` and the entries' names"""
        ranks: dict[str, dict[str, Any]] | None = {} if ranks_out is not None else None
        out = evaluate_model_and(
            model, on_top or {}, data, split, protocols=protocols, index=index,
            full_sample=full_sample, sample_seed=sample_seed, compile=compile, ranks_out=ranks,
        )
        if ranks is not None:  # given ranks_out
            ranks_out.update({name or run: value for name, value in ranks.items()})
        return out

    order = run_order(wanted)
    # fusions asked for beside their MASS run: scored from that run's distances, computed once
    # per batch for both (MASS's attention is most of a fusion's evaluation); a fusion whose MASS
    # part is not that run's weights (retrained since, say) is evaluated on its own
    fusions = {
        r: RUNS[r].parts[1]
        for r in order
        if r in RUNS and RUNS[r].procedure == "fuse" and RUNS[r].parts[1] in order
    }
    from masr.models.masr import FusionOnMass

    ready: dict[str, Any] = {}  # fusions loaded and evaluated with their MASS run
    for run in order:
        if run in ready:
            model = ready.pop(run)
        else:
            model, _ = load_run(runs_dir, run, data, dev, warn=log)
            _say_alpha(run, model, log)
            on_top = {}
            for fusion in (f for f, part in fusions.items() if part == run):
                notes: list[str] = []  # said here only when evaluated here (QA: said twice)
                fused, _ = load_run(runs_dir, fusion, data, dev, warn=notes.append)
                if hasattr(fused, "parts") and _same_weights(fused.parts()[1], model):
                    for note in notes:
                        log(note)
                    _say_alpha(fusion, fused, log)
                    ready[fusion] = fused.to(dev).eval()
                    on_top[fusion] = FusionOnMass.of(ready[fusion])
                    for a in alphas:
                        on_top[f"{fusion}@α={a:g}"] = FusionOnMass(ready[fusion].mdr, a)
            t0 = time.perf_counter()
            both = evaluate(model, on_top, run)
            results[run] = both.pop("")
            results.update(both)
            shared = f" (with {', '.join(on_top)} from the same distances)" if on_top else ""
            log(f"{run}: evaluated on {split} in {time.perf_counter() - t0:.1f} s{shared}")
        if candidates:
            t0 = time.perf_counter()
            proposer = _proposer(model, runs_dir, data, dev, shared_mdr)
            results[run]["two_stage"] = two_stage_metrics(
                model, proposer, data, split, index, candidates, full_sample, sample_seed
            )
            log(f"{run}: two-stage ({candidates} candidates) in {time.perf_counter() - t0:.1f} s")
        for a in alphas if hasattr(model, "with_alpha") else ():
            name = f"{run}@α={a:g}"
            if name in results and not candidates:  # scored with its MASS run already
                continue
            fused = model.with_alpha(a).to(dev)  # type: ignore[operator]
            if name not in results:
                results[name] = evaluate(fused, None, name)[""]
            if candidates:  # as `masr export --alpha A --candidates N` would serve it
                results[name]["two_stage"] = two_stage_metrics(
                    fused.eval(), _proposer(fused, runs_dir, data, dev, shared_mdr), data,
                    split, index, candidates, full_sample, sample_seed,
                )
    # table order: each run, then its fusion weights
    keys = [k for run in order for k in (run, *(f"{run}@α={a:g}" for a in alphas)) if k in results]
    return {k: results[k] for k in keys}


def _say_alpha(run: str, model: Any, log: Callable[[str], None]) -> None:
    """A fusion whose eq. 20 weight is not the paper's says so (its table row has no α)."""
    from masr.config import ALPHA

    if hasattr(model, "with_alpha") and model.config.alpha != ALPHA:
        log(f"{run}: eq. 20 with α {model.config.alpha:g} (the paper's is {ALPHA:g})")


def _same_weights(a: Any, b: Any) -> bool:
    """The same model class, config and tensors (a fusion's copy of a part, and the part's run)."""
    import torch

    if type(a) is not type(b) or a.config.to_dict() != b.config.to_dict():
        return False
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k].to(sa[k].device)) for k in sa
    )


def _check_proposer(runs_dir: Path) -> None:
    """One line when ``runs_dir`` has no ``mdr`` run to propose a non-fusion's candidates."""
    if "mdr" not in available_runs(runs_dir):
        raise MasrError(
            f"--candidates: MDR proposes the candidates, but {runs_dir} has no `mdr` run; "
            f"train it with `masr train --model mdr --runs {runs_dir}`"
        )


def _proposer(model: Any, runs_dir: Path, data: PreparedData, dev: Any, shared: list) -> Any:
    """The MDR that proposes candidates for ``model``: its own part when it is a fusion."""
    if hasattr(model, "parts"):
        return model.parts()[0]
    if not shared:  # an mdr run is there: evaluate_runs checked it before any work
        shared.append(load_run(runs_dir, "mdr", data, dev)[0].eval())
    return shared[0]


def two_stage_metrics(
    model: Any,
    proposer: Any,
    data: PreparedData,
    split: str,
    index: Any,
    candidates: int,
    full_sample: int = 0,
    sample_seed: int = 0,
) -> dict[str, float | int]:
    """hit@N / ndcg@N of the two-stage full ranking on the full protocol's cases, with
    ``candidates`` (the songs each case proposed: at most the catalog) and ``proposed`` (share
    of held-out songs among the candidates)."""
    from masr.evaluate import metrics_from_ranks, subsample_cases, two_stage_ranks

    cases = subsample_cases(data.test if split == "test" else data.valid, full_sample, sample_seed)
    was_training = model.training
    model.to(index.device).eval()
    proposer.to(index.device).eval()
    try:
        ranks, proposed = two_stage_ranks(model, proposer, cases, index, candidates)
    finally:
        model.train(was_training)
    out = metrics_from_ranks(ranks)
    out["candidates"] = min(int(candidates), data.n_songs)  # as used: at most the catalog
    out["proposed"] = float(proposed.mean()) if len(proposed) else 0.0
    return out


# --- the comparison table (paper's Table 2 layout) -------------------------------------------

#: the table's four columns: (protocol, metric)
COLUMNS = (("sampled", "hit@10"), ("sampled", "ndcg@10"), ("full", "hit@10"), ("full", "ndcg@10"))


@dataclass
class TableRow:
    """One line of the comparison table. ``values`` is None for a model not yet run."""

    group: str  # "baseline", "ours", "improvement" or "ablation" (Table 3's variants)
    run: str  # run name ("" for rows without one)
    label: str  # what the paper calls it
    values: list[float | None] | None  # one per COLUMNS entry
    note: str = ""


def comparison_rows(results: dict[str, dict[str, dict[str, float]]]) -> list[TableRow]:
    """The rows of the paper's Table 2 for ``results`` ({run: {protocol: metrics}}): baselines
    (the unimplemented paper baselines as "not yet run"), our models, then the relative
    improvement (%) of MASR and AMASR over the best baseline in each column."""
    labels = dict(PAPER_BASELINES + EXTRA_BASELINES + OURS + ABLATIONS)
    ours = {n for n, _ in OURS + ABLATIONS}

    def values(run: str) -> list[float | None]:
        res = results[run]
        return [res.get(p, {}).get(m) for p, m in COLUMNS]

    rows: list[TableRow] = []
    for run in run_order([*results, *NOT_YET_RUN]):
        if run in ours or "@α=" in run:
            continue
        if run in results:
            rows.append(TableRow("baseline", run, labels.get(run, run), values(run)))
        else:
            rows.append(TableRow("baseline", run, labels[run], None, "not yet run"))
    for run, label in OURS:
        if run in results:
            rows.append(TableRow("ours", run, label, values(run)))
        # `masr evaluate --alpha`: the same fusion at other weights, beside it (never a baseline)
        for variant in sorted(r for r in results if r.startswith(f"{run}@α=")):
            alpha = variant.split("@α=", 1)[1]
            rows.append(TableRow("ours", variant, f"{label} α={alpha}", values(variant)))
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
    for run, label in ABLATIONS:
        if run in results:
            rows.append(TableRow("ablation", run, label, values(run)))
    return rows


def paired_comparisons(
    results: dict[str, dict[str, dict[str, float]]], ranks: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """``masr evaluate --significance``: ``masr.significance.comparisons`` of the evaluated
    runs (the baselines are the runs of Table 2's baseline rows), each entry with the table
    labels of both runs (``run_label``, ``against_label``)."""
    from masr.significance import comparisons

    labels = dict(PAPER_BASELINES + EXTRA_BASELINES + OURS + ABLATIONS)
    baselines = [
        r.run for r in comparison_rows(results) if r.group == "baseline" and r.values is not None
    ]
    out = comparisons(results, ranks, baselines, [run for run, _ in OURS])
    for entry in out:
        entry["run_label"] = labels.get(entry["run"], entry["run"])
        entry["against_label"] = labels.get(entry["against"], entry["against"])
    return out


def plot_hit_curves(
    results: dict[str, dict[str, dict[str, float]]], path: str | Path, *, title: str = ""
) -> Path:
    """A PNG of hit@N against N (1..10), one line per run, one panel per protocol."""
    from masr.figures import pyplot, save_png

    plt = pyplot("--plot")
    path = Path(path)
    protocols = [p for p in PROTOCOLS if any(p in r for r in results.values())]
    runs = run_order(list(results))
    # one legend for both panels, beside them (never over the curves): as wide as it needs,
    # in columns of at most 12 runs; each run its own colour and marker (20 before repeating),
    # masr's own models solid, the baselines dashed
    columns = max(1, -(-len(runs) // 12))
    width = 5 * max(1, len(protocols))
    fig, axes = plt.subplots(
        1, max(1, len(protocols)), figsize=(width + 1.6 * columns, 4), squeeze=False
    )
    colours = plt.get_cmap("tab20").colors
    ours = {name for name, _ in OURS}
    for ax, protocol in zip(axes[0], protocols, strict=False):
        for i, run in enumerate(runs):
            metrics = results[run].get(protocol)
            if metrics:
                ax.plot(
                    CUTOFFS, [metrics[f"hit@{n}"] for n in CUTOFFS], label=run,
                    color=colours[i % len(colours)], marker="osD^v<>ph*"[i % 10], markersize=4,
                    linestyle="-" if run.split("@")[0] in ours else "--",
                )
        ax.set_title(f"{protocol} ranking" + (f" ({title})" if title else ""))
        ax.set_xlabel("N")
        ax.set_ylabel("hit@N")
        ax.set_xticks(CUTOFFS)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.tight_layout(rect=(0, 0, width / (width + 1.6 * columns), 1))
        fig.legend(handles, labels, loc="center right", ncol=columns, fontsize=8,
                   frameon=False)
    return save_png(fig, path, dpi=120, option="--plot", layout=not handles)


def to_jsonable(results: Any) -> Any:
    """Round floats for the JSON output (6 decimals keeps every reported digit; below 1e-4,
    6 significant digits, so that a p-value of 1e-50 stays one and never becomes 0), at any
    depth (``--significance`` adds standard errors and the paired comparisons, a list); NaN
    and infinities (undefined: a standard error of fewer than two cases) become null."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        if isinstance(value, (bool, int, str)) or value is None:
            return value
        number = float(value)
        if not math.isfinite(number):  # a standard error of one case: JSON has no NaN
            return None
        return float(f"{number:.6g}") if 0 < abs(number) < 1e-4 else round(number, 6)

    return walk(results)


def write_json(results: dict[str, Any], path: str | Path) -> Path:
    """``to_jsonable(results)`` written aside, then renamed into ``path``."""
    import json

    from masr.atomic import atomic_file

    path = Path(path)
    try:
        with atomic_file(path, "w") as fh:
            json.dump(to_jsonable(results), fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        raise MasrError(f"--json {path}: cannot write ({exc.strerror})") from None
    return path
