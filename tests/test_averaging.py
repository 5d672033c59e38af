"""--ema: the weight average (masr.averaging) and what training does with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from masr.averaging import WeightAverage
from masr.checkpoint import load_checkpoint
from masr.config import TrainConfig
from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.train import train_model

FAST = {"batch_size": 32, "lr": 0.02}


def _reference(trajectory: list[torch.Tensor], decay: float, every: int) -> torch.Tensor:
    """The bias-corrected average, written out: the weights after every ``every``-th step,
    weighted (1 - r) r^(n-i) with r = decay^every, divided by the weights' sum."""
    r = decay**every
    kept = trajectory[every - 1 :: every]
    n = len(kept)
    weights = [(1 - r) * r ** (n - 1 - i) for i in range(n)]
    return sum(w * t for w, t in zip(weights, kept, strict=True)) / sum(weights)


@pytest.mark.parametrize("every", [1, 3])
def test_average_equals_the_written_out_weighted_sum(every: int) -> None:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    average = WeightAverage([p], decay=0.9, every=every)
    trajectory = []
    for _ in range(10):
        with torch.no_grad():
            p.add_(torch.randn_like(p))
        trajectory.append(p.detach().clone())
        average.step()
    (got,) = average.averaged()
    torch.testing.assert_close(got, _reference(trajectory, 0.9, every), rtol=1e-12, atol=1e-12)
    # before the first update the average is the live weights
    q = torch.nn.Parameter(torch.ones(3))
    torch.testing.assert_close(WeightAverage([q], 0.9, every=4).averaged()[0], torch.ones(3))


def test_applied_swaps_in_and_always_restores() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    average = WeightAverage([p], decay=0.5, every=1)
    with torch.no_grad():
        p.fill_(2.0)
    average.step()  # the average is now 2
    with torch.no_grad():
        p.fill_(4.0)
    with average.applied():
        assert torch.equal(p.detach(), torch.full((2,), 2.0))
    assert torch.equal(p.detach(), torch.full((2,), 4.0))
    with pytest.raises(RuntimeError), average.applied():
        raise RuntimeError("boom")
    assert torch.equal(p.detach(), torch.full((2,), 4.0))
    with pytest.raises(MasrError, match="--ema"):
        WeightAverage([p], decay=1.0)


def _mdr(data: PreparedData):
    from masr.models.mdr import MDR, MDRConfig

    torch.manual_seed(0)
    return MDR(MDRConfig(dim=8), data.n_users, data.n_playlists, data.n_songs)


def test_training_validates_and_keeps_the_average(planted: PreparedData, tmp_path: Path) -> None:
    """best.pt holds the averaged weights (what was validated), last.pt the live ones with the
    average's state, and the model ends holding best.pt's."""
    config = TrainConfig(epochs=1, ema=0.99, batch_size=4, lr=0.02)
    model = _mdr(planted)
    result = train_model(model, planted, config, run_dir=tmp_path)
    best, last = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(tmp_path / "last.pt")
    state = last["weight_average"]
    assert state["steps"] == -(-len(planted.train_song) // 4) and state["updates"] >= 5
    # best.pt (epoch 1) holds the average rebuilt from last.pt's state, not the live weights
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    norm = 1 - (0.99 ** state["every"]) ** state["updates"]
    for name, total in zip(names, state["total"], strict=True):
        torch.testing.assert_close(best["state_dict"][name], total / norm)
        assert not torch.equal(best["state_dict"][name], last["state_dict"][name])
    for name, value in model.state_dict().items():
        assert torch.equal(value, best["state_dict"][name])
    assert best["train_config"]["ema"] == 0.99
    # and the validation figures recorded are the averaged weights'
    from masr.evaluate import evaluate_model

    again = evaluate_model(model, planted, "valid", protocols=("sampled",))
    assert again["sampled"]["hit@10"] == pytest.approx(result.best_valid["hit@10"])


def test_resume_continues_the_average_exactly(planted: PreparedData, tmp_path: Path) -> None:
    config = {"patience": 0, "ema": 0.99, **FAST}
    train_model(_mdr(planted), planted, TrainConfig(epochs=3, **config), run_dir=tmp_path / "a")
    train_model(_mdr(planted), planted, TrainConfig(epochs=2, **config), run_dir=tmp_path / "b")
    last = load_checkpoint(tmp_path / "b" / "last.pt")
    train_model(
        _mdr(planted), planted, TrainConfig(epochs=3, **config), run_dir=tmp_path / "b", resume=last
    )
    a, b = (load_checkpoint(tmp_path / r / "last.pt") for r in ("a", "b"))
    assert a["history"][-1]["valid"] == b["history"][-1]["valid"]
    for x, y in zip(a["weight_average"]["total"], b["weight_average"]["total"], strict=True):
        assert torch.equal(x, y)
    # a run without an average cannot be resumed with one
    train_model(_mdr(planted), planted, TrainConfig(epochs=1, **FAST), run_dir=tmp_path / "c")
    plain = load_checkpoint(tmp_path / "c" / "last.pt")
    with pytest.raises(MasrError, match="weight average"):
        train_model(
            _mdr(planted), planted, TrainConfig(epochs=2, **config), run_dir=tmp_path / "c",
            resume=plain,
        )


def test_cli_records_ema_only_when_on(tmp_path: Path) -> None:
    from conftest import write_planted
    from test_cli_train import TINY, _fails, _ok

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "mdr", "--data", str(data), "--runs", str(runs), *TINY]
    _ok(args)
    info = lambda: json.loads((runs / "mdr" / "run.json").read_text())  # noqa: E731
    assert "ema" not in info()["train_config"]  # off: the signature runs had before
    _ok([*args, "--ema", "0.995"])
    assert info()["train_config"]["ema"] == 0.995
    _fails([*args, "--ema", "1"], "--ema")
