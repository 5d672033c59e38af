"""Interrupts at the edges of a run and damaged files: a Ctrl-C while run.json is written or while
the commands load, a checkpoint whose bytes changed, prepared tables of two different preps."""

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


def _flip_bytes(path: Path) -> None:
    """Change bytes inside a tensor's data: the zip's directory stays whole."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    raw = bytearray(path.read_bytes())
    at = entry.header_offset  # the local header's own name and extra lengths
    start = at + 30 + int.from_bytes(raw[at + 26:at + 28], "little")
    start += int.from_bytes(raw[at + 28:at + 30], "little")
    for i in range(start + 8, start + 40):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_checkpoint_with_changed_bytes_is_refused_not_loaded(tmp_path: Path) -> None:
    """QA: 20 flipped bytes in last.pt and --resume trained on from the changed weights (loss
    325126 instead of 5.04, other figures, exit 0); in best.pt, evaluate scored the changed
    model and train reused it. torch.load checks no CRC: load_checkpoint does, and a finished
    run whose best.pt is changed is made again."""
    import pytest
    from conftest import write_planted

    from masr.checkpoint import load_checkpoint
    from masr.errors import MasrError
    from masr.runs.store import intact_checkpoint

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    assert runner.invoke(app, base).exit_code == 0
    pop = ["train", "--model", "pop", "--data", str(data), "--runs", str(runs)]
    assert runner.invoke(app, pop).exit_code == 0
    best, last = runs / "mdr" / "best.pt", runs / "mdr" / "last.pt"
    assert intact_checkpoint(best) and load_checkpoint(last)["epoch"] == 2
    _flip_bytes(last)
    with pytest.raises(MasrError, match="last.pt: damaged"):
        load_checkpoint(last)
    resumed = runner.invoke(app, [*base, "--resume"])
    assert resumed.exit_code == 1 and "without --resume, mdr is trained from the start" in (
        resumed.stderr
    )
    _flip_bytes(best)
    assert not intact_checkpoint(best)
    said = runner.invoke(app, ["evaluate", "--data", str(data), "--runs", str(runs),
                               "--threads", "1"])
    assert said.exit_code == 1 and "best.pt: damaged" in said.stderr
    assert "evaluated on" not in said.stderr  # said before the other runs' work (QA: after)
    again = runner.invoke(app, base)
    assert again.exit_code == 0, again.stderr
    load_checkpoint(best)


def test_tables_of_another_prep_are_one_line_not_an_index_error(tmp_path: Path) -> None:
    """QA: valid/test/train/playlists.parquet of another `masr prep` (a copy, or a folder read
    while `masr prep` replaced it) was an IndexError or ValueError traceback."""
    import shutil

    import pytest
    from conftest import write_planted

    from masr.dataset import load_prepared
    from masr.errors import MasrError

    data = write_planted(tmp_path / "data")
    other = write_planted(tmp_path / "other", users_per_group=5, playlists_per_user=4)
    load_prepared(data)
    for table in ("valid", "test", "train", "playlists"):
        mixed = tmp_path / f"mixed-{table}"
        shutil.copytree(data, mixed)
        shutil.copy(other / f"{table}.parquet", mixed / f"{table}.parquet")
        with pytest.raises(MasrError, match=f"{table}.parquet does not match manifest.json"):
            load_prepared(mixed)


def test_a_folder_replaced_while_it_is_read_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """A `masr prep --out` that replaces the folder between load_prepared's reads of
    manifest.json and of the tables: one line asking to run again, not tables of two preps."""
    import json as json_module

    import polars as pl
    import pytest
    from conftest import write_planted

    import masr.dataset
    from masr.dataset import load_prepared
    from masr.errors import MasrError

    data = write_planted(tmp_path / "data")
    real = pl.read_parquet

    def replaced_meanwhile(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        manifest = data / "manifest.json"
        values = json_module.loads(manifest.read_text())
        values["seed"] = int(values.get("seed", 0)) + 1  # what another prep would write
        manifest.write_text(json_module.dumps(values))
        return real(*args, **kwargs)

    monkeypatch.setattr(masr.dataset.pl, "read_parquet", replaced_meanwhile)
    with pytest.raises(MasrError, match="replaced while it was read"):
        load_prepared(data)


def _cut(path: Path) -> None:
    """Cut a file to half its size (a copy stopped, a full disk)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_resume_with_best_pt_cut_short_or_missing_is_refused_before_training(
    tmp_path: Path,
) -> None:
    """QA: best.pt cut short, `--resume` trained on; with no better epoch it then failed at
    the end with one line and no advice, the run marked failed, and every later --resume did
    the same. best.pt alone holds the best epoch so far: --resume refuses it at once, with the
    way out, which works. And an unfinished run whose last.pt is cut short, trained again
    without --resume, is not said to be one --resume "would have continued" (it refuses it)."""
    from conftest import write_planted

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    assert runner.invoke(app, base).exit_code == 0
    best, last = runs / "mdr" / "best.pt", runs / "mdr" / "last.pt"
    before = last.read_bytes()
    _cut(best)
    more = [*base, "--resume", "--epochs", "3"]  # a raised budget: --resume trains on
    refused = runner.invoke(app, more)
    assert refused.exit_code == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "best.pt: damaged (cut short); --resume needs" in lines[0]
    assert "without --resume, mdr is trained from the start" in lines[0]
    assert last.read_bytes() == before  # nothing trained, nothing written
    best.unlink()
    missing = runner.invoke(app, more)
    assert missing.exit_code == 1 and "best.pt: missing; --resume needs" in missing.stderr
    again = runner.invoke(app, [*base, "--epochs", "3"])  # the advice
    assert again.exit_code == 0, again.stderr
    # an unfinished run with last.pt cut short: --resume refuses it, so it is not offered
    info = json.loads((runs / "mdr" / "run.json").read_text())
    info["status"] = "interrupted"
    (runs / "mdr" / "run.json").write_text(json.dumps(info))
    _cut(last)
    restarted = runner.invoke(app, [*base, "--epochs", "3"])
    assert restarted.exit_code == 0, restarted.stderr
    assert "mdr: starting again; the unfinished run" in restarted.stderr
    assert "--resume would have continued it" not in restarted.stderr


def test_a_part_made_again_is_not_said_to_be_asked_for_and_export_names_a_bad_run_json(
    tmp_path: Path,
) -> None:
    """QA: `masr train --model masr` with mass/best.pt missing said "mass: replacing the
    finished run in ...: asked for" (masr was asked for; mass's best.pt was gone), and after a
    damaged one, under "is damaged ...; making it again", the same (and under --resume it was
    resumed instead, then failed on that best.pt). And `masr export` with
    masr/run.json damaged said "no masr run to take α from": the run is there, its α unread."""
    from conftest import write_planted

    from masr.export import export_model

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *TINY]
    assert runner.invoke(app, base).exit_code == 0
    (runs / "mass" / "best.pt").unlink()
    said = runner.invoke(app, base)
    assert said.exit_code == 0, said.stderr
    assert "mass: replacing the finished run in" in said.stderr
    assert f"{runs / 'mass'}: its best.pt is missing" in said.stderr
    assert "asked for" not in said.stderr
    _cut(runs / "mass" / "best.pt")
    said = runner.invoke(app, [*base, "--resume"])  # a finished part: made again, not resumed
    assert said.exit_code == 0, said.stderr
    assert "best.pt is damaged (cut short); making it again" in said.stderr
    assert "mass: replacing the finished run in" in said.stderr
    assert "mass: replacing the finished run in " + str(runs / "mass") + ": asked" not in (
        said.stderr
    )
    direct = runner.invoke(app, ["train", "--model", "mdr", "--data", str(data), "--runs",
                                 str(runs), *TINY])
    assert direct.exit_code == 0 and "mdr: replacing the finished run in" in direct.stderr
    assert "asked for" in direct.stderr  # the run the command named
    run_json = runs / "masr" / "run.json"
    run_json.write_text(run_json.read_text()[:100])
    notes: list[str] = []
    export_model(runs, tmp_path / "m.onnx", log=notes.append)
    assert any(f"{run_json}: unreadable" in n and "its α cannot be read" in n for n in notes)
    assert not any("no masr run to take α from" in n for n in notes)
    run_json.unlink()  # a fusion killed between its best.pt and its run.json
    notes.clear()
    export_model(runs, tmp_path / "m.onnx", log=notes.append)
    assert any(f"{run_json}: missing, so its α cannot be read" in n for n in notes)
    # a part's best.pt cut short: one line with the way out (QA: "not a readable masr
    # checkpoint" alone)
    import pytest

    from masr.errors import MasrError

    _cut(runs / "mdr" / "best.pt")
    with pytest.raises(MasrError, match=r"mdr/best.pt: damaged \(cut short\).*train mdr again"):
        export_model(runs, tmp_path / "n.onnx")


def test_resume_refuses_a_patience_that_would_have_stopped_the_run_earlier(
    tmp_path: Path,
) -> None:
    """QA: a run trained with --patience 4 to epoch 11 (best 7), resumed with --patience 2,
    was recorded as a patience-2 run of 11 epochs (one made with --patience 2 stops after 9),
    so a later command asking for --patience 2 reused a run its options do not make. Refused,
    as a lowered --epochs or --time-limit is, naming the least patience that continues."""
    import pytest

    from masr.config import TrainConfig
    from masr.errors import MasrError
    from masr.runs.make import _check_resumable

    flags = [True, True, False, True, False, False, False]  # bad stretches of 1, then 3
    state = {"epoch": 7, "seconds": 1.0, "train_config": {"patience": 5},
             "history": [{"epoch": i, "best": b} for i, b in enumerate(flags, 1)]}
    run_dir = tmp_path / "mdr"
    for patience in (0, 3, 5):  # never, the stretch the run ended on, more: it continues
        _check_resumable("mdr", run_dir, state, TrainConfig(epochs=10, patience=patience), False)
    stopped = r"--patience 2 .*would have stopped .* after epoch 6, .*--patience 3 or more"
    with pytest.raises(MasrError, match=stopped):
        _check_resumable("mdr", run_dir, state, TrainConfig(epochs=10, patience=2), False)
    flags[4:] = [False, False, False, False, True]  # a stretch of 4 before a better epoch
    state["history"] = [{"epoch": i, "best": b} for i, b in enumerate(flags, 1)]
    state["epoch"] = len(flags)
    with pytest.raises(MasrError, match=r"after epoch 7, .*--patience 5 or more"):
        _check_resumable("mdr", run_dir, state, TrainConfig(epochs=10, patience=3), False)
    old = {**state, "history": [{"epoch": i} for i in range(1, 10)]}  # no "best": not checked
    _check_resumable("mdr", run_dir, old, TrainConfig(epochs=10, patience=1), False)


def test_resume_with_a_damaged_run_json_is_refused_and_last_pt_kept(tmp_path: Path) -> None:
    """QA: run.json cut short, `--resume` warned and trained the run again from the start,
    over the last.pt it had asked to continue. It is refused in one line, last.pt untouched;
    the way out (without --resume) trains it again."""
    from conftest import write_planted

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    assert runner.invoke(app, base).exit_code == 0
    last = runs / "mdr" / "last.pt"
    before = last.read_bytes()
    _cut(runs / "mdr" / "run.json")
    refused = runner.invoke(app, [*base, "--resume"])
    assert refused.exit_code == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.json: unreadable" in lines[0]
    assert "--resume cannot tell what mdr was made with" in lines[0]
    assert last.read_bytes() == before
    again = runner.invoke(app, base)  # the advice
    assert again.exit_code == 0, again.stderr
    assert json.loads((runs / "mdr" / "run.json").read_text())["status"] == "finished"


def test_a_chain_part_with_a_damaged_best_pt_is_made_again_under_a_raised_resume(
    tmp_path: Path,
) -> None:
    """Review: a finished chain part whose best.pt is cut short, under `--resume --epochs 3`
    (a raised budget, so another signature), was refused mid-chain after mdr had trained on;
    it is made again, as "making it again" says. A part's refusal names that part's own way
    out, not a chain without --resume (which restarts every unfinished part)."""
    from conftest import write_planted

    torch.set_num_threads(1)
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *TINY]
    assert runner.invoke(app, base).exit_code == 0
    _cut(runs / "mass" / "best.pt")
    more = runner.invoke(app, [*base, "--resume", "--epochs", "3"])
    assert more.exit_code == 0, more.stderr
    assert json.loads((runs / "mass" / "run.json").read_text())["status"] == "finished"
    # an unfinished part (mdr) with a cut run.json: refused, with that part's way out
    info = json.loads((runs / "mdr" / "run.json").read_text())
    info["status"] = "interrupted"
    (runs / "mdr" / "run.json").write_text(json.dumps(info))
    _cut(runs / "mdr" / "run.json")
    refused = runner.invoke(app, [*base, "--resume", "--epochs", "4"])
    assert refused.exit_code == 1
    assert "train mdr again alone (masr train --model mdr" in refused.stderr
    assert "then --resume continues the rest" in refused.stderr
