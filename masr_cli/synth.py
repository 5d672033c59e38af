"""`masr synth`: write the embedded synthetic dataset to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from masr.synth import SynthConfig, write_synthetic
from masr_cli._common import console

NAME = "synth"


def command(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="File to write: .csv, .tsv or .parquet, with .gz for gzipped CSV/TSV.",
        ),
    ],
    seed: Annotated[int, typer.Option(help="Seed of the generator (same seed, same rows).")] = 0,
    users: Annotated[int, typer.Option(help="Number of users (about 5 playlists each).")] = 1000,
) -> None:
    """Write the embedded synthetic playlist dataset (the one `masr prep` uses without INPUT).

    Users have a few taste themes; each playlist follows one theme, often around two artists,
    with power-law song popularity and some noise. Columns: user_id, playlist_id, track_id,
    position, track_name, artist_name. `masr synth --out p.csv && masr prep p.csv` gives the
    same prepared data as `masr prep`.
    """
    rows = write_synthetic(out, SynthConfig(users=users, seed=seed))
    console.log(f"wrote {rows:,} rows ({users:,} users, seed {seed}) to {out}")
