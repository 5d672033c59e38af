"""benchmarks/blend.py: two runs' standardised distances mixed, and their hits' overlap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def blend():
    from conftest import load_benchmark

    return load_benchmark("blend")


def test_standardised_against_a_loop(blend) -> None:
    import torch

    rows = [[1.0, 2.0, 4.0, math.inf], [3.0, 3.0, 3.0, 3.0]]
    got = blend.standardised(torch.tensor(rows))
    finite = [v for v in rows[0] if math.isfinite(v)]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    assert got[0, :3].tolist() == pytest.approx([(v - mean) / std for v in finite])
    assert got[0, 3].item() == math.inf  # an excluded song stays excluded
    assert got[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # no spread: no preference


def test_blend_mixes_z_scores(blend) -> None:
    import torch

    class Fixed:
        uses_members = False

        def __init__(self, d):
            self.d = torch.tensor(d)

        def full_distance(self, batch):
            return self.d

    a, b = Fixed([[0.0, 1.0, 2.0]]), Fixed([[2.0, 1.0, 0.0]])
    assert blend.Blend(a, b, 1.0).full_distance(None).argmin().item() == 0
    assert blend.Blend(a, b, 0.0).full_distance(None).argmin().item() == 2
    mixed = blend.Blend(a, b, 0.5).full_distance(None)
    assert mixed[0].tolist() == pytest.approx([0.0, 0.0, 0.0])  # opposite z-scores cancel


def test_script_on_two_trained_runs(blend, planted_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.runs.store import load_run
    from masr_cli.main import app

    runs = tmp_path / "runs"
    for model in ("pop", "itemknn"):
        result = CliRunner().invoke(
            app, ["train", "--model", model, "--data", str(planted_dir), "--runs", str(runs)]
        )
        assert result.exit_code == 0, result.output
    out = tmp_path / "blend.json"
    assert blend.main(["--data", str(planted_dir), "--run", f"{runs}:itemknn", "--run",
                       f"{runs}:pop", "--weight", "1", "--weight", "0.5", "--full-sample", "0",
                       "--method", "z", "--method", "rrf", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    data = load_prepared(planted_dir)
    model, _ = load_run(runs, "itemknn", data)
    knn = evaluate_model(model, data, "valid", protocols=("full",))["full"]["hit@10"]
    assert got["hit@10"]["itemknn"] == pytest.approx(knn)  # the same ranks as masr evaluate
    assert got["blend hit@10"]["1"] == pytest.approx(knn)  # weight 1: the first run alone
    assert 0.0 <= got["blend hit@10"]["rrf 0.5"] <= 1.0
    overlap = got["overlap"]
    assert overlap["both"] + overlap["itemknn only"] == pytest.approx(knn)
    assert overlap["either"] == pytest.approx(
        overlap["both"] + overlap["itemknn only"] + overlap["pop only"]
    )


def test_reciprocal_ranks_against_a_loop(blend) -> None:
    import torch

    row = [0.3, -1.0, 2.0, 0.5]
    got = blend.reciprocal_ranks(torch.tensor([row]), k=60.0)[0].tolist()
    order = sorted(range(len(row)), key=lambda i: row[i])
    want = [0.0] * len(row)
    for rank, i in enumerate(order, start=1):
        want[i] = -1.0 / (60.0 + rank)
    assert got == pytest.approx(want)
