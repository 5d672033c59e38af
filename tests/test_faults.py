"""Faults a real machine has: kill -9, two commands on one output, a disk that fills up.

Real subprocesses where the fault is between processes (kill -9, two trainings at once); the
command that follows runs in-process (CliRunner), which is faster and sees the same files.
Nothing waits on sleeps: a subprocess started through ``GATED`` stops at a named point, writes
``<gate>.waiting`` and waits for ``<gate>``, so a kill or a second command lands exactly there
however busy the machine is.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from masr.errors import MasrError
from masr.lock import lock_path, locked
from masr_cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--batch-size", "32", "--lr", "0.02", "--dim", "8", "--threads", "1"]

#: `masr ...` that stops at MASR_GATE_AT: "epoch" (after run.json records an epoch; "epoch:mass":
#: of run mass), "dir"
#: (prep's folder written, before its rename) or a file-name suffix (before that atomic write)
GATED = textwrap.dedent(
    """
    import contextlib, os, sys, time
    import masr.atomic as atomic

    gate, at = os.environ["MASR_GATE"], os.environ["MASR_GATE_AT"]

    def wait():
        open(gate + ".waiting", "w").close()
        while not os.path.exists(gate):
            time.sleep(0.02)

    real_path, real_dir, real_group = atomic.atomic_path, atomic.atomic_dir, atomic.atomic_group

    @contextlib.contextmanager
    def atomic_path(path):
        if str(path).endswith(at):
            wait()
        with real_path(path) as tmp:
            yield tmp

    @contextlib.contextmanager
    def atomic_group():
        with real_group() as stage:
            def gated(path):
                if str(path).endswith(at):
                    wait()
                return stage(path)
            yield gated

    @contextlib.contextmanager
    def atomic_dir(path):
        with real_dir(path) as tmp:
            yield tmp
            if at == "dir":
                wait()

    atomic.atomic_path, atomic.atomic_dir = atomic_path, atomic_dir  # before importers bind them
    atomic.atomic_group = atomic_group
    import masr.runs.make as make

    real_json = make.write_run_json

    def write_run_json(run_dir, info):
        real_json(run_dir, info)
        if at in ("epoch", "epoch:" + info["run"]) and info.get("status") == "running" and (
            info.get("history")
        ):
            wait()

    make.write_run_json = write_run_json
    from masr_cli.main import app
    app(sys.argv[1:], prog_name="masr")
    """
)


#: subprocesses of the running test: killed when it ends, so a failed test leaves none waiting
_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _one_thread_and_no_leftovers():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import write_planted

    return write_planted(tmp_path_factory.mktemp("faults") / "data")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}


def _masr(*args: str, gate: Path | None = None, at: str = "") -> subprocess.Popen:
    """``masr args`` in a subprocess; with ``gate``, stopping at ``at`` (see GATED)."""
    code = ["-c", GATED] if gate else ["-m", "masr_cli.main"]
    env = {**_env(), "MASR_GATE": str(gate), "MASR_GATE_AT": at} if gate else _env()
    proc = subprocess.Popen(
        [sys.executable, *code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc


def _reach(proc: subprocess.Popen, gate: Path, timeout: float = 120.0) -> None:
    """Wait until ``proc`` stops at its gate (failing with its stderr if it ends first)."""
    deadline = time.monotonic() + timeout
    while not Path(f"{gate}.waiting").exists():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before its gate: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "gate not reached in time"
        time.sleep(0.02)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)  # reaped: its pid is gone, not a zombie that os.kill(pid, 0) finds
    proc.stdout.close()
    proc.stderr.close()


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def _one_error_line(stderr: str, *fragments: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("masr: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _taken_over(stderr: str, lock: Path) -> None:
    warnings = [line for line in stderr.splitlines() if line.startswith("masr: warning: ")]
    assert len(warnings) == 1 and str(lock) in warnings[0] and "taking over" in warnings[0]
    assert not lock.exists()


def _history(run_dir: Path) -> list[dict]:
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished"
    drop = ("train_seconds", "valid_seconds")
    return [{k: v for k, v in h.items() if k not in drop} for h in info["history"]]


def test_kill_then_resume_gives_the_uninterrupted_history(tmp_path: Path, data: Path) -> None:
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs)]
    proc = _masr(*train, *TINY, "--epochs", "2", gate=gate, at="epoch")
    _reach(proc, gate)  # epoch 1 is in last.pt and run.json; the lock is held
    _kill(proc)
    lock = runs / "mdr" / ".lock"
    assert json.loads(lock.read_text())["pid"] == proc.pid

    resumed = _ok([*train, "--epochs", "3", "--resume"])  # options come from the run
    assert "resuming" in resumed.stderr
    _taken_over(resumed.stderr, lock)
    _ok(["train", "--model", "mdr", "--data", str(data), "--runs", str(tmp_path / "straight"),
         *TINY, "--epochs", "3"])
    assert _history(runs / "mdr") == _history(tmp_path / "straight" / "mdr")
    assert len(_history(runs / "mdr")) == 3
    a = torch.load(runs / "mdr" / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "straight" / "mdr" / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_after_a_kill_anywhere_a_plain_train_takes_the_lock_over(
    tmp_path: Path, data: Path
) -> None:
    """No gate: killed wherever the first epoch's run.json finds it (mid-epoch, mid-save)."""
    runs = tmp_path / "runs"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    proc = _masr(*train, "--epochs", "1000")
    deadline = time.monotonic() + 120
    while not (runs / "mdr" / "run.json").exists() or not _epochs(runs / "mdr"):
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before its first epoch: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "no epoch in time"
        time.sleep(0.02)
    _kill(proc)
    result = _ok([*train, "--epochs", "2"])
    _taken_over(result.stderr, runs / "mdr" / ".lock")
    assert [h["epoch"] for h in _history(runs / "mdr")] == [1, 2]


def _epochs(run_dir: Path) -> int:
    try:
        return len(json.loads((run_dir / "run.json").read_text())["history"])
    except (OSError, ValueError, KeyError):
        return 0


def test_two_trainings_on_one_run_exactly_one_trains(tmp_path: Path, data: Path) -> None:
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    first = _masr(*train, "--epochs", "2", "--seed", "1", gate=gate, at="epoch")
    _reach(first, gate)  # first holds runs/mdr/.lock and waits after its epoch 1
    second = _masr(*train, "--epochs", "2", "--seed", "2")
    out, err = second.communicate(timeout=120)  # returns while first still waits: no waiting
    assert second.returncode == 1 and out == "" and "Traceback" not in err
    _one_error_line(err, str(runs / "mdr" / ".lock"), "masr train", f"pid {first.pid}")
    gate.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["status"] == "finished" and info["train_config"]["seed"] == 1
    for name in ("best.pt", "last.pt"):  # every file from the first process
        ckpt = torch.load(runs / "mdr" / name, weights_only=True)
        assert ckpt["train_config"]["seed"] == 1
    last = torch.load(runs / "mdr" / "last.pt", weights_only=True)
    assert [h["loss"] for h in last["history"]] == [h["loss"] for h in info["history"]]
    assert not (runs / "mdr" / ".lock").exists()


def test_a_chain_refuses_a_part_made_again_by_another_training(tmp_path: Path, data: Path) -> None:
    """Runs are locked while made, not while read: a chain checks the parts it builds on."""
    runs, gate = tmp_path / "runs", tmp_path / "gate"
    train = ["train", "--data", str(data), "--runs", str(runs), *TINY, "--epochs", "2"]
    chain = _masr(*train, "--model", "masr", gate=gate, at="epoch:mass")
    _reach(chain, gate)  # mdr made, mass being made
    _ok([*train, "--model", "mdr", "--seed", "7"])  # mdr is free: made again, other options
    gate.touch()
    out, err = chain.communicate(timeout=120)
    assert chain.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"masr: error: {runs / 'mdr'}: made again")
    assert not (runs / "masr" / "best.pt").exists()


@pytest.fixture(scope="module")
def mdr_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished runs/mdr (2 epochs), only read by the tests that use it."""
    runs = tmp_path_factory.mktemp("mdr") / "runs"
    _ok(["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY,
         "--epochs", "2"])
    return runs


def test_a_reused_or_read_run_never_waits_for_its_lock(
    mdr_runs: Path, data: Path, tmp_path: Path
) -> None:
    """A live holder of runs/mdr/.lock (here: pid 1) blocks making mdr, not reading it."""
    lock = mdr_runs / "mdr" / ".lock"
    lock.write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "command": "masr train"}))
    try:
        train = ["train", "--data", str(data), "--runs", str(mdr_runs), *TINY, "--epochs", "2"]
        result = runner.invoke(app, [*train, "--model", "mdr"])
        assert result.exit_code == 1
        _one_error_line(result.stderr, str(lock), "pid 1", "still running")
        result = _ok([*train, "--model", "amdr", "--adv-epochs", "1"])  # reuses mdr
        assert "mdr: reusing" in result.stderr
        _ok(["evaluate", "--data", str(data), "--runs", str(mdr_runs), "--model", "mdr"])
        assert lock.exists()  # still the holder's
    finally:
        lock.unlink()


def test_kill_during_prep_leaves_no_output_folder(tmp_path: Path) -> None:
    out, gate = tmp_path / "data", tmp_path / "gate"
    prep = ["prep", "--out", str(out), "--users", "60"]
    proc = _masr(*prep, gate=gate, at="dir")
    _reach(proc, gate)  # every table written into the temporary folder, not yet renamed
    _kill(proc)
    assert not out.exists()
    assert [p.name for p in tmp_path.glob(".data.*.tmp")]  # the killed prep's tables
    result = _ok(prep)
    _taken_over(result.stderr, tmp_path / "data.lock")
    assert (out / "manifest.json").is_file()
    assert "removed the temporary files of an earlier, killed masr prep" in result.stderr
    assert not list(tmp_path.glob(".data.*"))  # nothing of it left beside the new folder


@pytest.mark.parametrize("at", [".onnx", ".onnx.json"])
def test_kill_during_export_leaves_nothing_scorable_or_a_complete_set(
    mdr_runs: Path, tmp_path: Path, at: str
) -> None:
    """``at``: killed after the id maps are written aside, before the model, or before the
    JSON file: the set is renamed into place only when complete, so no model is there (`masr
    score` refuses in one line); the next export removes the killed one's temporary files."""
    out, gate = tmp_path / "exported" / "m.onnx", tmp_path / "gate"
    export = ["export", "--runs", str(mdr_runs), "--model", "mdr", "--out", str(out)]
    proc = _masr(*export, gate=gate, at=at)
    _reach(proc, gate)
    _kill(proc)
    playlists = tmp_path / "p.csv"
    playlists.write_text("user_id,playlist_id,track_id\nu0,p0,s1\nu0,p0,s2\n")
    score = ["score", str(playlists), "--model", str(out), "--k", "3"]
    result = runner.invoke(app, score)
    published = [f.name for f in out.parent.glob("m.onnx*") if f.suffix != ".lock"]
    assert not published  # nothing renamed into place (the killed export's lock stays)
    assert result.exit_code == 1
    _one_error_line(result.stderr, str(out), "export one first")
    result = _ok(export)
    _taken_over(result.stderr, lock_path(out))
    assert "removed the temporary files" in result.stderr
    assert not list(out.parent.glob(".*.tmp"))  # no half-written file left behind
    assert len(_ok(score).stdout.splitlines()) == 1 + 3


def _fill_disk_part_way(real_save):
    def save(obj, path, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        Path(path).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    return save


def _dev_full(real_save):
    """The real thing: torch writes to /dev/full, which fails every write with ENOSPC."""

    def save(obj, path, *args, **kwargs):
        real_save(obj, "/dev/full", *args, **kwargs)

    return save


@pytest.mark.parametrize("fault", [_fill_disk_part_way, _dev_full])
def test_a_save_that_fails_part_way_keeps_the_previous_checkpoint(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch, fault
) -> None:
    if fault is _dev_full and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    runs = tmp_path / "runs"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok([*train, "--epochs", "2"])
    before = {n: (runs / "mdr" / n).read_bytes() for n in ("best.pt", "last.pt")}
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", fault(torch.save))
        result = runner.invoke(app, [*train, "--epochs", "3", "--resume"])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("masr: error: ")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0])  # after the log lines
    _one_error_line(errors[0], str(runs / "mdr"), "could not save the checkpoint")
    if fault is _fill_disk_part_way:
        assert "No space left on device" in result.stderr
    assert before == {n: (runs / "mdr" / n).read_bytes() for n in before}
    assert sorted(p.name for p in (runs / "mdr").iterdir()) == ["best.pt", "last.pt", "run.json"]
    result = _ok([*train, "--epochs", "3", "--resume"])  # room again: it carries on
    assert [h["epoch"] for h in _history(runs / "mdr")] == [1, 2, 3]


def test_lock_of_another_host_or_unreadable_is_never_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("masr.lock._SETTLE_S", 0.1)
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": 999999, "host": "elsewhere", "command": "masr prep"}))
    with pytest.raises(MasrError, match=r"elsewhere.*remove .*x\.lock"), locked(lock, "masr"):
        pass
    lock.write_text("")  # a holder that never filled its file
    with pytest.raises(MasrError, match="unreadable lock file"), locked(lock, "masr"):
        pass
    assert lock.exists()
    lock.unlink()
    with locked(lock, "masr") as held:  # free: taken, then released
        assert json.loads(held.read_text())["pid"] == os.getpid()
        with pytest.raises(MasrError, match="still running"), locked(lock, "masr"):
            pass
    assert not lock.exists()
    with pytest.raises(RuntimeError, match="boom"), locked(lock, "masr"):
        raise RuntimeError("boom")
    assert not lock.exists()  # released on an exception too
    assert lock_path(tmp_path / "data") == tmp_path / "data.lock"


def test_a_command_that_fails_before_writing_leaves_no_empty_folders(tmp_path: Path) -> None:
    """The lock makes its folders; a command that fails inside it (before writing anything)
    leaves none of them behind, while a folder that was there, or got files, stays."""
    from masr.lock import locked

    out = tmp_path / "a" / "b" / "m.onnx.lock"
    with pytest.raises(RuntimeError), locked(out, "masr export"):
        assert out.is_file()
        raise RuntimeError("failed before writing")
    assert not (tmp_path / "a").exists() and tmp_path.is_dir()
    with locked(out, "masr export"):
        (tmp_path / "a" / "b" / "m.onnx").write_text("x")
    assert (tmp_path / "a" / "b" / "m.onnx").is_file() and not out.exists()


def test_train_removes_what_a_killed_writer_left_in_its_run(tmp_path: Path, data: Path) -> None:
    """SIGKILL during a checkpoint or run.json write leaves its temporary file in the run
    folder; the next training of that run (which holds its lock) removes it."""
    runs = tmp_path / "runs"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    (runs / "mdr").mkdir(parents=True)
    for name in (".best.pt.k1ll3d_0.tmp", ".run.json.abcdefgh.tmp"):
        (runs / "mdr" / name).write_bytes(b"half a file")
    result = _ok([*train, "--epochs", "1"])
    assert "mdr: removed the temporary files of an earlier, killed masr train" in result.stderr
    assert sorted(p.name for p in (runs / "mdr").iterdir()) == ["best.pt", "last.pt", "run.json"]


def test_a_full_disk_is_one_line_naming_the_file(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prep's Parquet writer (Polars: a ComputeError "(os error 28)") and a failed checkpoint
    whose run.json update fails too: one line that names the file, not a traceback nor the
    second failure's bare "No space left on device"."""
    import polars as pl

    import masr.runs.make as make

    def full(self, path, *args, **kwargs):
        raise pl.exceptions.ComputeError(
            "parquet: File out of specification: underlying IO error: No space left on device "
            "(os error 28)"
        )

    out = tmp_path / "data"
    with monkeypatch.context() as patch:
        patch.setattr(pl.DataFrame, "write_parquet", full)
        result = runner.invoke(app, ["prep", "--out", str(out), "--users", "60"])
    assert result.exit_code == 1
    _one_error_line(result.stderr.splitlines()[-1], str(out), "No space left on device")
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []

    runs = tmp_path / "runs"
    train = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    real_json = make.write_run_json

    def run_json(run_dir, info):
        if info.get("status") == "failed":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_json(run_dir, info)

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", _dev_full(torch.save))
        patch.setattr(make, "write_run_json", run_json)
        result = runner.invoke(app, [*train, "--epochs", "1"])
    assert result.exit_code == 1
    _one_error_line(result.stderr.strip().splitlines()[-1], "best.pt", "could not save")


def test_a_lock_that_cannot_be_written_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while writing the lock's record: the error names the lock, and no empty
    lock file stays to be read as "unreadable" by every later command."""
    import masr.lock as lock

    def full(obj, fh, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "runs" / "mdr" / ".lock"
    with monkeypatch.context() as patch:
        patch.setattr(lock.json, "dump", full)
        with pytest.raises(OSError) as err, locked(target, "masr train"):
            pass
    assert err.value.filename == str(target) and err.value.errno == errno.ENOSPC
    assert not target.exists()
    with locked(target, "masr train"):
        assert target.is_file()
