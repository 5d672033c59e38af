"""Training for whole-catalog ranking (issue 11): sampled softmax over shared negatives with the
logQ correction, the negative samplers, selection by full-ranking validation, and the recipes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sampling import make_data, playlist_sets
from typer.testing import CliRunner

from masr.config import RECIPES, AdversarialConfig, RunOptions, TrainConfig
from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.models.base import Batch
from masr.models.mass import MASS, MASSConfig
from masr.models.mdr import MDR, MDRConfig
from masr.sampling import (
    NegativeSampler,
    TrainingIndex,
    context_batch,
    is_training_pair,
    member_pairs,
)
from masr.train import softmax_loss, train_model
from masr_cli.main import app

runner = CliRunner()
FAST = ["--batch-size", "32", "--lr", "0.02", "--dim", "8", "--threads", "1"]


def members_among(index: TrainingIndex, playlists: torch.Tensor, songs: torch.Tensor):
    """``member_pairs`` as a dense (B, N) mask."""
    rows, cols = member_pairs(index, playlists, songs)
    hit = torch.zeros((playlists.shape[0], songs.shape[0]), dtype=torch.bool)
    hit[rows, cols] = True
    return hit


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(kind: str, data: PreparedData) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mdr":
        model = MDR(MDRConfig(dim=8, dropout=0.0, init_std=0.3), data.n_users,
                    data.n_playlists, data.n_songs)
    else:
        model = MASS(MASSConfig(dim=8, dropout=0.0, init_std=0.3), data.n_users,
                     data.n_playlists, data.n_songs)
        torch.nn.init.normal_(model.query.weight, std=0.3)  # away from the [-I | I] start
    torch.nn.init.normal_(model.song_bias.weight)
    return model.train()


@pytest.mark.parametrize("kind", ["mdr", "mass"])
def test_every_song_once_without_correction_is_the_full_softmax(
    planted: PreparedData, kind: str
) -> None:
    """With the whole catalog as the shared negatives and no logQ, sampled softmax is the full
    cross-entropy over the songs outside the playlist (float64 loop as the reference)."""
    model = _model(kind, planted).double()
    index = TrainingIndex.from_data(planted)
    rows = torch.arange(0, index.n_rows, 7)  # (B,)
    playlists = index.playlist[rows]
    batch = context_batch(index, playlists, uses_members=model.uses_members)
    positives = index.song[rows]
    everything = torch.arange(planted.n_songs)
    closed = member_pairs(index, playlists, everything)
    got = softmax_loss(model, batch, positives, everything, None, closed, 0.5)
    with torch.no_grad():
        d = model.distance(batch, everything.expand(rows.shape[0], -1))  # (B, V)
    want = []
    for i in range(rows.shape[0]):
        own = set(index.song[index.indptr[playlists[i]] : index.indptr[playlists[i] + 1]].tolist())
        pos = int(positives[i])
        logits = [-float(d[i, pos]) / 0.5] + [
            -float(d[i, v]) / 0.5 for v in range(planted.n_songs) if v not in own
        ]
        want.append(-logits[0] + math.log(sum(math.exp(x) for x in logits)))
    assert float(got.detach()) == pytest.approx(float(np.mean(want)), rel=1e-9)


def test_fused_cross_entropy_equals_masked_cross_entropy_with_gradients() -> None:
    """softmax_loss's one-node cross-entropy: the value and ∂/∂o of logits = shift - o / τ,
    closed negatives -inf, through F.cross_entropy with target 0 (float64, random closures,
    an upstream gradient other than 1)."""
    from masr.train import _SharedSoftmaxCE

    gen = torch.Generator().manual_seed(4)
    b, n, tau = 23, 31, 0.2
    o = torch.randn(b, 1 + n, dtype=torch.float64, generator=gen).requires_grad_()
    shift = torch.randn(1 + n, dtype=torch.float64, generator=gen)
    closed = torch.rand(b, n, generator=gen) < 0.3
    closed[0] = True  # a row whose every negative is closed: only the positive is left
    logits = torch.add(shift, o, alpha=-1.0 / tau).masked_fill(F.pad(closed, (1, 0)), -math.inf)
    want = F.cross_entropy(logits, torch.zeros(b, dtype=torch.long))
    (want_grad,) = torch.autograd.grad(2.5 * want, o)
    rows, cols = closed.nonzero(as_tuple=True)
    flat = rows * (1 + n) + cols + 1  # the closed negatives' places in o, as softmax_loss gives
    got = _SharedSoftmaxCE.apply(o, shift, flat, 1.0 / tau)
    (got_grad,) = torch.autograd.grad(2.5 * got, o)
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(got_grad, want_grad, atol=1e-12)
    # a negative closed twice (a song drawn twice that the playlist holds) is closed once
    twice = torch.cat([flat, flat[:5]])
    assert float(_SharedSoftmaxCE.apply(o, shift, twice, 1.0 / tau)) == pytest.approx(
        float(want), rel=1e-12
    )


class _Index:
    """The three fields NegativeSampler reads, for a hand-made song popularity."""

    def __init__(self, song: torch.Tensor, n_songs: int):
        self.song, self.n_songs, self.device = song, n_songs, torch.device("cpu")


@pytest.mark.parametrize("mode", ["uniform", "popularity", "mixed"])
def test_logq_corrected_partition_estimate_is_unbiased(mode: str) -> None:
    """Σ_j exp(l_j - log E[count_j]) over n draws estimates Σ_v exp(l_v) without bias."""
    counts = torch.tensor([50, 20, 10, 10, 5, 3, 1, 1])
    sampler = NegativeSampler(_Index(torch.repeat_interleave(torch.arange(8), counts), 8), mode)
    logits = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 1.5, 0.3], dtype=torch.float64)
    exact = float(logits.exp().sum())
    gen = torch.Generator().manual_seed(0)
    n, draws = 4, 40_000
    total = 0.0
    for _ in range(draws // 1000):  # 1000 independent draws of n songs at a time
        songs = torch.stack([sampler.draw(n, gen) for _ in range(1000)])  # (1000, n)
        log_e = sampler.log_expected(songs, n).double()
        total += float((logits[songs] - log_e).exp().sum(1).sum())
    assert total / draws == pytest.approx(exact, rel=0.02)


def test_popularity_and_mixed_frequencies() -> None:
    counts = torch.tensor([60, 25, 10, 4, 1, 0])
    sampler = NegativeSampler(_Index(torch.repeat_interleave(torch.arange(6), counts), 6),
                              "popularity")
    gen = torch.Generator().manual_seed(1)
    songs = sampler.draw(200_000, gen)
    freq = torch.bincount(songs, minlength=6).double() / songs.numel()
    assert torch.allclose(freq, counts.double() / counts.sum(), atol=0.004)
    mixed = NegativeSampler(sampler.index, "mixed")
    songs = mixed.draw(200_000, gen)
    freq = torch.bincount(songs, minlength=6).double() / songs.numel()
    want = 0.5 / 6 + 0.5 * counts.double() / counts.sum()
    assert torch.allclose(freq, want, atol=0.004)
    expected = mixed.log_expected(torch.arange(6), 2).exp().double()  # per 2 draws: 1 + 1
    assert torch.allclose(expected / 2, want, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(playlist_sets, st.integers(0, 2**31 - 1))
def test_members_among_and_per_row_draws(case: tuple[int, list[list[int]]], seed: int) -> None:
    n_songs, playlists = case
    index = TrainingIndex.from_data(make_data(playlists, n_songs))
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, len(playlists), (12,), generator=gen)
    songs = torch.randint(0, n_songs, (20,), generator=gen)
    want = is_training_pair(index, rows.unsqueeze(1), songs.unsqueeze(0))
    assert torch.equal(members_among(index, rows, songs), want)
    # the sparse form: every (row, column) pair once, songs drawn twice included
    pair_rows, pair_cols = member_pairs(index, rows, songs)
    got = sorted(zip(pair_rows.tolist(), pair_cols.tolist(), strict=True))
    assert got == sorted(map(tuple, want.nonzero().tolist()))
    for mode in ("popularity", "mixed"):
        negs = NegativeSampler(index, mode).draw_per_row(rows, 5, gen)  # (12, 5)
        assert not is_training_pair(index, rows.unsqueeze(1), negs).any()


@pytest.mark.parametrize("select", ["sampled", "full"])
def test_select_picks_the_best_epoch_of_its_protocol(planted: PreparedData, select: str) -> None:
    model = _model("mdr", planted)
    config = TrainConfig(epochs=6, batch_size=32, lr=0.05, patience=0, loss="softmax", neg=16,
                         select=select, valid_sample=0)
    result = train_model(model, planted, config)
    key = "valid_full" if select == "full" else "valid"
    scores = [(h[key]["hit@10"], h[key]["ndcg@10"]) for h in result.history]
    assert result.best_epoch == 1 + scores.index(max(scores))  # first of the best
    assert all("valid_full" in h and "valid" in h for h in result.history)


def test_softmax_learns_and_apr_runs_on_it(planted: PreparedData) -> None:
    from masr.evaluate import evaluate_model

    model = _model("mass", planted)
    config = TrainConfig(epochs=8, batch_size=32, lr=0.02, loss="softmax", neg=24,
                         neg_sampler="mixed", temperature=0.5, valid_sample=0)
    first = train_model(model, planted, config)
    assert first.history[-1]["loss"] < first.history[0]["loss"]
    full = evaluate_model(model, planted, "valid")["full"]["hit@10"]
    assert full > 0.5  # 12 songs a group: a learned model ranks the held-out song in its top 10
    adv = train_model(model, planted, TrainConfig(**{**config.to_dict(), "epochs": 2}),
                      adversarial=AdversarialConfig(epochs=2))
    assert len(adv.history) == 2 and all(math.isfinite(h["loss"]) for h in adv.history)


def test_shared_distance_equals_distance_for_every_model(planted: PreparedData) -> None:
    from masr.models import BASELINES, model_class

    index = TrainingIndex.from_data(planted)
    playlists = torch.arange(0, planted.n_playlists, 5)
    songs = torch.randint(0, planted.n_songs, (9,), generator=torch.Generator().manual_seed(0))
    for name in ["mdr", "mass", *BASELINES]:
        cls = model_class(name)
        if not cls.trainable:
            continue
        torch.manual_seed(0)
        model = cls(cls.config_class(), planted.n_users, planted.n_playlists, planted.n_songs)
        model.eval()
        batch: Batch = context_batch(index, playlists, uses_members=model.uses_members)
        with torch.no_grad():
            shared = model.distance_shared(batch, songs)
            plain = model.distance(batch, songs.expand(playlists.shape[0], -1))
        assert torch.allclose(shared, plain, atol=1e-5), name


def _train(args: list[str]) -> None:
    result = runner.invoke(app, ["train", *args])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)


def test_new_options_round_trip_through_resume(tmp_path: Path) -> None:
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    args = ["--model", "mdr", "--data", str(data), "--runs", str(tmp_path / "runs")]
    chosen = ["--loss", "softmax", "--neg", "16", "--neg-sampler", "popularity",
              "--temperature", "0.5", "--select", "full", "--valid-sample", "30"]
    _train([*args, *FAST, *chosen, "--epochs", "2"])
    _train([*args, "--epochs", "3", "--resume"])
    info = json.loads((tmp_path / "runs" / "mdr" / "run.json").read_text())
    train = info["train_config"]
    assert (train["loss"], train["neg"], train["neg_sampler"]) == ("softmax", 16, "popularity")
    assert (train["temperature"], train["select"], train["valid_sample"]) == (0.5, "full", 30)
    assert [h["epoch"] for h in info["history"]] == [1, 2, 3]
    assert "valid_full" in info["best"] and info["best"]["valid_full"]["hit@10"] > 0


def test_recipe_paper_is_the_old_default(tmp_path: Path) -> None:
    """`--recipe paper` trains what `masr train` trained before the recipes existed: the
    paper's loss and negatives, the configs' plain defaults, the same history."""
    assert RECIPES["paper"] == {}
    paper = RunOptions().with_recipe("paper", set())
    assert paper.train == TrainConfig() and paper.adversarial == AdversarialConfig()
    t = paper.train
    assert (t.loss, t.neg, t.neg_mode, t.neg_sampler, t.select) == (
        "bpr", 4, "hardest", "uniform", "sampled"
    )
    assert (t.lr, t.batch_size, t.epochs, t.patience) == (1e-3, 1024, 50, 5)
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    # every option the default recipe (fullrank) sets, given at the paper's values
    old_flags = ["--loss", "bpr", "--neg", "4", "--neg-mode", "hardest", "--neg-sampler",
                 "uniform", "--select", "sampled", "--temperature", str(t.temperature),
                 "--valid-sample", str(t.valid_sample), "--set", "dropout=0.2",
                 "--batch-by", t.batch_by]
    histories = []
    for name, extra in (("recipe", ["--recipe", "paper"]), ("flags", old_flags)):
        runs = tmp_path / name
        _train(["--model", "mass", "--data", str(data), "--runs", str(runs), *FAST,
                "--epochs", "2", *extra])
        info = json.loads((runs / "mass" / "run.json").read_text())
        histories.append(([h["loss"] for h in info["history"]], info["train_config"],
                          info["model_config"]))
    assert histories[0] == histories[1]


def test_the_default_recipe_chooses_the_fusion_weight_on_validation() -> None:
    """Under the fullrank recipe the fusions choose eq. 20's α on validation unless --alpha is
    given; the paper recipe keeps the paper's fixed 0.5, and --alpha auto searches under any
    recipe. --resume keeps what the run was started with."""
    assert RECIPES["fullrank"][""] == {"alpha": "auto"} and "" not in RECIPES["paper"]
    assert RunOptions().with_recipe("fullrank", set(), "cpu").alpha_search
    budget = RunOptions(train=TrainConfig(time_limit=120.0))
    assert budget.with_recipe("fullrank", {"time_limit"}, "cuda").alpha_search
    paper = RunOptions().with_recipe("paper", set(), "cpu")
    assert not paper.alpha_search and paper.alpha == 0.5
    fixed = replace(budget, alpha=0.5).with_recipe("fullrank", {"time_limit", "alpha"}, "cpu")
    assert not fixed.alpha_search and fixed.alpha == 0.5
    auto = RunOptions(alpha_search=True).with_recipe("paper", {"alpha"}, "cpu")
    assert auto.alpha_search
    started = RunOptions(alpha=0.75).with_recipe("fullrank", {"alpha"}, "cpu")
    resumed = RunOptions().with_recipe("fullrank", set(), "cpu").merged(started, set())
    assert not resumed.alpha_search and resumed.alpha == 0.75


def test_default_recipe_is_fullrank_for_masr_models_and_sized_for_the_device(
    tmp_path: Path,
) -> None:
    from masr.runs import default_recipe

    names = ("amasr", "mdr", "mass_ps", "fism", "itemknn")
    assert [default_recipe(r) for r in names] == ["fullrank"] * 3 + ["paper"] * 2
    gpu = RunOptions().with_recipe("fullrank", set(), "cuda")
    cpu = RunOptions().with_recipe("fullrank", set(), "cpu")
    assert (gpu.train.neg, cpu.train.neg) == (1024, 128) and cpu.train.loss == "softmax"
    # on a CPU MDR (and AMDR) keeps the 1,024 negatives, MASS and the rest take 128
    assert [gpu.train_for(m).neg for m in ("mdr", "mass")] == [1024, 1024]
    assert [cpu.train_for(m).neg for m in ("mdr", "mass", "fism")] == [1024, 128, 128]
    given = RunOptions(train=TrainConfig(neg=512)).with_recipe("fullrank", {"neg"}, "cpu")
    assert given.train.neg == 512 and given.train_for("mdr").neg == 512  # --neg wins for all
    assert RunOptions.from_dict(cpu.to_dict()).train_for("mdr").neg == 1024
    # --resume keeps the saved per-model values unless the option is given again
    assert RunOptions().merged(cpu, set()).train_for("mdr").neg == 1024
    again = RunOptions(train=TrainConfig(neg=64)).merged(cpu, {"neg"})
    assert again.train_for("mdr").neg == again.train_for("mass").neg == 64
    # APR's noise: the recipe's ε on every device, --eps given wins, the paper's is 1
    eps = RECIPES["fullrank"]["adversarial"]["eps"]
    assert gpu.adversarial.eps == cpu.adversarial.eps == eps != AdversarialConfig().eps
    given_eps = RunOptions(adversarial=AdversarialConfig(eps=0.5)).with_recipe(
        "fullrank", {"eps"}, "cpu"
    )
    assert given_eps.adversarial.eps == 0.5
    assert RunOptions().with_recipe("paper", set()).adversarial.eps == 1.0
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    for model in ("amdr", "fism"):  # no --recipe; amdr trains mdr first
        _train(["--model", model, "--data", str(data), "--runs", str(tmp_path / "r"), *FAST,
                "--epochs", "1", "--adv-epochs", "1", "--device", "cpu"])
    mdr = json.loads((tmp_path / "r" / "mdr" / "run.json").read_text())
    amdr = json.loads((tmp_path / "r" / "amdr" / "run.json").read_text())
    assert amdr["adversarial"]["eps"] == eps and amdr["signature"]["adversarial"]["eps"] == eps
    fism = json.loads((tmp_path / "r" / "fism" / "run.json").read_text())
    assert mdr["options"]["recipe"] == "fullrank" and mdr["train_config"]["neg"] == 1024
    assert mdr["train_config"]["loss"] == "softmax" and mdr["model_config"]["dropout"] == 0.0
    assert mdr["model_config"]["init_std"] == 0.002
    assert fism["options"]["recipe"] == "paper" and fism["train_config"]["loss"] == "bpr"


def test_recipe_fills_only_what_is_not_given() -> None:
    fullrank = RunOptions(train=TrainConfig(neg=64), model={"dim": None}).with_recipe(
        "fullrank", {"neg"}
    )
    assert fullrank.train.neg == 64 and fullrank.train.loss == "softmax"
    assert fullrank.recipe == "fullrank"
    for key, value in RECIPES["fullrank"]["train"].items():
        if key != "neg":
            assert getattr(fullrank.train, key) == value
    kept = RunOptions(model={"dropout": 0.3}).with_recipe("fullrank", set())  # --set wins
    assert kept.model["dropout"] == 0.3


def test_recipe_model_scoped_values_reach_only_their_model_and_yield_to_set() -> None:
    """The recipe's ``mdr.init_std`` sets MDR's (and AMDR's) start only; ``--set init_std=``
    and ``--set mdr.init_std=`` both win over it; the paper recipe keeps the 1/d rule."""
    from masr.runs.registry import model_config

    def init_std(options: RunOptions, run: str) -> float | None:
        return model_config(run, options.model).init_std

    fullrank = RunOptions().with_recipe("fullrank", set(), "cpu")
    assert fullrank.model["mdr.init_std"] == RECIPES["fullrank"]["model"]["mdr.init_std"]
    assert [init_std(fullrank, r) for r in ("mdr", "amdr", "mdr_ps", "mass", "amass")] == [
        0.002, 0.002, 0.002, None, None
    ]
    plain = RunOptions(model={"init_std": 0.01}).with_recipe("fullrank", set())
    assert [init_std(plain, r) for r in ("mdr", "mass")] == [0.01, 0.01]
    scoped = RunOptions(model={"mdr.init_std": 0.005}).with_recipe("fullrank", set())
    assert [init_std(scoped, r) for r in ("mdr", "mass")] == [0.005, None]
    paper = RunOptions().with_recipe("paper", set())
    assert [init_std(paper, r) for r in ("mdr", "mass")] == [None, None]


def test_shared_and_full_distance_equal_distance_for_every_run_and_variant(
    planted: PreparedData,
) -> None:
    """Every trainable run of the registry (the Table 3 ablations with their fixed settings)
    and every Table 4 attention: distance_shared and full_distance agree with distance."""
    from masr.models import model_class
    from masr.models.mass import ATTENTIONS
    from masr.runs.registry import RUNS, model_config

    index = TrainingIndex.from_data(planted)
    playlists = torch.arange(0, planted.n_playlists, 5)
    songs = torch.randint(0, planted.n_songs, (9,), generator=torch.Generator().manual_seed(1))
    # some candidates are members of some rows' playlists (FISM leaves a member out of its sum)
    songs = torch.cat([songs, context_batch(index, playlists, uses_members=True).members[:3, 0]])
    cases = [(run, {}) for run, spec in RUNS.items() if spec.procedure == "train"]
    cases += [("mass", {"attention": a}) for a in ATTENTIONS]
    for run, overrides in cases:
        cls = model_class(RUNS[run].model)
        if not cls.trainable:
            continue
        torch.manual_seed(0)
        config = model_config(run, overrides)
        model = cls(config, planted.n_users, planted.n_playlists, planted.n_songs).eval()
        batch: Batch = context_batch(index, playlists, uses_members=model.uses_members)
        with torch.no_grad():
            shared = model.distance_shared(batch, songs)
            plain = model.distance(batch, songs.expand(playlists.shape[0], -1))
            full = model.full_distance(batch)
            every = model.distance(batch, torch.arange(planted.n_songs).expand(len(playlists), -1))
        assert torch.allclose(shared, plain, atol=1e-5), (run, overrides)
        assert torch.allclose(full, every, atol=1e-5), (run, overrides)


def _plain_pool(q_att, att_w2, att_norm, q, out_w, out_norm, n_rows):  # noqa: ANN001, ANN202
    """The slow, obvious eqs. 14-18: per group, row, candidate and member slot, in loops."""
    n_groups, n, _ = q.shape
    n_slots = att_w2.shape[-1] // n_rows
    out = torch.zeros(n_groups, n, n_rows, dtype=q.dtype)
    for g in range(n_groups):
        for c in range(n):
            for r in range(n_rows):
                slots = range(r * n_slots, (r + 1) * n_slots)
                logits = torch.stack([q_att[g, c] @ att_w2[g, :, t] - att_norm[g, 0, t]
                                      for t in slots])
                alpha = torch.softmax(logits, 0)
                terms = torch.stack([out_norm[g, 0, t] - 2 * q[g, c] @ out_w[g, :, t]
                                     for t in slots])
                out[g, c, r] = (alpha * terms).sum()
    return out


@pytest.mark.parametrize("n_rows", [1, 3])
def test_attentive_pool_equals_the_plain_formula_with_gradients(n_rows: int) -> None:
    """MASS's fused eqs. 14-18 (hand-written backward): the loop formula's values and the
    gradients of every input, in float64, with closed (+inf) slots."""
    from masr.models.mass import attentive_pool

    gen = torch.Generator().manual_seed(3)
    groups, n, slots, d = 3, 4, 5, 6
    shapes = [(groups, n, d), (groups, d, n_rows * slots), (groups, 1, n_rows * slots),
              (groups, n, d), (groups, d, n_rows * slots), (groups, 1, n_rows * slots)]
    inputs = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    inputs[2][0, 0, 1::2] = math.inf  # closed slots in every row of group 0
    inputs = [t.requires_grad_() for t in inputs]
    weights = torch.randn(groups, n, n_rows, generator=gen, dtype=torch.float64)
    fused = attentive_pool(*inputs, n_rows)
    plain = _plain_pool(*inputs, n_rows)
    assert torch.allclose(fused, plain, atol=1e-12)
    g_fused = torch.autograd.grad((fused * weights).sum(), inputs)
    g_plain = torch.autograd.grad((plain * weights).sum(), inputs)
    for i, (a, b) in enumerate(zip(g_fused, g_plain, strict=True)):
        closed = torch.isinf(inputs[i].detach())
        assert torch.allclose(a[~closed], b[~closed], atol=1e-12), i
        assert (a[closed] == 0).all(), i  # a closed slot's own term gets no gradient
    with torch.no_grad():  # scoring: the same values without the autograd node
        assert torch.equal(attentive_pool(*inputs, n_rows), fused.detach())


def test_square_norm_equals_the_plain_formula_with_gradients() -> None:
    """|B⊙q|² of eq. 15 in one autograd node: a written-out loop's values, and the gradients
    of q and of the metric's weights w = B² as plain autograd gives them, in float64."""
    from masr.models.mass import square_norm

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64).relu().requires_grad_()
    w = torch.rand(6, generator=gen, dtype=torch.float64).requires_grad_()
    upstream = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    fused = square_norm(q, w)
    loop = torch.tensor([[sum(float(w[j]) * float(q[g, c, j]) ** 2 for j in range(6))
                          for c in range(4)] for g in range(3)], dtype=torch.float64)
    assert torch.allclose(fused.detach(), loop, atol=1e-12)
    g_fused = torch.autograd.grad((fused * upstream).sum(), (q, w))
    g_plain = torch.autograd.grad(((q * q * w).sum(-1) * upstream).sum(), (q, w))
    for a, b in zip(g_fused, g_plain, strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.autograd.gradcheck(square_norm, (q, w))
    with torch.no_grad():  # scoring: the plain formula, the same values
        assert torch.allclose(square_norm(q, w), fused.detach(), atol=1e-12)


OWN_SHARED_CASES = [("mass", {"attention": a}) for a in ("mem-metric", "mem-dot", "nonmem-metric",
                                                          "none")]
OWN_SHARED_CASES += [("mdr", {"terms": t}) for t in ("ups", "us", "ps")]


@pytest.mark.parametrize(("model_name", "settings"), OWN_SHARED_CASES)
def test_own_and_shared_distances_equal_the_plain_path_with_gradients(
    planted: PreparedData, model_name: str, settings: dict
) -> None:
    """Sampled softmax's scores (each row's positive and the shared negatives in one call,
    ``distance_own_shared``: GEMM form, the row-side work done once): the values and parameter
    gradients of ``distance`` per row, in float64, in training mode without dropout."""
    from masr.sampling import training_batch

    index = TrainingIndex.from_data(planted)
    rows = torch.arange(0, index.n_rows, 7)[:40]
    batch = training_batch(index, rows, uses_members=True, max_members=50)
    own = index.song[rows]
    shared = torch.randint(0, planted.n_songs, (11,), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    cls, config_class = (MASS, MASSConfig) if model_name == "mass" else (MDR, MDRConfig)
    config = config_class(dim=8, dropout=0.0, init_std=0.3, **settings)
    model = cls(config, planted.n_users, planted.n_playlists, planted.n_songs).double().train()
    weights = torch.randn(rows.shape[0], 12, dtype=torch.float64)
    fast = model.distance_own_shared(batch, own, shared)
    grads_fast = torch.autograd.grad((fast * weights).sum(), list(model.parameters()))
    songs = torch.cat([own.unsqueeze(1), shared.expand(rows.shape[0], -1)], dim=1)
    plain = model.distance(batch, songs)
    grads_plain = torch.autograd.grad((plain * weights).sum(), list(model.parameters()))
    assert torch.allclose(fast, plain, atol=1e-10), settings
    for (name, _), a, b in zip(model.named_parameters(), grads_fast, grads_plain, strict=True):
        assert torch.allclose(a.to_dense(), b.to_dense(), atol=1e-9), (settings, name)


def test_compiled_mass_training_matches_eager(
    planted: PreparedData, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compile=True` (masr train's default on a CPU): the same losses and per-epoch validation
    (its full ranking compiled too) as eager up to float rounding, and the model is eager again
    afterwards (evaluation, export)."""
    import shutil

    from masr.models.mass import MASS, MASSConfig
    from masr.train import train_model

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    monkeypatch.setenv("MASR_COMPILE", "1")
    monkeypatch.setattr("masr.compiled.EAGER_SECONDS", 0.0)  # compile on first use
    config = TrainConfig(epochs=1, loss="softmax", neg=32, neg_sampler="mixed", batch_size=64,
                         lr=0.02, temperature=0.1)
    losses, full = [], []
    for compile_ in (False, True):
        torch.manual_seed(0)
        model = MASS(MASSConfig(dim=8, dropout=0.0), planted.n_users, planted.n_playlists,
                     planted.n_songs)
        result = train_model(model, planted, config, compile=compile_)
        losses.append(result.history[0]["loss"])
        full.append(result.history[0]["valid_full"])
        assert model._compiled_scores is None
    assert "torch.compile of" not in capsys.readouterr().err  # it compiled, no fallback
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    one_case = 1.0 / min(len(planted.valid), config.valid_sample)
    for key in ("hit@10", "ndcg@10"):  # float rounding may flip a tie, never more
        assert full[1][key] == pytest.approx(full[0][key], abs=one_case + 1e-9), key


def test_compiled_full_ranking_gives_the_eager_ranks(
    planted: PreparedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`masr evaluate`'s default on a CPU: a fusion's full ranking through its MASS part's
    compiled scores ranks as eagerly (up to float rounding), and leaves the model eager."""
    import shutil

    from masr.compiled import compile_scores
    from masr.evaluate import full_ranks
    from masr.models.masr import MASR
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig
    from masr.sampling import TrainingIndex

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    monkeypatch.setenv("MASR_COMPILE", "1")
    monkeypatch.setattr("masr.compiled.EAGER_SECONDS", 0.0)  # compile on first use
    torch.manual_seed(0)
    sizes = (planted.n_users, planted.n_playlists, planted.n_songs)
    parts = MDR(MDRConfig(dim=8, init_std=0.3), *sizes), MASS(
        MASSConfig(dim=8, dropout=0.0, init_std=0.3), *sizes
    )
    fused = MASR.from_parts(*parts, 0.5)
    mass = fused.mass  # (its own copy of the part)
    index = TrainingIndex.from_data(planted, "cpu")
    eager = full_ranks(fused.eval(), planted.valid, index)
    assert compile_scores(fused, True, "cpu")
    wrapper = mass._compiled_scores
    compiled = full_ranks(fused, planted.valid, index)
    fused.compile_scores(False)
    assert not wrapper.failed and mass._compiled_scores is None  # it compiled; eager again
    assert (compiled != eager).mean() < 0.01 and abs(compiled - eager).max() <= 1


def test_a_short_time_limit_trains_eagerly(
    planted: PreparedData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a --time-limit shorter than MIN_COMPILE_BUDGET compiling cannot win back its
    seconds: the run never calls torch.compile and says so once; without a limit, or with a
    long one, the same run compiles."""
    from masr.models.mass import MASS, MASSConfig
    from masr.train import MIN_COMPILE_BUDGET, compile_pays, train_model

    assert compile_pays(0.0) and compile_pays(MIN_COMPILE_BUDGET)
    assert not compile_pays(MIN_COMPILE_BUDGET / 2)
    calls: list[object] = []

    def recorded(fn, **_kw):  # stands in for torch.compile: records, compiles nothing
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", recorded)
    monkeypatch.setenv("MASR_COMPILE", "1")
    monkeypatch.setattr("masr.compiled.EAGER_SECONDS", 0.0)  # compile on first use
    for limit, compiles in ((MIN_COMPILE_BUDGET / 2, False), (0.0, True), (1e4, True)):
        calls.clear()
        said: list[str] = []
        torch.manual_seed(0)
        model = MASS(MASSConfig(dim=8, dropout=0.0), planted.n_users, planted.n_playlists,
                     planted.n_songs)
        config = TrainConfig(epochs=1, loss="softmax", neg=16, batch_size=64, time_limit=limit)
        result = train_model(model, planted, config, compile=True, log=said.append)
        assert result.history, limit  # it trained an epoch
        assert bool(calls) == compiles, limit
        short = [m for m in said if "too short for compiling" in m]
        assert len(short) == (0 if compiles else 1), (limit, said)


def test_a_failing_compile_trains_on_eagerly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from masr.compiled import Compiled

    def broken(fn, **_kw):  # what torch.compile does without a working compiler, lazily
        def run(*args):
            raise RuntimeError("InductorError: no C++ compiler found\nmore")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr("masr.compiled.EAGER_SECONDS", 0.0)
    twice = Compiled(lambda x: 2 * x, "a test")
    assert twice(3) == 6 and twice.failed and twice(4) == 8
    err = capsys.readouterr().err
    assert err.count("torch.compile of a test failed") == 1 and "no C++ compiler" in err


def test_compiled_runs_eagerly_until_its_eager_calls_cost_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A short job never pays for the compiler: ``Compiled`` calls ``fn`` eagerly until those
    calls have taken EAGER_SECONDS in all, then compiles once and calls the compiled code."""
    import itertools

    from masr import compiled as compiled_module

    compiles: list[object] = []

    def recorded(fn, **_kw):  # stands in for torch.compile
        compiles.append(fn)
        return lambda *args: ("compiled", fn(*args))

    clock = itertools.count(0.0, 2.0)  # every eager call "takes" 2 s
    monkeypatch.setattr(torch, "compile", recorded)
    monkeypatch.setattr(compiled_module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(compiled_module, "EAGER_SECONDS", 5.0)
    twice = compiled_module.Compiled(lambda x: 2 * x, "a test")
    assert [twice(i) for i in range(3)] == [0, 2, 4] and not compiles  # 6 s > 5 s eager
    assert twice(3) == ("compiled", 6) and twice(4) == ("compiled", 8)
    assert len(compiles) == 1


def _plain_shared_slots(q_att, att_w2, att_norm, q, out_w, out_norm, group, open_slots, own):  # noqa: ANN001, ANN202
    """The slow, obvious eqs. 14-18 per row: over its open slots of its group (+inf ones are
    closed too), in loops; a row with none pools 0. Every candidate of the group, or with
    ``own`` the candidate own[b] alone."""
    n_rows = group.shape[0]
    cands = [list(range(q.shape[1])) if own is None else [int(own[b])] for b in range(n_rows)]
    out = torch.zeros(n_rows, len(cands[0]), dtype=q.dtype)
    for b in range(n_rows):
        g = int(group[b])
        slots = [t for t in range(att_w2.shape[-1])
                 if bool(open_slots[b, t]) and not math.isinf(float(att_norm[g, 0, t].detach()))]
        for j, c in enumerate(cands[b]):
            if not slots:
                continue
            logits = torch.stack([q_att[g, c] @ att_w2[g, :, t] - att_norm[g, 0, t]
                                  for t in slots])
            terms = torch.stack([out_norm[g, 0, t] - 2 * q[g, c] @ out_w[g, :, t]
                                 for t in slots])
            out[b, j] = (torch.softmax(logits, 0) * terms).sum()
    return out


def _pool_inputs(gen: torch.Generator, *, groups: int, slots: int, d: int, n: int) -> list:
    """Random float64 inputs of ``shared_slot_pool`` (queries, member halves and norms of
    eqs. 14-17) for ``groups`` groups of ``slots`` slots and ``n`` candidates."""
    shapes = [(groups, n, d), (groups, d, slots), (groups, 1, slots),
              (groups, n, d), (groups, d, slots), (groups, 1, slots)]
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


def _assert_same_input_grads(fast, plain, inputs, gen, *, atol: float) -> None:  # noqa: ANN001
    """Both outputs' gradients of one random weighting agree for every input, and the fast
    one's are exactly 0 at closed (+inf) entries."""
    weights = torch.randn(fast.shape, generator=gen, dtype=torch.float64)
    g_fast = torch.autograd.grad((fast * weights).sum(), inputs)
    g_plain = torch.autograd.grad((plain * weights).sum(), inputs, allow_unused=True)
    for i, (a, b) in enumerate(zip(g_fast, g_plain, strict=True)):
        closed = torch.isinf(inputs[i].detach())
        b = torch.zeros_like(a) if b is None else b
        assert torch.allclose(a[~closed], b[~closed], atol=atol), i
        assert (a[closed] == 0).all(), i


@pytest.mark.parametrize("own_only", [False, True])
def test_shared_slot_pool_equals_the_plain_formula_with_gradients(own_only: bool) -> None:
    """MASS's playlist-grouped eqs. 14-18 (rows share their playlist's slots, each pools over
    its own subset; hand-written backward): the loop formula's values and every input's
    gradients, in float64, with padded (+inf) slots and a row left without any open slot."""
    from masr.models.mass import shared_slot_pool

    gen = torch.Generator().manual_seed(5)
    slots = 5
    n = slots if own_only else 4  # own: the candidates are the group's slots' songs
    inputs = _pool_inputs(gen, groups=3, slots=slots, d=6, n=n)
    inputs[2][2, 0, 3:] = math.inf  # group 2: two padded slots
    inputs = [t.requires_grad_() for t in inputs]
    group = torch.tensor([0, 0, 2, 1, 0, 2, 2])
    own = torch.tensor([0, 4, 1, 0, 2, 0, 2])
    open_slots = torch.rand(7, slots, generator=gen) < 0.7
    open_slots[torch.arange(7), own] = False
    open_slots[3] = False  # a row without any member
    open_slots[5, 3:] = True  # padded slots given as open stay closed
    fused = shared_slot_pool(*inputs, group, open_slots, own if own_only else None)
    plain = _plain_shared_slots(*inputs, group, open_slots, own if own_only else None)
    assert fused.shape == plain.shape == (7, 1 if own_only else n)
    assert torch.allclose(fused, plain, atol=1e-12)
    assert (fused[3] == 0).all()
    _assert_same_input_grads(fused, plain, inputs, gen, atol=1e-12)
    with torch.no_grad():  # scoring: the same values without the autograd node
        again = shared_slot_pool(*inputs, group, open_slots, own if own_only else None)
        assert torch.allclose(again, fused, atol=1e-14)


@pytest.mark.parametrize("peak", [1.0, 8.0, 400.0])
def test_leave_one_out_pool_equals_the_plain_formula_with_gradients(peak: float) -> None:
    """Rows whose members are all their playlist's songs but their own: the softmin from
    per-group sums (``loo``) gives the loop formula's values and every input's gradients, in
    float64, with padded slots, a one-song group (its row has no member), tied logits and
    logits scaled by ``peak`` (8: a row's own slot holds nearly all the weight; 400: the
    others' weights underflow and the rows are pooled one by one instead)."""
    from masr.models.mass import _leave_one_out_parts, shared_slot_pool

    gen = torch.Generator().manual_seed(7)
    inputs = _pool_inputs(gen, groups=4, slots=6, d=5, n=7)
    inputs[0] *= peak**0.5
    inputs[1] *= peak**0.5
    inputs[2] *= peak
    inputs[2][1, 0, 4:] = math.inf  # group 1: four real slots
    inputs[2][3, 0, 1:] = math.inf  # group 3: one song, so its row has no member
    inputs[1][2, :, 3] = inputs[1][2, :, 1]  # group 2: two slots tied for every candidate
    inputs[2][2, 0, 3] = inputs[2][2, 0, 1]
    inputs = [t.requires_grad_() for t in inputs]
    real = ~torch.isinf(inputs[2].detach()[:, 0])  # (G, L)
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 0, 2])
    own = torch.tensor([0, 3, 5, 1, 3, 1, 3, 0, 0, 2, 4])
    open_slots = real[group].clone()
    open_slots[torch.arange(len(group)), own] = False
    plain = _plain_shared_slots(*inputs, group, open_slots, None)
    fast = shared_slot_pool(*inputs, group, open_slots, None, own)
    with torch.no_grad():
        lone = ~open_slots.any(1)
        underflow = _leave_one_out_parts(*inputs, group=group, own=own, lone=lone) is None
    assert underflow == (peak > 100)
    assert torch.allclose(fast, plain, atol=1e-9 * peak)
    assert (fast[8] == 0).all()
    _assert_same_input_grads(fast, plain, inputs, gen, atol=1e-9 * peak)
    with torch.no_grad():
        again = shared_slot_pool(*inputs, group, open_slots, None, own)
        assert torch.allclose(again, fast, atol=1e-12 * peak)


@pytest.mark.parametrize("attention", ["mem-metric", "mem-dot", "nonmem-metric"])
@pytest.mark.parametrize("context", ["user", "user+playlist"])
def test_playlist_grouped_scores_equal_the_plain_path_with_gradients(
    attention: str, context: str
) -> None:
    """Sampled softmax's scores for training rows from few playlists (MASS scores them once
    per playlist, ``_playlist_scores``): the values and parameter gradients of ``distance``
    per row, in float64, a playlist of one song (no other member) included, and with members
    capped (--max-members) or dropped (member dropout)."""
    from masr.models import mass as mass_module
    from masr.sampling import training_batch

    playlists = [[0, 3, 5, 7, 9], [1, 2], [4], [2, 6, 8, 10, 11, 12], [3, 9, 13]]
    data = make_data(playlists, 14)
    index = TrainingIndex.from_data(data)
    rows = torch.arange(index.n_rows)  # every row: 19 rows of 5 playlists
    torch.manual_seed(0)
    config = MASSConfig(dim=8, dropout=0.0, init_std=0.3, attention=attention, context=context)
    model = MASS(config, data.n_users, data.n_playlists, data.n_songs).double().train()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    shared = torch.tensor([0, 1, 4, 6, 8, 12, 13])
    own = index.song[rows]
    songs = torch.cat([own.unsqueeze(1), shared.expand(rows.shape[0], -1)], dim=1)
    assert mass_module.PLAYLIST_SHARE * rows.shape[0] >= len(playlists)
    for max_members, member_dropout in ((50, 0.0), (3, 0.0), (50, 0.4)):
        batch = training_batch(index, rows, uses_members=True, max_members=max_members,
                               generator=torch.Generator().manual_seed(1),
                               member_dropout=member_dropout)
        assert model._playlist_groups(batch) is not None
        weights = torch.randn(rows.shape[0], 1 + shared.shape[0], dtype=torch.float64)
        fast = model.distance_own_shared(batch, own, shared)
        grads_fast = torch.autograd.grad((fast * weights).sum(), list(model.parameters()))
        plain = model.distance(batch, songs)
        grads_plain = torch.autograd.grad((plain * weights).sum(), list(model.parameters()))
        assert torch.allclose(fast, plain, atol=1e-10), (max_members, member_dropout)
        for (name, _), a, b in zip(model.named_parameters(), grads_fast, grads_plain,
                                   strict=True):
            assert torch.allclose(a.to_dense(), b.to_dense(), atol=1e-9), (max_members, name,
                                                                           member_dropout)


def test_resume_keeps_the_recipe_and_the_settings_of_the_run(tmp_path: Path) -> None:
    """--resume without --recipe or --set continues with the run's own: its recipe's model
    values (the paper's dropout, not fullrank's) and its --set ones (MASS's attention)."""
    from conftest import write_planted

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    base = ["--data", str(data), "--runs", str(runs), *FAST]
    _train(["--model", "mdr", *base, "--recipe", "paper", "--epochs", "1"])
    _train(["--model", "mdr", *base, "--epochs", "2", "--resume"])
    info = json.loads((runs / "mdr" / "run.json").read_text())
    assert info["options"]["recipe"] == "paper" and info["train_config"]["loss"] == "bpr"
    assert info["model_config"]["dropout"] == 0.2 and info["model_config"]["init_std"] is None
    assert [h["epoch"] for h in info["history"]] == [1, 2]
    other = tmp_path / "other"
    base = ["--data", str(data), "--runs", str(other), *FAST]
    _train(["--model", "mass", *base, "--set", "attention=mem-dot", "--epochs", "1"])
    _train(["--model", "mass", *base, "--epochs", "2", "--resume"])
    info = json.loads((other / "mass" / "run.json").read_text())
    assert info["model_config"]["attention"] == "mem-dot"
    assert [h["epoch"] for h in info["history"]] == [1, 2]
    # a setting given again must match the run's: a different one is refused
    result = runner.invoke(app, ["train", "--model", "mass", *base, "--epochs", "3", "--resume",
                                 "--set", "attention=mem-metric"])
    assert result.exit_code == 1 and "attention" in result.stderr


def test_set_none_overrides_a_recipe_value() -> None:
    """--set mdr.init_std=none asks for the model's own default (1/d) under a recipe that sets
    init_std; an unset option (dim None) still takes nothing from the recipe."""
    from masr.runs.registry import model_config

    chosen = RunOptions(model={"dim": None, "mdr.init_std": None})
    recipe = chosen.with_recipe("fullrank", set(), "cpu")
    assert model_config("mdr", recipe.model).init_std is None
    plain = RunOptions(model={"dim": None}).with_recipe("fullrank", set(), "cpu")
    assert model_config("mdr", plain.model).init_std == 0.002
    from masr.models import parse_settings

    assert parse_settings(["mdr"], ["mdr.init_std=none"]) == {"mdr.init_std": None}
    with pytest.raises(MasrError, match=r"'abc' is not a valid float \(or none\)"):
        parse_settings(["mdr"], ["init_std=abc"])
