"""`masr score --engine ray`: Ray Data batch inference gives the local engine's CSV byte for byte
and the same rows as Parquet parts, on a two-CPU Ray cluster started here; without Ray it is one
error line, and the local engine never imports Ray."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import test_score
from test_score import write_csv
from typer.testing import CliRunner

from masr.score import ScoreConfig, score_file
from masr_cli.main import app

runner = CliRunner()
exported = test_score.exported  # the fixture: an AMASR export, random weights, songs s0..s47

OUT_SCHEMA = {"playlist_id": pl.String, "rank": pl.Int32, "track_id": pl.String,
              "score": pl.Float32}  # fmt: skip


def playlists() -> list[tuple[str, str, str]]:
    """Several dozen playlists in shuffled order over the export's ids (users u0..u11,
    playlists p0..p35, songs s0..s47): known and new playlists, known and new users, songs
    outside the catalog, a duplicate row, one playlist with no known song and one with fewer
    than K songs left."""
    rng = np.random.default_rng(7)
    lists: dict[tuple[str, str], list[str]] = {}
    for i in range(36):
        lists[(f"u{i % 12}", f"p{i}")] = [f"s{s}" for s in rng.choice(48, 1 + i % 6, False)]
    for i in range(24):
        user = f"u{i % 12}" if i % 3 else f"guest{i % 4}"
        songs = [f"s{s}" for s in rng.choice(48, 1 + i % 9, False)]
        lists[(user, f"new{i}")] = songs + ([f"elsewhere{i}"] if i % 4 == 0 else [])
    lists[("u3", "p3")].append(lists[("u3", "p3")][0])  # a duplicate row
    lists[("guest9", "void")] = ["nowhere", "nothing"]  # no known song: the fallback
    lists[("u5", "big")] = [f"s{s}" for s in range(45)]  # 3 songs left for K = 5
    keys = list(lists)
    return [(user, pid, track) for j in rng.permutation(len(keys))
            for user, pid in [keys[j]] for track in lists[keys[j]]]  # fmt: skip


@pytest.fixture(scope="module")
def ray_cluster():
    """A local two-CPU Ray cluster for this module; `masr score` joins it."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # new, even if one runs
    yield ray
    ray.shutdown()


def score(src: Path, model: Path, *extra: str):
    result = runner.invoke(app, ["score", str(src), "--model", str(model), "--k", "5", *extra])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def summary(result) -> str:
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("scored")]
    return line


def test_ray_gives_the_local_csv_and_parquet_rows(
    tmp_path: Path, exported: Path, ray_cluster
) -> None:
    src = write_csv(tmp_path / "in.csv", playlists())
    local = score(src, exported)
    ray = score(src, exported, "--engine", "ray")
    assert ray.stdout_bytes == local.stdout_bytes  # byte for byte, input order
    assert pl.read_csv(local.stdout_bytes)["playlist_id"].n_unique() == 62
    head, _, counts = summary(ray).partition(" · ")
    assert counts == summary(local).partition(" · ")[2]  # the same counts on both engines
    assert "on CPU, 2 Ray actors" in head and "62 playlists" in head
    assert "1 playlist with fewer than K songs left" in counts
    blocks = re.search(r"Ray Data: (\d+) block\(s\) of playlists over 2 CPU actor\(s\)", ray.stderr)
    assert blocks and int(blocks[1]) > 2  # the work was spread

    csv = tmp_path / "recs.csv"
    assert score(src, exported, "--engine", "ray", "--out", str(csv)).stdout == ""
    assert csv.read_bytes() == local.stdout_bytes

    parts = tmp_path / "recs"
    want = pl.read_csv(local.stdout_bytes, schema=OUT_SCHEMA).sort("playlist_id", "rank")
    for workers in ("2", "1"):  # the second run replaces the first's parts
        score(src, exported, "--engine", "ray", "--format", "parquet", "--out", str(parts),
              "--workers", workers)  # fmt: skip
        got = pl.read_parquet(parts / "*.parquet")
        assert got.schema == pl.Schema(OUT_SCHEMA)
        assert got.sort("playlist_id", "rank").equals(want)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "recs", "recs.csv"]


def test_ray_keeps_input_order_across_read_chunks(
    tmp_path: Path, exported: Path, ray_cluster
) -> None:
    """Inputs read in several chunks (a playlist's rows adjacent): each chunk's rows are put
    back in input order as the next chunk's arrive; the bytes are the local engine's."""
    src = write_csv(tmp_path / "in.csv", playlists())
    outs = {}
    for engine in ("local", "ray"):
        outs[engine] = tmp_path / f"{engine}.csv"
        config = ScoreConfig(k=4, read_rows=40, engine=engine)
        summary = score_file(src, exported, outs[engine], config)
        assert summary.playlists == 62
    assert outs["ray"].read_bytes() == outs["local"].read_bytes()


def test_ray_errors_are_one_line(tmp_path: Path, exported: Path) -> None:
    pytest.importorskip("ray.data")
    src = write_csv(tmp_path / "in.csv", playlists()[:5])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    for extra, message in [
        (["--format", "parquet"], "--format parquet: needs --out DIR"),
        (["--format", "parquet", "--out", str(src)], "is a file; --format parquet writes a dir"),
        (["--format", "parquet", "--out", str(tmp_path / "notes")], "other files than Parquet"),
        (["--workers", "0"], "--workers 0: must be >= 1"),
        # the model's own files, as the local engine refuses them (they were overwritten)
        (["--out", str(exported)], "is the model's file"),
        (["--out", f"{exported}.json"], "is the model's file"),
    ]:
        args = ["score", str(src), "--model", str(exported), "--engine", "ray", *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and result.stdout == "", result.stderr
        assert result.stderr.startswith("masr: error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert onnx_is_whole(exported)


def test_an_input_refused_by_the_first_pass_starts_no_cluster(
    tmp_path: Path, exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row with a blank playlist id (``u,"",t``) is one error line before Ray starts or
    joins a cluster (QA: the line came after a local cluster was started, 7 s later)."""
    pytest.importorskip("ray.data")
    import masr.score_ray

    def no_cluster(ray):
        raise AssertionError("a Ray cluster was started for an input refused at once")

    monkeypatch.setattr(masr.score_ray, "_cluster", no_cluster)
    src = tmp_path / "in.csv"
    src.write_text('user_id,playlist_id,track_id\nu0,p0,s0\nu0,"",s1\nu1,"  ",s2\n')
    for extra in ([], ["--format", "parquet", "--out", str(tmp_path / "parts")]):
        args = ["score", str(src), "--model", str(exported), "--engine", "ray", *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and result.stdout == "", result.stderr
        assert result.stderr == (
            f"masr: error: {src}: 2 row(s) have no playlist id (empty or \\N; first at data "
            "row 2)\n"
        )
    assert not (tmp_path / "parts").exists()


def onnx_is_whole(path: Path) -> bool:
    import onnx

    onnx.load(str(path))  # raises if the file was replaced by CSV
    return True


def test_without_ray_the_ray_engine_is_one_clear_line(
    tmp_path: Path, exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    src = write_csv(tmp_path / "in.csv", playlists()[:5])
    out = tmp_path / "o.csv"
    args = ["score", str(src), "--model", str(exported), "--engine", "ray", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr == "masr: error: --engine ray needs Ray: pip install 'masr[ray]'\n"
    assert not out.exists()
    local = runner.invoke(app, ["score", str(src), "--model", str(exported), "--k", "2"])
    assert local.exit_code == 0, local.stderr  # the local engine needs no Ray
    parquet = runner.invoke(app, [*args[:4], "--format", "parquet", "--out", str(tmp_path)])
    assert parquet.exit_code == 1 and "--format parquet: needs --engine ray" in parquet.stderr


def test_the_local_engine_never_imports_ray(tmp_path: Path, exported: Path) -> None:
    src = write_csv(tmp_path / "in.csv", playlists()[:5])
    code = (
        "import sys\n"
        "from masr_cli.main import app\n"
        f"app(['score', {str(src)!r}, '--model', {str(exported)!r}, '--k', '2'],"
        " standalone_mode=False)\n"
        "import masr.score_ray\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("playlist_id,rank,track_id,score\n")


def test_an_error_raised_in_an_actor_comes_back_as_its_one_line(
    tmp_path: Path, ray_cluster
) -> None:
    """An actor that cannot load the model (say, missing on its node): Ray returns its own
    wrapper with the traceback text; the run's error is the actor's MasrError line."""
    import pyarrow as pa

    from masr.score_ray import Scorer, _raised_by_masr

    gone = tmp_path / "gone.onnx"
    kwargs = {"model": str(gone), "device": "cpu", "candidates": None, "k": 5, "with_order": True}
    dataset = ray_cluster.data.from_arrow(pa.table({"x": [1]})).map_batches(
        Scorer,
        fn_constructor_kwargs=kwargs,
        batch_size=None,
        batch_format="pyarrow",
        compute=ray_cluster.data.ActorPoolStrategy(size=1),
        num_cpus=1,
    )
    try:
        dataset.take_all()
    except Exception as exc:
        error = _raised_by_masr(exc)
    else:
        pytest.fail("the actor started without its model")
    assert str(error) == f"--model {gone}: no such file; export one first (masr export)"
    assert _raised_by_masr(RuntimeError("the raylet died")) is None


def test_an_unreachable_ray_address_is_one_line_not_a_hang() -> None:
    """Ray retries an address nobody answers at for minutes, deaf to Ctrl-C: masr checks it
    first (no Ray needed for that). Addresses Ray resolves itself are left alone."""
    import socket

    from masr.errors import MasrError
    from masr.score_ray import check_reachable

    for address in ("", "auto", "local"):
        check_reachable(address)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(MasrError, match="no Ray cluster answers at RAY_ADDRESS=127.0.0.1:"):
        check_reachable(f"127.0.0.1:{port}")  # closed now: refused at once
