"""One entry point for the paper's experiments (section 5): Tables 2-4 and Figures 4-7 on a
prepared dataset, every run under one time budget, written as JSON tables, PNGs and a markdown
report (``masr reproduce``).

Layout of ``out/``::

    runs/main/              Table 2 (the AMASR chain, the baselines), Table 3's ablations
    runs/entity-<e>/        the baselines with an --entity, trained at the entity e that is not
                            their default (--entities both); Table 2 keeps, per baseline, the
                            entity with the better validation hit@10 (the paper ran its
                            baselines both ways and reported the better)
    runs/attention-<a>/     Table 4: MASS with --set attention=<a> (mem-metric is runs/main)
    runs/apr-<noise>-<eps>/ APR with fixed / flexible noise and eps 0.5 / 1.0 (mdr and mass
                            copied from runs/main, so only the APR runs are trained)
    runs/dim-<d>/           Figure 5: the chain at embedding size d (d = 64 is runs/main)
    table2.json table3.json table4.json apr_noise.json fig5_dims.json fig6_attention.json
    fig7_speed.json         the tables ({run: {protocol: {metric: value}}} and the like)
    entities.json           per baseline with an --entity: each entity's validation figure and
                            the one chosen for Table 2
    paired.json             Table 2's runs compared case by case on the same test cases (each
                            of masr's models vs the best baseline, the paper's orderings): Δ
                            hit@10 / ndcg@10 with 95% intervals, McNemar's p (masr.significance)
    fig4_hits.png fig5_dims.png fig6_attention.png fig7_speed.png   (with matplotlib)
    report.md               every table in markdown, the figures shown beside them, and the time
                            each stage took

A run that already finished with the same signature is reused, so an interrupted reproduce
continues where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from masr.config import (
    REPRODUCE_APR,
    AdversarialConfig,
    ReproduceConfig,
    RunOptions,
    TrainConfig,
)
from masr.errors import MasrError, check_instance
from masr.runs.registry import (
    ABLATIONS,
    EXTRA_BASELINES,
    OURS,
    PAPER_BASELINES,
    TABLE3,
    model_config,
    plan,
    run_order,
)

Log = Callable[[str], None]
#: Table 4's rows in the paper's order, then the no-attention design
TABLE4 = ("nonmem-dot", "nonmem-metric", "mem-dot", "mem-metric", "none")
#: the metrics every table reports: (protocol, metric)
COLUMNS = (("sampled", "hit@10"), ("sampled", "ndcg@10"), ("full", "hit@10"), ("full", "ndcg@10"))


@dataclass
class ReproduceResult:
    """What ``reproduce`` wrote: the report, the tables and PNGs, seconds per stage."""

    report: Path
    files: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def reproduce(
    data_dir: str | Path, out: str | Path, config: ReproduceConfig | None = None,
    log: Log | None = None,
) -> ReproduceResult:
    """Train and evaluate what Tables 2-4 and Figures 4-7 need; see the module docstring."""
    say = log or (lambda _msg: None)
    config = ReproduceConfig() if config is None else config
    check_instance(config, ReproduceConfig, "reproduce(config=...)")  # a dict: one line
    try:
        return _reproduce(data_dir, out, config, say)
    except KeyboardInterrupt:  # in training or not: the whole job goes on the same way
        say("masr reproduce: interrupted; the same `masr reproduce` command continues it "
            "(finished runs are reused, the interrupted one is trained again)")
        raise


def _reproduce(
    data_dir: str | Path, out: str | Path, config: ReproduceConfig, say: Log
) -> ReproduceResult:
    from masr.dataset import load_prepared

    data, out = load_prepared(data_dir), Path(out)
    from masr.atomic import check_output_dir, check_parents
    from masr.dataset import check_outside_prepared

    check_outside_prepared(out, "--out")  # the --data folder, or any other prep folder
    check_output_dir(out, "--out", "reproduce writes a folder (runs, tables, plots)")
    runs = out / "runs"
    check_parents(runs / "main", "--out")  # a file named runs in --out
    if len(data.test) == 0:  # QA: every run was trained before the test evaluation said so
        raise MasrError(
            f"{data.path}: no test cases to rank ({data.no_cases()}); reproduce reports the "
            "test split: prepare more playlists"
        )
    base = RunOptions(
        train=TrainConfig(
            epochs=config.epochs,
            time_limit=config.time_limit,
            patience=config.patience,
            seed=config.seed,
        ),
        adversarial=AdversarialConfig(epochs=config.adv_epochs),
        device=config.device,
    )
    stage = _Stages(say)
    tables: dict[str, Any] = {}

    from masr.runs import available_runs

    with stage("Table 2 and Table 3: the AMASR chain, baselines, ablations"):
        main = runs / "main"
        baselines = [n for n, _ in PAPER_BASELINES + EXTRA_BASELINES] * config.baselines
        made: set[str] = set()  # the runs of this reproduce (with their dependencies)
        for name in ["amasr", *baselines, *(n for n, _ in ABLATIONS)]:
            _make(name, data, main, base, say)
            made.update(plan(name))
        # a run an earlier reproduce left in the folder (before --no-baselines, or with
        # other settings) is not this one's: the tables leave it out, and say so
        stale = [n for n in available_runs(main) if n not in made]
        if stale:
            say(f"left out of the tables: {', '.join(stale)} in {main} (not made by this "
                "reproduce: an earlier one's, with other options)")

    tables["entities"] = {}
    moved: dict[str, Path] = {}  # baseline -> runs dir of the entity chosen over its default
    # one playlist a user (e.g. MPD prepared with --user-col naming the playlist column):
    # user- and playlist-based are the same model, so there is nothing to choose
    both = config.entities == "both" and data.n_users != data.n_playlists and bool(baselines)
    with stage("Table 2's baselines both ways: user- and playlist-based") if both else _quiet():
        for name in baselines if both else []:
            default = getattr(model_config(name, {}), "entity", None)
            if default is None:
                continue
            other = "user" if default == "playlist" else "playlist"
            where = runs / f"entity-{other}"
            _make(name, data, where, replace(base, model={"entity": other}), say)
            figures = {default: _valid_hit10(main / name), other: _valid_hit10(where / name)}
            chosen = other if figures[other] > figures[default] else default
            tables["entities"][name] = {"valid hit@10": figures, "chosen": chosen}
            if chosen == other:
                moved[name] = where

    with stage("Table 2 and Table 3: test evaluation"):
        # each run is evaluated on test once, from the runs dir of its chosen entity
        names = [n for n in available_runs(main) if n in made]
        table2 = _evaluate(data, main, [n for n in names if n not in moved], config, say)
        for name, where in moved.items():
            table2.update(_evaluate(data, where, [name], config, say))
        tables["table2"] = {run: table2[run] for run in names}  # table order
        tables["table3"] = {run: tables["table2"][run] for run, _ in TABLE3}
        # the paper's claims case by case: every Table 2 run ranked the same cases
        from masr.report import paired_comparisons, to_jsonable

        ranks = {run: _EVALUATED[_key(moved.get(run, main), run, config)][1] for run in names}
        tables["paired"] = to_jsonable(paired_comparisons(tables["table2"], ranks))

    with stage("Table 4: MASS's attention variants"):
        att_dirs = {a: main if a == "mem-metric" else runs / f"attention-{a}" for a in TABLE4}
        for a, where in att_dirs.items():
            _make("mass", data, where, replace(base, model={"attention": a}), say)
        tables["table4"] = {
            a: _evaluate(data, where, ["mass"], config, say)["mass"]
            for a, where in att_dirs.items()
        }

    with stage("APR: fixed vs flexible noise, eps 0.5 / 1.0"):
        apr = {"flexible eps=1.0": {r: tables["table2"][r] for r in ("amdr", "amass", "amasr")}}
        for noise, eps in REPRODUCE_APR:
            where = runs / f"apr-{noise}-{eps}"
            _copy_runs(main, where, ("mdr", "mass"))
            options = replace(base, adversarial=replace(base.adversarial, noise=noise, eps=eps))
            _make("amasr", data, where, options, say)
            apr[f"{noise} eps={eps}"] = _evaluate(data, where, ["amdr", "amass", "amasr"],
                                                  config, say)
        tables["apr_noise"] = apr

    with stage("Figure 5: quality against the embedding size"):
        chain = ["mdr", "mass", "masr"] + ["amdr", "amass", "amasr"] * (config.dim_chain == "amasr")
        dims: dict[str, dict[str, Any]] = {run: {} for run in chain}
        for d in config.dims:
            where = main if d == _default_dim() else runs / f"dim-{d}"
            if where is not main:
                _make(config.dim_chain, data, where, replace(base, model={"dim": d}), say)
            for run, res in _evaluate(data, where, chain, config, say).items():
                dims[run][str(d)] = res
        tables["fig5_dims"] = dims

    with stage("Figure 6: attention against PMI"):
        from masr.analyze import attention_correlation

        pairs = attention_correlation(
            data, [att_dirs[a] / "mass" for a in TABLE4], max_cases=config.attention_cases,
            seed=config.seed,
        )
        # bootstrap standard errors of both ρ over 200 resamples of the cases
        tables["fig6_attention"] = {p.label: p.summary(200, config.seed) for p in pairs}

    with stage("Figure 7: seconds per epoch"):
        from masr.analyze import epoch_seconds

        trained = run_order([p.name for p in main.iterdir() if p.is_dir() and p.name in made])
        tables["fig7_speed"] = epoch_seconds([main / run for run in trained])

    files = _write_tables(out, tables)
    files += _write_figures(out, tables, pairs)
    from masr.figures import NO_MATPLOTLIB, have_matplotlib

    if not have_matplotlib():
        say(NO_MATPLOTLIB)
    report = _write_report(out, tables, stage.seconds, config, data.path)
    say(f"wrote {report} and {len(files)} tables and figures in {out}")
    return ReproduceResult(report, [report, *files], stage.seconds)


def _default_dim() -> int:
    from masr.models.mdr import MDRConfig

    return MDRConfig().dim


@contextlib.contextmanager
def _quiet() -> Any:
    """A stage with nothing to do: no title, no time."""
    yield


class _Stages:
    """``with stage(title):`` logs the title and records the seconds it took."""

    def __init__(self, say: Log) -> None:
        self.say, self.seconds = say, {}
        self._title, self._t0 = "", 0.0

    def __call__(self, title: str) -> _Stages:
        self._title = title
        return self

    def __enter__(self) -> None:
        self.say(f"== {self._title}")
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._title] = round(time.perf_counter() - self._t0, 1)


def _make(name: str, data: Any, runs_dir: Path, options: RunOptions, say: Log) -> None:
    """Run ``name`` in ``runs_dir``, unless it and every run it is made from finished there
    with the same signature and can be reused as they are (``masr.runs.make.reusable``: a
    part missing, damaged or trained again since makes ``train_run`` redo what needs it)."""
    from masr.runs import signature, train_run
    from masr.runs.make import reusable

    def ok(run: str, say_why: Log | None = None) -> bool:
        sig = signature(run, options, data.fingerprint)
        return reusable(runs_dir / run, sig, say_why) is not None

    # why the run itself is not reused is said here (train_run says it of the parts)
    if ok(name, say) and all(ok(run) for run in plan(name)[:-1]):
        say(f"{runs_dir.name}/{name}: finished before, reused")
        return
    outcomes = train_run(
        name, data, runs_dir, options, log=say, command="masr reproduce"
    )
    for outcome in outcomes:
        say(f"{runs_dir.name}/{outcome.run}: {outcome.action} in {outcome.seconds:.1f} s")


def _valid_hit10(run_dir: Path) -> float:
    """A finished run's best validation hit@10 under the protocol that selected it."""
    from masr.runs import read_run_json

    info = read_run_json(run_dir) or {}
    select = info.get("train_config", {}).get("select", "sampled")
    best = info.get("best", {}).get("valid_full" if select == "full" else "valid", {})
    return float(best.get("hit@10", float("-inf")))


def _copy_runs(src: Path, dst: Path, names: tuple[str, ...]) -> None:
    """Copy finished runs (best.pt, run.json) so that a chain in ``dst`` reuses them."""
    for name in names:
        if not (dst / name / "best.pt").is_file():
            (dst / name).mkdir(parents=True, exist_ok=True)
            for file in ("run.json", "best.pt"):
                shutil.copy2(src / name / file, dst / name / file)


#: (runs directory, run) -> its test metrics and per-case ranks ({protocol: ranks}, for the
#: paired comparisons), within one process: runs/main's mass and the d = 64 chain are
#: evaluated once for Tables 2-4 and Figure 5 alike
_EVALUATED: dict[tuple[str, str], tuple[dict[str, dict[str, float]], dict[str, Any]]] = {}


def _evaluate(
    data: Any, runs_dir: Path, names: list[str], config: ReproduceConfig, say: Log
) -> dict[str, dict[str, dict[str, float]]]:
    from masr.report import evaluate_runs, to_jsonable

    if names == ["all"]:
        from masr.runs import available_runs

        names = available_runs(runs_dir)
    keys = {n: _key(runs_dir, n, config) for n in names}
    todo = [n for n in names if keys[n] not in _EVALUATED]
    if todo:
        ranks: dict[str, dict[str, Any]] = {}
        results = evaluate_runs(
            data, runs_dir, todo, device=config.device, full_sample=config.full_sample,
            sample_seed=config.seed, log=say, ranks_out=ranks,
        )
        for run, res in to_jsonable(results).items():
            _EVALUATED[keys[run]] = (res, ranks.get(run, {}))
    return {run: _EVALUATED[keys[run]][0] for run in run_order(names)}


def _key(runs_dir: Path, run: str, config: ReproduceConfig) -> tuple[str, str]:
    """A run's evaluation, cached: its folder and signature (a remade run is new)."""
    from masr.runs import read_run_json

    info = read_run_json(runs_dir / run) or {}
    return str(runs_dir.resolve() / run), json.dumps(
        [info.get("signature"), info.get("finished"), config.full_sample, config.seed],
        sort_keys=True, default=str,
    )


def _write_tables(out: Path, tables: dict[str, Any]) -> list[Path]:
    from masr.atomic import atomic_file

    files = []
    for name, table in tables.items():
        path = out / f"{name}.json"
        with atomic_file(path, "w") as fh:
            json.dump(table, fh, indent=2)
            fh.write("\n")
        files.append(path)
    return files


def _write_figures(out: Path, tables: dict[str, Any], pairs: list[Any]) -> list[Path]:
    """The four PNGs; without matplotlib none, and an earlier run's are removed
    (``figures.maybe``), so that report.md does not show them beside these tables."""
    from functools import partial

    from masr.figures import maybe, plot_attention, plot_dims, plot_epoch_seconds
    from masr.report import plot_hit_curves

    speed = {run: v["seconds_per_epoch"] for run, v in tables["fig7_speed"].items()}
    attention = {p.label: (p.pmi.tolist(), p.weight.tolist(), p.pearson, p.pearson_within)
                 for p in pairs}
    written = [
        maybe(partial(plot_hit_curves, title="test"), tables["table2"], out / "fig4_hits.png"),
        maybe(plot_dims, tables["fig5_dims"], out / "fig5_dims.png"),
        maybe(plot_attention, attention, out / "fig6_attention.png"),
        maybe(plot_epoch_seconds, speed, out / "fig7_speed.png"),
    ]
    return [path for path in written if path is not None]


def _figure(out: Path, name: str, title: str, heading: bool = False) -> list[str]:
    """report.md's lines showing the PNG ``name`` beside it (written first by
    ``_write_figures``), under a ``title`` heading of its own with ``heading``; none where it
    was not written (no matplotlib)."""
    if not (out / name).is_file():
        return []
    lines = [f"## {title}", ""] if heading else []
    return [*lines, f"![{title}]({name})", ""]


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _row(label: str, res: dict[str, dict[str, float]]) -> str:
    cells = [res.get(p, {}).get(m) for p, m in COLUMNS]
    return f"| {label} | " + " | ".join(map(_num, cells)) + " |"


def _metric_table(rows: list[tuple[str, dict[str, Any]]], first: str = "Method") -> list[str]:
    head = f"| {first} | sampled hit@10 | sampled ndcg@10 | full hit@10 | full ndcg@10 |"
    return [head, "|---|---:|---:|---:|---:|", *(_row(label, res) for label, res in rows)]


def _label(run: str, labels: dict[str, str], entities: dict[str, Any]) -> str:
    label = labels.get(run, run)
    return f"{label} ({entities[run]['chosen']})" if run in entities else label


def _entities_section(entities: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """The baselines trained both ways: each entity's validation hit@10, the chosen one."""
    if not entities:
        return []
    return [
        "Baselines with an entity were trained user- and playlist-based; Table 2 shows the one "
        "with the better validation hit@10 (the paper's choice, section 5.1):",
        "",
        "| baseline | user | playlist | chosen |",
        "|---|---:|---:|---|",
        *(f"| {labels.get(r, r)} | {_num(v['valid hit@10'].get('user'))} | "
          f"{_num(v['valid hit@10'].get('playlist'))} | {v['chosen']} |"
          for r, v in entities.items()),
        "",
    ]


def _paired_section(paired: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Table 2's runs compared case by case (``masr evaluate --significance``'s comparisons):
    Δ hit@10 with its 95% interval and McNemar's exact p-value."""
    from masr.significance import interval_text

    if not paired:
        return []
    lines = [
        "Paired on the same test cases (`masr evaluate --significance`): Δ = run − vs, ± the",
        "half-width of its 95% interval; p = McNemar's exact test on the cases only one of the",
        "two gets right (hit@10).",
        "",
        "| protocol | run | vs | why | Δ hit@10 | p | Δ ndcg@10 |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for e in paired:
        hit, ndcg = e["hit@10"], e["ndcg@10"]
        lines.append(
            f"| {e['protocol']} | {labels.get(e['run'], e['run'])} | "
            f"{labels.get(e['against'], e['against'])} | {e['why']} | "
            f"{interval_text(hit)} | {hit['p']:.2g} | {interval_text(ndcg)} |"
        )
    return [*lines, ""]


def _write_report(
    out: Path, tables: dict[str, Any], seconds: dict[str, float], config: ReproduceConfig,
    data_path: Path,
) -> Path:
    from masr.analyze import rho_text
    from masr.atomic import atomic_file

    labels = dict(PAPER_BASELINES + EXTRA_BASELINES + OURS + ABLATIONS)
    t2 = tables["table2"]
    lines = [
        "# masr reproduce",
        "",
        f"Data: `{data_path}`. Budget: "
        + (f"{config.time_limit:g} s per run" if config.time_limit else "no time limit")
        + f", at most {config.epochs} BPR / {config.adv_epochs} APR epochs, patience "
        f"{config.patience}, device {config.device}, "
        f"seed {config.seed}. Test split; sampled = the held-out song against its stored "
        "negatives, full = against every catalog song outside the playlist's training songs"
        + (f" ({config.full_sample} cases)." if config.full_sample else "."),
        "",
        "## Table 2: all models",
        "",
        *_metric_table([(_label(r, labels, tables["entities"]), t2[r])
                        for r in t2 if r not in dict(ABLATIONS)]),
        "",
        *_entities_section(tables["entities"], labels),
        *_paired_section(tables.get("paired", []), labels),
        *_figure(out, "fig4_hits.png", "Figure 4: hit@N of every model, N = 1..10", heading=True),
        "## Table 3: playlist and user embeddings",
        "",
        *_metric_table([(label, tables["table3"][r]) for r, label in TABLE3]),
        "",
        "## Table 4: MASS's attention",
        "",
        *_metric_table(list(tables["table4"].items()), "attention"),
        "",
        "## APR: fixed vs flexible noise",
        "",
        *_metric_table(
            [(f"{labels[r]} ({setting})", res) for setting, by_run in
             tables["apr_noise"].items() for r, res in by_run.items()],
            "run (noise)",
        ),
        "",
        "## Figure 5: embedding size",
        "",
        *_metric_table(
            [(f"{labels[r]} d={d}", res) for r, by_dim in tables["fig5_dims"].items()
             for d, res in by_dim.items()],
            "run",
        ),
        "",
        *_figure(out, "fig5_dims.png", "Figure 5"),
        "## Figure 6: attention weights against PMI attentive scores",
        "",
        "Pearson ρ over all member slots (the paper's), and within cases (each side's deviation",
        "from its case's mean 1/|members|: the member count left out; none for equal weights).",
        "",
        "| attention | Pearson ρ | ρ within cases | member slots | cases |",
        "|---|---:|---:|---:|---:|",
        *(f"| {a} | {rho_text(v, 'pearson')} | {rho_text(v, 'pearson_within')} | {v['pairs']} "
          f"| {v['cases']} |"
          for a, v in tables["fig6_attention"].items()),
        "",
        *_figure(out, "fig6_attention.png", "Figure 6"),
        "## Figure 7: seconds per training epoch (runs/main)",
        "",
        "| run | s/epoch | epochs | device |",
        "|---|---:|---:|---|",
        *(f"| {r} | {v['seconds_per_epoch']:.3f} | {v['epochs']} | {v['device']} |"
          for r, v in tables["fig7_speed"].items()),
        "",
        *_figure(out, "fig7_speed.png", "Figure 7"),
        "## Time per stage",
        "",
        *(f"- {title}: {s:.1f} s" for title, s in seconds.items()),
        "",
    ]
    path = out / "report.md"
    with atomic_file(path, "w") as fh:
        fh.write("\n".join(lines))
    return path
