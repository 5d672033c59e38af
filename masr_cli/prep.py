"""`masr prep`: turn a playlist file (or the embedded dataset) into prepared training data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from masr.io import Columns
from masr.prep import PrepConfig, prepare
from masr_cli._common import console, log_line

NAME = "prep"


def command(
    input: Annotated[
        Path | None,
        typer.Argument(
            metavar="INPUT",
            help="Playlist file: CSV (comma, semicolon or pipe), TSV or Parquet, optionally "
            "gzipped, or a directory of Parquet parts; one row per (user, playlist, track); "
            "or the Million Playlist Dataset's JSON slices (a slice or its folder). "
            "Leave out to use the embedded synthetic dataset.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory (replaced whole, atomically).")
    ] = Path("data"),
    user_col: Annotated[str, typer.Option(help="Input column holding the user id.")] = "user_id",
    playlist_col: Annotated[
        str, typer.Option(help="Input column holding the playlist id (a playlist's key).")
    ] = "playlist_id",
    track_col: Annotated[str, typer.Option(help="Input column holding the track id.")] = "track_id",
    position_col: Annotated[
        str | None,
        typer.Option(
            help="Input column that orders a playlist's songs (a position, a timestamp, a date "
            "or datetime): the sequential baselines (prme, transrec, caser) read that order. "
            "Default: a column named 'position' when there is one, else the input's row order.",
            show_default=False,
        ),
    ] = None,
    min_songs: Annotated[
        int, typer.Option(help="k-core: drop playlists with fewer songs (repeated until stable).")
    ] = 5,
    min_song_playlists: Annotated[
        int, typer.Option(help="k-core: drop songs in fewer playlists (repeated until stable).")
    ] = 1,
    max_playlist_songs: Annotated[
        int | None,
        typer.Option(
            help="Drop outlier playlists with more songs than this (before the k-core). "
            "Default: none dropped.",
            show_default=False,
        ),
    ] = None,
    max_user_playlists: Annotated[
        int | None,
        typer.Option(
            help="Drop outlier users with more playlists than this (before the k-core). "
            "Default: none dropped.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seeds the split, the negatives and the embedded dataset.")
    ] = 0,
    negatives: Annotated[
        int, typer.Option(help="Sampled negative songs stored with each validation/test case.")
    ] = 100,
    users: Annotated[
        int | None,
        typer.Option(
            help="Embedded dataset only: number of users to generate (default 1000).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Clean, split and sample negatives, as in the paper (section 5.1).

    Drops duplicate (playlist, song) rows, then outliers (--max-playlist-songs,
    --max-user-playlists), then repeats the k-core filter (--min-songs, --min-song-playlists)
    until stable. Holds out one random song per playlist for validation and one for test, and
    stores --negatives sampled catalog songs with each case. A held-out song that no training
    row holds cannot be ranked: its case is dropped (counted as "cases dropped"), so a kept
    playlist may hold fewer songs than --min-songs in the tables, and the statistics (counted
    after the k-core, before the split) include those rows. Writes Parquet tables and
    manifest.json to --out and prints the dataset statistics (the paper's Table 1) on stderr.

    Example: masr prep playlists.csv.gz --playlist-col pid --track-col track_uri --out data
    """
    config = PrepConfig(
        min_songs=min_songs,
        min_song_playlists=min_song_playlists,
        max_playlist_songs=max_playlist_songs,
        max_user_playlists=max_user_playlists,
        seed=seed,
        negatives=negatives,
    )
    columns = Columns(
        user=user_col, playlist=playlist_col, track=track_col, position=position_col
    )
    result = prepare(
        input,
        out,
        columns=columns,
        config=config,
        synth_users=users,
        log=log_line,
    )
    console.print(stats_table(result.manifest))
    m = result.manifest
    dropped = m["dropped_cases"]
    console.print(
        f"train {m['train']:,} · valid {m['valid']:,} · test {m['test']:,} interactions "
        f"(cases dropped: valid {dropped['valid']}, test {dropped['test']}) · "
        f"catalog {m['catalog_songs']:,} songs → [bold]{result.out}[/bold]"
    )


def stats_table(manifest: dict) -> Table:
    """The paper's Table 1 for the prepared data."""
    s = manifest["stats"]
    table = Table(title="Statistics of the prepared dataset (paper's Table 1)")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    table.add_row("# of users", f"{s['users']:,}")
    table.add_row("# of playlists", f"{s['playlists']:,}")
    table.add_row("# of songs", f"{s['songs']:,}")
    table.add_row("# of interactions", f"{s['interactions']:,}")
    table.add_row("avg. # of playlists per user", f"{s['avg_playlists_per_user']:.1f}")
    table.add_row(
        "avg. & max # of songs per playlist",
        f"{s['avg_songs_per_playlist']:.2f} & {s['max_songs_per_playlist']}",
    )
    table.add_row("density", f"{100 * s['density']:.3f}%")
    return table
