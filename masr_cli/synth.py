"""`masr synth`: write the embedded synthetic dataset, or a playlist set of a given size."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from masr.synth import MPD_SONGS_PER_PLAYLIST, SynthConfig, write_synthetic
from masr_cli._common import log_line

NAME = "synth"


def command(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="File to write: .csv, .tsv or .parquet, with .gz for gzipped CSV/TSV; - for "
            "CSV on stdout; a name without an extension is written as CSV, other extensions "
            "are refused.",
        ),
    ],
    seed: Annotated[int, typer.Option(help="Seed of the generator (same seed, same rows).")] = 0,
    users: Annotated[
        int | None,
        typer.Option(
            help="Number of users (default 1000, about 5 playlists each; with --playlists: "
            "one user per playlist, as MPD has no users).",
            show_default=False,
        ),
    ] = None,
    playlists: Annotated[
        int | None,
        typer.Option(
            help="Million-Playlist-Dataset shape with this many playlists, one user each (with "
            "--users: spread over them, 1 + Poisson per user, so about this many): catalog "
            f"{MPD_SONGS_PER_PLAYLIST:g} songs per playlist (at least 200), lengths 5..250 with "
            "mean 66, power-law popularity.",
            show_default=False,
        ),
    ] = None,
    songs: Annotated[
        int | None,
        typer.Option(
            help="Catalog size (songs that can be drawn). Default: "
            f"{SynthConfig.songs_per_user:g} per user, at least 200 ({SynthConfig().n_songs:,} "
            f"for the default {SynthConfig.users} users); with --playlists, "
            f"{MPD_SONGS_PER_PLAYLIST:g} per playlist.",
            show_default=False,
        ),
    ] = None,
    mean_length: Annotated[
        float | None,
        typer.Option(
            help="Mean playlist length before deduplication (default 14; 66 with --playlists). "
            "Lengths are cut at 60 (250 with --playlists), so a mean near that cut comes out "
            "lower.",
            show_default=False,
        ),
    ] = None,
    names: Annotated[bool, typer.Option(help="Write track_name and artist_name columns.")] = True,
) -> None:
    """Write the embedded synthetic playlist dataset (the one `masr prep` uses without INPUT),
    or, with --playlists, an MPD-shaped set of any size, streamed in bounded memory.

    Users have a few taste themes; each playlist follows one theme, often around two artists,
    with power-law song popularity and some noise. Columns: user_id, playlist_id, track_id,
    position, track_name, artist_name. `masr synth --out p.csv && masr prep p.csv` gives the
    same prepared data as `masr prep`.

    MPD's size (1M playlists, 2.26M songs, about 66M rows):
    `masr synth --playlists 1000000 --songs 2262292 --out mpd.parquet`; MPD has no users, so
    prepare it with each playlist its own user: `masr prep mpd.parquet --user-col playlist_id`.
    """
    from masr.atomic import check_output_file
    from masr.seed import check_seed

    check_seed(seed)
    if out is not None and str(out) != "-":
        check_output_file(out, "--out")
    if playlists is not None:
        kwargs = {} if mean_length is None else {"mean_length": mean_length}
        cfg = SynthConfig.sized(
            playlists, songs=songs, users=users, seed=seed, names=names, **kwargs
        )
    else:
        base = SynthConfig()
        cfg = SynthConfig(
            users=base.users if users is None else users,
            seed=seed,
            songs=songs,
            songs_per_playlist=base.songs_per_playlist if mean_length is None else mean_length,
            names=names,
        )
    rows = write_synthetic(out, cfg, log_line)
    users_word = "user" if cfg.users == 1 else "users"
    log_line(
        f"wrote {rows:,} rows ({cfg.users:,} {users_word}, {cfg.n_songs:,} songs, seed {seed}) "
        f"to {out}"
    )
