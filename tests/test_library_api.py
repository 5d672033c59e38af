"""masr as a Python library: what a researcher's script gets for the mistakes the command line
would have caught (one MasrError naming the setting, not an error deep inside training), and the
conveniences the CLI has (device "auto", stdout that is a text stream)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from masr.config import AdversarialConfig, RunOptions, TrainConfig
from masr.errors import MasrError


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(prepared data, runs) with one tiny MDR run."""
    from conftest import write_planted

    from masr.dataset import load_prepared
    from masr.runs import train_run

    root = tmp_path_factory.mktemp("lib")
    data_dir = write_planted(root / "data")
    options = RunOptions(device="cpu", train=TrainConfig(epochs=1, batch_size=32), model={"dim": 8})
    train_run("mdr", load_prepared(data_dir), root / "runs", options)
    return data_dir, root / "runs"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 1.5}, "--batch-size 1.5: is not an integer"),
        ({"neg": 2.5}, "--neg 2.5: is not an integer"),
        ({"seed": 1.5}, "--seed 1.5: is not an integer"),
        ({"epochs": "3"}, "--epochs '3': is not an integer"),
        ({"lr": "0.01"}, "--lr '0.01': is not a number"),
        ({"sparse": 1}, "--sparse 1: is not true/false"),
    ],
)
def test_configs_refuse_values_of_the_wrong_kind(kwargs: dict, message: str) -> None:
    with pytest.raises(MasrError, match=f"^{message}"):
        TrainConfig(**kwargs)


def test_configs_take_numpy_integers_and_ints_for_floats() -> None:
    import numpy as np

    config = TrainConfig(epochs=np.int64(3), lr=1, time_limit=0)
    assert type(config.epochs) is int and config.epochs == 3 and config.lr == 1
    with pytest.raises(MasrError, match="--adv-epochs 2.0: is not an integer"):
        AdversarialConfig(epochs=2.0)
    assert AdversarialConfig(lr=None).lr is None


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("mdr", {"dim": "8"}, "--dim '8': is not an integer"),
        ("mass", {"dropout": "0.1"}, "--set dropout='0.1': is not a number"),
        ("caser", {"window": 2.5}, "--set window=2.5: is not an integer"),
        ("itemknn", {"shrink": "10"}, "--set shrink='10': is not a number"),
        ("masr", {"alpha": "0.5"}, "--set alpha='0.5': is not a number"),
    ],
)
def test_model_configs_refuse_values_of_the_wrong_kind(
    name: str, values: dict, message: str
) -> None:
    from masr.models import model_class

    config_class = model_class(name).config_class
    with pytest.raises(MasrError, match=f"^{re.escape(message)}$"):
        config_class(**values)


def test_model_configs_take_numpy_integers_and_ints_for_floats() -> None:
    from masr.models.itemknn import ItemKNNConfig
    from masr.models.mdr import MDRConfig

    config = MDRConfig(dim=np.int64(8), dropout=0)
    assert type(config.dim) is int and config.dim == 8 and config.dropout == 0
    assert ItemKNNConfig(shrink=10).shrink == 10


def test_prepare_refuses_a_dict_for_its_typed_parts(tmp_path: Path) -> None:
    from masr.config import Columns
    from masr.prep import prepare

    for kwargs, message in (
        ({"columns": {"user": "u"}}, "prepare(columns=...): expected Columns, not dict"),
        ({"config": {"seed": 1}}, "prepare(config=...): expected PrepConfig, not dict"),
    ):
        with pytest.raises(MasrError, match=re.escape(message)):
            prepare(None, tmp_path / "data", **kwargs)
    assert not (tmp_path / "data").exists()
    with pytest.raises(MasrError, match="^--track-col 3: is not text$"):
        Columns(track=3)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"dimm": 8}, "--set dimm=8: no model setting is called 'dimm'"),
        ({"mdrr.dim": 8}, "--set mdrr.dim=8: no model is called 'mdrr'"),
        ({"mdr.shrink": 10.0}, "--set mdr.shrink=10.0: no mdr setting is called 'shrink'"),
        ({"dim": 3.5}, "--set dim=3.5: is not an integer"),
        ({"dim": "8"}, "--set dim='8': is not an integer"),
    ],
)
def test_run_options_model_settings_are_checked_like_set(
    trained: tuple[Path, Path], tmp_path: Path, model: dict, message: str
) -> None:
    from masr.dataset import load_prepared
    from masr.runs import train_run

    options = RunOptions(device="cpu", train=TrainConfig(epochs=1), model=model)
    with pytest.raises(MasrError, match=f"^{message}"):
        train_run("mdr", load_prepared(trained[0]), tmp_path / "runs", options)
    assert not (tmp_path / "runs").exists()  # refused before anything was made


def test_evaluate_and_load_take_auto_and_refuse_other_data(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    from conftest import write_planted

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run, read_run_json

    data_dir, runs = trained
    data = load_prepared(data_dir)
    model, _ = load_run(runs, "mdr", data, device="auto")
    both = evaluate_model(model, data, "test", device="auto")
    assert evaluate_model(model, data, "test", protocols="full") == {"full": both["full"]}
    with pytest.raises(MasrError, match="--protocol must be among sampled, full, not sample"):
        evaluate_model(model, data, protocols=["sample"])
    with pytest.raises(MasrError, match="--full-sample -5: must be >= 0"):
        evaluate_model(model, data, full_sample=-5)
    with pytest.raises(MasrError, match="--device must be auto, cpu or cuda, not 'gpu'"):
        evaluate_model(model, data, device="gpu")
    other = load_prepared(write_planted(tmp_path / "other", songs_per_group=13))
    with pytest.raises(MasrError, match="trained on data of another size"):
        evaluate_model(model, other)
    assert read_run_json(str(runs / "mdr"))["status"] == "finished"  # a str path too
    (tmp_path / "damaged").mkdir()
    from masr.runs.store import run_warnings

    for text in ("[1, 2]", '"abc"', "{not json", '{"history": 5}', '{"signature": 3}'):
        (tmp_path / "damaged" / "run.json").write_text(text)
        assert read_run_json(tmp_path / "damaged") is None  # damaged: the run is not there
        (note,) = run_warnings(tmp_path / "damaged")  # and readers are told
        assert "run.json: " in note and "cannot be told" in note


def test_recipes_follow_the_options_device_and_check_names() -> None:
    from masr.runs import default_recipe

    cpu = RunOptions(device="cpu").with_recipe("fullrank")
    assert cpu.train.neg == 128 and cpu.model_train["mdr"]["neg"] == 1024
    assert RunOptions(device="cuda").with_recipe("fullrank").train.neg == 1024
    with pytest.raises(MasrError, match="with_recipe: epoch not among the options"):
        RunOptions().with_recipe("fullrank", {"epoch"})
    with pytest.raises(MasrError, match="--model amsar: unknown model"):
        default_recipe("amsar")


def test_score_file_writes_csv_to_a_text_stdout(
    trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's stdout (and io.StringIO) has no bytes below it; "-" is stdout too."""
    from masr.config import ExportConfig
    from masr.export import export_model
    from masr.score import score_file

    model = export_model(trained[1], tmp_path / "m.onnx", ExportConfig(model="mdr")).path
    src = tmp_path / "in.csv"
    src.write_text("user_id,playlist_id,track_id\nu0,p0,s1\nu0,p0,s2\nu9,fresh,s40\n")
    score_file(src, model, tmp_path / "file.csv")
    monkeypatch.chdir(tmp_path)
    for out in (None, "-"):
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            score_file(src, model, out)
        assert text.getvalue() == (tmp_path / "file.csv").read_text()
    assert not (tmp_path / "-").exists()


def test_an_empty_split_is_refused_not_reported_as_zeros(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """No test (or validation) case left by prep: evaluation refuses in one line instead of
    printing hit@10 = 0.0, and training refuses, having nothing to choose its epochs on."""
    import dataclasses

    import numpy as np

    from masr.dataset import Cases, load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run, train_run

    data = load_prepared(trained[0])
    empty = Cases(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros((0, 0), dtype=np.int64))
    model, _ = load_run(trained[1], "mdr", data)
    no_test = dataclasses.replace(data, test=empty)
    with pytest.raises(MasrError, match="no test cases to rank .*; --split valid has some"):
        evaluate_model(model, no_test, "test")
    assert evaluate_model(model, no_test, "valid")["full"]["hit@10"] >= 0
    options = RunOptions(device="cpu", train=TrainConfig(epochs=1), model={"dim": 8})
    with pytest.raises(MasrError, match="no validation cases"):
        train_run("pop", dataclasses.replace(data, valid=empty), tmp_path / "runs", options)


def test_undefined_figures_are_null_in_json_and_said_in_the_table() -> None:
    """A standard error of one case is NaN: JSON has no NaN, so it is null there."""
    import json

    from masr.report import to_jsonable
    from masr.significance import interval_text

    out = to_jsonable({"se": float("nan"), "ci95": [float("-inf"), 0.5], "n": 1})
    assert json.loads(json.dumps(out, allow_nan=False)) == {"se": None, "ci95": [None, 0.5], "n": 1}
    nan = float("nan")
    assert interval_text({"delta": 0.0, "ci95": [nan, nan]}) == "+0.0000 (one case: no interval)"
    assert interval_text({"delta": 0.01, "ci95": [0.0, 0.02]}) == "+0.0100 ± 0.0100"


def test_train_run_checks_its_runs_folder_as_the_cli_does(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """From Python too: a runs folder inside the prepared data (which masr prep replaces whole)
    or below a file is refused before anything is made."""
    from masr.dataset import load_prepared
    from masr.runs import train_run

    data = load_prepared(trained[0])
    options = RunOptions(device="cpu", train=TrainConfig(epochs=1))
    with pytest.raises(MasrError, match="--runs .*: inside the prepared data folder"):
        train_run("pop", data, Path(trained[0]) / "runs", options)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(MasrError, match="afile is a file, not a directory"):
        train_run("pop", data, tmp_path / "afile" / "runs", options)
    assert not (Path(trained[0]) / "runs").exists()


def test_a_run_with_a_damaged_run_json_is_made_again_and_says_so(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    from masr.dataset import load_prepared
    from masr.runs import train_run

    data = load_prepared(trained[0])
    options = RunOptions(device="cpu", train=TrainConfig(epochs=1))
    train_run("pop", data, tmp_path / "runs", options)
    (tmp_path / "runs" / "pop" / "run.json").write_text('{"history": 5}')
    said: list[str] = []
    train_run("pop", data, tmp_path / "runs", options, log=said.append)
    assert any("run.json: not what `masr train` writes (history is not a list of epochs); "
               "pop is made again from the start" in line for line in said), said


def test_a_path_where_prepared_data_or_a_model_belongs_is_one_clear_error(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """The likely slip from the README's block: the folder's path instead of load_prepared(path)
    (QA: bare AttributeErrors from train_run, load_run and evaluate_model)."""
    from masr.analyze import attention_correlation
    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run, train_run

    data_dir, runs = trained
    data = load_prepared(data_dir)
    with pytest.raises(MasrError, match=r"^data: expected prepared data, masr\.dataset\.load_"):
        train_run("pop", str(data_dir), tmp_path / "runs")
    with pytest.raises(MasrError, match="^data: expected prepared data"):
        load_run(runs, "mdr", str(data_dir))
    model, _ = load_run(runs, "mdr", data)
    with pytest.raises(MasrError, match="^data: expected prepared data"):
        evaluate_model(model, str(data_dir))
    with pytest.raises(MasrError, match="^model: expected a trained model"):
        evaluate_model("mdr", data)
    with pytest.raises(MasrError, match="--split must be one of"):
        attention_correlation(data, [runs / "mdr"], split="train")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train": {"epochs": 1}}, "RunOptions.train: expected TrainConfig, not dict"),
        ({"model": ["dim", 8]}, "RunOptions.model: expected dict, not list"),
        ({"compile": "no"}, "RunOptions.compile: expected bool, not str"),
        ({"device": 3}, "--device must be one of auto, cpu, cuda, not 3"),
        ({"device": "gpu"}, "--device must be one of auto, cpu, cuda, not 'gpu'"),
    ],
)
def test_run_options_refuse_parts_of_the_wrong_kind(kwargs: dict, message: str) -> None:
    """At construction, in one line (QA: AttributeErrors later, inside train_run)."""
    with pytest.raises(MasrError, match=f"^{re.escape(message)}"):
        RunOptions(**kwargs)
    assert RunOptions(device="cuda:1").device == "cuda:1"


def test_prep_score_and_export_configs_refuse_text_for_numbers() -> None:
    """Checked by their one consumer (prepare, score_file, export_model) through validate():
    one line naming the option (QA: TypeError '<' not supported between 'str' and 'int')."""
    from masr.config import ExportConfig, ScoreConfig
    from masr.prep import PrepConfig

    for config, message in (
        (PrepConfig(min_songs="5"), "--min-songs '5': is not an integer"),
        (ScoreConfig(k="10"), "--k '10': is not an integer"),
        (ExportConfig(chunk="256"), "--chunk '256': is not an integer"),
    ):
        with pytest.raises(MasrError, match=f"^{re.escape(message)}"):
            config.validate()
    PrepConfig(min_songs=np.int64(5)).validate()  # numpy integers are integers


@pytest.mark.parametrize("seed", ["1", 1.5, None])
def test_set_seed_refuses_a_seed_that_is_no_integer(seed: object) -> None:
    """Before any generator is seeded (QA: TypeError from the range check, or from numpy after
    Python's generator was already seeded)."""
    import masr

    with pytest.raises(MasrError, match=r"^--seed .*: is not an integer"):
        masr.set_seed(seed)  # type: ignore[arg-type]
    masr.set_seed(np.int64(3))  # numpy integers are integers


def test_one_name_or_path_is_not_read_as_its_letters(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """Where a function takes several runs, paths or option names, one given alone is one
    (QA: evaluate_runs(data, runs, "mdr") looked for runs "m", "d", "r"; epoch_seconds said
    "r, u, n, s, ...: no such run folder"; with_recipe named the letters of "epochs")."""
    from masr.analyze import epoch_seconds, quality_by_dim
    from masr.dataset import load_prepared
    from masr.report import evaluate_runs

    data_dir, runs = trained
    data = load_prepared(data_dir)
    assert list(evaluate_runs(data, runs, "mdr", device="cpu", protocols=["sampled"])) == ["mdr"]
    assert list(epoch_seconds(str(runs / "mdr"))) == ["mdr"]
    assert list(quality_by_dim(data, str(runs), "mdr", device="cpu")) == ["mdr"]
    options = RunOptions(train=TrainConfig(epochs=3)).with_recipe("paper", "epochs")
    assert options.train.epochs == 3


def test_evaluation_arguments_of_the_wrong_kind_are_one_line(
    trained: tuple[Path, Path],
) -> None:
    """Text for a count or a weight, the folder's path for the data (QA: TypeError '<' not
    supported, ValueError from float('.'), AttributeError inside TrainingIndex)."""
    from masr.analyze import pmi_attentive_scores
    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.report import evaluate_runs
    from masr.runs import load_run

    data_dir, runs = trained
    data = load_prepared(data_dir)
    model, _ = load_run(runs, "mdr", data)
    with pytest.raises(MasrError, match=r"^--full-sample '5': is not an integer"):
        evaluate_model(model, data, full_sample="5")
    for kwargs, message in (
        ({"full_sample": "5"}, "--full-sample '5': is not an integer"),
        ({"candidates": "5"}, "--candidates '5': is not an integer"),
        ({"alphas": "0.5"}, "--alpha '0.5': is not a number"),
        ({"sample_seed": "1"}, "--sample-seed '1': is not an integer"),
    ):
        with pytest.raises(MasrError, match=f"^{re.escape(message)}"):
            evaluate_runs(data, runs, ["mdr"], device="cpu", **kwargs)
    with pytest.raises(MasrError, match="^data: expected prepared data"):
        evaluate_runs(str(data_dir), runs, ["mdr"], device="cpu")
    with pytest.raises(MasrError, match=r"^--alpha 'x': is not a number"):
        RunOptions(alpha="x")
    with pytest.raises(MasrError, match=r"^--cases -1: must be >= 0"):
        pmi_attentive_scores(data, "test", -1)
    with pytest.raises(MasrError, match=r"^--split must be one of test, valid, not 'train'"):
        pmi_attentive_scores(data, "train", 10)


def test_a_dict_for_a_typed_config_is_one_line(trained: tuple[Path, Path], tmp_path: Path) -> None:
    """As prepare's: train_run's options, export_model's and score_file's configs, a score
    config's columns, and from_dict of something not a dict (QA: AttributeErrors)."""
    from masr.config import ExportConfig, ScoreConfig
    from masr.dataset import load_prepared
    from masr.export import export_model
    from masr.runs import train_run
    from masr.score import score_file

    data_dir, runs = trained
    with pytest.raises(MasrError, match=r"^train_run\(options=...\): expected RunOptions"):
        train_run("pop", load_prepared(data_dir), tmp_path / "runs", {"train": {}})
    with pytest.raises(MasrError, match=r"^export_model\(config=...\): expected ExportConfig"):
        export_model(runs, tmp_path / "m.onnx", {"model": "mdr"})
    model = export_model(runs, tmp_path / "m.onnx", ExportConfig(model="mdr")).path
    src = tmp_path / "in.csv"
    src.write_text("user_id,playlist_id,track_id\nu0,p0,s1\n")
    with pytest.raises(MasrError, match=r"^score_file\(config=...\): expected ScoreConfig"):
        score_file(src, model, tmp_path / "out.csv", {"k": 3})
    with pytest.raises(MasrError, match=r"^ScoreConfig.columns: expected Columns, not dict"):
        score_file(src, model, tmp_path / "out.csv", ScoreConfig(columns={"user": "u"}))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out.csv").exists()
    for cls in (TrainConfig, AdversarialConfig, RunOptions):
        with pytest.raises(MasrError, match=f"^{cls.__name__}.from_dict: expected dict"):
            cls.from_dict(None)  # type: ignore[arg-type]


def test_data_loaded_without_cases_says_so_when_cases_are_needed(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """load_prepared(path, cases=False) (what the export reads) has empty splits: evaluating or
    training on it says why, not that masr prep kept no case (QA)."""
    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run, train_run

    data_dir, runs = trained
    bare = load_prepared(data_dir, cases=False)
    model, _ = load_run(runs, "mdr", bare)
    with pytest.raises(MasrError, match=r"no test cases to rank \(load_prepared\(path, cases=Fa"):
        evaluate_model(model, bare)
    with pytest.raises(MasrError, match=r"no validation cases \(load_prepared\(path, cases=Fa"):
        train_run("pop", bare, tmp_path / "runs", RunOptions(device="cpu"))
    assert load_prepared(data_dir).cases_loaded and not bare.cases_loaded


def test_a_run_failing_after_an_epoch_was_saved_counts_that_epoch(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """A progress hook that raises after epoch 2's last.pt was written: run.json of the failed
    run counts the 2 epochs last.pt holds (QA: it said 1, as a Ctrl-C there no longer does)."""
    from masr.dataset import load_prepared
    from masr.runs import read_run_json, train_run
    from masr.train import TrainProgress

    class Failing(TrainProgress):
        def epoch(self, record: dict) -> None:
            if record["epoch"] == 2:
                raise RuntimeError("a notebook's progress bar broke")

    options = RunOptions(device="cpu", train=TrainConfig(epochs=3, patience=0), model={"dim": 8})
    with pytest.raises(RuntimeError, match="progress bar broke"):
        train_run("mdr", load_prepared(trained[0]), tmp_path / "runs", options, progress=Failing())
    info = read_run_json(tmp_path / "runs" / "mdr")
    assert info is not None and info["status"] == "failed"
    assert [h["epoch"] for h in info["history"]] == [1, 2]


def test_a_torch_cuda_device_without_cuda_is_one_line(trained: tuple[Path, Path]) -> None:
    """load_run / resolve_device given torch.device("cuda") on a machine without CUDA (QA: an
    AssertionError from inside torch), or None for the device."""
    import torch

    from masr.dataset import load_prepared
    from masr.runs import load_run
    from masr.train import resolve_device

    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    data_dir, runs = trained
    with pytest.raises(MasrError, match="^--device cuda: no CUDA device is available"):
        load_run(runs, "mdr", load_prepared(data_dir), device=torch.device("cuda"))
    with pytest.raises(MasrError, match="^--device must be auto, cpu or cuda, not None"):
        resolve_device(None)  # type: ignore[arg-type]
    assert resolve_device(torch.device("cpu")).type == "cpu"


def test_a_model_loaded_without_data_is_not_evaluated_on_other_data(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """load_run's data is optional; a re-split of the same playlists (another prep seed) can have
    the same sizes, and its test songs were the model's training songs (QA: evaluate_model
    gave figures for it)."""
    import dataclasses

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run

    data_dir, runs = trained
    data = load_prepared(data_dir)
    model, _ = load_run(runs, "mdr")
    assert evaluate_model(model, data, protocols="sampled")["sampled"]["hit@10"] >= 0
    other = dataclasses.replace(data, manifest={**data.manifest, "fingerprint": "0123456789abcdef"})
    with pytest.raises(MasrError, match="^mdr: trained on other prepared data .*0123456789abcdef"):
        evaluate_model(model, other)
    # the same from masr.checkpoint.load_model, the lower-level path (review)
    from masr.checkpoint import load_model

    bare, _ = load_model(runs / "mdr" / "best.pt")
    assert bare.data_fingerprint == data.fingerprint
    with pytest.raises(MasrError, match="^mdr: trained on other prepared data"):
        evaluate_model(bare, other)


def test_evaluating_on_another_device_leaves_the_model_where_it_was(
    trained: tuple[Path, Path],
) -> None:
    """evaluate_model(device="cuda") of a CPU model (a notebook's): the model is back on the
    CPU afterwards, with the same figures as on the CPU."""
    import torch

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs import load_run

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    data_dir, runs = trained
    data = load_prepared(data_dir)
    model, _ = load_run(runs, "mdr", data, device="cpu")
    on_cpu = evaluate_model(model, data, "valid", device="cpu")
    on_gpu = evaluate_model(model, data, "valid", device="cuda")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert on_gpu["sampled"]["hit@10"] == pytest.approx(on_cpu["sampled"]["hit@10"], abs=1e-3)
