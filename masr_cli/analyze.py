"""`masr analyze dims|attention|speed`: the paper's Figures 5, 6 and 7 over trained runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from masr.config import SPLITS
from masr_cli._common import (
    Device,
    RunsData,
    Threads,
    choices,
    console,
    cpu_threads_line,
    governed,
    handle_errors,
    log_after,
    log_line,
    unwrap,
)

NAME = "analyze"
HELP = """Analyses of trained runs, each a JSON table and a PNG: dims (Figure 5), attention
(Figure 6) and speed (Figure 7)."""

Split = choices("Split", SPLITS)
#: the most --bootstrap resamples (each recomputes both rho over every case)
MAX_BOOTSTRAP = 100_000


def dims(
    runs: Annotated[
        list[Path],
        typer.Option(
            metavar="DIR",
            help="A runs directory trained at one --dim (every run in it with an embedding "
            "size) or one run directory; repeat for each size.",
            show_default=False,
        ),
    ],
    data: RunsData = Path("data"),
    out: Annotated[
        Path, typer.Option(help="Folder for dims.json and dims.png.")
    ] = Path("analysis"),
    model: Annotated[
        list[str],
        typer.Option(metavar="RUN", help="Only these runs (repeatable), e.g. mdr, mass, masr."),
    ] = ["all"],  # noqa: B006 - typer reads the default, nothing mutates it
    split: Annotated[Split, typer.Option(help="Held-out split that is evaluated.")] = Split.test,
    full_sample: Annotated[
        int, typer.Option(help="Full-ranking cases per run, drawn with --seed; 0 = all.")
    ] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the --full-sample draw.")] = 0,
    device: Annotated[Device, typer.Option(help="auto picks CUDA when present.")] = Device.auto,
    threads: Threads = 0,
) -> None:
    """Quality against the embedding size d, as the paper's Figure 5.

    Train the same models at several sizes, one runs directory per size (e.g. `masr train
    --model masr --dim 16 --runs runs-d16`), then name the directories here. Each run is
    evaluated under both protocols (sampled: 100 negatives; full: the whole catalog) and keyed
    by the d in its run.json. The JSON is {run: {d: {protocol: metrics}}}; the PNG plots
    hit@10 and ndcg@10 against d, one line per run, one row of panels per protocol. `masr
    reproduce` draws the same figure for the sizes of its --dims.

    Examples:

      masr analyze dims --runs runs-d8 --runs runs-d16 --runs runs --out analysis

      masr analyze dims --runs runs-d8 --runs runs --model mdr --full-sample 2000
    """
    from rich.table import Table

    from masr.analyze import quality_by_dim
    from masr.atomic import atomic_file
    from masr.dataset import load_prepared
    from masr.figures import maybe, plot_dims
    from masr.seed import check_seed

    check_seed(seed, "--seed")
    _check_out(out, "dims")  # before the evaluation, not after it
    prepared = load_prepared(data)
    log = log_after(cpu_threads_line(threads, device.value))
    with governed(threads, device.value, log):
        table = quality_by_dim(prepared, runs, model, split=split.value, device=device.value,
                               full_sample=full_sample, seed=seed, log=log)
    _out_folder(out)
    with atomic_file(out / "dims.json", "w") as fh:
        json.dump(table, fh, indent=2)
        fh.write("\n")
    view = Table("run", "d", "sampled hit@10", "sampled ndcg@10", "full hit@10", "full ndcg@10",
                 title=f"{split.value}: quality against the embedding size")
    for run, by_dim in table.items():
        for d, res in by_dim.items():
            view.add_row(run, d, *(f"{res.get(p, {}).get(m, float('nan')):.4f}"
                                   for p in ("sampled", "full") for m in ("hit@10", "ndcg@10")))
    console.print(view)
    _wrote(out / "dims.json", maybe(plot_dims, table, out / "dims.png"))


def attention(
    runs: Annotated[
        list[Path],
        typer.Option(
            metavar="DIR",
            help="A run directory (runs/<run>) of a MASS model or a fusion, or a runs "
            "directory (its MASS runs: mass, amass, the ablations); repeat for several, e.g. "
            "one per --set attention variant.",
            show_default=False,
        ),
    ],
    data: RunsData = Path("data"),
    out: Annotated[
        Path, typer.Option(help="Folder for attention.json and attention.png.")
    ] = Path("analysis"),
    split: Annotated[Split, typer.Option(help="Held-out split whose cases are used.")] = Split.test,
    cases: Annotated[
        int, typer.Option(help="Cases drawn with --seed (0 = every case).")
    ] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the --cases draw.")] = 0,
    bootstrap: Annotated[
        int,
        typer.Option(help="Resamples of the cases (with --seed) for the standard errors of rho "
                     f"(pearson_se, pearson_within_se): 0 = none, else 2 to {MAX_BOOTSTRAP:,}."),
    ] = 200,
    threads: Threads = 0,
) -> None:
    """Pearson correlation between PMI attentive scores and learned attention weights.

    For each held-out song k of a playlist and each member song t, PMI(k, t) = log P(k, t) /
    (P(k) P(t)) over the training playlists, turned into a distribution over the members by a
    softmax (the paper's PMI attentive scores). Each run's MASS gives its attention weights
    (eq. 18) to the same members for the same song; the JSON holds Pearson's rho per run and
    the PNG one scatter per run, as the paper's Figure 6. A run given twice is analysed once;
    an unfinished run is analysed with a warning; a run whose run.json is unreadable or not
    what masr train writes is left out with a warning.

    The JSON is keyed by each run's attention label (mem-metric, mem-dot, "mem-metric
    (user+playlist)") when no two runs share one; otherwise every run is keyed by its name as
    in analyze speed (mass; runs-dot/mass where two runs share a name; the whole path where
    even that repeats). Each row holds the run's path ("run") and label ("attention").

    Both sides sum to 1 over a playlist's members, so the pooled rho also rewards weights
    that only follow the member count (equal weights, --set attention=none, score well on
    it). pearson_within is rho of each side's deviation from 1/|members|: whether a model
    weights the same members as PMI does (none for equal weights).

    Examples:

      masr analyze attention --runs runs/mass --runs runs-dot/mass --out analysis

      masr analyze attention --runs runs    # every MASS run in it
    """
    from masr.analyze import attention_correlation, attention_keys, rho_text
    from masr.atomic import atomic_file
    from masr.dataset import load_prepared
    from masr.errors import MasrError
    from masr.figures import maybe, plot_attention
    from masr.seed import check_seed

    if cases < 0:
        raise MasrError("--cases must be >= 0 (0 = every case)")
    if bootstrap < 0 or bootstrap == 1 or bootstrap > MAX_BOOTSTRAP:
        raise MasrError(f"--bootstrap {bootstrap}: must be 0 (no standard errors) or from 2 to "
                        f"{MAX_BOOTSTRAP:,} resamples")
    check_seed(seed, "--seed")
    _check_out(out, "attention")
    prepared = load_prepared(data)
    log = log_after(cpu_threads_line(threads, "cpu"))
    pairs = attention_correlation(
        prepared, _mass_runs(runs, log), split=split.value, max_cases=cases, seed=seed, log=log
    )
    keys = attention_keys(pairs)
    rows = [{"attention": p.label, **p.summary(bootstrap, seed)} for p in pairs]
    table = dict(zip(keys, rows, strict=True))
    _out_folder(out)
    with atomic_file(out / "attention.json", "w") as fh:
        json.dump(table, fh, indent=2)
        fh.write("\n")
    constant = "undefined (constant weights)"
    for p, row in zip(pairs, rows, strict=True):
        console.print(f"{p.run} ({p.label}): rho = {rho_text(row, 'pearson', constant)}, "
                      f"within cases {rho_text(row, 'pearson_within', constant)}, over "
                      f"{len(p.pmi)} members")
    panels = {key if key == p.label else f"{p.label}\n{key}":
              (p.pmi.tolist(), p.weight.tolist(), p.pearson, p.pearson_within)
              for key, p in zip(keys, pairs, strict=True)}
    _wrote(out / "attention.json", maybe(plot_attention, panels, out / "attention.png"))


def _mass_runs(paths: list[Path], log: Callable[[str], None]) -> list[Path]:
    """``--runs`` of ``attention``: a run directory as given; a runs directory as the MASS
    runs in it (run.json's model "mass": MASS, AMASS, the Table 3 ablations; not the fusions,
    which hold the same MASS parts). A run in it whose run.json is unreadable or not what
    ``masr train`` writes is left out, with a line to ``log``."""
    from masr.analyze import run_info
    from masr.errors import MasrError
    from masr.runs import available_runs

    dirs: list[Path] = []
    for path in paths:
        if (path / "best.pt").is_file() or not path.is_dir():
            dirs.append(path)  # a run (or a missing path: attention_correlation says so)
            continue
        found = []
        for run in available_runs(path):
            info, problem = run_info(path / run)
            if problem is not None:
                log(problem)
            elif (info or {}).get("model") == "mass":
                found.append(path / run)
        if not found:
            raise MasrError(f"--runs {path}: no best.pt, and no MASS run in it (give run "
                            "directories, runs/<run>, or a runs directory with a MASS run)")
        dirs += found
    return dirs


def _wrote(table: Path, png: Path | None) -> None:
    """The closing line: what was written, and why there is no PNG when there is none."""
    if png is None:
        from masr.figures import NO_MATPLOTLIB

        console.print(NO_MATPLOTLIB, markup=False)
        console.print(f"wrote {table}")
    else:
        console.print(f"wrote {table} and {png}")


def speed(
    runs: Annotated[
        list[Path],
        typer.Option(
            metavar="DIR",
            help="A runs directory (every run in it) or one run directory; repeatable.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="Folder for speed.json and speed.png.")
    ] = Path("analysis"),
) -> None:
    """Seconds per training epoch of every trained run, as the paper's Figure 7.

    Reads the per-epoch training time in each run.json (validation excluded); fitted and fused
    runs have no epochs and are left out. Compare only runs trained on the same data and
    device, with the same number of processes: the JSON records each run's device and
    torchrun's data-parallel processes (1 when not under torchrun). A run resumed with another
    number of processes is timed by the epochs of its latest number alone (stderr says so).

    Examples:

      masr analyze speed --runs runs --out analysis
    """
    from rich.table import Table

    from masr.analyze import epoch_seconds
    from masr.atomic import atomic_file
    from masr.errors import MasrError
    from masr.figures import maybe, plot_epoch_seconds

    _check_out(out, "speed")
    dirs: list[Path] = []
    for path in runs:
        dirs += [path] if (path / "run.json").is_file() else sorted(p for p in path.iterdir()
                                                                     if p.is_dir())
    table = epoch_seconds(dirs, log_line)
    if not table:
        raise MasrError(f"--runs {', '.join(map(str, runs))}: no trained run with epochs")
    _out_folder(out)
    with atomic_file(out / "speed.json", "w") as fh:
        json.dump(table, fh, indent=2)
        fh.write("\n")
    png = maybe(plot_epoch_seconds, {k: v["seconds_per_epoch"] for k, v in table.items()},
                out / "speed.png")
    shown = Table(title="seconds per training epoch (validation excluded)")
    for column in ("run", "model", "s/epoch", "epochs", "device"):
        shown.add_column(column, justify="left" if column in {"run", "model"} else "right")
    for run, row in table.items():
        processes = row.get("processes", 1)
        device = str(row["device"]) + (f" × {processes} processes" if processes > 1 else "")
        shown.add_row(run, str(row["model"]), f"{row['seconds_per_epoch']:.2f}",
                      str(row["epochs"]), device)
    console.print(shown)
    _wrote(out / "speed.json", png)


app = typer.Typer(name=NAME, help=unwrap(HELP), no_args_is_help=True, add_completion=False)
for _command in (dims, attention, speed):
    app.command(name=_command.__name__, help=unwrap(_command.__doc__))(handle_errors(_command))


def _check_out(out: Path, stem: str) -> None:
    """One clear line, before the work, for an --out folder that cannot be written or would
    go with a prepared data folder (``masr.analyze.check_out_folder``), or whose STEM.json or
    STEM.png is a folder (QA: dims.json was written, then dims.png failed)."""
    from masr.analyze import check_out_folder
    from masr.errors import MasrError

    check_out_folder(out)
    for name in (f"{stem}.json", f"{stem}.png"):
        if (out / name).is_dir():
            raise MasrError(
                f"--out {out}: its {name} is a folder, where this command writes a file; "
                "remove it or choose another --out"
            )


def _out_folder(out: Path) -> None:
    """Create the --out folder (checked by ``_check_out`` before the work; here only that it
    did not become a file meanwhile)."""
    from masr.analyze import OUT_WRITES
    from masr.atomic import check_output_dir

    check_output_dir(out, "--out", OUT_WRITES, creatable=False)
    out.mkdir(parents=True, exist_ok=True)
