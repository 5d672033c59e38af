"""`masr reproduce`: the paper's Tables 2-4 and Figures 4-7 from one command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from masr.config import ReproduceConfig
from masr_cli._common import Device, Threads, console, cpu_threads_line, governed, log_after

NAME = "reproduce"

_R = ReproduceConfig()


def command(
    data: Annotated[
        Path, typer.Option(help="Prepared data directory (output of `masr prep`).")
    ] = Path("data"),
    out: Annotated[
        Path, typer.Option(help="Folder for the runs, the JSON tables, the PNGs and report.md.")
    ] = Path("results"),
    time_limit: Annotated[
        float,
        typer.Option(
            help="Seconds of training and validation per run, checked at every step, with "
            "room kept for each epoch's validation (as `masr train --time-limit`); "
            "0 = no limit (every run then ends by --patience or --epochs)."
        ),
    ] = _R.time_limit,
    epochs: Annotated[int, typer.Option(help="BPR epochs per run at most.")] = _R.epochs,
    adv_epochs: Annotated[int, typer.Option(help="APR epochs per run at most.")] = _R.adv_epochs,
    patience: Annotated[
        int,
        typer.Option(
            help="Stop a run after this many epochs without a better validation; 0 = never."
        ),
    ] = _R.patience,
    dims: Annotated[
        str, typer.Option(help="Figure 5's embedding sizes, comma-separated.")
    ] = ",".join(map(str, _R.dims)),
    dim_chain: Annotated[
        str,
        typer.Option(help="Figure 5's models at each size: masr (MDR, MASS, MASR) or amasr."),
    ] = _R.dim_chain,
    full_sample: Annotated[
        int,
        typer.Option(help="Full-ranking test cases per model, a seeded sample; 0 = all."),
    ] = _R.full_sample,
    attention_cases: Annotated[
        int, typer.Option(help="Figure 6's test cases (0 = all).")
    ] = _R.attention_cases,
    baselines: Annotated[
        bool, typer.Option(help="Train Table 2's baselines too.")
    ] = _R.baselines,
    entities: Annotated[
        str,
        typer.Option(
            metavar="<both|default>",
            help="both: every baseline with an --entity (MF-BPR, CML, NeuMF++, CMN++, PRME, "
            "TransRec, Caser, ALS) is trained user- and playlist-based, and Table 2 keeps the "
            "one with the better validation hit@10, as the paper did; default: each at its "
            "default entity only (half their training time).",
        ),
    ] = _R.entities,
    device: Annotated[Device, typer.Option(help="auto picks CUDA when present.")] = Device.auto,
    seed: Annotated[int, typer.Option(help="Seed of every run and sample.")] = _R.seed,
    threads: Threads = 0,
) -> None:
    """Train and evaluate what the paper's Tables 2-4 and Figures 4-7 need, on one dataset.

    Table 2: the AMASR chain and every baseline (user- and playlist-based, the better on
    validation kept: --entities). Table 3: mdr_us, mdr_ps, mass_ups, mass_ps.
    Table 4: MASS under each --set attention variant. APR with fixed and flexible noise, eps
    0.5 and 1.0. Figure 5: the models at each embedding size. Figure 6: attention weights
    against PMI attentive scores. Figure 7: seconds per training epoch. Every run gets the
    same --time-limit; a run that finished before with the same settings is reused, so an
    interrupted reproduce continues. Writes the runs, one JSON per table, the PNGs (with
    matplotlib, the masr\\[plot] extra) and report.md under --out.

    Examples:

      masr prep --out data

      masr reproduce --data data --out results --time-limit 300

      masr reproduce --data aotm --time-limit 0 --patience 10
    """
    from masr.reproduce import reproduce

    config = ReproduceConfig(
        time_limit=time_limit,
        epochs=epochs,
        adv_epochs=adv_epochs,
        patience=patience,
        dims=_dims(dims),
        dim_chain=dim_chain,
        full_sample=full_sample,
        attention_cases=attention_cases,
        baselines=baselines,
        entities=entities,
        device=device.value,
        seed=seed,
    )
    log = log_after(cpu_threads_line(threads, device.value))
    with governed(threads, device.value, log):
        result = reproduce(data, out, config, log=log)
    for title, seconds in result.seconds.items():
        console.print(f"{title}: {seconds:.1f} s")
    console.print(f"wrote {result.report}")


def _dims(text: str) -> tuple[int, ...]:
    from masr.errors import MasrError

    try:
        sizes = tuple(int(part) for part in text.split(","))  # an empty part fails too
    except ValueError:
        raise MasrError(f"--dims {text}: expected sizes like 8,16,32,64") from None
    if len(set(sizes)) != len(sizes):
        raise MasrError(f"--dims {text}: a size is given twice; give each once")
    return sizes
