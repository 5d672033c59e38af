"""`masr score`: recommend songs for every playlist of a file with an exported model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from masr.config import SCORE_ENGINES, SCORE_FORMATS, ScoreConfig
from masr_cli._common import Device, choices, console, log_line

NAME = "score"

Engine = choices("Engine", SCORE_ENGINES)
Format = choices("Format", SCORE_FORMATS)
_S = ScoreConfig()


def command(
    input: Annotated[
        Path,
        typer.Argument(
            metavar="INPUT",
            help="Playlists to continue, in the `masr prep` input format: one row per member "
            "song with user, playlist and track ids (CSV with commas, semicolons or pipes, "
            "TSV or Parquet, optionally gzipped, or a directory of Parquet parts; MPD JSON "
            "slices, e.g. its challenge set; - reads standard input). "
            "Ids are the original strings; playlists and users may be new.",
            show_default=False,
        ),
    ],
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            "-m",
            help="Exported model (masr export); its metadata JSON and id maps sit next to it.",
        ),
    ] = Path("exported/masr.onnx"),
    k: Annotated[int, typer.Option("--k", "-k", help="Songs to recommend per playlist.")] = 10,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write the CSV here (written aside, renamed when complete) instead of stdout "
            "(- = stdout); with --format parquet, a directory.",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            help="local: this process; ray: Ray Data batch inference over a Ray cluster "
            "(pip install 'masr\\[ray]'), the same rows.",
        ),
    ] = Engine.local,
    out_format: Annotated[
        Format,
        typer.Option(
            "--format",
            help="csv, or parquet: Parquet parts written by the Ray workers into the --out "
            "directory (--engine ray).",
        ),
    ] = Format.csv,
    workers: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Concurrent ONNX Runtime calls: threads (local, CPU) or Ray actors "
            "\\[default: one per CPU core; ray: per CPU, or GPU, of the cluster].",
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        Device,
        typer.Option(help="ONNX Runtime device: auto = CUDA when it can really be used, else CPU."),
    ] = Device.auto,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Playlists per ONNX Runtime call \\[default: 16 on CPU, 512 on CUDA].",
            show_default=False,
        ),
    ] = None,
    read_rows: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Input rows read and scored at a time: memory holds about one such chunk "
            "(with its playlists' recommendations) when each playlist's rows are adjacent; "
            "lower it for a deep --k on a small machine.",
        ),
    ] = _S.read_rows,
    candidates: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Songs MDR proposes per playlist for the fusion to re-rank, in a two-stage "
            "export (masr export --candidates) \\[default: the export's]; N >= the catalog "
            "gives the exact export's rankings. An exact export refuses it.",
            show_default=False,
        ),
    ] = None,
    user_col: Annotated[
        str | None,
        typer.Option(
            help="Input column holding the user id \\[default: the name in the model's "
            "training data (masr prep --user-col), else user_id].",
            show_default=False,
        ),
    ] = None,
    playlist_col: Annotated[
        str | None,
        typer.Option(
            help="Input column holding the playlist id (a playlist's key) \\[default: as in "
            "the model's training data, else playlist_id].",
            show_default=False,
        ),
    ] = None,
    track_col: Annotated[
        str | None,
        typer.Option(
            help="Input column holding the track id \\[default: as in the model's training "
            "data, else track_id].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Recommend K new songs for every playlist in INPUT, offline, with ONNX Runtime (no torch).

    Writes CSV `playlist_id,rank,track_id,score` to stdout (or --out): K rows per playlist in
    input order, rank 1 best, score = the negated fused distance (higher is better). A
    playlist's own songs are never recommended. New playlists are folded in from their known
    songs; unknown songs are ignored; a new playlist with no known song is ranked by its
    user's taste, then by popularity (an export without MDR, α 0: by MASS's song biases
    alone), a known one by its trained playlist vector.
    Logs and the summary line go to stderr. --engine ray spreads the same scoring over a Ray
    cluster's actors.

    Example: masr score examples/playlists.csv > recs.csv
    """
    from masr.score import (
        check_candidates,
        check_model_path,
        export_metadata,
        input_columns,
        score_file,
    )

    config = ScoreConfig(
        k=k,
        batch_size=batch_size,
        device=device.value,
        candidates=candidates,
        workers=workers,
        read_rows=read_rows,
        engine=engine.value,
        out_format=out_format.value,
        columns=None,
    )
    config.validate()
    # each id column as named, else as in the model's training data (its export's metadata)
    given = {"user": user_col, "playlist": playlist_col, "track": track_col}
    path = check_model_path(model)
    meta = export_metadata(path)
    check_candidates(meta, config, path)  # before the columns' line: a refusal stands alone
    columns = input_columns(path, given, log_line, metadata=meta)
    config = replace(config, columns=columns)
    # `-` or a pipe: spooled; the metadata read and checked above, not again
    summary = score_file(input, model, out, config, log=log_line, metadata=meta)
    console.print(summary.line(), highlight=False, soft_wrap=True)
    warning = summary.warning()
    if warning:
        log_line(warning)
