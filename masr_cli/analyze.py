"""`masr analyze attention|speed`: the paper's Figures 6 and 7 over trained runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from masr.config import SPLITS
from masr_cli._common import choices, console, handle_errors, unwrap

NAME = "analyze"
HELP = """Analyses of trained runs, each a JSON table and a PNG: attention (Figure 6) and speed
(Figure 7)."""

Split = choices("Split", SPLITS)


def attention(
    runs: Annotated[
        list[Path],
        typer.Option(
            metavar="DIR",
            help="A run directory (runs/<run>) of a MASS model or a fusion; repeat for several, "
            "e.g. one per --set attention variant.",
            show_default=False,
        ),
    ],
    data: Annotated[
        Path, typer.Option(help="Prepared data directory the runs were trained on.")
    ] = Path("data"),
    out: Annotated[
        Path, typer.Option(help="Folder for attention.json and attention.png.")
    ] = Path("analysis"),
    split: Annotated[Split, typer.Option(help="Held-out split whose cases are used.")] = Split.test,
    cases: Annotated[
        int, typer.Option(help="Cases drawn with --seed (0 = every case).")
    ] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the --cases draw.")] = 0,
) -> None:
    """Pearson correlation between PMI attentive scores and learned attention weights.

    For each held-out song k of a playlist and each member song t, PMI(k, t) = log P(k, t) /
    (P(k) P(t)) over the training playlists, turned into a distribution over the members by a
    softmax (the paper's PMI attentive scores). Each run's MASS gives its attention weights
    (eq. 18) to the same members for the same song; the JSON holds Pearson's rho per run and
    the PNG one scatter per run, as the paper's Figure 6.

    Examples:

      masr analyze attention --runs runs/mass --runs runs-dot/mass --out analysis
    """
    from masr.analyze import attention_correlation
    from masr.atomic import atomic_file
    from masr.dataset import load_prepared
    from masr.errors import MasrError
    from masr.figures import plot_attention

    if cases < 0:
        raise MasrError("--cases must be >= 0 (0 = every case)")
    prepared = load_prepared(data)
    pairs = attention_correlation(prepared, runs, split=split.value, max_cases=cases, seed=seed)
    table = {p.label if p.label not in {q.run for q in pairs} else p.run: p.summary()
             for p in pairs}
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "attention.json", "w") as fh:
        json.dump(table, fh, indent=2)
        fh.write("\n")
    for p in pairs:
        console.print(f"{p.run} ({p.label}): rho = {p.pearson:.4f} over {len(p.pmi)} members")
    panels = {f"{p.label}\n{Path(p.run).parent.name}/{Path(p.run).name}":
              (p.pmi.tolist(), p.weight.tolist(), p.pearson) for p in pairs}
    plot_attention(panels, out / "attention.png")
    console.print(f"wrote {out / 'attention.json'} and {out / 'attention.png'}")


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
    device: the JSON records each run's device.

    Examples:

      masr analyze speed --runs runs --out analysis
    """
    from masr.analyze import epoch_seconds
    from masr.atomic import atomic_file
    from masr.errors import MasrError
    from masr.figures import plot_epoch_seconds

    dirs: list[Path] = []
    for path in runs:
        dirs += [path] if (path / "run.json").is_file() else sorted(p for p in path.iterdir()
                                                                     if p.is_dir())
    table = epoch_seconds(dirs)
    if not table:
        raise MasrError(f"--runs {', '.join(map(str, runs))}: no trained run with epochs")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / "speed.json", "w") as fh:
        json.dump(table, fh, indent=2)
        fh.write("\n")
    plot_epoch_seconds({k: v["seconds_per_epoch"] for k, v in table.items()}, out / "speed.png")
    console.print(f"wrote {out / 'speed.json'} and {out / 'speed.png'}")


app = typer.Typer(name=NAME, help=unwrap(HELP), no_args_is_help=True, add_completion=False)
for _command in (attention, speed):
    app.command(name=_command.__name__, help=unwrap(_command.__doc__))(handle_errors(_command))
