"""`masr analyze` on runs and folders it must not trust: damaged run.json, --out inside
prepared data or where nothing can be made, runs of other data, unfinished or repeated runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_planted
from typer.testing import CliRunner

from masr_cli.main import app

runner = CliRunner()


def _ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return " ".join(result.stderr.split())  # rich wraps long lines


def _fails(args: list[str], *fragments: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("masr: error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in " ".join(result.stderr.split()), result.stderr
    return line


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(prepared data, runs folder with mdr, mass, and runs-dot/mass of attention mem-dot)."""
    root = tmp_path_factory.mktemp("analyze")
    data = write_planted(root / "data")
    common = ["--data", str(data), "--epochs", "1", "--dim", "8", "--device", "cpu",
              "--threads", "1"]
    for model in ("mdr", "mass"):
        _ok(["train", "--model", model, "--runs", str(root / "runs"), *common])
    _ok(["train", "--model", "mass", "--runs", str(root / "runs-dot"), "--set",
         "attention=mem-dot", *common])
    return data, root / "runs"


def _copy_runs(runs: Path, to: Path) -> Path:
    shutil.copytree(runs, to)
    return to


def _edit_run_json(run_dir: Path, **fields: object) -> None:
    info = json.loads((run_dir / "run.json").read_text())
    info.update(fields)
    (run_dir / "run.json").write_text(json.dumps(info))


def test_a_damaged_run_json_is_left_out_with_its_cause(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    data, runs = trained
    bad = _copy_runs(runs, tmp_path / "bad")
    _edit_run_json(bad / "mdr", model_config="abc")  # was AttributeError in dims
    _edit_run_json(bad / "mass", history=5)  # was TypeError in speed
    out = tmp_path / "analysis"
    common = ["--data", str(data), "--out", str(out), "--device", "cpu", "--full-sample", "10"]
    log = _ok(["analyze", "dims", "--runs", str(bad), "--runs", str(runs), *common])
    assert f"{bad / 'mdr' / 'run.json'}: not what `masr train` writes (model_config is not an " \
           f"object); {bad / 'mdr'} left out" in log
    assert f"{bad / 'mass'}: no embedding size" not in log
    assert set(json.loads((out / "dims.json").read_text())) == {"mdr", "mass"}
    log = _ok(["analyze", "speed", "--runs", str(bad), "--runs", str(runs), "--out", str(out)])
    assert "(history is not a list of epochs)" in log and f"{bad / 'mass'} left out" in log
    assert set(json.loads((out / "speed.json").read_text())) == {"runs/mass", "runs/mdr"}
    # unreadable: said, not "no embedding size" (dims) nor nothing (speed, attention)
    (bad / "mass" / "run.json").write_text("{oops")
    (bad / "mdr" / "run.json").write_text("[1, 2]")
    log = _ok(["analyze", "dims", "--runs", str(bad), "--runs", str(runs), *common])
    assert f"{bad / 'mass' / 'run.json'}: unreadable (" in log
    assert "(not a JSON object)" in log and "no embedding size" not in log
    log = _ok(["analyze", "speed", "--runs", str(bad), "--runs", str(runs), "--out", str(out)])
    assert f"{bad / 'mass' / 'run.json'}: unreadable (" in log
    _fails(["analyze", "attention", "--data", str(data), "--runs", str(bad), "--out", str(out),
            "--bootstrap", "0"], f"{bad / 'mass' / 'run.json'}: unreadable (", "no MASS run in it")


def test_out_inside_prepared_data_is_refused(trained: tuple[Path, Path], tmp_path: Path) -> None:
    data, runs = trained
    other = write_planted(tmp_path / "other-data", seed=1)  # any prepared folder, not --data
    for out in (data / "analysis", data, other / "deep" / "analysis"):
        for args in (["dims", "--data", str(data), "--device", "cpu"],
                     ["attention", "--data", str(data)], ["speed"]):
            _fails(["analyze", *args, "--runs", str(runs), "--out", str(out)],
                   f"--out {out}: inside the prepared data folder", "choose a folder beside it")
    assert not (data / "analysis").exists() and not (other / "deep").exists()


def test_dims_checks_every_run_and_the_out_folder_before_evaluating(
    trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import masr.report

    data, runs = trained
    elsewhere = tmp_path / "d16"
    shutil.copytree(runs / "mdr", elsewhere / "mdr")
    # as if trained on other prepared data: its run.json and best.pt say so
    signature = json.loads((elsewhere / "mdr" / "run.json").read_text())["signature"]
    _edit_run_json(elsewhere / "mdr", model_config={"dim": 16},
                   signature={**signature, "data": "0123456789abcdef"})
    ckpt = torch.load(elsewhere / "mdr" / "best.pt", weights_only=True)
    ckpt["data_fingerprint"] = "0123456789abcdef"
    torch.save(ckpt, elsewhere / "mdr" / "best.pt")
    evaluated: list[object] = []
    monkeypatch.setattr(masr.report, "evaluate_runs",
                        lambda *a, **k: evaluated.append(a) or {})
    common = ["analyze", "dims", "--data", str(data), "--device", "cpu", "--model", "mdr"]
    _fails([*common, "--runs", str(runs), "--runs", str(elsewhere), "--out",
            str(tmp_path / "analysis")],
           f"{elsewhere / 'mdr' / 'best.pt'}: trained on other prepared data")
    if Path("/proc").is_dir():
        _fails([*common, "--runs", str(runs), "--out", "/proc/x"],
               "--out /proc/x: nothing can be made in /proc")
    assert evaluated == []  # both found before any evaluation


def test_attention_warns_dedupes_and_keys_one_way(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    data, runs = trained
    copy = _copy_runs(runs, tmp_path / "copy")
    _edit_run_json(copy / "mass", status="interrupted")
    out = tmp_path / "analysis"
    common = ["analyze", "attention", "--data", str(data), "--out", str(out), "--cases", "0",
              "--bootstrap", "0"]
    dot = runs.parent / "runs-dot" / "mass"
    log = _ok([*common, "--runs", str(copy / "mass"), "--runs", str(copy / "mass") + "/",
               "--runs", str(dot)])
    assert f"warning: {copy / 'mass'} is not finished (interrupted, after 1 epoch(s))" in log
    assert log.count(f"{copy / 'mass'} (mem-metric): rho") == 1  # given twice, analysed once
    table = json.loads((out / "attention.json").read_text())
    assert set(table) == {"mem-metric", "mem-dot"}  # distinct labels: keyed by label
    # two runs share a label: every key is the run's name, none a label
    _ok([*common, "--runs", str(runs / "mass"), "--runs", str(copy / "mass"), "--runs",
         str(dot)])
    table = json.loads((out / "attention.json").read_text())
    assert set(table) == {"runs/mass", "copy/mass", "runs-dot/mass"}
    assert table["runs-dot/mass"]["attention"] == "mem-dot"
    assert table["copy/mass"]["run"] == str(copy / "mass")
    # a run given by its own folder with a damaged run.json: left out, with the cause
    (copy / "mass" / "run.json").write_text("{oops")
    _fails([*common, "--runs", str(copy / "mass")], f"{copy / 'mass' / 'run.json'}: unreadable (",
           "no run left to analyse")


def test_attention_bootstrap_has_an_upper_bound(trained: tuple[Path, Path], tmp_path: Path) -> None:
    data, runs = trained
    for n in ("100001", "99999999999999999999"):  # the old code ran (or hung on) each
        line = _fails(["analyze", "attention", "--data", str(data), "--runs", str(runs / "mass"),
                       "--out", str(tmp_path / "a"), "--cases", "3", "--bootstrap", n])
        assert f"--bootstrap {n}: must be 0 (no standard errors) or from 2 to 100,000" in line


def test_an_output_file_that_is_a_folder_is_refused_before_anything_is_written(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """QA: with dims.png a folder, dims.json was written and then the PNG failed; each
    command's STEM.json and STEM.png are checked with --out, before the work."""
    data, runs = trained
    for stem, args in (("dims", ["dims", "--data", str(data), "--device", "cpu", "--model",
                                 "mdr"]),
                       ("attention", ["attention", "--data", str(data)]),
                       ("speed", ["speed"])):
        for suffix, other in ((".png", ".json"), (".json", ".png")):
            out = tmp_path / f"{stem}{suffix}-a-folder"
            (out / f"{stem}{suffix}").mkdir(parents=True)
            _fails(["analyze", *args, "--runs", str(runs), "--out", str(out)],
                   f"--out {out}: its {stem}{suffix} is a folder")
            assert not (out / f"{stem}{other}").exists()
