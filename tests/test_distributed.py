"""Data-parallel training (issue 14): two CPU processes on the gloo backend.

The gradient reduction is checked exactly (two ranks' shards give the single process's
whole-batch gradient, dense and row-sparse), and ``masr train`` under ``torchrun`` end to end:
the same validation figures as one process within noise, files written by rank 0 only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from masr.distributed import World, shard, world
from masr.models.base import Batch
from masr.models.mdr import MDR, MDRConfig

needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_and_batch() -> tuple[MDR, Batch, torch.Tensor]:
    torch.manual_seed(0)
    model = MDR(MDRConfig(dim=8, dropout=0.0), n_users=5, n_playlists=7, n_songs=30)
    for emb in (model.user_emb, model.playlist_emb, model.song_emb, model.song_bias):
        emb.sparse = True
    gen = torch.Generator().manual_seed(1)
    users = torch.randint(0, 5, (9,), generator=gen)
    playlists = torch.randint(0, 7, (9,), generator=gen)
    batch = Batch(users, playlists, torch.zeros(9, 1, dtype=torch.long),
                  torch.zeros(9, 1, dtype=torch.bool))
    songs = torch.randint(0, 30, (9, 5), generator=gen)  # positive + 4 negatives per row
    return model, batch, songs


def _loss(model: MDR, batch: Batch, songs: torch.Tensor) -> torch.Tensor:
    o = model.distance(batch, songs)
    return torch.nn.functional.softplus(o[:, :1] - o[:, 1:]).mean()


def _worker(rank: int, size: int, port: int, out: str) -> None:
    import masr.distributed as md

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    md.init_from_env("cpu")
    try:
        model, batch, songs = _model_and_batch()
        part = md.shard(songs.shape[0])
        _loss(model, batch.select(part), songs[part]).backward()
        n_local = len(range(songs.shape[0])[part])
        params = [p for p in model.parameters() if p.requires_grad]
        sparse = {id(m.weight) for m in model.modules()
                  if isinstance(m, torch.nn.Embedding) and m.sparse}
        md.reduce_gradients(params, sparse, n_local, songs.shape[0])
        grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).tolist()
                 for n, p in model.named_parameters()}
        Path(out, f"rank{rank}.json").write_text(json.dumps(grads))
    finally:
        md.shutdown()


@needs_gloo
def test_two_ranks_reduce_to_the_whole_batch_gradient(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    model, batch, songs = _model_and_batch()
    _loss(model, batch, songs).backward()  # one process, the whole (odd-sized) batch
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name, p in model.named_parameters():
            want = p.grad.to_dense() if p.grad.is_sparse else p.grad
            torch.testing.assert_close(torch.tensor(got[name]), want, rtol=1e-5, atol=1e-7)


def _timed_worker(rank: int, size: int, port: int, data_dir: str, out: str) -> None:
    """A rank of ``masr.train.train_model`` under --time-limit; rank 1's clock runs 3x fast,
    as if its epochs had taken longer (it counts the waits for rank 0's checkpoints)."""
    import time

    import masr.distributed as md
    from masr.config import TrainConfig
    from masr.dataset import load_prepared
    from masr.train import train_model

    if rank == 1:
        real, start = time.perf_counter, time.perf_counter()
        time.perf_counter = lambda: start + 3 * (real() - start)  # type: ignore[assignment]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    md.init_from_env("cpu")
    try:
        data = load_prepared(data_dir)
        torch.manual_seed(0)
        model = MDR(MDRConfig(dim=8), data.n_users, data.n_playlists, data.n_songs)
        config = TrainConfig(epochs=10_000, batch_size=32, patience=0, time_limit=1.5,
                             loss="bpr", neg=4, neg_mode="hardest", select="sampled")
        result = train_model(model, data, config)
        Path(out, f"rank{rank}.json").write_text(json.dumps(len(result.history)))
    finally:
        md.shutdown()


@needs_gloo
def test_time_limit_stops_every_rank_at_the_same_epoch(planted_dir: Path, tmp_path: Path) -> None:
    """--time-limit under torchrun: the ranks' clocks differ, and a rank that stopped on its
    own left the others waiting in the next all-reduce (QA: torchrun hung until killed).
    Rank 0's decision counts for all."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(target=_timed_worker, args=(r, 2, port, str(planted_dir), str(tmp_path)))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join()
    assert not hung, "a rank was still training (waiting for a peer that had stopped)"
    assert [p.exitcode for p in procs] == [0, 0]
    epochs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert epochs[0] == epochs[1] and epochs[0] < 10_000


def test_one_process_is_rank_0_of_1_and_takes_every_row() -> None:
    assert world() == World() and world().is_main and not world().distributed
    assert list(range(10)[shard(10)]) == list(range(10))


@needs_gloo
def test_masr_train_under_torchrun_matches_one_process(planted_dir: Path, tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 -m masr_cli.main train` as a user runs it."""
    args = ["train", "--model", "mdr", "--data", str(planted_dir), "--epochs", "4",
            "--patience", "0", "--threads", "1", "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    single = subprocess.run(
        [sys.executable, "-m", "masr_cli.main", *args, "--runs", str(tmp_path / "one")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(_free_port()), "-m", "masr_cli.main", *args,
         "--runs", str(tmp_path / "two")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    assert "data-parallel over 2 processes" in two.stderr
    assert two.stderr.count("next: masr evaluate") == 1  # the table: rank 0 only
    one_run = json.loads((tmp_path / "one" / "mdr" / "run.json").read_text())
    two_run = json.loads((tmp_path / "two" / "mdr" / "run.json").read_text())
    assert two_run["status"] == "finished" and len(two_run["history"]) == 4
    assert sorted(p.name for p in (tmp_path / "two" / "mdr").iterdir()) == [
        "best.pt", "last.pt", "run.json"
    ]
    for a, b in zip(one_run["history"], two_run["history"], strict=True):
        # the same steps up to the per-rank dropout masks: the same figures within noise
        assert abs(a["loss"] - b["loss"]) < 0.02
        assert abs(a["valid"]["hit@10"] - b["valid"]["hit@10"]) < 0.08


def test_a_rank_whose_peer_stopped_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under torchrun, an error on rank 0 (a runs folder below a file, a held lock) leaves the
    other ranks failing in a collective with gloo's "Connection closed by peer": one line
    pointing to the rank that says why, not a traceback. In one process such an error is
    not reworded."""
    import typer

    from masr.errors import MasrError
    from masr_cli._common import handle_errors

    def train() -> None:
        raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:16279.")

    train.__module__ = "masr_cli.train"  # the one command torchrun runs
    command = handle_errors(train)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(typer.Exit) as stopped:
        command()
    assert stopped.value.exit_code == 1
    assert capsys.readouterr().err == (
        "masr: error (rank 1 of 2): another process of this torchrun stopped; its own error "
        "line says why\n"
    )
    # an error every process meets: the first says it plainly, the others with their rank
    def refused() -> None:
        raise MasrError("--data none: no prepared data")

    refused.__module__ = "masr_cli.train"
    with pytest.raises(typer.Exit):
        handle_errors(refused)()
    assert capsys.readouterr().err == "masr: error (rank 1 of 2): --data none: no prepared data\n"
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(typer.Exit):
        handle_errors(refused)()
    assert capsys.readouterr().err == "masr: error: --data none: no prepared data\n"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        command()


@pytest.mark.parametrize(
    ("args", "status"),
    [(["train", "--modle", "amasr"], 2), (["train", "--runs", ""], 2)],
)
def test_a_usage_error_under_torchrun_names_the_rank_after_the_first(
    args: list[str], status: int
) -> None:
    """A usage error (an unknown option, an empty value) is met by every process torchrun
    started, before any command runs: rank 0 says it plainly and the others name their rank,
    as with the commands' own errors, so one mistake does not read as several (QA: two
    identical lines under --nproc-per-node 2)."""
    lines = {}
    for rank in ("0", "1"):
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": rank}
        proc = subprocess.run(
            [sys.executable, "-c", "from masr_cli.main import run; run()", *args],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert proc.returncode == status and proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        lines[rank] = proc.stderr.strip()
    assert lines["0"].startswith("masr: error: ")
    assert lines["1"] == lines["0"].replace("masr: error: ", "masr: error (rank 1 of 2): ", 1)


def test_only_train_runs_under_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process of a torchrun would run a whole `masr reproduce` or `masr evaluate`,
    colliding on the same files: refused in one line; `masr train` is not."""
    from typer.testing import CliRunner

    from masr_cli.main import app

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    runner = CliRunner()
    for args in (["evaluate", "--data", str(tmp_path)], ["analyze", "speed", "--runs", "r"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert result.stderr == (
            f"masr: error: masr {args[0]} runs as one process; only masr train runs under "
            "torchrun\n"
        )
    train = runner.invoke(app, ["train", "--data", str(tmp_path / "none")])
    assert "only masr train" not in train.stderr
