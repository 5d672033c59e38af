"""`masr evaluate`: hit@N / ndcg@N of trained runs, sampled and full-ranking protocols."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from masr.config import SPLITS
from masr_cli._common import (
    Device,
    RunsData,
    Threads,
    choices,
    console,
    cpu_threads_line,
    governed,
    log_after,
    log_line,
)

NAME = "evaluate"


Split = choices("Split", SPLITS)


def command(
    data: RunsData = Path("data"),
    runs: Annotated[Path, typer.Option(help="Runs directory (output of `masr train`).")] = Path(
        "runs"
    ),
    model: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="Run to evaluate; repeat for several (--model mdr --model amasr). "
            "'all' (the default) = every run in --runs.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json",
            metavar="PATH",
            help='Write {"<run>": {"sampled": {"hit@1": ..., "ndcg@10": ...}, "full": {...}}} '
            "here; '-' prints it on stdout.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write the hit@N curves (N = 1..10, both protocols) as a PNG (needs matplotlib).",
            show_default=False,
        ),
    ] = None,
    split: Annotated[
        Split, typer.Option(help="Held-out split to score; model selection used 'valid'.")
    ] = Split.test,
    device: Annotated[Device, typer.Option(help="auto picks CUDA when present.")] = Device.auto,
    full_sample: Annotated[
        int,
        typer.Option(
            help="Full ranking on this many cases only, drawn with --sample-seed (the same for "
            "every model); 0 = all. Full ranking costs cases x catalog, so large data may want "
            "a sample; the sampled protocol always uses every case.",
        ),
    ] = 0,
    sample_seed: Annotated[int, typer.Option(help="Seed of the --full-sample draw.")] = 0,
    alpha: Annotated[
        list[float] | None,
        typer.Option(
            metavar="A",
            help="Also evaluate every fusion run (masr, amasr) with its MDR part weighted by "
            "this α instead of its own (eq. 20), as <run>@α=<α>; repeatable. Shows what "
            "another fusion weight would give without retraining. To pick one, compare them "
            "with --split valid (as `masr train --alpha auto` does), never on the test split "
            "you report, then export it with `masr export --alpha`.",
            show_default=False,
        ),
    ] = None,
    candidates: Annotated[
        int,
        typer.Option(
            help="Also rank in two stages, as `masr score --candidates N`: MDR's full distance "
            "proposes N songs per case, each run's own distance ranks the held-out song among "
            "them (a song not proposed is a miss). Prints exact and two-stage full hit@10 side "
            'by side; --json adds "two_stage" per run. 0 = exact only.',
        ),
    ] = 0,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile/--no-compile",
            help="On a CPU, rank the whole catalog with MASS's scores (MASS, AMASS, the "
            "fusions) through torch.compile (about a third off their full ranking, after "
            "seconds of compiling; without a C++ compiler it goes on eagerly). Same ranks up "
            "to float rounding.",
        ),
    ] = True,
    significance: Annotated[
        bool,
        typer.Option(
            "--significance",
            help="Also compare runs case by case on the same cases: each of masr's models "
            "against the best baseline of each protocol, and the paper's orderings (AMDR vs "
            "MDR, AMASS vs MASS, AMASR vs MASR, each fusion vs its better part). Prints the "
            "difference in hit@10 and ndcg@10 with its 95% interval and McNemar's exact "
            'p-value for hit@10; --json adds "se" per run and "_paired".',
        ),
    ] = False,
    threads: Threads = 0,
) -> None:
    """Score trained runs on the held-out songs, as the paper's Table 2 and Fig. 4.

    Two protocols. sampled (the paper's): each held-out song is ranked against the negatives
    stored with its case. full: against every catalog song not among the playlist's training
    songs. Ties count against the held-out song. Prints hit@10 / ndcg@10 in the layout of the
    paper's Table 2 (with the relative improvement of MASR/AMASR over the best baseline) on
    stderr; --json writes hit@N and ndcg@N for N = 1..10.

    Examples:

      masr evaluate                                  # every run, test split

      masr evaluate --model mdr --model amasr --json - > metrics.json

      masr evaluate --split valid --plot hits.png
    """
    from masr.atomic import check_creatable, check_not_inside, check_output_file
    from masr.dataset import load_prepared
    from masr.errors import MasrError
    from masr.figures import pyplot
    from masr.report import (
        comparison_rows,
        evaluate_runs,
        paired_comparisons,
        plot_hit_curves,
        to_jsonable,
        write_json,
    )
    from masr.runs.store import check_not_run_file

    if plot is not None and plot.suffix.lower() != ".png":
        raise MasrError(f"--plot {plot}: the plot is a PNG; give a path ending in .png")
    if plot is not None:
        check_output_file(plot, "--plot")  # before the evaluation, not after it
    if json_out not in (None, "-"):
        target = Path(json_out)
        if not json_out.strip() or target.is_dir():
            raise MasrError(f"--json {json_out!r}: give a file name (or - for stdout)")
        check_output_file(target, "--json")
        if plot is not None and target.resolve() == plot.resolve():
            raise MasrError(f"--json {json_out}: the same file as --plot; give two names")
    # masr prep replaces the data folder (QA: --json written over its manifest.json)
    for option, path in (("--json", json_out), ("--plot", plot)):
        if path not in (None, "-"):
            check_not_inside(path, data, option)
            check_not_run_file(path, option)  # QA: --json runs/mdr/best.pt replaced it
            check_creatable(path, option)  # QA: --json /sys/x.json failed after the work
    if plot is not None:  # QA: a missing matplotlib was said after the whole evaluation
        pyplot("--plot")  # the one error line naming the optional extra
    prepared = load_prepared(data)
    log = log_after(cpu_threads_line(threads, device.value))
    names = model or ["all"]
    ranks: dict | None = {} if significance else None
    with governed(threads, device.value, log):
        results = evaluate_runs(
            prepared,
            runs,
            names,
            split=split.value,
            device=device.value,
            full_sample=full_sample,
            sample_seed=sample_seed,
            alphas=alpha or (),
            candidates=candidates,
            compile=compile_,
            log=log,
            ranks_out=ranks,
        )
    cases = prepared.test if split is Split.test else prepared.valid
    counts = (cases.negatives >= 0).sum(1).tolist() or [0]  # fewer on a small catalog
    negatives = f"{max(counts)}" if min(counts) == max(counts) else f"up to {max(counts)}"
    full_n = len(cases) if not full_sample else min(full_sample, len(cases))
    full_of = "" if full_n == len(cases) else f" ({full_n} cases drawn with seed {sample_seed})"
    table = Table(
        title=f"{split.value} split, {len(cases)} playlists: sampled = held-out song vs its "
        f"{negatives} stored negatives; full{full_of} = vs every song of the "
        f"{prepared.n_songs}-song catalog outside the playlist's training songs",
        title_justify="left",
    )
    table.add_column("", style="dim")
    table.add_column("Method")
    for head in ("sampled hit@10", "sampled ndcg@10", "full hit@10", "full ndcg@10"):
        table.add_column(head, justify="right")
    group_title = {
        "baseline": "Baselines",
        "ours": "Ours",
        "improvement": "Imprv. (%)",
        "ablation": "Ablations",
    }
    previous = None
    for row in comparison_rows(results):
        if previous is not None and row.group != previous:
            table.add_section()
        label = group_title[row.group] if row.group != previous else ""
        previous = row.group
        if row.values is None:
            table.add_row(label, row.label, *(["[dim]not yet run[/dim]"] + [""] * 3))
        elif row.group == "improvement":
            table.add_row(label, row.label, *(_pct(v) for v in row.values))
        else:
            table.add_row(label, row.label, *(_num(v) for v in row.values))
    console.print(table)
    if candidates:
        console.print(two_stage_table(results, min(candidates, prepared.n_songs)))
    payload: dict = results  # what --json writes: the runs, and the comparisons when asked
    if ranks is not None:
        from masr.significance import standard_errors

        paired = paired_comparisons(results, ranks)
        if paired:
            console.print(paired_table(paired, split.value))
        else:
            log_line(
                "--significance: nothing to compare among these runs (it pairs masr's models "
                "with the best baseline and with each other: AMDR vs MDR, AMASR vs MASR ...)"
            )
        for run, by_protocol in ranks.items():
            if run in results:
                results[run]["se"] = {p: standard_errors(r) for p, r in by_protocol.items()}
        payload = {**results, "_paired": paired}
    if json_out == "-":
        sys.stdout.write(json.dumps(to_jsonable(payload), indent=2) + "\n")
    elif json_out is not None:
        write_json(payload, json_out)
        console.print(f"wrote {json_out}")
    if plot is not None:
        plot_hit_curves(results, plot, title=split.value)
        console.print(f"wrote {plot}")


def paired_table(paired: list[dict], split: str) -> Table:
    """``--significance``: one row per comparison (a section per protocol and kind: against
    the best baseline, then the paper's orderings): Δ hit@10 with the half-width of its 95%
    interval, McNemar's p, and the same Δ for ndcg@10 (both runs' figures: the table above)."""
    from masr.significance import interval_text

    table = Table(
        title=f"{split} split, paired on the same cases: Δ = run - vs, ± its 95% interval; "
        "p = McNemar's exact test (hit@10)",
        title_justify="left",
    )
    for head in ("", "run", "vs", "Δ hit@10", "p", "Δ ndcg@10"):
        table.add_column(head, justify="left" if head in ("", "run", "vs") else "right")
    previous = None
    for e in paired:
        group = (e["protocol"], e["why"] == "best baseline")
        if previous is not None and group != previous:
            table.add_section()
        hit, ndcg = e["hit@10"], e["ndcg@10"]
        table.add_row(
            e["protocol"] if group != previous else "",
            e["run_label"],
            e["against_label"],
            interval_text(hit),
            f"{hit['p']:.2g}",
            interval_text(ndcg),
        )
        previous = group
    return table


def two_stage_table(results: dict, candidates: int) -> Table:
    """Full-protocol hit@10 exact and in two stages (MDR proposes ``candidates`` songs)."""
    table = Table(
        title=f"full ranking, exact vs two-stage: an MDR proposes {candidates} songs per case "
        "(a fusion's own MDR part, else the mdr run), the run ranks them",
        title_justify="left",
    )
    for head in ("run", "exact hit@10", "two-stage hit@10", "held-out song proposed"):
        table.add_column(head, justify="left" if head == "run" else "right")
    for run, res in results.items():
        two = res.get("two_stage")
        if two is not None:
            exact = res.get("full", {}).get("hit@10")
            table.add_row(run, _num(exact), _num(two["hit@10"]), f"{two['proposed']:.1%}")
    return table


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}"
