"""benchmarks/new_playlists.py: playlists held out of training, ranked as `masr score` folds
them in; its PyTorch figures against the user's path (masr export, masr score)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from masr.checkpoint import save_checkpoint
from masr.dataset import load_prepared


def held_out_runs(planted_dir: Path, tmp_path: Path) -> tuple[Path, Path, object]:
    """A copy of the planted data without 6 playlists, and random AMDR / AMASS checkpoints
    (d = 2) recorded as trained on it: (copy, runs, the benchmark module)."""
    from conftest import load_benchmark

    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    bench = load_benchmark("new_playlists")
    copy = tmp_path / "held"
    assert bench.main(["holdout", "--data", str(planted_dir), "--out", str(copy),
                       "--playlists", "6", "--seed", "1"]) == 0
    data = load_prepared(copy)
    torch.manual_seed(0)
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    runs = tmp_path / "runs"
    for run, model in (("amdr", MDR(MDRConfig(dim=2, init_std=0.5), *sizes)),
                       ("amass", MASS(MASSConfig(dim=2, init_std=0.5), *sizes))):
        (runs / run).mkdir(parents=True)
        save_checkpoint(runs / run / "best.pt", model.eval(), data_fingerprint=data.fingerprint)
        info = {"data": {"path": str(copy), "fingerprint": data.fingerprint}}
        (runs / run / "run.json").write_text(json.dumps(info))
    return copy, runs, bench


def test_holdout_removes_the_playlists_everywhere_but_their_ids(
    planted_dir: Path, tmp_path: Path
) -> None:
    copy, _, bench = held_out_runs(planted_dir, tmp_path)
    held = json.loads((copy / "holdout.json").read_text())["playlists"]
    assert len(held) == 6
    for table in ("train", "valid", "test"):
        ids = pl.read_parquet(copy / f"{table}.parquet")["playlist_idx"].to_list()
        assert not set(ids) & set(held)
    full, part = load_prepared(planted_dir), load_prepared(copy)
    assert (part.n_playlists, part.n_users, part.n_songs) == (
        full.n_playlists, full.n_users, full.n_songs)  # the id maps are kept whole
    assert part.fingerprint != full.fingerprint
    with pytest.raises(SystemExit):  # an existing folder is never overwritten
        bench.main(["holdout", "--data", str(planted_dir), "--out", str(copy)])


def test_evaluate_agrees_with_masr_score_under_both_fold_ins(
    planted_dir: Path, tmp_path: Path
) -> None:
    """The figures of `evaluate` (PyTorch) are those of `score` (masr export, masr score) for
    the same held-out cases, fused at α 0.5, under the maps and under the mean; α 1 is the MDR
    side alone and α 0 the MASS side alone."""
    from typer.testing import CliRunner

    from masr_cli.main import app

    copy, runs, bench = held_out_runs(planted_dir, tmp_path)
    out = tmp_path / "eval.json"
    assert bench.main(["evaluate", "--data", str(planted_dir), "--holdout", str(copy),
                       "--runs", str(runs), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    hits = got["full hit@10"]
    assert got["cases"] == 6 and got["fold_in_map"]["playlists"] == 30
    # the two fold-ins rank differently here, so the comparison below tells them apart
    assert hits["fusion fold-in map alpha 0.5"] != hits["fusion fold-in mean alpha 0.5"]
    for fold in ("map", "mean"):
        assert hits[f"fusion fold-in {fold} alpha 1"] == hits[f"mdr fold-in {fold}"]
        assert hits[f"fusion fold-in {fold} alpha 0"] == hits["mass"]
    runner = CliRunner()
    models = []
    for fold in ("map", "mean"):
        model = tmp_path / f"{fold}.onnx"
        result = runner.invoke(app, ["export", "--runs", str(runs), "--alpha", "0.5",
                                     "--fold-in", fold, "--out", str(model)])
        assert result.exit_code == 0, result.stderr
        models += ["--model", str(model)]
    scored = tmp_path / "score.json"
    assert bench.main(["score", "--data", str(planted_dir), "--holdout", str(copy), *models,
                       "--json", str(scored)]) == 0
    through = json.loads(scored.read_text())
    assert through["cases"] == 6
    for fold in ("map", "mean"):
        summary = through["models"][str(tmp_path / f"{fold}.onnx")]
        assert "6 new playlists" in summary["summary"]
        assert summary["hit@10"] == pytest.approx(hits[f"fusion fold-in {fold} alpha 0.5"])
    assert np.isfinite(list(hits.values())).all()
    # the sampled protocol ranks against the case's stored negatives, a subset of the songs
    # the full protocol ranks against: never a worse rank
    sampled = got["sampled hit@10"]
    assert set(sampled) == set(hits)
    assert all(hits[name] <= sampled[name] <= 1.0 for name in hits)
