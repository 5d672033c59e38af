"""On the documented scoring-only install (exported/README.md: `pip install --no-deps -e .` plus
numpy, polars, typer, rich and onnxruntime), the commands that need PyTorch or onnx say so in
one error line, as masr's other errors do, instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HIDE = textwrap.dedent(
    """
    import sys
    from importlib.machinery import PathFinder

    HIDDEN = set(sys.argv[1].split(","))

    class Hide:
        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            return self.inner.find_spec(name, path, target)

        def invalidate_caches(self):
            self.inner.invalidate_caches()

    sys.meta_path[:] = [Hide(f) if f is PathFinder else f for f in sys.meta_path]
    sys.argv = ["masr", *sys.argv[2:]]
    from masr_cli.main import run
    run()
    """
)


def _masr_without(hidden: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", HIDE, hidden, *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    ("hidden", "command", "names"),
    [
        ("torch", ["train", "--model", "mdr"], "PyTorch"),
        ("torch", ["evaluate"], "PyTorch"),
        ("torch", ["export"], "PyTorch"),
        ("onnx", ["export"], "onnx"),
    ],
)
def test_a_missing_dependency_is_one_error_line(
    tmp_path: Path, hidden: str, command: list[str], names: str
) -> None:
    from typer.testing import CliRunner

    from masr_cli.main import app

    data, runs = tmp_path / "data", tmp_path / "runs"
    assert CliRunner().invoke(app, ["prep", "--out", str(data), "--users", "60"]).exit_code == 0
    if command[0] != "train":  # a trained run to read
        ok = CliRunner().invoke(app, ["train", "--model", "pop", "--data", str(data),
                                      "--runs", str(runs), "--threads", "1"])
        assert ok.exit_code == 0, ok.output
    where = ["--runs", str(runs)] + (["--data", str(data)] if command[0] != "export" else [])
    if command[0] == "export":
        where += ["--model", "mdr", "--out", str(tmp_path / "x.onnx")]
        ok = CliRunner().invoke(app, ["train", "--model", "mdr", "--data", str(data), "--runs",
                                      str(runs), "--epochs", "1", "--threads", "1"])
        assert ok.exit_code == 0, ok.output
    proc = _masr_without(hidden, *command, *where)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("masr: error: ") and names in last, proc.stderr
    assert sum(line.startswith("masr: error") for line in proc.stderr.splitlines()) == 1


def test_evaluate_plot_without_matplotlib_stops_before_evaluating(tmp_path: Path) -> None:
    """--plot without matplotlib was refused only after every run had been evaluated (QA)."""
    from typer.testing import CliRunner

    from masr_cli.main import app

    data, runs = tmp_path / "data", tmp_path / "runs"
    assert CliRunner().invoke(app, ["prep", "--out", str(data), "--users", "60"]).exit_code == 0
    ok = CliRunner().invoke(app, ["train", "--model", "pop", "--data", str(data),
                                  "--runs", str(runs), "--threads", "1"])
    assert ok.exit_code == 0, ok.output
    plot = tmp_path / "hits.png"
    proc = _masr_without("matplotlib", "evaluate", "--data", str(data), "--runs", str(runs),
                         "--plot", str(plot), "--threads", "1")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "evaluated on" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines == ["masr: error: --plot needs matplotlib; install it with "
                     "`pip install 'masr[plot]'`"], proc.stderr
    assert not plot.exists()
