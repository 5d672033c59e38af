"""benchmarks/bench_step.py: it times the training step of a run's own recipe from its
checkpoint, plain and with APR's second pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from masr_cli.main import app


@pytest.mark.parametrize("apr", [False, True])
def test_bench_step_times_a_trained_mass(planted_dir: Path, tmp_path: Path, apr: bool) -> None:
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        ["train", "--model", "mass", "--data", str(planted_dir), "--runs", str(runs),
         "--epochs", "1", "--neg", "16", "--batch-size", "32", "--threads", "1"],
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "step.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"
    argv = [sys.executable, str(script), str(runs / "mass" / "best.pt"), "--data",
            str(planted_dir), "--steps", "3", "--eager", "--json", str(out)]
    # its own process: it sets the allocator and the thread count as the CLI does
    done = subprocess.run(argv + (["--apr"] if apr else []), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ("mass + APR:" if apr else "mass:") in done.stdout
    figures = json.loads(out.read_text())
    assert figures["model"] == "mass" and figures["apr"] is apr and figures["steps"] == 3
    assert figures["loss"] == "softmax" and figures["neg"] == 16 and figures["batch_size"] == 32
    assert figures["ms_per_step_wall"] > 0 and figures["ms_per_step_cpu"] > 0


def test_bench_without_names_leaves_out_the_step_benchmark(monkeypatch, capsys) -> None:
    """`nox -s bench` with no names runs every bench_*.py that needs nothing given (QA: the
    step benchmark, which needs a checkpoint, exited 2 and failed the whole session); named,
    it runs."""
    import subprocess

    from conftest import load_benchmark

    runner = load_benchmark("run")
    called: list[str] = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: called.append(cmd[1]) or 0)
    assert runner.main([]) == 0
    ran = {name.rsplit("bench_", 1)[1].removesuffix(".py") for name in called}
    assert "step" not in ran and {"prep", "train", "quickstart"} <= ran
    assert "bench step needs a run's checkpoint" in capsys.readouterr().err
    called.clear()
    assert runner.main(["step", "--help"]) == 0 and called[0].endswith("bench_step.py")
