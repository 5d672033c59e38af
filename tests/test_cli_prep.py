"""`masr prep` and `masr synth` through Typer's CliRunner."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from typer.testing import CliRunner

from masr.dataset import load_prepared
from masr_cli.main import app

runner = CliRunner()


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def test_prep_embedded_dataset_prints_table1_on_stderr(tmp_path):
    out = tmp_path / "data"
    result = _ok(["prep", "--out", str(out), "--users", "60", "--negatives", "20"])
    assert result.stdout == ""  # data only on stdout: prep has none
    for label in (
        "# of users",
        "# of playlists",
        "# of interactions",
        "density",
        "songs per playlist",
    ):
        assert label in result.stderr
    d = load_prepared(out)
    assert d.n_users == 60 and d.valid.negatives.shape[1] == 20
    assert json.loads((out / "manifest.json").read_text())["checksum"] == "synthetic:0:60"


def test_synth_then_prep_file_with_options(tmp_path):
    src = tmp_path / "mine.csv.gz"
    _ok(["synth", "--out", str(src), "--users", "50", "--seed", "2"])
    df = pl.read_csv(gzip.open(src), infer_schema=False)
    assert df["user_id"].n_unique() == 50
    renamed = tmp_path / "renamed.tsv"
    df.rename({"user_id": "owner", "playlist_id": "pid", "track_id": "uri"}).write_csv(
        renamed, separator="\t"
    )
    out = tmp_path / "data"
    _ok(
        [
            "prep",
            str(renamed),
            "--out",
            str(out),
            "--user-col",
            "owner",
            "--playlist-col",
            "pid",
            "--track-col",
            "uri",
            "--min-songs",
            "6",
            "--min-song-playlists",
            "2",
            "--max-playlist-songs",
            "30",
            "--max-user-playlists",
            "8",
            "--seed",
            "1",
            "--negatives",
            "10",
        ]
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["columns"] == {"user": "owner", "playlist": "pid", "track": "uri"}
    assert (m["min_songs"], m["min_song_playlists"], m["max_playlist_songs"]) == (6, 2, 30)
    assert (m["max_user_playlists"], m["seed"], m["negatives"]) == (8, 1, 10)
    assert m["input"]["format"] == "tsv"


def test_synth_parquet_matches_embedded_prep(tmp_path):
    src = tmp_path / "s.parquet"
    _ok(["synth", "--out", str(src), "--users", "40"])
    _ok(["prep", str(src), "--out", str(tmp_path / "a"), "--negatives", "5"])
    _ok(["prep", "--users", "40", "--out", str(tmp_path / "b"), "--negatives", "5"])
    for name in ("playlists", "songs", "train", "test"):
        a = pl.read_parquet(tmp_path / "a" / f"{name}.parquet")
        b = pl.read_parquet(tmp_path / "b" / f"{name}.parquet")
        assert a.equals(b), name
    # the same data has one fingerprint, wherever it came from (runs trained on one are
    # evaluable with the other); a copy under another name and path too
    copy = tmp_path / "elsewhere" / "renamed.parquet"
    copy.parent.mkdir()
    copy.write_bytes(src.read_bytes())
    _ok(["prep", str(copy), "--out", str(tmp_path / "c"), "--negatives", "5"])
    prints = {load_prepared(tmp_path / d).fingerprint for d in ("a", "b", "c")}
    assert len(prints) == 1
    _ok(["prep", str(src), "--out", str(tmp_path / "d"), "--negatives", "6"])
    assert load_prepared(tmp_path / "d").fingerprint not in prints


def _fails(args: list[str], *needles: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    err = lines[-1]  # progress logs may come first; the error is one last line
    assert err.startswith("masr: error: "), result.stderr
    assert sum("error" in line for line in lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in err, err
    return err


def _truncated_gzip() -> bytes:
    rows = "".join(f"u{i % 7},p{i % 300},t{i * 7919 % 10007}\n" for i in range(20_000))
    data = gzip.compress(("user_id,playlist_id,track_id\n" + rows).encode())
    return data[: len(data) - 1000]


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda t: str(t / "missing.csv"), "no such file"),
        (lambda t: str(t), "is a directory"),
        (lambda t: _write(t / "empty.csv", b""), "empty file"),
        (lambda t: _write(t / "cut.csv.gz", _truncated_gzip()), "truncated"),
        (
            lambda t: _write(t / "cols.csv", b"user,playlist_id,track_id\nu,p,t\n"),
            "missing column 'user_id'",
        ),
        (
            lambda t: _write(t / "null.csv", b"user_id,playlist_id,track_id\nu,,t\n"),
            "empty 'playlist_id'",
        ),
        (
            lambda t: _write(t / "few.csv", b"user_id,playlist_id,track_id\nu,p,t1\nu,p,t2\n"),
            "nothing left",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, make, needle):
    path = make(tmp_path)
    _fails(["prep", path, "--out", str(tmp_path / "out")], path, needle)
    assert not (tmp_path / "out").exists()


def test_bad_options(tmp_path):
    _fails(["prep", "--min-songs", "2", "--out", str(tmp_path / "o")], "--min-songs")
    src = tmp_path / "s.csv"
    _ok(["synth", "--out", str(src), "--users", "5"])
    _fails(["prep", str(src), "--users", "5", "--out", str(tmp_path / "o")], "--users")
    _fails(["synth", "--out", str(tmp_path), "--users", "5"], "is a directory")


def test_help_teaches():
    result = runner.invoke(app, ["prep", "--help"])
    assert result.exit_code == 0
    for option in ("--user-col", "--min-songs", "--max-user-playlists", "--negatives", "--users"):
        assert option in result.stdout
    assert "k-core" in result.stdout
    assert "--out" in runner.invoke(app, ["synth", "--help"]).stdout


def test_prep_never_replaces_what_is_not_its_own_output(tmp_path, monkeypatch):
    """--out is replaced whole, so prep refuses a folder of other files, the input itself, a
    folder holding the input and the working folder; it replaces an earlier prep output."""
    src = tmp_path / "s.csv"
    _ok(["synth", "--out", str(src), "--users", "40"])
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    _fails(["prep", str(src), "--out", str(other)], "no manifest.json")
    assert (other / "keep.txt").read_text() == "precious"
    _fails(["prep", str(src), "--out", str(src)], "is the input")
    assert src.is_file()
    _fails(["prep", str(src), "--out", str(tmp_path)], "holds the input")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _fails(["prep", str(src), "--out", "."], "current folder")
    _fails(["prep", str(src), "--out", str(work)], "current folder")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no .old left
    monkeypatch.chdir(tmp_path)
    _ok(["prep", str(src), "--out", str(tmp_path / "data")])
    _ok(["prep", str(src), "--out", str(tmp_path / "data")])  # its own output: replaced
    empty = tmp_path / "empty"
    empty.mkdir()
    _ok(["prep", str(src), "--out", str(empty)])


def test_prep_refuses_data_without_validation_or_test_cases(tmp_path):
    rows = "".join(f"u{p},p{p},t{p}{t}\n" for p in range(3) for t in range(5))
    path = _write(tmp_path / "apart.csv", ("user_id,playlist_id,track_id\n" + rows).encode())
    _fails(["prep", path, "--out", str(tmp_path / "out")], "no validation and no test case")
    assert not (tmp_path / "out").exists()


def test_positions_beyond_int32_are_kept(tmp_path):
    """Millisecond timestamps as positions: prep keeps them (Int64) and their order."""
    src = tmp_path / "s.csv"
    _ok(["synth", "--out", str(src), "--users", "40"])
    frame = pl.read_csv(src)
    stamped = tmp_path / "stamped.csv"
    frame.with_columns(pl.col("position").cast(pl.Int64) * 1000 + 1_700_000_000_000).write_csv(
        stamped
    )
    _ok(["prep", str(src), "--out", str(tmp_path / "a")])
    _ok(["prep", str(stamped), "--out", str(tmp_path / "b")])
    a = pl.read_parquet(tmp_path / "a" / "train.parquet")
    b = pl.read_parquet(tmp_path / "b" / "train.parquet")
    assert b.schema["position"] == pl.Int64 and a.drop("position").equals(b.drop("position"))


@pytest.mark.parametrize(
    "args",
    [
        ["synth", "--users", "5", "--seed", "-1", "--out", "{t}/s.csv"],
        ["prep", "--seed", "-1", "--out", "{t}/o"],
        ["prep", "--seed", str(2**64), "--out", "{t}/o"],
    ],
)
def test_seeds_out_of_range_are_one_line(tmp_path, args):
    _fails([a.format(t=tmp_path) for a in args], "--seed")


def test_synth_writes_csv_to_stdout_and_refuses_unknown_types(tmp_path):
    result = _ok(["synth", "--users", "5", "--out", "-"])
    assert result.stdout.startswith("user_id,playlist_id,track_id,position")
    assert not (tmp_path / "-").exists()
    _fails(["synth", "--users", "5", "--out", str(tmp_path / "s.json")], "unknown file type")
    assert not (tmp_path / "s.json").exists()


def test_prep_refuses_out_inside_the_input_folder_and_the_root(tmp_path):
    """A folder of Parquet parts is read whole (rglob): an --out inside it would be written
    among the parts and read as input next time, so it is refused; so is the root folder,
    which has no name for the lock beside it (QA: a ValueError traceback)."""
    src = tmp_path / "s.parquet"
    _ok(["synth", "--out", str(src), "--users", "40"])
    parts = tmp_path / "table"
    parts.mkdir()
    pl.read_parquet(src).write_parquet(parts / "part-00000.parquet")
    (parts / "_SUCCESS").write_text("")
    _fails(["prep", str(parts), "--out", str(parts / "data")], "inside the input folder")
    assert sorted(p.name for p in parts.iterdir()) == ["_SUCCESS", "part-00000.parquet"]
    _fails(["prep", str(src), "--out", "/"], "root folder")


def test_prep_reads_parquet_parts_whose_schemas_differ(tmp_path):
    """Parts written by different jobs: ids as Int32 in one, Int64, Float64 (pandas with a
    missing value elsewhere) or text in others, and a column only some parts have. They are
    one table with the same ids (QA: 'unreadable or truncated file (data type mismatch ...)')."""
    src = tmp_path / "s.parquet"
    _ok(["synth", "--out", str(src), "--users", "40"])
    frame = pl.read_parquet(src).select("user_id", "playlist_id", "track_id")
    digits = frame.with_columns(pl.all().str.extract(r"(\d+)$").cast(pl.Int64))
    # the same table with numeric ids, in four parts of four kinds
    parts = tmp_path / "table"
    parts.mkdir()
    n = frame.height // 4
    kinds = [pl.Int32, pl.Int64, pl.Float64, pl.String]
    for i, kind in enumerate(kinds):
        chunk = digits.slice(i * n, n if i < 3 else None).cast(kind)
        if i == 3:
            chunk = chunk.with_columns(pl.lit("x").alias("added_later"))
        chunk.write_parquet(parts / f"part-{i:05d}.parquet")
    (parts / "_SUCCESS").write_text("")
    _ok(["prep", str(parts), "--out", str(tmp_path / "b")])
    whole = tmp_path / "whole.parquet"
    digits.write_parquet(whole)
    _ok(["prep", str(whole), "--out", str(tmp_path / "c")])
    for name in ("train", "valid", "test", "songs", "playlists", "users"):
        b = pl.read_parquet(tmp_path / "b" / f"{name}.parquet")
        c = pl.read_parquet(tmp_path / "c" / f"{name}.parquet")
        assert b.equals(c), name


def test_prep_out_through_a_symbolic_link_replaces_the_folder_it_names(tmp_path):
    """--out data, where data is a link to an earlier output elsewhere (a bigger disk): that
    folder gets the new output and the link stays (QA: the link was replaced by a folder, the
    linked output left stale)."""
    src = tmp_path / "s.csv"
    _ok(["synth", "--out", str(src), "--users", "40"])
    real = tmp_path / "disk" / "data"
    _ok(["prep", str(src), "--out", str(real)])
    link = tmp_path / "data"
    link.symlink_to(real, target_is_directory=True)
    _ok(["prep", str(src), "--out", str(link), "--seed", "3"])
    assert link.is_symlink()
    assert json.loads((real / "manifest.json").read_text())["seed"] == 3


@pytest.mark.parametrize("value", [[1, 2], {"at": 1}])
def test_prep_refuses_a_position_column_of_lists_beside_one_track_per_row(tmp_path, value):
    """One track per row but a position column of lists (or structs): one line naming the
    column (QA: InvalidOperationError traceback from casting a List to String)."""
    src = tmp_path / "p.parquet"
    n = 12
    pl.DataFrame(
        {
            "user_id": ["u"] * n,
            "playlist_id": [f"p{i % 2}" for i in range(n)],
            "track_id": [f"t{i}" for i in range(n)],
            "position": [value] * n,
        }
    ).write_parquet(src)
    _fails(["prep", str(src), "--out", str(tmp_path / "o")], "song-order column 'position'")


def test_prep_an_empty_position_column_keeps_the_input_order(tmp_path):
    """A 'position' column with no value in it (an export's placeholder) orders nothing: the
    songs keep the input's row order and the manifest says so, with a warning (QA: every song
    tied, so sorted by track id, and the manifest said sequence 'position')."""
    rows = [
        (f"u{p % 3}", f"p{p}", f"t{(7 * p + 5 * i) % 23:02d}") for p in range(12) for i in range(6)
    ]
    src = tmp_path / "p.csv"
    src.write_text(
        "user_id,playlist_id,track_id,position\n" + "".join(f"{u},{p},{t},\n" for u, p, t in rows)
    )
    result = _ok(["prep", str(src), "--out", str(tmp_path / "o")])
    assert "is empty in every row" in result.stderr
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["sequence"] == "input order"
    assert load_prepared(tmp_path / "o").manifest["sequence"] == "input order"
    train = pl.read_parquet(tmp_path / "o" / "train.parquet")
    assert "position" not in train.columns
    songs = pl.read_parquet(tmp_path / "o" / "songs.parquet")["track_id"].to_list()
    playlists = pl.read_parquet(tmp_path / "o" / "playlists.parquet")["playlist_id"].to_list()
    for index, pid in enumerate(playlists):
        got = [songs[s] for s in train.filter(pl.col("playlist_idx") == index)["song_idx"]]
        given = [t for _, p, t in rows if p == pid and t in got]
        assert got == given, pid


def test_prep_warning_for_no_validation_case_says_train_refuses(tmp_path):
    """Three playlists sharing one song: some seeds hold out no validation song that training
    holds. The warning says what follows, that masr train refuses the data (QA: it said only
    'training cannot choose its epochs', and train then refused)."""
    rows = [(f"u{p}", f"p{p}", "s0" if i == 0 else f"t{p}_{i}") for p in range(3) for i in range(5)]
    src = tmp_path / "one.csv"
    src.write_text("user_id,playlist_id,track_id\n" + "".join(",".join(r) + "\n" for r in rows))
    for seed in range(20):
        out = tmp_path / f"d{seed}"
        result = runner.invoke(app, ["prep", str(src), "--out", str(out), "--seed", str(seed)])
        if result.exit_code == 0 and "no valid case left" in result.stderr:
            break
    else:
        pytest.skip("no seed gave a dataset without validation cases")
    assert "masr train` refuses" in result.stderr, result.stderr
    runs = str(tmp_path / "runs")
    _fails(["train", "--model", "pop", "--data", str(out), "--runs", runs], "no validation cases")


def test_prep_refuses_out_inside_another_prepared_folder(tmp_path):
    """masr prep replaces its folder whole, so a prepared dataset written inside another would
    go with the next prep of the outer one: refused, as train --runs is (QA: accepted)."""
    src = tmp_path / "s.csv"
    _ok(["synth", "--out", str(src), "--users", "40"])
    outer = tmp_path / "data"
    _ok(["prep", str(src), "--out", str(outer)])
    _fails(["prep", str(src), "--out", str(outer / "small")], "inside the prepared data folder")
    assert not (outer / "small").exists()
    _ok(["prep", str(src), "--out", str(outer)])  # the folder itself: replaced, as before
