"""`masr evaluate --candidates N`: two-stage full ranking (MDR proposes, the run re-ranks)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_evaluate import TableModel, data_with
from typer.testing import CliRunner

from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.evaluate import full_ranks, two_stage_ranks
from masr.sampling import TrainingIndex
from masr_cli.main import app


def _data(train: list[list[int]], n_songs: int, test_song: list[int]) -> PreparedData:
    """test_evaluate's data, one (unused) sampled negative per case: full ranking only."""
    return data_with(train, n_songs, test_song, [[0]] * len(train))


def test_all_candidates_give_the_exact_ranks_and_few_give_a_subset():
    rng = np.random.default_rng(0)
    n_pl, v = 40, 30
    train = [sorted(rng.choice(v, 6, replace=False).tolist()) for _ in range(n_pl)]
    test = [int(rng.choice(np.setdiff1d(np.arange(v), t))) for t in train]
    data = _data(train, v, test)
    index = TrainingIndex.from_data(data)
    run = TableModel(torch.as_tensor(rng.random((n_pl, v))))
    mdr = TableModel(torch.as_tensor(rng.random((n_pl, v))))
    exact = full_ranks(run, data.test, index)
    for n in (v - 6, v, 10 * v):  # every eligible song proposed
        ranks, proposed = two_stage_ranks(run, mdr, data.test, index, n, batch_size=7)
        assert proposed.all() and np.array_equal(ranks, exact), n
    ranks, proposed = two_stage_ranks(run, mdr, data.test, index, 5)
    # by hand: proposed iff the held-out song is among MDR's 5 nearest eligible songs
    d = mdr.table.numpy().copy()
    for p, t in enumerate(train):
        d[p, t] = np.inf
    nearest = np.argsort(d, axis=1)[:, :5]
    assert np.array_equal(proposed, [test[p] in nearest[p] for p in range(n_pl)])
    assert (ranks[~proposed] == v).all()
    r = run.table.numpy()
    for p in np.flatnonzero(proposed):
        others = [s for s in nearest[p] if s != test[p]]
        assert ranks[p] == sum(r[p, s] <= r[p, test[p]] for s in others)
    with pytest.raises(MasrError, match="--candidates"):
        two_stage_ranks(run, mdr, data.test, index, 0)


def test_cli_candidates_at_catalog_size_match_the_exact_figures(tmp_path):
    from conftest import write_planted

    torch.set_num_threads(1)
    runner = CliRunner()
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    tiny = ["--epochs", "2", "--batch-size", "32", "--lr", "0.02", "--dim", "8", "--threads", "1"]
    result = runner.invoke(
        app, ["train", "--model", "masr", "--data", str(data), "--runs", str(runs), *tiny]
    )
    assert result.exit_code == 0, (result.stderr, result.exception)
    base = ["evaluate", "--data", str(data), "--runs", str(runs), "--model", "masr"]
    result = runner.invoke(app, [*base, "--model", "mass", "--candidates", "100000", "--json", "-"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert "two-stage hit@10" in result.stderr
    assert "MDR proposes 48 songs per case" in result.stderr  # the catalog, not 100000
    out = json.loads(result.stdout)
    for run in ("masr", "mass"):  # masr: its own MDR part proposes; mass: the mdr run
        two = out[run]["two_stage"]
        assert two["proposed"] == 1.0 and two["candidates"] == 48  # as used, an int (QA)
        assert {k: two[k] for k in out[run]["full"]} == out[run]["full"], run
    result = runner.invoke(app, [*base, "--candidates", "3", "--json", "-"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    two = json.loads(result.stdout)["masr"]["two_stage"]
    assert 0 <= two["proposed"] <= 1 and two["hit@10"] <= two["proposed"]
    assert two["candidates"] == 3 and isinstance(two["candidates"], int)
    # a fusion's other weights (--alpha) get their two-stage figures too, as `masr export
    # --alpha A --candidates N` serves them: at the catalog's size, the exact ones
    result = runner.invoke(app, [*base, "--alpha", "0.3", "--candidates", "100000", "--json", "-"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    variant = json.loads(result.stdout)["masr@α=0.3"]
    assert {k: variant["two_stage"][k] for k in variant["full"]} == variant["full"]


def test_cli_candidates_without_an_mdr_run_is_refused_before_any_evaluation(tmp_path):
    """QA: a runs folder without `mdr` (pop only) evaluated pop first, then failed on
    --candidates; now one line before any run is evaluated. A fusion brings its own MDR."""
    from conftest import write_planted

    runner = CliRunner()
    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs), "--threads", "1"]
    result = runner.invoke(app, ["train", "--model", "pop", *base])
    assert result.exit_code == 0, (result.stderr, result.exception)
    result = runner.invoke(app, ["evaluate", *base, "--candidates", "5"])
    assert result.exit_code == 1
    assert "--candidates: MDR proposes the candidates" in result.stderr
    assert "evaluated on" not in result.stderr  # nothing was evaluated first
