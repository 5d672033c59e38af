"""`masr train` and `masr evaluate` end to end through Typer's CliRunner, on planted data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from masr.checkpoint import load_checkpoint
from masr.evaluate import metric_names
from masr_cli.main import app

runner = CliRunner()
TINY = ["--epochs", "2", "--adv-epochs", "1", "--batch-size", "32", "--lr", "0.02", "--dim", "8"]
TINY += ["--threads", "1"]
SIX = {"mdr", "mass", "masr", "amdr", "amass", "amasr"}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads; on a busy machine they cost a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def _fails(args: list[str], *fragments: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("masr: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def amasr_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One `masr train --model amasr` on planted data, shared by the tests below."""
    from conftest import write_planted

    root = tmp_path_factory.mktemp("cli")
    data = write_planted(root / "data")
    runs = root / "runs"
    result = runner.invoke(
        app, ["train", "--model", "amasr", "--data", str(data), "--runs", str(runs), *TINY]
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return data, runs, result.stderr


def test_train_amasr_leaves_six_evaluable_runs(amasr_runs: tuple[Path, Path, str]) -> None:
    data, runs, stderr = amasr_runs
    assert {p.name for p in runs.iterdir() if (p / "best.pt").is_file()} == SIX
    assert "valid hit@10" in stderr  # per-epoch validation lines
    # not a terminal: no progress bars, so none of the blank lines rich leaves where one stops
    assert "\n\n" not in stderr and not stderr.startswith("\n")
    info = json.loads((runs / "amdr" / "run.json").read_text())
    assert info["status"] == "finished" and info["start_from"] == "mdr"
    assert len(info["history"]) == 1 and info["best"]["epoch"] == 1
    fused = load_checkpoint(runs / "amasr" / "best.pt")
    assert fused["model"] == "masr" and fused["parts"] == ["amdr", "amass"]
    from masr.config import ALPHA_GRID

    info = json.loads((runs / "amasr" / "run.json").read_text())
    assert fused["alpha"] == info["alpha"] in ALPHA_GRID  # chosen on validation (fullrank)
    assert info["signature"]["alpha"] == "auto" and "alpha_search" in info

    result = _ok(["evaluate", "--data", str(data), "--runs", str(runs), "--json", "-"])
    metrics = json.loads(result.stdout)
    assert set(metrics) == SIX
    for run in SIX:
        assert set(metrics[run]) == {"sampled", "full"}
        for protocol in ("sampled", "full"):
            assert list(metrics[run][protocol]) == metric_names()
            assert 0.0 <= metrics[run][protocol]["ndcg@10"] <= metrics[run][protocol]["hit@10"]
    assert metrics["amasr"]["sampled"]["hit@10"] > 0.5  # planted groups are easy
    for label in ("AMASR", "sampled"):
        assert label in result.stderr
    assert "not yet run" not in result.stderr  # every Table 2 baseline is implemented


def test_train_again_reuses_the_chain(amasr_runs: tuple[Path, Path, str]) -> None:
    data, runs, _ = amasr_runs
    chain = ("mdr", "mass", "amdr", "amass")
    stamps = {r: (runs / r / "best.pt").stat().st_mtime_ns for r in chain}
    result = _ok(["train", "--model", "amasr", "--data", str(data), "--runs", str(runs), *TINY])
    assert "reusing" in result.stderr
    assert stamps == {r: (runs / r / "best.pt").stat().st_mtime_ns for r in stamps}


def test_a_finished_run_is_never_replaced_silently(tmp_path: Path) -> None:
    """A prerequisite made with other options is trained again (its signature differs); stderr
    names the run and what changed before the old one is overwritten."""
    from conftest import write_planted

    data, runs = write_planted(tmp_path / "data"), tmp_path / "runs"
    base = ["train", "--data", str(data), "--runs", str(runs), *TINY]
    first = _ok([*base, "--model", "mdr"])
    assert "replacing" not in first.stderr
    again = _ok([*base, "--model", "amdr", "--time-limit", "500"])
    assert "mdr: replacing the finished run in" in again.stderr
    assert "train.time_limit 0.0 -> 500.0" in again.stderr
    same = _ok([*base, "--model", "mdr", "--time-limit", "500"])  # asked for by name
    assert "mdr: replacing the finished run in" in same.stderr and "asked for" in same.stderr


def test_runs_of_an_older_masr_are_reused_after_an_upgrade(tmp_path: Path) -> None:
    """A run whose run.json predates a config field (an earlier masr wrote it) is the same run
    when the field's default is what the code did before: reused, not trained again. A value
    other than the default still makes it a different run."""
    from conftest import write_planted

    data, runs = write_planted(tmp_path / "data"), tmp_path / "runs"
    base = ["train", "--data", str(data), "--runs", str(runs), *TINY]
    _ok([*base, "--model", "mass"])
    stamp = (runs / "mass" / "best.pt").stat().st_mtime_ns
    run_json = runs / "mass" / "run.json"
    info = json.loads(run_json.read_text())
    # as an older masr wrote it: no song_init (MASS), no member_dropout (train) in the signature
    del info["signature"]["model_config"]["song_init"]
    info["signature"]["train"].pop("member_dropout", None)
    run_json.write_text(json.dumps(info))
    again = _ok([*base, "--model", "amass"])
    assert "mass: reusing" in again.stderr and "replacing" not in again.stderr
    assert (runs / "mass" / "best.pt").stat().st_mtime_ns == stamp
    # the APR run's own signature holds the start's: an older one is reused the same way
    amass_json = runs / "amass" / "run.json"
    info = json.loads(amass_json.read_text())
    del info["signature"]["start"]["model_config"]["song_init"]
    amass_json.write_text(json.dumps(info))
    assert "amass: reusing" in _ok([*base, "--model", "amasr"]).stderr  # a dependency there
    other = _ok([*base, "--model", "amass", "--set", "mass.song_init=svd"])
    assert "mass: replacing the finished run in" in other.stderr
    assert "model_config.song_init None -> svd" in other.stderr


def test_evaluate_selected_models_json_file_and_plot(
    amasr_runs: tuple[Path, Path, str], tmp_path: Path
) -> None:
    data, runs, _ = amasr_runs
    out, png = tmp_path / "m.json", tmp_path / "hits.png"
    base = ["evaluate", "--data", str(data), "--runs", str(runs)]
    pick = ["--model", "mdr", "--model", "amasr"]
    result = _ok([*base, *pick, "--json", str(out), "--plot", str(png)])
    assert result.stdout == ""
    assert set(json.loads(out.read_text())) == {"mdr", "amasr"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    valid = json.loads(_ok([*base, "--model", "mdr", "--split", "valid", "--json", "-"]).stdout)
    best = load_checkpoint(runs / "mdr" / "best.pt")["valid"]
    assert valid["mdr"]["sampled"]["hit@10"] == pytest.approx(best["hit@10"], abs=1e-6)
    _fails([*base, "--model", "nope"], "--model nope")
    _fails([*base, "--plot", str(tmp_path / "x.txt")], "--plot")
    # full ranking on a seeded sample of cases: named in the table, sampled protocol unchanged
    some = _ok([*base, "--model", "mdr", "--full-sample", "7", "--json", "-"])
    assert "7 cases drawn with seed 0" in " ".join(some.stderr.split())
    every = json.loads(_ok([*base, "--model", "mdr", "--json", "-"]).stdout)
    assert json.loads(some.stdout)["mdr"]["sampled"] == every["mdr"]["sampled"]
    _fails([*base, "--full-sample", "-1"], "--full-sample")


def test_resume_continues_a_run(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    args = ["train", "--model", "mdr", "--data", str(data), "--runs", str(tmp_path / "runs")]
    fast = ["--batch-size", "32", "--lr", "0.02", "--dim", "8"]
    _ok([*args, *fast, "--epochs", "2"])
    result = _ok([*args, "--epochs", "3", "--resume"])  # other options come from the run
    assert "resuming" in result.stderr
    info = json.loads((tmp_path / "runs" / "mdr" / "run.json").read_text())
    assert [h["epoch"] for h in info["history"]] == [1, 2, 3]
    assert info["train_config"]["batch_size"] == 32
    _fails([*args, "--epochs", "4", "--lr", "0.5", "--resume"], "cannot --resume", "lr")


def test_resume_restarts_apr_when_its_start_found_a_better_epoch(tmp_path: Path) -> None:
    """Raising --epochs on --resume lets MDR train on; when that moves MDR's best epoch, the
    AMDR run that began from MDR's old best starts again from the new one (a resumed AMDR
    would claim a start it was not trained from)."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "amdr", "--data", str(data), "--runs", str(runs)]
    fast = ["--batch-size", "32", "--lr", "0.02", "--dim", "8", "--patience", "0"]
    _ok([*args, *fast, "--epochs", "1", "--adv-epochs", "2"])

    def info(run: str) -> dict:
        return json.loads((runs / run / "run.json").read_text())

    assert info("amdr")["start_epochs"] == {"mdr": 1}
    result = _ok([*args, "--epochs", "4", "--adv-epochs", "2", "--resume"])
    best = info("mdr")["best"]["epoch"]
    assert [h["epoch"] for h in info("mdr")["history"]] == [1, 2, 3, 4]
    assert best > 1  # the planted data keeps MDR improving past its first epoch
    assert "starting it again" in result.stderr
    assert info("amdr")["start_epochs"] == {"mdr": best}
    assert [h["epoch"] for h in info("amdr")["history"]] == [1, 2]  # a fresh APR phase
    # nothing moved: a second resume with a raised --adv-epochs continues AMDR
    result = _ok([*args, "--epochs", "4", "--adv-epochs", "3", "--resume"])
    assert "starting it again" not in result.stderr
    assert [h["epoch"] for h in info("amdr")["history"]] == [1, 2, 3]


def test_adv_lr_is_the_apr_phase_learning_rate(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "amdr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok([*args, "--adv-lr", "0.005"])

    def config(run: str) -> dict:
        return json.loads((runs / run / "run.json").read_text())

    assert config("mdr")["train_config"]["lr"] == 0.02  # BPR: --lr
    assert config("amdr")["train_config"]["lr"] == 0.005  # APR: --adv-lr
    assert config("amdr")["adversarial"]["lr"] == 0.005
    mdr_stamp = (runs / "mdr" / "best.pt").stat().st_mtime_ns
    _ok([*args, "--adv-lr", "0.001"])  # another APR phase on the same pre-trained MDR
    assert (runs / "mdr" / "best.pt").stat().st_mtime_ns == mdr_stamp
    assert config("amdr")["train_config"]["lr"] == 0.001
    _ok([*args])  # no --adv-lr: the APR phase takes --lr, as the paper
    assert config("amdr")["train_config"]["lr"] == 0.02
    _fails([*args, "--adv-lr", "0"], "--adv-lr")


def test_member_dropout_is_recorded_and_retrains_only_member_models(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok(args)

    def info(run: str) -> dict:
        return json.loads((runs / run / "run.json").read_text())

    assert "member_dropout" not in info("mass")["train_config"]  # off: the old signature
    stamps = {r: (runs / r / "best.pt").stat().st_mtime_ns for r in ("mdr", "mass")}
    _ok([*args, "--member-dropout", "0.4"])
    assert info("mass")["train_config"]["member_dropout"] == 0.4
    assert (runs / "mass" / "best.pt").stat().st_mtime_ns != stamps["mass"]  # retrained
    assert (runs / "mdr" / "best.pt").stat().st_mtime_ns == stamps["mdr"]  # reads no members
    _fails([*args, "--member-dropout", "1"], "--member-dropout")


def test_set_scoped_to_one_model_and_row_dropout(tmp_path: Path) -> None:
    """--set MODEL.NAME=VALUE sets NAME for that model's runs only, over --set NAME=VALUE; the
    recipe's values give way to it; row dropout trains under the softmax loss."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok([*args, "--recipe", "fullrank", "--neg", "16", "--set", "dropout=0.1",
         "--set", "mdr.dropout=0.6", "--set", "mdr.dropout-mode=row"])

    def model_config(run: str) -> dict:
        return json.loads((runs / run / "run.json").read_text())["model_config"]

    assert model_config("mdr")["dropout"] == 0.6 and model_config("mdr")["dropout_mode"] == "row"
    assert model_config("mass")["dropout"] == 0.1  # the unscoped value
    assert model_config("mass")["dropout_mode"] == "element"
    _fails([*args, "--set", "cml.margin=1"], "--set cml.margin=1", "mdr, mass")
    _fails([*args, "--set", "mdr.shrink=1"], "--set mdr.shrink=1", "dropout")
    _fails([*args, "--set", "mdr.dropout_mode=shared"], "dropout_mode")


def test_time_limit_keeps_room_for_validation_and_says_when_it_cuts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import write_planted

    import masr.train as train

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    # a validation "estimated" at 1 s + 1,000 s does not fit a quarter of 60 s: cut to the
    # floor, 10 of 36 cases, still 1 + 278 s: the room kept for it ends the epoch at one step
    monkeypatch.setattr(train, "estimate_validation", lambda *args, **kw: (1.0, 1000.0))
    monkeypatch.setattr(train, "MIN_VALID_SAMPLE", 10)
    result = _ok(["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *TINY,
                  "--time-limit", "60", "--valid-sample", "0"])
    assert "ranking 36 validation cases against the whole catalog" in result.stderr
    assert "ranking 10 instead" in result.stderr
    for part in ("mdr", "mass"):
        info = json.loads((runs / part / "run.json").read_text())
        assert info["train_config"]["valid_sample"] == 10
        assert info["stopped_by_time_limit"] is True
        assert info["history"][0]["steps"].startswith("1/")


def test_time_limit_is_a_budget_per_run(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    fast = ["--batch-size", "32", "--lr", "0.02", "--dim", "8", "--epochs", "5"]
    _ok(["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *fast,
         "--time-limit", "0.001"])
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert len(info["history"]) == 1 and info["stopped_by_time_limit"] is True
    assert info["status"] == "finished" and (runs / "mdr" / "best.pt").is_file()


def test_dense_gradients_are_an_option(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    fast = ["--batch-size", "32", "--lr", "0.02", "--dim", "8", "--epochs", "2"]
    args = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *fast]
    _ok([*args, "--dense-grads"])
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["train_config"]["sparse"] is False and len(info["history"]) == 2
    assert info["history"][-1]["valid"]["hit@10"] > 0


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    _fails(["train", "--model", "mdr", "--data", str(tmp_path / "none")], "manifest.json")
    _fails(["evaluate", "--data", str(tmp_path / "none")], "manifest.json")
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    _fails(["train", "--data", str(data), "--batch-size", "0"], "--batch-size")
    _fails(["train", "--data", str(data), "--time-limit", "-1"], "--time-limit")
    _fails(["evaluate", "--data", str(data), "--runs", str(tmp_path / "empty")], "no trained runs")
    if not torch.cuda.is_available():
        _fails(["train", "--data", str(data), "--device", "cuda"], "--device cuda")


def test_help_teaches_the_defaults() -> None:
    text = _ok(["train", "--help"]).stdout
    for option in ("--model", "--neg-mode", "--patience", "--eps", "--noise", "--resume"):
        assert option in text
    assert "amasr" in text


def test_train_and_evaluate_modules_import_without_torch() -> None:
    """main.py imports every command, and `masr score` must not load torch through them."""
    import subprocess
    import sys

    code = (
        "import sys, masr.runs, masr.evaluate, masr_cli.train, masr_cli.evaluate; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_set_refuses_a_setting_with_its_own_option(tmp_path: Path) -> None:
    """α of the fusions belongs to --alpha: `--set alpha=` used to be accepted and ignored."""
    for model in ("amasr", "masr"):
        _fails(["train", "--model", model, "--data", str(tmp_path), "--set", "alpha=0.7"],
               "--set alpha=0.7", "--alpha 0.7")
    # item-kNN's own alpha (asymmetric cosine) is still a --set setting
    _fails(["train", "--model", "itemknn", "--data", str(tmp_path / "none"),
            "--set", "alpha=0.75"], "manifest.json")


def test_evaluate_fusion_at_other_alphas(amasr_runs: tuple[Path, Path, str]) -> None:
    """--alpha re-weights the fusion's parts: α = 1 is its MDR part alone (amdr)."""
    data, runs, _ = amasr_runs
    args = ["evaluate", "--data", str(data), "--runs", str(runs), "--json", "-"]
    out = json.loads(_ok([*args, "--model", "amasr", "--model", "amdr", "--alpha", "1",
                          "--alpha", "0.3"]).stdout)
    assert set(out) == {"amasr", "amdr", "amasr@α=1", "amasr@α=0.3"}
    assert out["amasr@α=1"]["sampled"] == pytest.approx(out["amdr"]["sampled"], abs=1e-6)
    assert out["amasr@α=0.3"] != out["amasr"]
    _fails([*args, "--model", "amasr", "--alpha", "1.5"], "--alpha 1.5")


def test_bad_seeds_fail_before_anything_is_written(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs)]
    _fails(["train", "--model", "pop", *base, "--seed", "-1"], "--seed")
    _fails(["train", "--model", "pop", *base, "--seed", str(2**64)], "--seed")
    assert not runs.exists()
    _ok(["train", "--model", "pop", *base, "--threads", "1"])
    _fails(["evaluate", *base, "--full-sample", "5", "--sample-seed", "-1", "--threads", "1"],
           "--sample-seed")
    # analyze's own --seed (QA: attention gave a traceback, dims named --sample-seed)
    out = tmp_path / "analysis"
    for args in (["attention", "--cases", "10"], ["attention", "--cases", "0", "--bootstrap",
                                                  "0"], ["dims"]):
        _fails(["analyze", *args, "--data", str(data), "--runs", str(runs), "--seed", "-5",
                "--out", str(out)], "--seed must be in [0, 2^63 - 1] (got -5)")
    assert not out.exists()


def test_the_next_step_hint_runs_as_printed(tmp_path: Path) -> None:
    """train's closing hint names --data and --runs when they are not the defaults, and a
    --resume with nothing to resume says so."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    done = _ok(["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY,
                "--resume"])
    assert "nothing to resume" in done.stderr
    # a part the plan needs that never began just starts; the run named says it
    chain = _ok(["train", "--model", "amass", "--data", str(data), "--runs", str(runs), *TINY,
                 "--resume"])
    assert "amass: nothing to resume" in chain.stderr
    assert "mass: nothing to resume" not in chain.stderr.replace("amass: nothing", "")
    hint = done.stderr.split("next: ")[-1].split()
    assert hint[:2] == ["masr", "evaluate"]
    assert "--data" in hint and "--runs" in hint
    _ok([*hint[1:], "--threads", "1"])


def test_options_no_run_reads_are_said_not_dropped_silently(tmp_path: Path) -> None:
    from conftest import write_planted

    from masr.runs.registry import unused_options

    assert unused_options("pop", {"loss", "dim", "seed"}) == ["dim", "loss"]
    assert unused_options("mdr", {"entity", "eps", "lr"}) == ["entity", "eps"]
    assert unused_options("amasr", {"eps", "dim", "loss"}) == []
    assert unused_options("fism", {"entity"}) == ["entity"]
    assert unused_options("mfbpr", {"entity"}) == []
    assert unused_options("mdr", {"temperature", "neg_mode"}, "bpr") == ["temperature"]
    assert unused_options("amasr", {"temperature", "neg_mode"}, "softmax") == ["neg_mode"]
    assert unused_options("pop", {"temperature"}, "softmax") == ["temperature"]
    # member lists: only trained models that read them (MASS, FISM ...), as read_by_run
    member = {"max_members", "member_dropout"}
    assert unused_options("mdr", member) == ["max_members", "member_dropout"]
    assert unused_options("amasr", member) == [] and unused_options("fism", member) == []
    data = write_planted(tmp_path / "data")
    base = ["--data", str(data), "--runs", str(tmp_path / "runs"), "--threads", "1"]
    said = _ok(["train", "--model", "pop", *base, "--loss", "softmax"])
    assert "note: --loss not used by pop" in said.stderr
    # a command that fails keeps its one error line
    _fails(["train", "--model", "pop", *base, "--loss", "softmax", "--set", "nope=1"], "--set")


def test_an_interrupted_run_is_marked_and_readers_say_so(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C (or SIGTERM) mid-run: run.json says "interrupted", evaluate warns that best.pt is
    only the best epoch so far, and a new train without --resume says it starts again."""
    from conftest import write_planted

    import masr.train

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    real = masr.train.train_model

    def stop_after_one_epoch(*args, **kwargs):
        on_epoch = kwargs["on_epoch"]

        def then_stop(record):
            on_epoch(record)
            raise KeyboardInterrupt

        return real(*args, **{**kwargs, "on_epoch": then_stop})

    monkeypatch.setattr(masr.train, "train_model", stop_after_one_epoch)
    result = runner.invoke(app, base)
    assert result.exit_code == 130 and "masr: error: interrupted" in result.stderr
    assert "--resume" in result.stderr
    monkeypatch.setattr(masr.train, "train_model", real)
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["status"] == "interrupted" and len(info["history"]) == 1
    said = _ok(["evaluate", "--data", str(data), "--runs", str(runs), "--threads", "1"])
    assert "mdr is not finished (interrupted, after 1 epoch(s))" in said.stderr
    import shutil

    # "--resume would have continued it" only where it would have (QA: said after a changed
    # value the run reads, which --resume refuses)
    other = tmp_path / "other"
    shutil.copytree(runs, other)
    changed = _ok([*base, "--runs", str(other), "--lr", "0.5"])
    assert "starting again" in changed.stderr and "would have" not in changed.stderr
    again = _ok(base)
    assert "starting again" in again.stderr and "--resume would have continued it" in again.stderr
    done = _ok(["evaluate", "--data", str(data), "--runs", str(runs), "--threads", "1"])
    assert "not finished" not in done.stderr


def test_outputs_inside_the_prepared_data_are_refused(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    _fails(["train", "--model", "pop", "--data", str(data), "--runs", str(data / "runs")],
           "inside the prepared data folder")
    _fails(["reproduce", "--data", str(data), "--out", str(data / "results"), "--threads", "1"],
           "inside the prepared data folder")
    before = (data / "manifest.json").read_bytes()
    for option, name in (("--json", "manifest.json"), ("--plot", "hits.png")):
        _fails(["evaluate", "--data", str(data), "--runs", str(tmp_path / "runs"), option,
                str(data / name)], f"{option} {data / name}: inside the prepared data folder")
    assert (data / "manifest.json").read_bytes() == before
    (tmp_path / "afile").write_text("x")
    _fails(["reproduce", "--data", str(data), "--out", str(tmp_path / "afile"), "--threads",
            "1"], "is a file")


def test_evaluate_never_writes_over_a_runs_own_files(tmp_path: Path) -> None:
    """QA: `masr evaluate --json runs/pop/best.pt` replaced the checkpoint it had just read
    (and --json runs/pop/run.json its record): refused before the work; another name in a
    run folder is fine."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs), "--threads", "1"]
    _ok(["train", "--model", "pop", *base])
    before = {n: (runs / "pop" / n).read_bytes() for n in ("best.pt", "run.json")}
    for name in before:
        _fails(["evaluate", *base, "--json", str(runs / "pop" / name)],
               f"--json {runs / 'pop' / name}: a file of the run folder")
    assert {n: (runs / "pop" / n).read_bytes() for n in before} == before
    _ok(["evaluate", *base, "--json", str(runs / "pop" / "metrics.json")])
    assert "pop" in json.loads((runs / "pop" / "metrics.json").read_text())
    for _ in range(2):  # review: a run.json of one's own is no run folder, the 2nd time too
        _ok(["evaluate", *base, "--json", str(tmp_path / "results" / "run.json")])
    if Path("/proc").is_dir():  # QA: where nothing can be made, said after the evaluation
        for option, name in (("--json", "/proc/x.json"), ("--plot", "/proc/x.png")):
            said = _fails(["evaluate", *base, option, name],
                          f"{option} {name}: nothing can be made in /proc")
            assert "evaluated on" not in said


def test_evaluate_model_is_a_runs_name_not_a_path(tmp_path: Path) -> None:
    """QA: --model ../other/mass evaluated a run outside --runs and showed it among the
    baselines as "../other/mass"; --model mdr/ (a shell's completion) was keyed "mdr/"."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs), "--threads", "1"]
    _ok(["train", "--model", "pop", *base])
    for name in ("../runs/pop", str(runs / "pop"), ".", "..", "/"):
        _fails(["evaluate", *base, "--model", name], f"--model {name}: a run's name in")
    said = _ok(["evaluate", *base, "--model", "pop/", "--json", "-"])
    assert list(json.loads(said.stdout)) == ["pop"]


def test_outputs_below_a_file_are_one_clear_line(tmp_path: Path) -> None:
    """An output path under a file (QA: prep and export said only "afile: File exists", train
    "afile/mdr: Not a directory"): every command names the file, and nothing is made."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    afile = tmp_path / "afile"
    afile.write_text("x")
    below = afile / "sub"
    for args in (
        ["prep", "--out", str(below)],
        ["synth", "--out", str(below / "x.csv")],
        ["train", "--model", "pop", "--data", str(data), "--runs", str(below)],
        ["export", "--runs", str(tmp_path / "runs"), "--out", str(below / "m.onnx")],
        ["reproduce", "--data", str(data), "--out", str(below), "--threads", "1"],
        ["evaluate", "--data", str(data), "--runs", str(tmp_path / "runs"), "--json",
         str(below / "m.json")],
        ["analyze", "speed", "--runs", str(tmp_path / "runs"), "--out", str(below)],
    ):
        _fails(args, f"{afile} is a file, not a directory")
    _fails(["train", "--model", "pop", "--data", str(data), "--runs", str(afile)],
           f"--runs {afile}: is a file, not a folder")
    assert afile.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "data"]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs").write_text("x")  # reproduce's runs folder is a file
    _fails(["reproduce", "--data", str(data), "--out", str(tmp_path / "out"), "--threads", "1"],
           f"{tmp_path / 'out' / 'runs'} is a file, not a directory")


def test_evaluate_checks_its_json_path_before_the_work(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    base = ["--data", str(data), "--runs", str(tmp_path / "runs"), "--threads", "1"]
    _ok(["train", "--model", "pop", *base])
    _fails(["evaluate", *base, "--json", str(tmp_path)], "give a file name")
    png = str(tmp_path / "p.png")
    _fails(["evaluate", *base, "--json", png, "--plot", png], "the same file as --plot")
    said = _ok(["evaluate", *base, "--alpha", "0.3"])
    assert "note: --alpha re-weighs fusion runs" in said.stderr


def test_a_fusion_made_from_an_earlier_part_is_flagged(tmp_path: Path) -> None:
    """mdr trained again after masr was fused: evaluate says masr holds the former mdr. A
    copied runs folder (new file times, parts newer than the runs made from them) is not
    flagged: the check compares the parts' best epochs and figures, not file times."""
    import os
    import shutil
    import time

    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs)]
    _ok(["train", "--model", "amasr", *base, *TINY])
    fresh = _ok(["evaluate", *base, "--threads", "1"])
    assert "warning" not in fresh.stderr
    copy = tmp_path / "copy"
    shutil.copytree(runs, copy, copy_function=shutil.copyfile)  # no file times kept
    later = time.time() + 60
    for part in ("mdr", "mass", "amdr", "amass"):
        os.utime(copy / part / "best.pt", (later, later))
    copied = _ok(["evaluate", "--data", str(data), "--runs", str(copy), "--threads", "1"])
    assert "warning" not in copied.stderr
    _ok(["train", "--model", "mdr", *base, *TINY, "--lr", "0.05"])  # mdr made again
    said = _ok(["evaluate", *base, "--threads", "1"])
    assert "masr was made from an earlier mdr" in said.stderr
    assert "amdr was made from an earlier mdr" in said.stderr
    assert "mass was made" not in said.stderr and "amasr was made" not in said.stderr
    _ok(["train", "--model", "mass", *base, *TINY, "--lr", "0.05"])  # mass made again too
    said = _ok(["evaluate", *base, "--threads", "1"])
    # once, though masr is loaded beside mass and then alone (QA: said twice)
    assert said.stderr.count("masr was made from an earlier mdr and mass") == 1
    # a run made before made_from existed: its parts' file times still tell
    info = json.loads((copy / "amasr" / "run.json").read_text())
    del info["made_from"]
    (copy / "amasr" / "run.json").write_text(json.dumps(info))
    legacy = _ok(["evaluate", "--data", str(data), "--runs", str(copy), "--threads", "1"])
    assert "amasr was made from an earlier amdr and amass" in legacy.stderr


def test_the_default_recipe_chooses_the_fusion_weight_on_validation(tmp_path: Path) -> None:
    """`masr train` without --alpha under the default recipe: the fusion chooses α on
    validation as with --alpha auto (with or without a --time-limit); --alpha given keeps its
    weight, and so does --recipe paper (the paper's fixed 0.5)."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    for runs, extra, auto in (("default", [], True), ("budget", ["--time-limit", "600"], True),
                              ("given", ["--alpha", "0.5"], False),
                              ("paper", ["--recipe", "paper"], False)):
        said = _ok(["train", "--model", "masr", "--data", str(data), "--runs",
                    str(tmp_path / runs), *TINY, *extra])
        info = json.loads((tmp_path / runs / "masr" / "run.json").read_text())
        assert ("α of eq. 20 chosen on validation" in said.stderr) is auto, runs
        assert info["signature"]["alpha"] == ("auto" if auto else 0.5), runs
        assert ("alpha_search" in info) is auto, runs
        chosen = load_checkpoint(tmp_path / runs / "masr" / "best.pt")["alpha"]
        assert chosen == info["alpha"] and (auto or chosen == 0.5), runs


def test_alpha_auto_chooses_the_fusion_weight_on_validation(
    amasr_runs: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """`--alpha auto`: the trained parts are reused, each fusion is scored at every weight of
    ALPHA_GRID on validation and keeps the best under --select (a tie: the weight nearest 0.5);
    its figures at α = 1 and 0 are its MDR and MASS parts' own; best.pt serves the choice."""
    import shutil

    from masr.config import ALPHA_GRID

    data, shared, _ = amasr_runs
    runs = tmp_path / "runs"
    shutil.copytree(shared, runs)
    base = ["train", "--model", "amasr", "--data", str(data), "--runs", str(runs), *TINY]
    result = _ok([*base, "--alpha", "auto"])
    assert "amdr: reusing" in result.stderr and "amass: reusing" in result.stderr
    assert "α of eq. 20 chosen on validation" in result.stderr
    info = json.loads((runs / "amasr" / "run.json").read_text())
    assert info["signature"]["alpha"] == "auto"
    search = info["alpha_search"]
    protocol = search["protocol"]
    grid = search["grid"]
    assert list(grid) == [f"{a:g}" for a in ALPHA_GRID]

    def key(a: float) -> tuple[float, float, float]:
        m = grid[f"{a:g}"][protocol]
        return (m["hit@10"], m["ndcg@10"], -abs(a - 0.5))

    chosen = max(ALPHA_GRID, key=key)
    assert info["alpha"] == chosen
    assert info["best"]["valid"] == grid[f"{chosen:g}"]["sampled"]
    assert info["best"]["valid_full"] == grid[f"{chosen:g}"]["full"]
    for alpha, part in (("1", "amdr"), ("0", "amass")):
        best = json.loads((runs / part / "run.json").read_text())["best"]
        assert grid[alpha]["sampled"] == pytest.approx(best["valid"], abs=1e-6)
        assert grid[alpha]["full"] == pytest.approx(best["valid_full"], abs=1e-6)
    fused = load_checkpoint(runs / "amasr" / "best.pt")
    assert fused["alpha"] == chosen and fused["config"]["alpha"] == chosen
    again = _ok([*base, "--alpha", "auto"])
    assert "masr: reusing" in again.stderr  # the plain fusion, chosen the same way before
    # the summary table shows each fusion's weight where a trained run shows its best epoch
    assert f"α {chosen:g} " in again.stderr
    _ok([*base, "--alpha", "0.5"])
    info = json.loads((runs / "amasr" / "run.json").read_text())
    assert info["alpha"] == 0.5 and "alpha_search" not in info
    _ok([*base, "--alpha", "0.75"])
    said = _ok(["evaluate", "--data", str(data), "--runs", str(runs), "--model", "amasr",
                "--model", "amass", "--threads", "1"])
    assert "amasr: eq. 20 with α 0.75" in said.stderr
    # masr export reads the parts' checkpoints and serves the fusion run's α ...
    from masr.config import ExportConfig
    from masr.export import export_model

    assert export_model(runs, tmp_path / "a.onnx").metadata["alpha"] == 0.75
    over = export_model(runs, tmp_path / "b.onnx", ExportConfig(alpha=0.3))
    assert over.metadata["alpha"] == 0.3  # --alpha on export still wins
    # ... unless the fusion was made from parts trained again since: the paper's, with a note
    _ok(["train", "--model", "amdr", "--data", str(data), "--runs", str(runs), *TINY,
         "--eps", "0.3"])
    notes: list[str] = []
    stale = export_model(runs, tmp_path / "c.onnx", log=notes.append)
    assert stale.metadata["alpha"] == 0.5
    assert any("fused from parts trained again since" in n for n in notes)
    assert not any("no amasr run to take α from" in n for n in notes)  # one note, not two
    # no fusion run at all: the paper's α, said
    import shutil

    shutil.rmtree(runs / "amasr")
    notes.clear()
    assert export_model(runs, tmp_path / "d.onnx", log=notes.append).metadata["alpha"] == 0.5
    assert any("no amasr run to take α from: exporting the paper's α 0.5" in n for n in notes)
    _fails([*base, "--alpha", "most"], "--alpha most", "auto")
    _fails([*base, "--alpha", "1.5"], "--alpha 1.5")


def test_evaluate_significance_pairs_runs_on_the_same_cases(
    amasr_runs: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """--significance: the paired table on stderr; --json keeps every run's metrics as before
    and adds their standard errors ("se") and the comparisons ("_paired"), whose Δ is the
    difference of the two runs' figures; --plot works beside it."""
    import shutil

    data, shared, _ = amasr_runs
    runs = tmp_path / "runs"
    shutil.copytree(shared, runs)
    _ok(["train", "--model", "pop", "--data", str(data), "--runs", str(runs), *TINY])
    args = ["evaluate", "--data", str(data), "--runs", str(runs), "--threads", "1"]
    plain = json.loads(_ok([*args, "--json", "-"]).stdout)
    png = tmp_path / "hits.png"
    result = _ok([*args, "--json", "-", "--significance", "--plot", str(png)])
    assert "paired on the same cases" in result.stderr and "McNemar" in result.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"  # --plot beside it draws the runs alone
    out = json.loads(result.stdout)
    paired = out.pop("_paired")
    assert set(out) == set(plain)
    for run, metrics in out.items():
        se = metrics.pop("se")
        assert metrics == plain[run] and set(se) == {"sampled", "full"}
        assert 0 < se["sampled"]["hit@10"] < 0.5
    kinds = {(e["run"], e["against"], e["protocol"]) for e in paired}
    assert ("amasr", "pop", "full") in kinds and ("amdr", "mdr", "sampled") in kinds
    for e in paired:
        a, b = out[e["run"]][e["protocol"]], out[e["against"]][e["protocol"]]
        assert e["hit@10"]["delta"] == pytest.approx(a["hit@10"] - b["hit@10"], abs=2e-6)
        assert e["hit@10"]["ci95"][0] <= e["hit@10"]["delta"] <= e["hit@10"]["ci95"][1]
        assert 0.0 <= e["hit@10"]["p"] <= 1.0


def test_an_interrupt_in_the_first_epoch_says_there_is_nothing_to_resume(
    tmp_path: Path, monkeypatch
) -> None:
    """Ctrl-C before any epoch is saved: the run says that a new train starts it again (no
    promise of --resume), and a --resume then says it trains from the start."""
    from conftest import write_planted

    import masr.train

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    real = masr.train.train_model

    def stop_at_once(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(masr.train, "train_model", stop_at_once)
    result = runner.invoke(app, base)
    assert result.exit_code == 130
    assert "nothing saved to resume from" in result.stderr
    assert "--resume with the same options continues" not in result.stderr
    monkeypatch.setattr(masr.train, "train_model", real)
    again = _ok([*base, "--resume"])
    assert "nothing to resume" in again.stderr


def test_the_summary_notes_full_figures_on_different_case_counts() -> None:
    """A part cut by a time limit ranks fewer full-ranking validation cases than the others:
    the summary says so under the table; with every row on the same cases, nothing."""
    from masr.runs.make import RunOutcome
    from masr_cli.train import cases_note

    same = [RunOutcome("mdr", "trained", 3, {}, 1.0, valid_sample=2000),
            RunOutcome("mass", "reused", 2, {}, 0.0, valid_sample=0)]
    assert cases_note(same, 2000) is None
    note = cases_note(same[:1], 2500)
    assert note is not None and "rank 2,000 of the 2,500 validation cases" in note
    cut = [*same, RunOutcome("masr", "fused", 0, {}, 1.0, alpha=0.5, valid_sample=700)]
    note = cases_note(cut, 2000)
    assert note is not None and "mdr 2,000, mass 2,000, masr 700" in note


def test_non_finite_settings_are_refused_and_a_run_says_why_it_stopped(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    base = ["train", "--data", str(data), "--runs", str(tmp_path / "runs")]
    for item in ("shrink=nan", "shrink=inf", "alpha=-inf"):
        _fails([*base, "--model", "itemknn", "--set", item], f"--set {item}", "finite")
    _fails([*base, "--model", "mdr", "--set", "init_std=inf"], "finite")
    assert not (tmp_path / "runs").exists()
    done = _ok([*base, "--model", "mdr", *TINY])
    assert "mdr: trained its 2 epoch(s); best epoch" in done.stderr
    early = _ok([*base, "--model", "mass", *TINY, "--epochs", "30", "--patience", "1",
                 "--lr", "0.5"])
    assert "mass: stopped early after" in early.stderr and "(--patience)" in early.stderr


def test_output_paths_below_a_file_fail_before_any_work(tmp_path: Path) -> None:
    """--json / --plot / synth --out under a path that is a file: one line at once, saying
    which part is a file (not an OS error after the evaluation)."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    (tmp_path / "afile").write_text("x")
    base = ["evaluate", "--data", str(data), "--runs", str(tmp_path / "none"), "--threads", "1"]
    for option, name in (("--json", "x.json"), ("--plot", "x.png")):
        below = str(tmp_path / "afile" / name)
        _fails([*base, option, below], option, "is a file, not a directory")
    _fails(["synth", "--out", str(tmp_path / "afile" / "p.csv")], "is a file, not a directory")
    _fails(["synth", "--out", str(tmp_path)], "is a directory")
    _ok(["train", "--model", "pop", "--data", str(data), "--runs", str(tmp_path / "my runs")])
    hint = runner.invoke(app, ["train", "--model", "pop", "--data", str(data), "--runs",
                               str(tmp_path / "my runs")]).stderr.split("next: ")[-1]
    assert f"--runs '{tmp_path / 'my runs'}'" in hint  # copies into a shell whole


def test_a_reader_says_when_a_run_is_being_trained_now(tmp_path: Path) -> None:
    """run.json says "running": while its lock is held by a live process, readers say the run
    is being trained now (not that --resume finishes it); once the lock is gone or stale, the
    run is an unfinished one as before."""
    from masr.lock import locked
    from masr.runs.store import RUN_LOCK, run_warnings

    run = tmp_path / "runs" / "mass"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run": "mass", "status": "running",
                                              "history": [{}, {}]}))
    with locked(run / RUN_LOCK, "masr train"):
        (note,) = run_warnings(run)
        assert "is being trained now by masr train (pid" in note and "2 epoch(s)" in note
        assert "--resume" not in note
    (note,) = run_warnings(run)
    assert "is not finished (running, after 2 epoch(s))" in note and "--resume" in note


def test_reproduce_refuses_a_size_given_twice() -> None:
    _fails(["reproduce", "--dims", "8,16,8"], "--dims 8,16,8", "twice")
    _fails(["reproduce", "--dims", "8,,16"], "--dims 8,,16", "expected sizes like")
    _fails(["reproduce", "--dims", "8,16,"], "--dims 8,16,", "expected sizes like")


def test_recipe_paper_equals_the_options_its_help_names(tmp_path: Path) -> None:
    """`--recipe paper` and the default recipe with the options `masr train --help` says are
    the same train identical runs (MDR's and MASS's model settings included), and the help's
    model values are the model configs' own defaults."""
    import shlex

    from conftest import write_planted

    from masr.models.mass import MASSConfig
    from masr.models.mdr import MDRConfig
    from masr_cli.train import _PAPER_MODEL, _paper_text

    assert MDRConfig().dropout == MASSConfig().dropout == _PAPER_MODEL["dropout"]
    assert MDRConfig().init_std is None and _PAPER_MODEL["mdr.init_std"] == "none"
    data = write_planted(tmp_path / "data")
    base = ["train", "--model", "amasr", "--data", str(data), *TINY]
    _ok([*base, "--runs", str(tmp_path / "paper"), "--recipe", "paper"])
    _ok([*base, "--runs", str(tmp_path / "flags"), *shlex.split(_paper_text())])
    for run in ("mdr", "mass", "amdr", "amass", "amasr"):
        paper = json.loads((tmp_path / "paper" / run / "run.json").read_text())
        flags = json.loads((tmp_path / "flags" / run / "run.json").read_text())
        assert paper["best"] == flags["best"], run
        assert paper["model_config"] == flags["model_config"], run


def test_one_setting_given_two_values_is_refused(tmp_path: Path) -> None:
    """--dim 16 with --set dim=8, --reg with ease's --set reg, or one --set name twice with
    different values: one line naming both, nothing trained; the same value twice is fine."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    base = ["train", "--data", str(data), "--runs", str(tmp_path / "runs")]
    _fails([*base, "--model", "mdr", "--dim", "16", "--set", "dim=8"], "--dim 16", "dim=8")
    _fails([*base, "--model", "ease", "--reg", "5", "--set", "reg=7"], "two values")
    _fails([*base, "--model", "mdr", "--set", "dropout=0.1", "--set", "dropout=0.3"],
           "--set dropout: given twice")
    assert not (tmp_path / "runs").exists()
    _ok([*base, "--model", "mdr", *TINY, "--set", "dim=8", "--set", "dim=8"])


def test_resume_never_trains_past_what_its_options_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume with --epochs below the epochs trained, or a new --time-limit below the seconds
    spent, is refused (QA: the run kept its epochs and was recorded as made with the lower
    value, then reused as such); a run whose --time-limit is spent trains nothing more (QA:
    every --resume added a one-step epoch); a Ctrl-C right after an epoch's last.pt counts that
    epoch (QA: run.json and the message said one fewer than last.pt held)."""
    from dataclasses import replace

    from conftest import write_planted

    import masr.train
    from masr.checkpoint import load_checkpoint
    from masr.config import TrainConfig
    from masr.dataset import load_prepared
    from masr.models.mdr import MDR, MDRConfig
    from masr.train import train_model

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok(base)  # 2 epochs
    before = (runs / "mdr" / "run.json").read_bytes()
    _fails([*base, "--epochs", "1", "--resume"],
           "--epochs 1 (given, or saved with the run --resume continues) is below the 2 "
           "epoch(s)", "has trained")
    _fails([*base, "--time-limit", "0.001", "--resume"], "--time-limit 0.001 (given")
    assert (runs / "mdr" / "run.json").read_bytes() == before

    # a last.pt whose 0.5 s limit is spent: resumed with it, no epoch is added
    state = load_checkpoint(runs / "mdr" / "last.pt")
    state["train_config"]["time_limit"], state["seconds"] = 0.5, 0.6
    prepared = load_prepared(data)
    model = MDR(MDRConfig(dim=8), prepared.n_users, prepared.n_playlists, prepared.n_songs)
    model.load_state_dict(state["state_dict"])
    config = TrainConfig(**{**state["train_config"], "epochs": 9})
    result = train_model(model, prepared, config, resume=state)
    assert len(result.history) == 2 and result.extra["stopped_by_time_limit"]
    # its last epoch cut by the limit (a slow validation before it): spent the same way
    cut = {**state, "seconds": 0.1, "history": [*state["history"][:-1],
                                                {**state["history"][-1], "steps": "3/9"}]}
    result = train_model(model, prepared, config, resume=cut)
    assert len(result.history) == 2 and result.extra["stopped_by_time_limit"]
    # every epoch trained: a resume is no stop by the time limit
    done = TrainConfig(**{**state["train_config"], "epochs": 2})
    assert not train_model(model, prepared, done, resume=state).extra["stopped_by_time_limit"]
    # a limit raised, even one the run had overrun (torchrun checks at epoch ends): not
    # refused, and it trains on; a lowered one below the seconds spent is refused
    from masr.errors import MasrError
    from masr.runs.make import _check_resumable

    over = {**state, "seconds": 9.8, "train_config": {**state["train_config"], "time_limit": 8}}
    _check_resumable("mdr", runs / "mdr", over, replace(config, time_limit=9.0), False)
    with pytest.raises(MasrError, match="--time-limit 7 .* is below the 9.8 s"):
        _check_resumable("mdr", runs / "mdr", over, replace(config, time_limit=7.0), False)
    with pytest.raises(MasrError, match="--adv-epochs 1 .* is below the 2 epoch"):
        _check_resumable("amdr", runs / "amdr", state, replace(config, epochs=1), True)

    # Ctrl-C right after epoch 2's last.pt is written
    real = masr.train.save_checkpoint

    def save_then_stop(path, *args, **kwargs):  # noqa: ANN001, ANN202
        real(path, *args, **kwargs)
        if Path(path).name == "last.pt" and kwargs.get("epoch") == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(masr.train, "save_checkpoint", save_then_stop)
    result = runner.invoke(app, [*base, "--epochs", "3"])
    assert result.exit_code == 130
    assert "mdr: interrupted after 2 epoch(s)" in result.stderr
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["status"] == "interrupted" and len(info["history"]) == 2


def test_out_of_range_numbers_are_one_line(tmp_path: Path) -> None:
    """Values past what a machine or float32 holds (QA fuzz: tracebacks from an int64
    overflow, an allocation of 92.8 GB, a float32 overflow): one line each; PyTorch's failed
    allocation, a RuntimeError, reads as out of memory; column names without an INPUT are
    refused, not ignored."""
    from conftest import write_planted

    from masr_cli._common import _allocation_failed

    data = write_planted(tmp_path / "data")
    base = ["train", "--model", "mdr", "--data", str(data), "--runs", str(tmp_path / "runs")]
    huge = str(2**63)
    for args, said in (
        (["--threads", huge], "--threads must be >= 0 (0 = the free cores) and at most 4,096"),
        (["--dim", "100000000"], "--dim 100000000: must be in [1, 65,536]"),
        (["--neg", huge], "--neg must be >= 1 and at most 2,147,483,647"),
        (["--lr", "1e308"], "--lr must be a positive number (float32)"),
        (["--temperature", "1e39"], "--temperature must be a positive number (float32)"),
    ):
        _fails([*base, *args], said)
    _fails(["evaluate", "--data", str(data), "--threads", huge], "and at most 4,096")
    assert not (tmp_path / "runs").exists()
    assert _allocation_failed(RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. "
                                           "DefaultCPUAllocator: can't allocate memory: you "
                                           "tried to allocate 92800000000 bytes"))
    assert not _allocation_failed(RuntimeError("shape mismatch"))
    _fails(["prep", "--out", str(tmp_path / "p"), "--track-col", "song"],
           "--track-col name columns of an INPUT file")


def test_evaluate_title_says_what_each_protocol_ranks_against(tmp_path: Path) -> None:
    """On a small catalog some cases store fewer negatives: the title gives the largest count
    as 'up to N', and full ranking's competitors as the songs outside the training songs."""
    import polars as pl
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    cases = pl.read_parquet(data / "test.parquet")
    short = cases["negatives"].to_list()
    short[0] = short[0][:10]
    cases.with_columns(pl.Series("negatives", short, dtype=cases.schema["negatives"])) \
        .write_parquet(data / "test.parquet")
    base = ["--data", str(data), "--runs", str(tmp_path / "runs"), "--threads", "1"]
    _ok(["train", "--model", "pop", *base])
    said = " ".join(_ok(["evaluate", *base]).stderr.split())
    assert "vs its up to 20 stored negatives" in said
    assert "catalog outside the playlist's training songs" in said
    said = " ".join(_ok(["evaluate", *base, "--split", "valid"]).stderr.split())
    assert "vs its 20 stored negatives" in said


def test_the_summary_table_keeps_whole_run_names_in_80_columns() -> None:
    """QA: at 80 columns neumf's branch runs both read "neumf_…" (and the last header was cut);
    the table now fits with whole names."""
    import io

    from rich.console import Console

    from masr.config import RunOptions
    from masr.runs.make import RunOutcome
    from masr_cli.train import summary_table

    figures = {"hit@10": 0.4, "ndcg@10": 0.3}
    outcomes = [RunOutcome(run, "trained", 3, figures, 123.4, figures)
                for run in ("neumf_gmf", "neumf_mlp", "neumf")]
    outcomes.append(RunOutcome("itemknn", "fitted", 0, figures, 0.5, figures))
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(summary_table("neumf", RunOptions(), outcomes))
    text = console.export_text()
    assert "neumf_gmf" in text and "neumf_mlp" in text and "…" not in text
    assert "seconds" in text and max(len(line) for line in text.splitlines()) <= 80
    fitted = next(line for line in text.splitlines() if line.startswith("itemknn"))
    assert fitted.split("│")[2].strip() == "—"  # a closed-form fit has no epoch, not "0"


def test_lines_stay_whole_when_stderr_is_a_log(tmp_path: Path) -> None:
    """stderr to a file or a pipe (here the test runner's): a note longer than 80 columns is
    one line, not broken mid-sentence at Rich's default width (QA: log files)."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    said = _ok(["train", "--model", "pop", "--data", str(data), "--runs", str(tmp_path / "runs"),
                "--valid-sample", "5", "--threads", "1"])
    (note,) = [line for line in said.stderr.splitlines() if line.startswith("note: the full")]
    assert len(note) > 80 and note.endswith("ranks them all")


def test_the_stop_line_says_which_epoch_the_time_limit_cut() -> None:
    """QA: "stopped by --time-limit 5 after 2 epoch(s)" of which the second had run 44 of its 57
    steps: only run.json said so. The line names the cut."""
    from types import SimpleNamespace

    from masr.config import TrainConfig
    from masr.runs.make import stop_reason

    config = TrainConfig(time_limit=5.0)
    cut = SimpleNamespace(history=[{"epoch": 1}, {"epoch": 2, "steps": "44/57"}], best_epoch=2,
                          stopped_early=True, extra={"stopped_by_time_limit": True})
    assert stop_reason(cut, config) == (
        "stopped by --time-limit 5 after 2 epoch(s), the last cut at step 44/57; best epoch 2"
    )
    whole = SimpleNamespace(**{**vars(cut), "history": [{"epoch": 1}, {"epoch": 2}]})
    assert stop_reason(whole, config) == "stopped by --time-limit 5 after 2 epoch(s); best epoch 2"
