"""BPR / APR training loop, checkpoints, determinism and resume (masr.train, masr.runs)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from masr.checkpoint import load_checkpoint, load_model
from masr.config import AdversarialConfig, RunOptions, TrainConfig
from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.evaluate import evaluate_model
from masr.models.base import Batch, ModelConfig, Recommender
from masr.runs import plan, signature, train_run
from masr.train import LazyAdam, TrainProgress, ranking_loss, resolve_device, train_model

FAST = {"batch_size": 32, "lr": 0.02}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy machine the thread
    hand-offs cost far more than the work (measured: 50x on 2 shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class DotConfig(ModelConfig):
    dim: int = 8


class Dot(Recommender):
    """A tiny distance model for the loop: o = |p - s|^2 (playlist and song embeddings)."""

    name = "dot"
    config_class = DotConfig

    def __init__(self, config: DotConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        self.playlist = nn.Embedding(n_playlists, config.dim)
        self.song = nn.Embedding(n_songs, config.dim)
        nn.init.normal_(self.playlist.weight, std=0.1)
        nn.init.normal_(self.song.weight, std=0.1)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        p = self.playlist(batch.playlists).unsqueeze(1)  # (B, 1, d)
        return (p - self.song(songs)).square().sum(-1)  # (B, C)


@dataclass
class PopConfig(ModelConfig):
    pass


class Popularity(Recommender):
    """Reference point: distance = -(number of training playlists holding the song)."""

    name = "popularity"
    config_class = PopConfig
    trainable = False

    def __init__(self, data: PreparedData):
        super().__init__(PopConfig(), data.n_users, data.n_playlists, data.n_songs)
        self.register_buffer("neg_pop", -torch.as_tensor(data.song_popularity, dtype=torch.float))

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        return self.neg_pop[songs]


def _dot(data: PreparedData) -> Dot:
    torch.manual_seed(0)
    return Dot(DotConfig(), data.n_users, data.n_playlists, data.n_songs)


def test_bpr_loss_falls_and_beats_popularity(planted: PreparedData) -> None:
    model = _dot(planted)
    result = train_model(model, planted, TrainConfig(epochs=15, **FAST))
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < 0.5 * losses[0]
    trained = evaluate_model(model, planted, "test")
    pop = evaluate_model(Popularity(planted), planted, "test")
    # planted groups: a model that learned them ranks the held-out song in the top few
    assert trained["sampled"]["hit@5"] >= 0.9
    assert trained["sampled"]["ndcg@10"] > pop["sampled"]["ndcg@10"] + 0.2
    assert trained["full"]["hit@10"] > pop["full"]["hit@10"] + 0.2


@pytest.mark.parametrize("model_name", ["mdr", "mass"])
def test_paper_models_learn_the_planted_groups(planted: PreparedData, model_name: str) -> None:
    from masr.models import model_class

    cls = model_class(model_name)
    torch.manual_seed(0)
    model = cls(cls.config_class(dim=16), planted.n_users, planted.n_playlists, planted.n_songs)
    result = train_model(model, planted, TrainConfig(epochs=12, batch_size=32, lr=0.01))
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert result.best_valid["hit@5"] >= 0.8


def test_ranking_loss_hardest_and_pairs() -> None:
    class Fixed(Dot):
        def distance(self, batch: Batch, songs: Tensor) -> Tensor:
            return songs.float()  # distance = song index

    model = Fixed(DotConfig(), 1, 1, 10)
    batch = Batch(
        torch.zeros(1, dtype=torch.long),
        torch.zeros(1, dtype=torch.long),
        torch.zeros((1, 1), dtype=torch.long),
        torch.zeros((1, 1), dtype=torch.bool),
    )
    pos, neg = torch.tensor([2]), torch.tensor([[5, 3, 9]])
    sp = torch.nn.functional.softplus
    hardest = ranking_loss(model, batch, pos, neg, "hardest")
    assert float(hardest) == pytest.approx(float(sp(torch.tensor(2.0 - 3.0))))
    pairs = ranking_loss(model, batch, pos, neg, "pairs")
    assert float(pairs) == pytest.approx(float(sp(torch.tensor([-3.0, -1.0, -7.0])).mean()))


def test_lazy_adam_matches_adam_when_every_row_is_touched() -> None:
    """Against Adam written out (Kingma & Ba, with coupled L2 as torch.optim.Adam)."""
    torch.manual_seed(0)
    emb = nn.Embedding(6, 3, sparse=True)
    w = emb.weight.detach().clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    lr, wd, (b1, b2), eps = 0.1, 0.01, (0.9, 0.999), 1e-8
    opt = LazyAdam(emb.parameters(), lr=lr, weight_decay=wd)
    coef = torch.arange(18.0).view(6, 3)
    for t in range(1, 6):
        idx = torch.arange(6).roll(t)
        opt.zero_grad()
        (emb(idx) * coef).sum().backward()
        opt.step()
        g = coef[torch.argsort(idx)] + wd * w  # d/dw of sum(w[idx] * coef) + L2
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    assert torch.allclose(emb.weight.detach(), w, atol=1e-6)


def test_lazy_adam_dense_gradients_match_torch_adam() -> None:
    """A dense gradient (a metric vector, a query matrix) takes torch.optim.Adam's update."""
    torch.manual_seed(0)
    ours, ref = nn.Linear(4, 3), nn.Linear(4, 3)
    ref.load_state_dict(ours.state_dict())
    opt = LazyAdam(ours.parameters(), lr=0.05, weight_decay=0.01)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.05, weight_decay=0.01)
    for t in range(6):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(t))
        for model, o in ((ours, opt), (ref, opt_ref)):
            o.zero_grad()
            model(x).square().sum().backward()
            o.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_lazy_adam_leaves_untouched_rows_alone() -> None:
    emb = nn.Embedding(5, 2, sparse=True)
    before = emb.weight.detach().clone()
    opt = LazyAdam(emb.parameters(), lr=0.1, weight_decay=0.5)
    opt.zero_grad()
    emb(torch.tensor([1, 3])).sum().backward()
    opt.step()
    changed = (emb.weight.detach() != before).any(1)
    assert changed.tolist() == [False, True, False, True, False]


def test_sortish_batches_are_a_permutation_of_length_sorted_runs() -> None:
    from masr.train import _sortish

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 50, (1000,))
    order = torch.randperm(1000, generator=g)
    config = TrainConfig(batch_size=64, sort_window=4)
    out = _sortish(order, lengths, config, g)
    assert sorted(out.tolist()) == list(range(1000))
    batches = out[: 15 * 64].view(15, 64)
    assert bool((lengths[batches].diff(dim=1) >= 0).all())  # each batch: one sorted run
    assert bool((lengths[out[15 * 64 :]].diff() >= 0).all())  # the short batch comes last
    spread = (lengths[batches].max(1).values - lengths[batches].min(1).values).float().mean()
    assert float(spread) < 25  # a random batch of 64 spans almost the whole 1..49 range


@pytest.mark.parametrize("uses_members", [False, True])
def test_playlist_batches_hold_whole_playlists(uses_members: bool) -> None:
    """--batch-by playlist: an epoch is a permutation of the rows in which a playlist's rows
    sit together: contiguous in one batch, or split where a batch ends (and, for
    member-reading models, where a length-sorting window ends); playlists come in a new
    random order every epoch; batches hold far fewer playlists than under --batch-by row."""
    from masr.train import _epoch_order

    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 12, (300,), generator=g)
    playlists = torch.repeat_interleave(torch.arange(300), sizes)  # (N,) index order
    n = playlists.shape[0]
    lengths = sizes[playlists]
    model = type("M", (), {"uses_members": uses_members})()
    config = TrainConfig(batch_size=64, sort_window=4, batch_by="playlist")
    first = _epoch_order(model, lengths, config, g, playlists)
    second = _epoch_order(model, lengths, config, g, playlists)
    assert not torch.equal(first, second)
    for order in (first, second):
        assert sorted(order.tolist()) == list(range(n))
        batch_of = torch.empty(n, dtype=torch.long)
        batch_of[order] = torch.arange(n) // 64
        for p in range(300):
            at = torch.nonzero(playlists[order] == p).squeeze(1)  # positions of p's rows
            runs = int((at.diff() != 1).sum()) + 1
            pieces = 3 if uses_members else 2
            assert runs <= pieces and batch_of[playlists == p].unique().numel() <= pieces, p
    distinct = torch.tensor([playlists[first[i : i + 64]].unique().numel() for i in
                             range(0, n - 63, 64)]).float().mean()
    rows = _epoch_order(model, lengths, replace(config, batch_by="row"), g, playlists)
    distinct_rows = torch.tensor([playlists[rows[i : i + 64]].unique().numel() for i in
                                  range(0, n - 63, 64)]).float().mean()
    assert float(distinct) < 0.5 * float(distinct_rows)  # whole playlists, not scattered rows


def _weights(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_cpu_determinism_by_seed(planted: PreparedData) -> None:
    from masr.models.mdr import MDR, MDRConfig

    def run(seed: int) -> dict[str, Tensor]:
        torch.manual_seed(seed)
        model = MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
        train_model(model, planted, TrainConfig(epochs=2, seed=seed, **FAST))
        return _weights(model)

    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_checkpoint_round_trip(planted: PreparedData, tmp_path: Path) -> None:
    from masr.models.mdr import MDR, MDRConfig

    model = MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
    result = train_model(model, planted, TrainConfig(epochs=3, **FAST), run_dir=tmp_path)
    # weights_only loading (load_checkpoint uses it) and the recorded metadata
    ckpt = load_checkpoint(tmp_path / "best.pt")
    assert ckpt["data_fingerprint"] == planted.fingerprint
    assert ckpt["epoch"] == result.best_epoch
    assert ckpt["train_config"]["batch_size"] == 32
    assert ckpt["valid"]["hit@10"] == result.best_valid["hit@10"]
    torch.load(tmp_path / "last.pt", weights_only=True)
    loaded, _ = load_model(tmp_path / "best.pt")
    model.eval()
    assert evaluate_model(loaded, planted) == evaluate_model(model, planted)


def test_resume_continues_exactly(planted: PreparedData, tmp_path: Path) -> None:
    from masr.models.mdr import MDR, MDRConfig

    def fresh() -> MDR:
        torch.manual_seed(0)
        return MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)

    straight = fresh()
    full = train_model(straight, planted, TrainConfig(epochs=3, **FAST), run_dir=tmp_path / "a")
    first = fresh()
    train_model(first, planted, TrainConfig(epochs=2, **FAST), run_dir=tmp_path / "b")
    last = load_checkpoint(tmp_path / "b" / "last.pt")
    assert last["epoch"] == 2
    resumed = fresh()
    more = train_model(
        resumed, planted, TrainConfig(epochs=3, **FAST), run_dir=tmp_path / "b", resume=last
    )
    assert [h["loss"] for h in more.history] == [h["loss"] for h in full.history]
    a = load_checkpoint(tmp_path / "a" / "last.pt")["state_dict"]
    b = load_checkpoint(tmp_path / "b" / "last.pt")["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_patience_stops_early(planted: PreparedData) -> None:
    model = _dot(planted)
    # a learning rate this small cannot change the ranking: no epoch beats the first
    config = TrainConfig(epochs=10, patience=2, batch_size=64, lr=1e-12)
    result = train_model(model, planted, config)
    assert result.stopped_early and len(result.history) == 3 and result.best_epoch == 1


def test_time_limit_cuts_the_epoch_that_passes_it(planted: PreparedData) -> None:
    model = _dot(planted)
    # any step takes more than a nanosecond: the first epoch stops after its first step,
    # is validated and kept, and no second epoch starts
    config = TrainConfig(epochs=10, patience=0, time_limit=1e-9, **FAST)
    result = train_model(model, planted, config)
    assert len(result.history) == 1 and result.extra["stopped_by_time_limit"]
    steps = -(-len(planted.train_song) // FAST["batch_size"])
    assert result.history[0]["steps"] == f"1/{steps}" and result.best_epoch == 1
    assert np.isfinite(result.history[0]["loss"])
    unlimited = train_model(_dot(planted), planted, TrainConfig(epochs=2, patience=0, **FAST))
    assert len(unlimited.history) == 2 and not unlimited.extra["stopped_by_time_limit"]


def test_apr_trains_from_a_checkpoint(planted: PreparedData, tmp_path: Path) -> None:
    from masr.models.mdr import MDR, MDRConfig

    model = MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
    train_model(model, planted, TrainConfig(epochs=4, **FAST), run_dir=tmp_path / "mdr")
    start = _weights(model)
    adv = train_model(
        model, planted, TrainConfig(epochs=2, **FAST), adversarial=AdversarialConfig(eps=0.5)
    )
    assert len(adv.history) == 2
    assert not all(torch.equal(start[k], v) for k, v in model.state_dict().items())
    # the adversarial term adds a second, non-negative loss: APR's loss exceeds the clean one
    clean = train_model(_dot(planted), planted, TrainConfig(epochs=1, **FAST))
    assert adv.history[0]["loss"] > 0 and clean.history[0]["loss"] > 0


def test_progress_hooks_are_called(planted: PreparedData) -> None:
    seen: list[str] = []

    class Recorder(TrainProgress):
        def start(self, title: str, epochs: int, steps: int, first_epoch: int) -> None:
            seen.append(f"start {title} {epochs} {first_epoch}")

        def epoch(self, record: dict) -> None:
            seen.append(f"epoch {record['epoch']}")

        def finish(self) -> None:
            seen.append("finish")

    train_model(_dot(planted), planted, TrainConfig(epochs=2, **FAST), progress=Recorder())
    assert seen == ["start dot 2 1", "epoch 1", "epoch 2", "finish"]


@pytest.mark.parametrize(
    ("field", "value", "option"),
    [("batch_size", 0, "--batch-size"), ("lr", -1.0, "--lr"), ("neg_mode", "x", "--neg-mode")],
)
def test_bad_options_name_the_option(planted: PreparedData, field: str, value, option: str) -> None:
    with pytest.raises(MasrError, match=option):
        train_model(_dot(planted), planted, TrainConfig(**{field: value}))


def test_plan_and_signatures() -> None:
    assert plan("amasr") == ["mdr", "mass", "masr", "amdr", "amass", "amasr"]
    assert plan("masr") == ["mdr", "mass", "masr"]
    opts = RunOptions(train=TrainConfig(epochs=3))
    a = signature("amdr", opts, "fp")
    b = signature("amdr", RunOptions(train=TrainConfig(epochs=4)), "fp")
    assert a != b and a["start"]["train"]["epochs"] == 3  # a changed BPR run invalidates APR
    assert signature("mdr", opts, "fp") != signature("mdr", opts, "other data")


def test_train_run_reuses_matching_dependencies(planted: PreparedData, tmp_path: Path) -> None:
    opts = RunOptions(
        train=TrainConfig(epochs=2, **FAST),
        adversarial=AdversarialConfig(epochs=1),
        model={"dim": 8},
        device="cpu",
    )
    first = train_run("amdr", planted, tmp_path, opts)
    assert [(o.run, o.action) for o in first] == [("mdr", "trained"), ("amdr", "trained")]
    mdr_mtime = (tmp_path / "mdr" / "best.pt").stat().st_mtime_ns
    again = train_run("amdr", planted, tmp_path, opts)
    assert [(o.run, o.action) for o in again] == [("mdr", "reused"), ("amdr", "trained")]
    assert (tmp_path / "mdr" / "best.pt").stat().st_mtime_ns == mdr_mtime
    changed = RunOptions(**{**opts.__dict__, "train": TrainConfig(epochs=1, **FAST)})
    assert train_run("amdr", planted, tmp_path, changed)[0].action == "trained"


def test_a_fusions_outcome_names_its_weight(planted: PreparedData, tmp_path: Path) -> None:
    """masr train's summary table says which α of eq. 20 a fusion serves."""
    opts = RunOptions(
        train=TrainConfig(epochs=1, **FAST), model={"dim": 8}, device="cpu", alpha=0.75
    )
    first = train_run("masr", planted, tmp_path, opts)
    assert [(o.run, o.action, o.alpha) for o in first] == [
        ("mdr", "trained", None), ("mass", "trained", None), ("masr", "fused", 0.75)
    ]
    # a weight chosen on validation: the one run.json records
    auto = replace(opts, alpha_search=True)
    chosen = train_run("masr", planted, tmp_path, auto)[-1]
    assert chosen.action == "fused"
    assert chosen.alpha == json.loads((tmp_path / "masr" / "run.json").read_text())["alpha"]


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(MasrError, match="--device cuda"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_and_sampling_on_cuda(planted: PreparedData) -> None:
    from masr.models.mass import MASS, MASSConfig
    from masr.sampling import TrainingIndex, is_training_pair, sample_negatives

    index = TrainingIndex.from_data(planted, "cuda")
    who = index.playlist[torch.arange(index.n_rows, device="cuda")]
    neg = sample_negatives(index, who, 4)
    assert neg.is_cuda and not bool(is_training_pair(index, who.unsqueeze(1), neg).any())
    model = MASS(MASSConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
    result = train_model(model, planted, TrainConfig(epochs=2, **FAST), device="cuda")
    assert np.isfinite(result.history[-1]["loss"])
    cpu = evaluate_model(model.cpu(), planted)
    gpu = evaluate_model(model.cuda(), planted, device="cuda")
    assert cpu["sampled"]["hit@10"] == pytest.approx(gpu["sampled"]["hit@10"], abs=0.03)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("loss", ["bpr", "softmax"])
def test_the_adversarial_chain_on_cuda(planted: PreparedData, tmp_path: Path, loss: str) -> None:
    """BPR or sampled softmax (shared mixed negatives, selection by full ranking), then APR,
    for both model families on the GPU; what is evaluated matches the CPU's evaluation."""
    softmax = {"neg": 64, "neg_sampler": "mixed", "select": "full", "valid_sample": 200}
    opts = RunOptions(
        train=TrainConfig(epochs=2, loss=loss, **(softmax if loss == "softmax" else {}), **FAST),
        adversarial=AdversarialConfig(epochs=2),
        model={"dim": 8},
        device="cuda",
    )
    done = train_run("amasr", planted, tmp_path, opts)
    assert [o.run for o in done] == ["mdr", "mass", "masr", "amdr", "amass", "amasr"]
    for run in ("amdr", "amass"):
        model, _ = load_model(tmp_path / run / "best.pt")
        cpu = evaluate_model(model.cpu(), planted)
        gpu = evaluate_model(model.cuda(), planted, device="cuda")
        assert cpu["sampled"]["hit@10"] == pytest.approx(gpu["sampled"]["hit@10"], abs=0.03)
        assert cpu["sampled"]["hit@10"] > 0.2  # chance is 10/101


def test_resume_merge_keeps_explicit_options_and_takes_the_rest() -> None:
    """RunOptions.merged: what --resume does with the options of the interrupted run."""
    saved = RunOptions(
        train=TrainConfig(epochs=3, lr=0.02, batch_size=32),
        adversarial=AdversarialConfig(eps=0.5),
        model={"dim": 8},
        alpha=0.3,
    )
    given = RunOptions(train=TrainConfig(epochs=9), model={"dim": None})
    merged = given.merged(saved, {"epochs"})
    assert merged.train.epochs == 9  # given on the command line
    assert (merged.train.lr, merged.train.batch_size) == (0.02, 32)  # from the run
    assert merged.adversarial.eps == 0.5 and merged.alpha == 0.3 and merged.model["dim"] == 8
    assert saved.train.epochs == 3 and given.train.lr != 0.02  # neither input is changed
    # --alpha auto is --alpha: kept from the run unless --alpha is given again
    auto = RunOptions(alpha_search=True)
    assert RunOptions().merged(auto, set()).alpha_search
    assert not RunOptions(alpha=0.7).merged(auto, {"alpha"}).alpha_search
    assert RunOptions.from_dict(auto.to_dict()).alpha_search


def test_resume_may_change_budgets_at_every_level_of_a_chain() -> None:
    """An APR run's signature holds its start's; --resume with a longer time limit or more
    epochs must match it there too (AMASS continued with --time-limit raised)."""
    from masr.runs.registry import differences, resumable

    def sig(**train: float) -> dict:
        options = RunOptions(train=TrainConfig(**train), adversarial=AdversarialConfig(epochs=4))
        return signature("amass", options, "data")

    old, longer = sig(time_limit=100.0, epochs=3), sig(time_limit=900.0, epochs=9, patience=7)
    assert old != longer and resumable(old) == resumable(longer)
    assert differences(resumable(old), resumable(sig(lr=0.5)))  # a real change still blocks
    fused = signature("amasr", RunOptions(train=TrainConfig(time_limit=100.0)), "data")
    assert resumable(fused) == resumable(
        signature("amasr", RunOptions(train=TrainConfig(time_limit=5.0)), "data")
    )


def test_configs_are_checked_when_made() -> None:
    with pytest.raises(MasrError, match="--alpha"):
        RunOptions(alpha=1.5)
    with pytest.raises(MasrError, match="--noise"):
        AdversarialConfig(noise="loud")


def test_fit_validation_keeps_a_quarter_of_the_budget_for_validation() -> None:
    from masr.train import (
        MIN_VALID_SAMPLE,
        VALID_EPOCH_RATIO,
        VALID_FREE_SHARE,
        VALID_SHARE,
        fit_validation,
    )

    limited = TrainConfig(time_limit=400.0)
    assert VALID_SHARE * limited.time_limit == 100.0
    assert fit_validation(TrainConfig(), 50.0, 5000.0, 2000) == 2000  # no limit: as asked
    assert fit_validation(limited, 20.0, 80.0, 2000) == 2000  # fits in 100 s
    assert fit_validation(limited, 20.0, 160.0, 2000) == 1000  # 80 s left for 160 s of 2000
    assert fit_validation(limited, 120.0, 160.0, 2000) == MIN_VALID_SAMPLE  # floor
    assert fit_validation(limited, 20.0, 1600.0, 150) == 150  # never more than asked
    # given the first epoch's training time, validation takes at most VALID_EPOCH_RATIO of it
    assert VALID_EPOCH_RATIO == 1.0
    assert fit_validation(limited, 20.0, 80.0, 2000, train_seconds=500.0) == 2000
    assert fit_validation(limited, 20.0, 80.0, 2000, train_seconds=60.0) == 1000  # 40 s of 80
    assert fit_validation(limited, 20.0, 160.0, 2000, train_seconds=500.0) == 1000  # the share
    assert fit_validation(TrainConfig(), 20.0, 160.0, 2000, train_seconds=1.0) == 2000
    # ... but a validation within VALID_FREE_SHARE of the limit (20 s of 400) stays whole
    assert VALID_FREE_SHARE * limited.time_limit == 20.0
    assert fit_validation(limited, 1.0, 19.0, 2000, train_seconds=4.0) == 2000
    assert fit_validation(limited, 0.0, 40.0, 2000, train_seconds=4.0) == 1000


def test_a_time_limited_run_fits_its_validation_to_its_first_epoch(
    planted: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation estimated well inside a quarter of the budget but longer than the first
    epoch's training: cut after that epoch, before its validation, and kept by --resume."""
    import masr.train as train
    from masr.models.mdr import MDR, MDRConfig

    monkeypatch.setattr(train, "MIN_VALID_SAMPLE", 10)
    monkeypatch.setattr(train, "estimate_validation", lambda *args, **kw: (0.0, 50.0))
    logs: list[str] = []
    model = MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)
    # 50 s: within a quarter of 400 s, above the 20 s that stay whole whatever the epoch takes
    config = TrainConfig(epochs=2, patience=0, time_limit=400.0, valid_sample=0, **FAST)
    result = train_model(model, planted, config, run_dir=tmp_path, log=logs.append)
    keep = max(10, int(len(planted.valid) * 20 / 50))
    assert keep < len(planted.valid)
    assert result.extra["valid_sample"] == keep and len(result.history) == 2
    assert len(logs) == 1 and "of training" in logs[0] and f"ranking {keep:,} instead" in logs[0]
    assert load_checkpoint(tmp_path / "best.pt")["train_config"]["valid_sample"] == keep


def test_estimate_validation_times_both_protocols(planted: PreparedData) -> None:
    from masr.sampling import TrainingIndex
    from masr.train import estimate_validation

    model = _dot(planted)
    model.train()
    sampled, full = estimate_validation(
        model, planted, TrainingIndex.from_data(planted), TrainConfig(valid_sample=0)
    )
    assert 0 < sampled < 60 and 0 < full < 60
    assert model.training  # left as it was


def test_a_time_limited_run_cuts_its_validation_to_fit(
    planted: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import masr.train as train
    from masr.models.mdr import MDR, MDRConfig

    def mdr() -> MDR:
        return MDR(MDRConfig(dim=8), planted.n_users, planted.n_playlists, planted.n_songs)

    MIN_VALID_SAMPLE = 10  # the planted data has few validation cases: a lower floor
    monkeypatch.setattr(train, "MIN_VALID_SAMPLE", MIN_VALID_SAMPLE)
    assert len(planted.valid) > MIN_VALID_SAMPLE
    # validation "takes" 1 s (sampled) + 100 s (full ranking of every case): more than a
    # quarter of a 60 s budget, so the full ranking keeps the floor's cases, and the first
    # epoch keeps room for them
    monkeypatch.setattr(train, "estimate_validation", lambda *args, **kw: (1.0, 100.0))
    logs: list[str] = []
    config = TrainConfig(epochs=2, patience=0, time_limit=60.0, valid_sample=0, **FAST)
    result = train_model(mdr(), planted, config, run_dir=tmp_path, log=logs.append)
    assert result.extra["valid_sample"] == MIN_VALID_SAMPLE
    assert len(logs) == 1 and f"ranking {MIN_VALID_SAMPLE:,} instead" in logs[0]
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["train_config"]["valid_sample"] == MIN_VALID_SAMPLE
    # --resume validates on the same cases, whatever the options say
    more = train_model(
        mdr(), planted, TrainConfig(epochs=3, patience=0, valid_sample=0, **FAST),
        run_dir=tmp_path, resume=last,
    )
    assert more.extra["valid_sample"] == MIN_VALID_SAMPLE and len(more.history) == 3
    # without a limit nothing is estimated or cut
    plain = train_model(_dot(planted), planted, TrainConfig(epochs=1, valid_sample=0, **FAST))
    assert plain.extra["valid_sample"] == 0


def test_a_fusion_validates_on_the_fewest_cases_its_parts_ranked(tmp_path: Path) -> None:
    from masr.runs.make import _parts_valid_sample
    from masr.runs.store import write_run_json

    for part, size in (("amdr", 2000), ("amass", 350)):
        (tmp_path / part).mkdir()
        write_run_json(tmp_path / part, {"train_config": {"valid_sample": size}})
    assert _parts_valid_sample(tmp_path, ["amdr", "amass"], 2000) == 350
    assert _parts_valid_sample(tmp_path, ["amdr"], 2000) == 2000
    assert _parts_valid_sample(tmp_path, ["missing"], 500) == 500
    assert _parts_valid_sample(tmp_path, ["amass"], 0) == 350  # 0 = every case, the most


def test_fusion_note_only_past_two_standard_errors() -> None:
    from masr.runs.make import fusion_note

    note = fusion_note("amasr", 0.5, 0.045, {"amdr": 0.057, "amass": 0.008}, 2000, "full")
    assert note is not None and "below its amdr part" in note
    assert "0.0450 against 0.0570" in note and "--alpha" in note
    # one standard error at 0.057 over 2,000 cases is 0.0052: 0.05 is within two
    assert fusion_note("amasr", 0.5, 0.050, {"amdr": 0.057}, 2000, "full") is None
    assert fusion_note("amasr", 0.5, 0.070, {"amdr": 0.057}, 2000, "full") is None
    assert fusion_note("masr", 0.5, 0.0, {}, 2000, "full") is None
    assert fusion_note("masr", 0.5, 0.0, {"mdr": 0.5}, 0, "sampled") is None


def test_a_fusion_below_its_better_part_says_so(planted: PreparedData, tmp_path: Path) -> None:
    """The chain's fusion step compares its validation figure with its parts' (read from their
    run.json) and logs one note when it is clearly below the better part."""
    from masr.runs.store import read_run_json, write_run_json

    opts = RunOptions(train=TrainConfig(epochs=1, **FAST), model={"dim": 8}, device="cpu")
    train_run("masr", planted, tmp_path, opts)
    def set_best(part: str, value: float) -> None:
        info = read_run_json(tmp_path / part)
        for protocol in ("valid", "valid_full"):
            info["best"][protocol]["hit@10"] = value
        write_run_json(tmp_path / part, info)

    set_best("mdr", 1.0)  # a part far above anything the fusion reaches
    shutil.rmtree(tmp_path / "masr")
    said: list[str] = []
    done = train_run("masr", planted, tmp_path, opts, log=said.append)
    assert [o.action for o in done] == ["reused", "reused", "fused"]
    assert any("masr (α 0.5) is below its mdr part" in line for line in said), said
    said.clear()
    set_best("mdr", 0.0)
    set_best("mass", 0.0)
    shutil.rmtree(tmp_path / "masr")
    train_run("masr", planted, tmp_path, opts, log=said.append)
    assert not any("is below its" in line for line in said)


def test_cli_records_batch_by_only_when_playlist(tmp_path: Path) -> None:
    """`masr train --batch-by playlist` trains MASS with whole playlists per batch and says so
    in run.json; --batch-by row (the default, the recipes' too) leaves the record as runs had
    it before the option."""
    from conftest import write_planted
    from test_cli_train import TINY, _ok

    data = write_planted(tmp_path / "data")
    runs = tmp_path / "runs"
    args = ["train", "--model", "mass", "--data", str(data), "--runs", str(runs), "--loss",
            "softmax", "--neg", "16", *TINY]
    info = lambda: json.loads((runs / "mass" / "run.json").read_text())  # noqa: E731
    _ok([*args, "--batch-by", "row"])
    assert "batch_by" not in info()["train_config"]
    _ok([*args, "--batch-by", "playlist"])
    assert info()["train_config"]["batch_by"] == "playlist"
    assert info()["history"]
    default = [a.replace(str(runs), str(tmp_path / "default")) for a in args]
    _ok([*default, "--device", "cpu"])  # the CPU recipe keeps row batches
    saved = json.loads((tmp_path / "default" / "mass" / "run.json").read_text())
    assert "batch_by" not in saved["train_config"]
    from test_cli_train import runner

    from masr_cli.main import app

    bad = runner.invoke(app, [*args, "--batch-by", "song"])
    assert bad.exit_code != 0 and "batch-by" in bad.output


def test_training_values_a_run_does_not_read_do_not_retrain_it(
    planted: PreparedData, tmp_path: Path
) -> None:
    """QA: --max-members (members: MASS reads them, MDR not) and --neg-mode (bpr only) under
    softmax made every part train again, to identical losses; only the runs that read a
    changed value are made again now, and --resume is not refused for them either."""
    from masr.runs.registry import read_by_run, resumable, signature

    softmax = {"loss": "softmax", "neg": 16, "select": "full", "valid_sample": 50}
    base = RunOptions(train=TrainConfig(epochs=1, **softmax, **FAST), model={"dim": 8})
    train_run("masr", planted, tmp_path, base)

    def again(**train: object) -> dict[str, str]:
        opts = replace(base, train=replace(base.train, **train))
        return {o.run: o.action for o in train_run("masr", planted, tmp_path, opts)}

    assert again(neg_mode="pairs") == {"mdr": "reused", "mass": "reused", "masr": "fused"}
    assert again(max_members=3) == {"mdr": "reused", "mass": "trained", "masr": "fused"}
    assert again(temperature=0.5) == {"mdr": "trained", "mass": "trained", "masr": "fused"}
    # the stored signature stays whole; only comparisons drop what the run does not read
    sig = signature("amdr", replace(base, train=replace(base.train, neg_mode="pairs")), "d")
    assert sig["train"]["neg_mode"] == "pairs" and "neg_mode" not in read_by_run(sig)["train"]
    assert "max_members" not in resumable(sig)["start"]["train"]
    bpr = signature("mass", RunOptions(train=TrainConfig(loss="bpr")), "d")
    assert "neg_mode" in read_by_run(bpr)["train"] and "temperature" not in resumable(bpr)["train"]


def test_the_differences_said_are_the_recorded_values_that_count() -> None:
    """QA: a run made under softmax and asked for under bpr was "replaced: train.loss softmax
    -> bpr, train.neg_mode None -> hardest, train.temperature 0.1 -> None" (values read_by_run
    left out, not the ones recorded); NeuMF's and the fusions' parts were printed whole."""
    from masr.runs.registry import differences, read_differences, resumable, signature

    softmax = RunOptions(train=TrainConfig(loss="softmax", temperature=0.1))
    bpr = RunOptions(train=TrainConfig(loss="bpr", temperature=0.1, epochs=3))
    made, asked = signature("amdr", softmax, "d"), signature("amdr", bpr, "d")
    loss = ["start.train.loss softmax -> bpr", "train.loss softmax -> bpr"]
    assert read_differences(made, asked, resumable) == loss  # --resume may change epochs
    assert read_differences(made, asked) == [
        "start.train.epochs 50 -> 3", loss[0], "train.epochs 50 -> 3", loss[1]
    ]
    pairs = RunOptions(train=TrainConfig(neg_mode="pairs"))
    said = read_differences(signature("neumf", RunOptions(), "d"), signature("neumf", pairs, "d"))
    assert said == [
        "parts.neumf_gmf.train.neg_mode hardest -> pairs",
        "parts.neumf_mlp.train.neg_mode hardest -> pairs",
        "train.neg_mode hardest -> pairs",
    ]
    assert differences({"p": [1]}, {"p": [1, 2]}) == ["p [1] -> [1, 2]"]  # not as many: whole
