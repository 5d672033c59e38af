"""benchmarks/by_popularity.py: full-ranking hit@10 per popularity bin of the held-out song."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bypop():
    from conftest import load_benchmark

    return load_benchmark("by_popularity")


def test_bins_cover_every_count_once(bypop) -> None:
    counts = np.array([1, 2, 3, 5, 6, 10, 11, 25, 26, 100, 101, 5000])
    bins = bypop.popularity_bins(counts, (2, 5, 10, 25, 100))
    assert bins.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert bypop.bin_labels((2, 5, 10, 25, 100)) == [
        "1-2", "3-5", "6-10", "11-25", "26-100", ">100"
    ]


def test_hits_by_bin_against_a_loop(bypop) -> None:
    rng = np.random.default_rng(0)
    ranks, bins = rng.integers(0, 30, 500), rng.integers(0, 4, 500)
    got = bypop.hits_by_bin(ranks, bins, 5)
    for b in range(4):
        cases = [r for r, c in zip(ranks, bins, strict=True) if c == b]
        assert got[b] == pytest.approx(sum(r < 10 for r in cases) / len(cases))
    assert np.isnan(got[4])  # an empty bin is NaN, not 0


def test_script_on_a_trained_run(bypop, planted_dir: Path, tmp_path: Path, capsys) -> None:
    from typer.testing import CliRunner

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs.store import load_run
    from masr_cli.main import app

    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app, ["train", "--model", "pop", "--data", str(planted_dir), "--runs", str(runs)]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "bypop.json"
    assert bypop.main(["--data", str(planted_dir), "--run", f"{runs}:pop", "--full-sample",
                       "0", "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    label = f"pop ({runs})"
    data = load_prepared(planted_dir)
    model, _ = load_run(runs, "pop", data)
    full = evaluate_model(model, data, "valid", protocols=("full",))["full"]["hit@10"]
    assert table["hit@10"][label] == pytest.approx(full)  # the same ranks as masr evaluate
    shares = table["hit@10_by_bin"]["share of cases"]
    assert sum(shares.values()) == pytest.approx(1.0)
    # the overall figure is the share-weighted mean of the bins' figures
    by_bin = table["hit@10_by_bin"][label]
    assert sum(shares[b] * (by_bin[b] or 0.0) for b in shares) == pytest.approx(full)
    assert "full hit@10 by training playlists" in capsys.readouterr().out


def test_prior_shifts_the_distance_by_log_popularity(bypop) -> None:
    import torch

    class Fixed:  # two cases, three songs
        uses_members = False

        def full_distance(self, batch):
            return torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])

    log_pop = torch.log(torch.tensor([1.0, 10.0, 100.0]))
    shifted = bypop.WithPrior(Fixed(), 0.5, log_pop).full_distance(None)
    assert torch.allclose(shifted, Fixed().full_distance(None) - 0.5 * log_pop)
    assert bypop.WithPrior(Fixed(), 0.5, log_pop).uses_members is False
