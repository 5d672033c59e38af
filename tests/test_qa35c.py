"""QA pass 35c (reliability): interrupts at the edges of a run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from masr_cli.main import app

runner = CliRunner()
TINY = ["--epochs", "2", "--batch-size", "32", "--lr", "0.02", "--dim", "8", "--threads", "1"]


def test_ctrl_c_while_the_final_run_json_is_written_marks_the_run_interrupted(
    tmp_path: Path, monkeypatch
) -> None:
    """QA: SIGINT while the run.json that says "finished" was being written left status
    "running" (no process) and no --resume hint; the run is marked interrupted, and --resume
    finishes it with the same history."""
    from conftest import write_planted

    import masr.runs.make

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    real = masr.runs.make.write_run_json
    hit = []

    def stop_at_the_finish(run_dir, info):  # noqa: ANN001, ANN202
        if info.get("status") == "finished" and not hit:
            hit.append(True)
            raise KeyboardInterrupt
        return real(run_dir, info)

    monkeypatch.setattr(masr.runs.make, "write_run_json", stop_at_the_finish)
    result = runner.invoke(app, base)
    assert result.exit_code == 130 and "masr: error: interrupted" in result.stderr
    assert "mdr: interrupted after 2 epoch(s)" in result.stderr and "--resume" in result.stderr
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["status"] == "interrupted" and len(info["history"]) == 2
    history = info["history"]
    monkeypatch.setattr(masr.runs.make, "write_run_json", real)
    resumed = runner.invoke(app, [*base, "--resume"])
    assert resumed.exit_code == 0, resumed.stderr
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["status"] == "finished"
    strip = [{k: v for k, v in h.items() if "seconds" not in k} for h in history]
    assert [{k: v for k, v in h.items() if "seconds" not in k} for h in info["history"]] == strip


def test_ctrl_c_while_the_commands_load_is_one_line(tmp_path: Path) -> None:
    """QA: SIGINT in the first fraction of a second (masr_cli.main importing its commands)
    printed a KeyboardInterrupt traceback; it is one line and exit status 130."""
    import os
    import subprocess
    import sys

    script = tmp_path / "stop.py"
    script.write_text(
        "import importlib.abc, runpy, sys\n"
        "class Stop(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'masr_cli.train':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
        "sys.argv = ['masr', '--help']\n"
        "runpy.run_module('masr_cli.main', run_name='__main__')\n"
    )
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": path}, timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "masr: error: interrupted"
