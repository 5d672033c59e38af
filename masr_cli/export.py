"""`masr export`: the trained MASR / AMASR (or one part) as one ONNX file plus id maps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from masr.config import EXPORT_CHUNK, EXPORT_KINDS, FOLD_IN_MODES, UNKNOWN_USER_MODES
from masr_cli._common import choices, console, log_line

NAME = "export"


Kind = choices("Kind", EXPORT_KINDS)
FoldIn = choices("FoldIn", FOLD_IN_MODES)
UnknownUser = choices("UnknownUser", UNKNOWN_USER_MODES)


def command(
    runs: Annotated[
        Path,
        typer.Option(
            help="Runs directory written by masr train (its run.json files "
            "lead to the prepared data and its id maps)."
        ),
    ] = Path("runs"),
    model: Annotated[
        Kind | None,
        typer.Option(
            help="What to export \\[default: amasr when runs/amdr and runs/amass (or "
            "runs/amasr) exist, else masr]. amasr/masr fuse the MDR and MASS parts (eq. 20); "
            "the others export one part.",
            show_default=False,
        ),
    ] = None,
    alpha: Annotated[
        float | None,
        typer.Option(
            help="Weight of MDR in the fusion, o = α·MDR + (1-α)·MASS \\[default: the fusion "
            "run's, else 0.5].",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        str,  # as typed: a trailing "/" (a folder meant) is lost in a Path
        typer.Option(
            "--out",
            "-o",
            metavar="PATH",
            help="ONNX file to write; the metadata JSON and the id maps go next to it.",
        ),
    ] = "exported/masr.onnx",
    data: Annotated[
        Path | None,
        typer.Option(
            help="Prepared data the runs were trained on \\[default: found through run.json].",
            show_default=False,
        ),
    ] = None,
    chunk: Annotated[
        int,
        typer.Option(
            help="Catalog songs per step of the graph's MASS loop. 256 is cache-sized, the "
            "fastest measured on CPU; for scoring on CUDA use one step over the whole catalog "
            "(any value >= its size, e.g. 65536: 3.3x faster on an H200). Rankings do not "
            "depend on it (scores only by float32 rounding).",
        ),
    ] = EXPORT_CHUNK,
    external_data: Annotated[
        bool,
        typer.Option(
            "--external-data",
            help="Write the weights to NAME.weights beside the model --out NAME (ONNX external "
            "data; exported/masr.onnx.weights for the default --out) even when one file would "
            "do; done anyway past protobuf's 2 GB limit. masr score still takes the one --model "
            "path.",
        ),
    ] = False,
    fold_in: Annotated[
        FoldIn,
        typer.Option(
            help="How a playlist the model never saw gets its MDR vector (eq. 11) from its "
            "songs: map = an affine map of their mean and the user's vector, fitted on the "
            "training playlists (on AOTM-2011 playlists held out of training, AMASR's "
            "full-ranking hit@10 on test 0.0515 instead of 0.0373); mean = the plain mean of "
            "their vectors. Known playlists keep their learned vectors either way.",
        ),
    ] = FoldIn("map"),
    unknown_user: Annotated[
        UnknownUser,
        typer.Option(
            help="The MDR user term of a user the model never saw: members = from the "
            "playlist's songs, as a new playlist's vector is (on the embedded data, new "
            "playlist and user ids: hit@10 0.3280 against 0.2885); drop = no user term "
            "(exported/README.md, Unknown users).",
        ),
    ] = UnknownUser("members"),
    candidates: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Build the two-stage graph: MDR's one GEMM (eq. 11) proposes N songs per "
            "playlist and the fusion re-ranks only those, much faster on large catalogs; N is "
            "recorded and is masr score's default (masr score --candidates changes it). "
            "amasr/masr only \\[default: exact, every song scored].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export the trained model to one ONNX file for `masr score` (ONNX Runtime, no torch).

    The graph scores the whole catalog for a batch of playlists and returns the top-K songs
    (member songs excluded); new playlists and users are folded in from their songs. Next to
    the model (--out NAME): NAME.json (α, dims, opset, source checkpoints, data checksum, masr
    version; the same metadata is in the ONNX metadata_props) and the id maps
    NAME.songs.parquet, NAME.playlists.parquet and NAME.users.parquet; past protobuf's 2 GB (or
    with --external-data) the weights too, in NAME.weights. For --out exported/masr.onnx:
    masr.onnx.json, masr.onnx.songs.parquet and the other maps, masr.onnx.weights. The files
    are written aside and renamed together at the end, so a failed or interrupted export
    leaves the former one whole; parent folders are created.

    Examples:

      masr export --runs runs --out exported/masr.onnx

      masr export --chunk 65536 --out exported/masr-cuda.onnx      # CUDA

      masr export --candidates 1000 --out exported/n1000.onnx      # two-stage
    """
    from masr.export import ExportConfig, check_outside_runs, export_model

    config = ExportConfig(
        model=model.value if model else None,
        alpha=alpha,
        data=data,
        chunk=chunk,
        external_data=external_data,
        candidates=candidates,
        fold_in=fold_in.value,
        unknown_user=unknown_user.value,
    )
    from masr.atomic import check_parents, sole_writer
    from masr.errors import MasrError

    if out.endswith(("/", os.sep)) or Path(out).is_dir():
        folder = out.rstrip("/" + os.sep) or out
        raise MasrError(f"--out {out}: is a folder; give a file name (e.g. {folder}/masr.onnx)")
    path = Path(out)
    check_parents(path, "--out")  # before the lock beside it is made
    check_outside_runs(path, runs)  # before the lock and the clean-up of temporary files
    # one writer per --out (OUT.lock); a killed export's temporary files, its sidecars' too,
    # removed first
    with sole_writer(path, "masr export", log_line, sidecars=True):
        result = export_model(runs, path, config, log=log_line)
    meta = result.metadata
    console.print(
        f"exported {meta['model']} (α = {meta['alpha']:g}, {meta['sizes']['n_songs']:,} songs) "
        f"→ [bold]{result.path}[/bold]"
    )
