"""`masr export` and `masr score` through the CLI: CliRunner for the happy paths and the error
lines, and a subprocess in which torch cannot be imported at all."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from masr_cli.main import app

runner = CliRunner()

ROWS = "user_id,playlist_id,track_id\nu0,p0,s1\nu0,p0,s2\nu9,fresh,s40\nu9,fresh,unknown\n"

#: Runs `masr` with torch hidden from the import system, as in a scoring-only install.
NO_TORCH = textwrap.dedent(
    """
    import sys
    from importlib.machinery import PathFinder

    class HideTorch:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "torch":
                return None
            return self.inner.find_spec(name, path, target)

        def invalidate_caches(self):
            self.inner.invalidate_caches()

    sys.meta_path[:] = [HideTorch(f) if f is PathFinder else f for f in sys.meta_path]
    try:
        import torch
    except ImportError:
        pass
    else:
        raise SystemExit("torch is still importable")
    from masr_cli.main import app
    try:
        app(sys.argv[1:], prog_name="masr")
    finally:
        assert "torch" not in sys.modules
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/mdr and runs/mass (random weights) trained on the planted data (48 songs s0..s47)."""
    import torch
    from conftest import write_planted

    from masr.checkpoint import save_checkpoint
    from masr.dataset import load_prepared
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    root = tmp_path_factory.mktemp("cli")
    data_dir = write_planted(root / "data")
    data = load_prepared(data_dir)
    torch.manual_seed(1)
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    for run, model in (
        ("mdr", MDR(MDRConfig(dim=8), *sizes)),
        ("mass", MASS(MASSConfig(dim=8), *sizes)),
    ):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        (root / "runs" / run).mkdir(parents=True)
        save_checkpoint(root / "runs" / run / "best.pt", model, data_fingerprint=data.fingerprint)
        info = {"data": {"path": str(data_dir), "fingerprint": data.fingerprint}}
        (root / "runs" / run / "run.json").write_text(json.dumps(info))
    return root / "runs"


@pytest.fixture(scope="module")
def model(runs: Path) -> Path:
    out = runs.parent / "exported" / "masr.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout == ""  # export prints nothing on stdout
    assert "exported masr" in result.stderr
    return out


def test_score_writes_csv_on_stdout_and_the_summary_on_stderr(tmp_path: Path, model: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "3"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "playlist_id,rank,track_id,score" and len(lines) == 1 + 2 * 3
    assert [line.split(",")[:2] for line in lines[1:4]] == [["p0", "1"], ["p0", "2"], ["p0", "3"]]
    summary = [line for line in result.stderr.splitlines() if line.startswith("scored")]
    assert len(summary) == 1 and "1 row with unknown songs ignored" in summary[0]
    assert "ONNX Runtime on CPU" in result.stderr


def test_export_folds_new_playlists_in_through_maps_unless_asked_for_the_mean(
    tmp_path: Path, planted_dir: Path
) -> None:
    """The default export fits the fold-in maps (recorded in its metadata); `--fold-in mean`
    keeps the plain mean. Known playlists score the same under both, new ones differ. Too few
    training playlists for the maps: the mean, said on stderr and in the metadata."""
    from test_export import make_runs

    from masr.onnx_format import sidecar

    runs = make_runs(tmp_path / "runs", planted_dir, ("mdr", "mass"))  # d 4: 36 suffice
    exported = {}
    for mode in ("map", "mean"):
        out = tmp_path / f"{mode}.onnx"
        fold = [] if mode == "map" else ["--fold-in", "mean"]
        result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out), *fold])
        assert result.exit_code == 0, result.stderr
        exported[mode] = out
    meta = json.loads(sidecar(exported["map"], "json").read_text())
    assert meta["fold_in"]["mode"] == "map" and meta["fold_in"]["playlists"] == 36
    assert json.loads(sidecar(exported["mean"], "json").read_text())["fold_in"] == {"mode": "mean"}
    # --unknown-user drop (ExportConfig.unknown_user, which only Python could set) is recorded
    dropped = tmp_path / "drop.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(dropped),
                                 "--unknown-user", "drop"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(sidecar(dropped, "json").read_text())["unknown_user"] == "drop"
    assert json.loads(sidecar(exported["map"], "json").read_text())["unknown_user"] == "members"
    known, new = tmp_path / "known.csv", tmp_path / "new.csv"
    known.write_text("user_id,playlist_id,track_id\nu0,p0,s1\nu0,p0,s2\n")
    new.write_text("user_id,playlist_id,track_id\nu0,fresh,s1\nu0,fresh,s2\n")
    scored = {
        (src.name, mode): runner.invoke(app, ["score", str(src), "--model", str(m)]).stdout
        for src in (known, new)
        for mode, m in exported.items()
    }
    assert scored["known.csv", "map"] == scored["known.csv", "mean"]
    assert scored["new.csv", "map"] != scored["new.csv", "mean"]


def test_export_of_a_small_catalog_folds_in_by_the_mean_and_says_so(
    tmp_path: Path, runs: Path
) -> None:
    """d = 8 on 36 playlists: too few to fit the maps (4 per coefficient row)."""
    from masr.onnx_format import sidecar

    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
    assert result.exit_code == 0 and "too few training playlists" in result.stderr
    meta = json.loads(sidecar(out, "json").read_text())
    assert meta["fold_in"]["mode"] == "mean" and "too few" in meta["fold_in"]["why"]


def test_score_reads_standard_input_as_a_file(tmp_path: Path, model: Path) -> None:
    """INPUT `-`: the same CSV as from the file, plain or gzipped; an empty stream is one
    error line naming standard input (not the spool file)."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    args = ["score", "-", "--model", str(model), "--k", "3"]
    from_file = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "3"])
    for data in (ROWS.encode(), gzip.compress(ROWS.encode())):
        piped = runner.invoke(app, args, input=data)
        assert piped.exit_code == 0, piped.stderr
        assert piped.stdout == from_file.stdout
    pq = tmp_path / "in.parquet"
    pl.read_csv(src).write_parquet(pq)
    zipped = runner.invoke(app, args, input=gzip.compress(pq.read_bytes()))
    assert zipped.exit_code == 1
    assert "standard input: gzipped Parquet is not supported" in zipped.stderr
    empty = runner.invoke(app, args, input=b"")
    assert empty.exit_code == 1 and "standard input: empty file" in empty.stderr
    ray = runner.invoke(app, [*args, "--engine", "ray"], input=ROWS.encode())
    assert ray.exit_code == 1 and "--engine ray needs a file" in ray.stderr


def test_score_reads_a_named_pipe_as_standard_input(tmp_path: Path, model: Path) -> None:
    """INPUT a named pipe (``<(zcat f.csv.gz)``): spooled as ``-`` is, the same CSV (QA: it hung,
    deaf to SIGTERM, reopening a pipe whose writer was gone). masr prep, which cannot take
    one, says so in one line."""
    import threading

    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    expected = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "3"]).stdout
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(gzip.compress(ROWS.encode())),
                              daemon=True)
    writer.start()
    result = runner.invoke(app, ["score", str(fifo), "--model", str(model), "--k", "3"])
    writer.join(timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == expected
    prep = runner.invoke(app, ["prep", str(fifo), "--out", str(tmp_path / "data")])
    assert prep.exit_code == 1 and "not a regular file (a pipe or a device)" in prep.stderr
    dash = runner.invoke(app, ["prep", "-", "--out", str(tmp_path / "data")], input=ROWS)
    assert dash.exit_code == 1 and "masr prep reads a file, not standard input" in dash.stderr


def test_input_of_unknown_songs_only_is_warned_about(tmp_path: Path, model: Path) -> None:
    """Every song unknown (ids of other data, or numbers where the training ids had zeros in
    front): the rows still come, with a warning line on stderr (QA: the counts alone)."""
    src = tmp_path / "other.csv"
    src.write_text("user_id,playlist_id,track_id\nu0,p0,x1\nu0,p0,x2\n")
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "3"])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 + 3
    assert "warning: none of the input's songs is in the model's catalog" in result.stderr
    known = tmp_path / "in.csv"
    known.write_text(ROWS)
    result = runner.invoke(app, ["score", str(known), "--model", str(model)])
    assert result.exit_code == 0 and "warning" not in result.stderr
    same = runner.invoke(app, ["score", str(known), "--model", str(model), "--playlist-col",
                               "track_id"])
    assert same.exit_code == 1 and "--track-col 'track_id': also the playlist column" in (
        same.stderr
    )


def test_score_out_gzip_lock_and_places_it_refuses(tmp_path: Path, runs: Path, model: Path) -> None:
    """--out NAME.gz is gzipped CSV (QA: plain CSV under a .gz name); a .parquet name and a place
    inside prepared data (which the next masr prep replaces whole) are refused in one line; a
    killed score's temporary file beside --out is removed by the next score to it."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    expected = runner.invoke(app, ["score", str(src), "--model", str(model)]).stdout
    packed = tmp_path / "recs.csv.gz"
    left = tmp_path / ".recs.csv.gz.abcd1234.tmp"  # what a SIGKILL leaves
    left.write_bytes(b"half")
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(packed)])
    assert result.exit_code == 0, result.stderr
    assert gzip.decompress(packed.read_bytes()).decode() == expected
    assert not left.exists() and "removed the temporary files of an earlier" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "recs.csv.gz"]  # no lock
    data = Path(json.loads((runs / "mdr" / "run.json").read_text())["data"]["path"])
    for out, message in (
        (tmp_path / "recs.parquet", "masr score writes CSV"),
        (data / "recs.csv", "inside the prepared data folder"),
    ):
        refused = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(out)])
        assert refused.exit_code == 1 and message in refused.stderr, refused.stderr
        assert not out.exists()


def test_score_out_file_and_defaults_from_the_working_directory(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(model.parent.parent)  # exported/masr.onnx is the default --model
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    out = tmp_path / "recs.csv"
    result = runner.invoke(app, ["score", str(src), "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    recs = pl.read_csv(out)
    assert recs.height == 20 and recs["rank"].max() == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["score", "{tmp}/missing.csv", "--model", "{model}"], "missing.csv: no such file"),
        (["score", "{tmp}", "--model", "{model}"], "is a directory"),
        (["score", "{tmp}/in.csv", "--model", "{tmp}/none.onnx"], "no such file; export one"),
        # the column names come from the model: a missing model is named, not the columns
        (["score", "{tmp}/odd.csv", "--model", "{tmp}/none.onnx"], "no such file; export one"),
        (["score", "{tmp}/in.csv", "--model", "{model}", "--k", "0"], "--k 0: must be >= 1"),
        (
            ["score", "{tmp}/in.csv", "--model", "{model}", "--track-col", "uri"],
            "missing column 'uri'",
        ),
        (["score", "{tmp}/in.csv", "--model", "{model}", "--out", "{tmp}/in.csv"], "is the input"),
        (["export", "--runs", "{tmp}/runs"], "no such directory"),
        (["export", "--runs", "{runs}", "--model", "amasr"], "no trained amasr"),
        (["export", "--runs", "{runs}", "--alpha", "2"], "--alpha 2.0: must be between 0 and 1"),
    ],
)
def test_errors_are_one_line_with_exit_1(
    tmp_path: Path, model: Path, runs: Path, args: list[str], message: str
) -> None:
    (tmp_path / "in.csv").write_text(ROWS)
    (tmp_path / "odd.csv").write_text("owner,pid,uri\nu0,p0,s1\n")
    out = tmp_path / "o.csv"
    filled = [a.format(tmp=tmp_path, model=model, runs=runs) for a in args]
    given_out = args[0] == "score" and "--out" not in args
    result = runner.invoke(app, [*filled, *(["--out", str(out)] if given_out else [])])
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("masr: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not out.exists()
    assert (tmp_path / "in.csv").read_text() == ROWS  # never overwritten


def test_help_teaches_the_options() -> None:
    for command, options in (
        ("score", ["--model", "--k", "--out", "--device", "--batch-size", "--user-col",
                   "--playlist-col", "--track-col", "--engine", "--format", "--workers"]),
        ("export", ["--runs", "--model", "--alpha", "--out", "--chunk", "--fold-in"]),
    ):  # fmt: skip
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        for option in options:
            assert option in result.stdout
        assert "[default: " in result.stdout and " ." not in result.stdout  # markup kept


def test_score_runs_where_torch_is_not_installed(tmp_path: Path, model: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "score", str(src), "--model", str(model), "--k", "2"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "playlist_id,rank,track_id,score"
    assert len(proc.stdout.splitlines()) == 1 + 2 * 2
    assert "scored 2 playlists" in proc.stderr


def test_example_playlists_fit_the_embedded_dataset(tmp_path: Path) -> None:
    """examples/playlists.csv holds a playlist of the embedded dataset, a new playlist of a known
    user, a new user's playlist and a song outside the catalog, and scores as documented."""
    import torch

    from masr.checkpoint import save_checkpoint
    from masr.dataset import load_prepared
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    data_dir = tmp_path / "data"
    assert runner.invoke(app, ["prep", "--out", str(data_dir)]).exit_code == 0
    data = load_prepared(data_dir)
    example = Path(__file__).resolve().parent.parent / "examples" / "playlists.csv"
    rows = pl.read_csv(example, infer_schema=False)
    catalog = set(data.table("songs").filter(pl.col("song_idx") < data.n_songs)["track_id"])
    assert set(rows["track_id"]) - catalog == {"garage-demo-01"}
    owners = data.table("playlists").join(data.table("users"), on="user_idx")
    assert owners.filter(pl.col("playlist_id") == "p00000")["user_id"].to_list() == ["u0000"]
    assert not set(rows["playlist_id"]) - {"p00000"} & set(owners["playlist_id"])
    assert "u0001" in set(owners["user_id"]) and "newcomer" not in set(owners["user_id"])

    torch.manual_seed(0)
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    for run, model in (
        ("mdr", MDR(MDRConfig(dim=8), *sizes)),
        ("mass", MASS(MASSConfig(dim=8), *sizes)),
    ):
        (tmp_path / "runs" / run).mkdir(parents=True)
        save_checkpoint(
            tmp_path / "runs" / run / "best.pt", model, data_fingerprint=data.fingerprint
        )
        info = {"data": {"path": str(data_dir), "fingerprint": data.fingerprint}}
        (tmp_path / "runs" / run / "run.json").write_text(json.dumps(info))
    onnx_path = tmp_path / "exported" / "masr.onnx"
    assert (
        runner.invoke(
            app, ["export", "--runs", str(tmp_path / "runs"), "--out", str(onnx_path)]
        ).exit_code
        == 0
    )
    result = runner.invoke(app, ["score", str(example), "--model", str(onnx_path)])
    assert result.exit_code == 0, result.stderr
    recs = pl.read_csv(result.stdout.encode(), infer_schema=False)
    assert recs["playlist_id"].unique(maintain_order=True).to_list() == [
        "p00000",
        "road-trip",
        "first-mix",
    ]
    assert recs.height == 30
    assert "2 new playlists and 1 playlist of new users folded in" in result.stderr
    assert "1 row with unknown songs ignored" in result.stderr


def test_export_chunk_changes_speed_not_scores(tmp_path: Path, runs: Path, model: Path) -> None:
    """--chunk (the MASS loop's step; bigger is faster on CUDA) is recorded and scores equal."""
    big = tmp_path / "big.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(big), "--chunk", "7"])
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "big.onnx.json").read_text())["chunk"] == 7
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    outs = []
    for onnx_file in (model, big):
        result = runner.invoke(app, ["score", str(src), "--model", str(onnx_file), "--k", "5"])
        assert result.exit_code == 0, result.stderr
        outs.append(pl.read_csv(result.stdout.encode()))
    assert outs[0]["track_id"].to_list() == outs[1]["track_id"].to_list()
    np.testing.assert_allclose(outs[0]["score"].to_numpy(), outs[1]["score"].to_numpy(), rtol=1e-5)
    bad = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(big), "--chunk", "0"])
    assert bad.exit_code == 1 and "--chunk 0: must be >= 1" in bad.stderr


def test_two_stage_export_and_score_round_trip(tmp_path: Path, runs: Path, model: Path) -> None:
    """masr export --candidates N builds the two-stage graph (N recorded); masr score uses it,
    --candidates changes N at run time, N >= the catalog (48) gives the exact export's CSV, and
    an exact export or a one-part export refuses with one line naming the option."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)

    def score(onnx_file: Path, *extra: str):
        return runner.invoke(app, ["score", str(src), "--model", str(onnx_file), *extra])

    exact = score(model)
    two = tmp_path / "two.onnx"
    args = ["export", "--runs", str(runs), "--out", str(two)]
    result = runner.invoke(app, [*args, "--candidates", "48"])
    assert result.exit_code == 0, result.stderr
    meta = json.loads((tmp_path / "two.onnx.json").read_text())
    assert meta["candidates"] == 48 and "candidates" in meta["inputs"]
    assert json.loads(model.with_name("masr.onnx.json").read_text())["candidates"] is None
    full = score(two)
    assert full.exit_code == 0, full.stderr
    assert "two-stage: MDR proposes 48 songs per playlist" in full.stderr
    got, want = pl.read_csv(full.stdout.encode()), pl.read_csv(exact.stdout.encode())
    assert got["track_id"].to_list() == want["track_id"].to_list()
    np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), rtol=1e-5)

    assert runner.invoke(app, [*args, "--candidates", "5"]).exit_code == 0
    few = score(two, "--k", "5")
    assert few.exit_code == 0, few.stderr
    recs = pl.read_csv(few.stdout.encode())
    assert sorted(recs.group_by("playlist_id").len()["len"].to_list()) == [5, 5]
    widened = score(two, "--candidates", "1000")  # past the catalog: exact again
    assert widened.exit_code == 0, widened.stderr
    got = pl.read_csv(widened.stdout.encode())
    assert got["track_id"].to_list() == want["track_id"].to_list()
    np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), rtol=1e-5)

    for onnx_file, extra, line in [
        (two, ["--k", "10"], "--k 10: more than the 5 candidates per playlist of this two-stage "
         "export; pass --candidates 10 or more"),
        (model, ["--candidates", "10"], "is an exact export (the fusion scores every song); "
         "export a two-stage model with masr export --candidates 10"),
        (two, ["--candidates", "0"], "--candidates 0: must be >= 1"),
    ]:  # fmt: skip
        bad = score(onnx_file, *extra)
        assert bad.exit_code == 1 and line in bad.stderr and bad.stdout == ""
        # refused from the metadata, before the model is loaded: the one line alone
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    one_part = runner.invoke(app, [*args, "--model", "mdr", "--candidates", "5"])
    assert one_part.exit_code == 1 and "--candidates: mdr is one part" in one_part.stderr
    # the refusal alone, before the progress line (QA: "exporting mdr from ..." came first)
    assert len(one_part.stderr.strip().splitlines()) == 1, one_part.stderr
    alpha = runner.invoke(app, [*args, "--model", "mdr", "--alpha", "0.5"])
    assert alpha.exit_code == 1 and alpha.stderr.strip().splitlines() == [
        "masr: error: --alpha: mdr is one part; α weights the parts of amasr/masr only"
    ]
    assert "--candidates" in runner.invoke(app, ["export", "--help"]).stdout


def test_an_input_the_first_pass_refuses_is_one_line_before_the_model_loads(
    tmp_path: Path, model: Path
) -> None:
    """QA: a row without a playlist id was refused after the "ONNX Runtime on CPU" line (the
    model loaded first); the first pass now comes before, as on the Ray engine."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS + 'u0,"",s1\n')
    out = tmp_path / "recs.csv"
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(out)])
    assert result.exit_code == 1 and "have no playlist id (empty" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()
    # the model's own problems are still said first (review: the input's error won over
    # them, after a whole pass over the input, and the Ray engine's order was the other)
    from masr.score import ExportedModel

    if ExportedModel(model, "auto").provider != "cuda":  # no usable GPU here
        cuda = runner.invoke(app, ["score", str(src), "--model", str(model), "--device", "cuda"])
        assert cuda.exit_code == 1 and "--device cuda" in cuda.stderr, cuda.stderr
        assert "no playlist id" not in cuda.stderr


def test_read_rows_option_chunks_the_input_with_the_same_output(
    tmp_path: Path, model: Path
) -> None:
    """--read-rows N (ScoreConfig.read_rows, which only Python could set): the same CSV in
    chunks of N rows; 0 is one error line."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    whole = runner.invoke(app, ["score", str(src), "--model", str(model)])
    chunked = runner.invoke(app, ["score", str(src), "--model", str(model), "--read-rows", "2"])
    assert whole.exit_code == chunked.exit_code == 0, chunked.stderr
    assert chunked.stdout == whole.stdout and chunked.stdout.count("\n") > 1
    bad = runner.invoke(app, ["score", str(src), "--model", str(model), "--read-rows", "0"])
    assert bad.exit_code == 1 and "--read-rows 0: must be >= 1" in bad.stderr


def test_out_dash_is_stdout_and_short_playlists_count_against_k(
    tmp_path: Path, model: Path
) -> None:
    """--out - writes to stdout (as --json - does elsewhere); a --k above the catalog (48
    songs) leaves every playlist short of K, and the summary counts them all."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", "-",
                                 "--k", "500"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("playlist_id,rank,track_id,score")
    assert not (Path.cwd() / "-").exists()
    recs = pl.read_csv(result.stdout.encode())
    assert recs.group_by("playlist_id").len()["len"].max() <= 48
    summary = next(line for line in result.stderr.splitlines() if line.startswith("scored"))
    assert "2 playlists with fewer than K songs left" in summary


def test_a_closed_pipe_stops_scoring_quietly(tmp_path: Path, model: Path) -> None:
    """`masr score ... | head -1`: no error line, no traceback, the exit status of a Unix tool
    whose reader went away (141)."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS.rstrip("\n") + "".join(f"\nu{i},q{i},s{i % 40}" for i in range(20000)))
    code = "from masr_cli.main import run; run()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "score", str(src), "--model", str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "error" not in err and "Traceback" not in err


def test_an_interrupted_export_leaves_the_former_one_whole(
    tmp_path: Path, runs: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a new export is checked: the id maps, model and metadata already there
    still belong together (score works with them) and no temporary file is left."""
    import shutil

    import onnx.checker

    out = tmp_path / "ex" / model.name  # the files name each other: the same names
    shutil.copytree(model.parent, out.parent)
    before = {f.name: f.read_bytes() for f in out.parent.iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx.checker, "check_model", interrupted)
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out),
                                 "--alpha", "0.3"])
    assert result.exit_code == 130, result.stderr
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in out.parent.iterdir()} == before
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    scored = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert scored.exit_code == 0, scored.stderr


def test_a_damaged_model_file_is_refused(tmp_path: Path, model: Path) -> None:
    """Bytes changed inside the model's weights (the size intact, the graph still loads): the
    SHA-256 in the JSON beside it no longer matches, and score says so in one line."""
    import shutil

    copy = tmp_path / "ex" / model.name
    shutil.copytree(model.parent, copy.parent)
    data = bytearray(copy.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    copy.write_bytes(bytes(data))
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    result = runner.invoke(app, ["score", str(src), "--model", str(copy)])
    assert result.exit_code == 1, result.stdout
    assert "damaged" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_score_out_never_replaces_the_model_or_its_files(tmp_path: Path, model: Path) -> None:
    """--out naming the model or one of the files beside it is refused before anything is
    written: the export stays scorable."""
    import shutil

    copy = tmp_path / "ex" / model.name
    shutil.copytree(model.parent, copy.parent)
    before = {p.name: p.read_bytes() for p in copy.parent.iterdir()}
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    for name in (copy.name, f"{copy.name}.json", f"{copy.name}.songs.parquet"):
        result = runner.invoke(
            app, ["score", str(src), "--model", str(copy), "--out", str(copy.parent / name)]
        )
        assert result.exit_code == 1, name
        assert "is the model's file" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in copy.parent.iterdir()} == before


def test_score_out_writes_through_links_and_pipes(tmp_path: Path, model: Path) -> None:
    """A symbolic link stays a link (the file it names gets the CSV); a named pipe (like
    /dev/stdout) is written to, not replaced by a regular file."""
    import threading

    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    expected = runner.invoke(app, ["score", str(src), "--model", str(model)]).stdout
    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old")
    link.symlink_to(target.name)
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(link)])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and target.read_text() == expected

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    # a daemon: should scoring fail before it opens the pipe, the blocked reader cannot
    # keep the test process alive
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(fifo)])
    reader.join(timeout=60)
    assert result.exit_code == 0, result.stderr
    assert got == [expected]
    assert not fifo.is_file() and fifo.is_fifo()


def test_score_without_the_metadata_file_reads_the_models_own(
    tmp_path: Path, runs: Path
) -> None:
    """The id column names come from the model itself when the JSON file beside it is gone;
    an unreadable JSON file or a --model that is not ONNX is named as such (not as columns
    missing from the input)."""
    out = tmp_path / "ex" / "m.onnx"
    data = json.loads((runs / "mdr" / "run.json").read_text())["data"]["path"]
    assert pl.read_parquet(Path(data) / "songs.parquet").height  # the planted data
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    expected = runner.invoke(app, ["score", str(src), "--model", str(out)]).stdout
    out.with_name("m.onnx.json").unlink()
    result = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == expected
    out.with_name("m.onnx.json").write_text("{bad")
    result = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert result.exit_code == 1 and "unreadable metadata file" in result.stderr
    result = runner.invoke(app, ["score", str(src), "--model", str(src)])
    assert result.exit_code == 1 and "not a readable ONNX model" in result.stderr


def test_score_metadata_checks_need_no_onnx_and_come_before_the_input(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the JSON file the model's own metadata is read with neither onnx (not part of
    a scoring install) nor a warning missed: the model cannot be checked for damage then. A
    JSON file that is no object, or another export's (trained on other column names), is one
    line about that file, not a traceback or a complaint about the input's columns."""
    out = tmp_path / "ex" / "m.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    side = out.with_name("m.onnx.json")
    kept = side.read_text()
    expected = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert expected.exit_code == 0 and "cannot be checked" not in expected.stderr
    side.unlink()
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` fails as if not installed
    result = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == expected.stdout
    assert f"warning: {side} is missing: m.onnx cannot be checked for damage" in result.stderr
    for text in ("[]", "null", "42"):
        side.write_text(text)
        result = runner.invoke(app, ["score", str(src), "--model", str(out)])
        assert result.exit_code == 1 and result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"masr: error: {side}: unreadable metadata file (not a JSON object)"
        ]
    other = json.loads(kept)
    other["export_id"] = "another"
    other["data"]["columns"] = {"user": "owner", "playlist": "list", "track": "song"}
    side.write_text(json.dumps(other))
    result = runner.invoke(app, ["score", str(src), "--model", str(out)])
    assert result.exit_code == 1
    assert "belongs to another export than m.onnx" in result.stderr
    assert "missing column" not in result.stderr


def test_score_refuses_an_unreadable_input_before_writing_anything(
    tmp_path: Path, model: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """A gzip cut short past its first playlists, or a row without a playlist id after the
    first playlist: one error line and nothing on stdout (QA: 152,431 lines of a truncated
    file's first playlists, or the header, were written before the error)."""
    from masr.errors import MasrError
    from masr.score import ScoreConfig, score_file

    lines = ["user_id,playlist_id,track_id"]
    lines += [f"u{i % 12},p{i},s{(i + j) % 48}" for i in range(20_000) for j in range(3)]
    blob = gzip.compress(("\n".join(lines) + "\n").encode())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(blob[: len(blob) * 2 // 3])
    result = runner.invoke(app, ["score", str(cut), "--model", str(model)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"{cut}: unreadable or malformed file" in result.stderr
    empty = tmp_path / "empty_id.csv"
    empty.write_text("\n".join([*lines[:3000], "u0,,s3", *lines[3000:]]) + "\n")
    # to stdout in chunks of 1,000 rows: the playlists before the bad spot would be written
    for bad, why in ((cut, "unreadable or malformed file"),
                     (empty, r"1 row\(s\) have no playlist id \(empty or \\N")):
        with pytest.raises(MasrError, match=why):
            score_file(bad, model, None, ScoreConfig(read_rows=1000))
        assert capsysbinary.readouterr().out == b"", bad


def test_score_counts_rows_without_a_track(tmp_path: Path, model: Path) -> None:
    """A row with an empty track id inside a playlist that has songs is ignored and counted;
    a playlist of such rows only is an empty playlist to continue (not counted)."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS + "u0,p0,\nu0,p0,\nu5,empty,\n")
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "2"])
    assert result.exit_code == 0, result.stderr
    assert "2 rows without a track id ignored" in result.stderr
    assert {line.split(",")[0] for line in result.stdout.splitlines()[1:]} == {
        "p0", "fresh", "empty"
    }


def test_score_reads_a_database_null_mark_as_a_missing_id(tmp_path: Path, model: Path) -> None:
    """\\N, how MySQL, PostgreSQL and Hive export NULL, is a missing id as an empty field is
    (QA: the rows of two playlists without an id were scored as one playlist '\\N')."""
    src = tmp_path / "in.tsv"
    src.write_text(ROWS.replace(",", "\t") + "u0\tp0\t\\N\n\\N\tfresh\ts41\n")
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "2"])
    assert result.exit_code == 0, result.stderr
    assert "1 row without a track id ignored" in result.stderr
    assert "0 playlists of new users" in result.stderr  # fresh keeps its user u9
    assert "\\N" not in result.stdout
    src.write_text(ROWS.replace(",", "\t") + "u0\t\\N\ts3\nu1\t\\N\ts4\n")
    result = runner.invoke(app, ["score", str(src), "--model", str(model)])
    assert result.exit_code == 1 and result.stdout == ""
    # where the first is, as masr prep says it (QA: prep's line named the row, score's not)
    assert "2 row(s) have no playlist id (empty or \\N; first at data row 5)" in result.stderr


def test_export_out_inside_the_prepared_data_is_refused(tmp_path: Path, runs: Path) -> None:
    data = Path(json.loads((runs / "mdr" / "run.json").read_text())["data"]["path"])
    before = sorted(p.name for p in data.iterdir())
    result = runner.invoke(
        app, ["export", "--runs", str(runs), "--out", str(data / "train.parquet")]
    )
    assert result.exit_code == 1
    assert "inside the prepared data folder" in result.stderr
    assert sorted(p.name for p in data.iterdir()) == before


def test_export_out_inside_a_run_folder_is_refused(tmp_path: Path, runs: Path) -> None:
    """--out naming one of the checkpoints the export reads (QA: it replaced the trained run
    with the ONNX file) or any file of a run folder: one line, every file left as it was."""
    # a training run's checkpoint being written: the clean-up of a killed export's temporary
    # files beside --out must not take it (the check comes first)
    (runs / "mdr" / ".best.pt.abcd1234.tmp").write_bytes(b"being written")
    before = {p: p.read_bytes() for p in runs.glob("*/*") if p.is_file()}
    for out in (runs / "mdr" / "best.pt", runs / "mass" / "model.onnx"):
        result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
        assert result.exit_code == 1, out
        assert f"inside the run folder {out.parent.resolve()}" in result.stderr
    assert {p: p.read_bytes() for p in runs.glob("*/*") if p.is_file()} == before
    (runs / "mdr" / ".best.pt.abcd1234.tmp").unlink()


def test_score_out_never_names_a_runs_own_file(tmp_path: Path, runs: Path, model: Path) -> None:
    """Review: --out runs/mdr/best.pt would have replaced the checkpoint with the CSV."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    before = (runs / "mdr" / "best.pt").read_bytes()
    out = runs / "mdr" / "best.pt"
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--out", str(out)])
    assert result.exit_code == 1 and f"--out {out}: a file of the run folder" in result.stderr
    assert (runs / "mdr" / "best.pt").read_bytes() == before


def test_export_replaces_an_earlier_export_only(tmp_path: Path, runs: Path) -> None:
    """--out naming an existing file that is not a masr export (QA fuzz: a text file became
    an ONNX model in silence) is refused and left as it was; an earlier export is replaced."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(notes)])
    assert result.exit_code == 1
    assert "an existing file that is not a masr export" in result.stderr
    assert notes.read_text() == "mine"
    out = tmp_path / "m.onnx"
    for _ in range(2):
        result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
        assert result.exit_code == 0, result.stderr
    # the files written beside --out too (QA: another program's m2.onnx.json was replaced)
    mine = tmp_path / "m2.onnx.json"
    mine.write_text('{"mine": 1}')
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(tmp_path / "m2.onnx")])
    assert result.exit_code == 1 and "m2.onnx.json exists and is not a masr export's" in (
        result.stderr
    )
    assert mine.read_text() == '{"mine": 1}' and not (tmp_path / "m2.onnx").exists()
    out.unlink()  # an earlier export's files without its model: still its own, replaced
    result = runner.invoke(app, ["export", "--runs", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    a_file = runner.invoke(app, ["export", "--runs", str(notes), "--out", str(out)])
    assert a_file.exit_code == 1 and "is a file, not a folder" in a_file.stderr


def test_export_out_naming_a_folder_is_refused(tmp_path: Path, runs: Path) -> None:
    """--out DIR/ (a folder meant, not yet there) or an existing folder: one line asking for
    a file name; nothing is written."""
    for out in (f"{tmp_path / 'new'}/", str(tmp_path)):
        result = runner.invoke(app, ["export", "--runs", str(runs), "--out", out])
        assert result.exit_code == 1, out
        assert "is a folder; give a file name" in result.stderr
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_candidate_counts_out_of_range_and_two_stage_hints(tmp_path: Path, runs: Path) -> None:
    """A count past int32 is one line (not an ONNX Runtime traceback); a one-part export asked
    for --candidates says two stages need a fusion; an export whose N is below score's default
    K says so, and score names whose N is too small."""
    src = tmp_path / "in.csv"
    src.write_text(ROWS)
    huge = str(10**20)
    for args in (["export", "--runs", str(runs), "--candidates", huge],
                 ["export", "--runs", str(runs), "--chunk", huge],
                 ["score", str(src), "--candidates", huge]):
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "x.onnx")])
        assert result.exit_code == 1 and "at most 2,147,483,647" in result.stderr, args
        assert "Traceback" not in result.stderr
    part = tmp_path / "mdr.onnx"
    assert runner.invoke(app, ["export", "--runs", str(runs), "--model", "mdr", "--out",
                               str(part)]).exit_code == 0
    result = runner.invoke(app, ["score", str(src), "--model", str(part), "--candidates", "5"])
    assert result.exit_code == 1 and "one-part export (mdr)" in result.stderr
    small = tmp_path / "n5.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--candidates", "5", "--out",
                                 str(small)])
    assert result.exit_code == 0 and "below masr score's default --k 10" in result.stderr
    result = runner.invoke(app, ["score", str(src), "--model", str(small)])
    assert result.exit_code == 1 and "of this two-stage export" in result.stderr
    result = runner.invoke(app, ["score", str(src), "--model", str(small), "--candidates", "7"])
    assert result.exit_code == 1 and "asked for (--candidates)" in result.stderr
    result = runner.invoke(app, ["score", str(src), "--model", str(small), "--k", "5"])
    assert result.exit_code == 0, result.stderr


def test_fold_in_on_an_export_without_mdr_is_noted(tmp_path: Path, runs: Path) -> None:
    result = runner.invoke(app, ["export", "--runs", str(runs), "--model", "mass", "--fold-in",
                                 "mean", "--out", str(tmp_path / "mass.onnx")])
    assert result.exit_code == 0, result.stderr
    assert "--fold-in mean not used" in result.stderr


def test_an_export_without_mdr_says_how_songless_playlists_are_ranked(
    tmp_path: Path, runs: Path
) -> None:
    """α 0 exports MASS alone: a playlist with no known song has no user taste to fall back
    on, only MASS's song biases; export and score say so (with MDR: user taste first)."""
    src = tmp_path / "in.csv"
    src.write_text("user_id,playlist_id,track_id\nu0,NEW,unknown\n")
    for alpha, said in (("0", "MASS's song biases alone"), ("0.5", "user taste, then")):
        out = tmp_path / alpha / "m.onnx"
        export = runner.invoke(
            app, ["export", "--runs", str(runs), "--alpha", alpha, "--out", str(out)]
        )
        assert export.exit_code == 0, export.stderr
        assert ("without MDR" in export.stderr) == (alpha == "0")
        result = runner.invoke(app, ["score", str(src), "--model", str(out), "--k", "3"])
        assert result.exit_code == 0, result.stderr
        assert f"1 playlist without a known song (ranked by {said}" in result.stderr


def test_a_known_playlist_without_a_known_song_is_ranked_by_its_trained_vector(
    tmp_path: Path, model: Path
) -> None:
    """A playlist the model was trained on keeps its trained MDR vector when none of its input
    songs is known: it ranks as with its songs (bar them), and the summary and the warning say
    so (QA: both said it was ranked by user taste, then popularity, as a new one is)."""
    with_songs, without = tmp_path / "with.csv", tmp_path / "without.csv"
    with_songs.write_text("user_id,playlist_id,track_id\nu0,p0,s1\n")
    without.write_text("user_id,playlist_id,track_id\nu0,p0,zz\nu0,NEW,zz\n")
    alone = runner.invoke(app, ["score", str(without), "--model", str(model), "--k", "5"])
    assert alone.exit_code == 0, alone.stderr
    summary = next(line for line in alone.stderr.splitlines() if line.startswith("scored"))
    assert "1 playlist without a known song (ranked by user taste" in summary
    assert "1 known playlist without a known song (each ranked by its trained" in summary
    assert "known playlists by their trained vectors, the others by user taste" in alone.stderr
    only_known = tmp_path / "only_known.csv"
    only_known.write_text("user_id,playlist_id,track_id\nu0,p0,zz\n")
    result = runner.invoke(app, ["score", str(only_known), "--model", str(model), "--k", "5"])
    assert result.exit_code == 0, result.stderr
    assert "0 playlists without a known song" in result.stderr
    assert "warning: none of the input's songs is in the model's catalog" in result.stderr
    assert "every playlist was ranked by" not in result.stderr
    # its trained vector ranks it: the MDR part as with its songs (α 1 exports MDR alone)
    mdr = tmp_path / "mdr.onnx"
    export = runner.invoke(app, ["export", "--runs", str(model.parent.parent / "runs"),
                                 "--model", "mdr", "--out", str(mdr)])
    assert export.exit_code == 0, export.stderr
    known = runner.invoke(app, ["score", str(with_songs), "--model", str(mdr), "--k", "5"])
    bare = runner.invoke(app, ["score", str(only_known), "--model", str(mdr), "--k", "6"])
    assert known.exit_code == 0 and bare.exit_code == 0, (known.stderr, bare.stderr)
    rows = [line for line in bare.stdout.splitlines()[1:] if ",s1," not in line]
    drop_rank = [line.split(",", 2)[2] for line in rows[:5]]
    assert drop_rank == [line.split(",", 2)[2] for line in known.stdout.splitlines()[1:]]


def test_export_on_other_data_is_one_line(tmp_path: Path, runs: Path) -> None:
    """QA: `masr export --data` naming other prepared data said "exporting ... from" and the
    fusion's α before the error; the data is now checked first, so the refusal stands alone."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(runs.parent / "data", other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["fingerprint"] = "0" * len(manifest["fingerprint"])
    (other / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "x.onnx"
    result = runner.invoke(app, ["export", "--runs", str(runs), "--data", str(other),
                                 "--out", str(out)])
    assert result.exit_code == 1 and not out.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not the data the checkpoints were trained on" in lines[0]
