"""APR's fast-gradient perturbation (eq. 24): norms, touched rows, exact restore."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from masr.adversarial import fast_gradient_deltas, noise_scales, perturbed
from masr.models.base import Batch, ModelConfig, Recommender


@dataclass
class TinyConfig(ModelConfig):
    dim: int = 4
    dense_lookup: bool = False  # index the table's weight directly (dense gradient)


class Tiny(Recommender):
    """o = |metric * (p - s)|^2 + bias_s: one table per kind, one dense vector, a bias table."""

    name = "tiny"
    config_class = TinyConfig

    def __init__(self, config: TinyConfig, n_users: int, n_playlists: int, n_songs: int):
        super().__init__(config, n_users, n_playlists, n_songs)
        torch.manual_seed(0)
        self.playlist = nn.Embedding(n_playlists, config.dim, sparse=not config.dense_lookup)
        self.song = nn.Embedding(n_songs, config.dim, sparse=not config.dense_lookup)
        self.bias = nn.Embedding(n_songs, 1, sparse=not config.dense_lookup)
        self.metric = nn.Parameter(torch.rand(config.dim) + 0.5)

    def _rows(self, emb: nn.Embedding, idx: Tensor) -> Tensor:
        return emb.weight[idx] if self.config.dense_lookup else emb(idx)

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        p = self._rows(self.playlist, batch.playlists).unsqueeze(1)  # (B, 1, d)
        s = self._rows(self.song, songs)  # (B, C, d)
        return ((p - s) * self.metric).square().sum(-1) + self._rows(self.bias, songs).squeeze(-1)


def _batch(playlists: list[int]) -> Batch:
    b = len(playlists)
    return Batch(
        users=torch.zeros(b, dtype=torch.long),
        playlists=torch.tensor(playlists),
        members=torch.zeros((b, 1), dtype=torch.long),
        member_mask=torch.zeros((b, 1), dtype=torch.bool),
    )


def _loss(model: Tiny) -> Tensor:
    batch = _batch([0, 2, 2])
    songs = torch.tensor([[1, 3], [4, 3], [6, 1]])  # positive, negative
    o = model.distance(batch, songs)
    return nn.functional.softplus(o[:, 0] - o[:, 1]).mean()


@pytest.mark.parametrize("dense_lookup", [False, True])
@pytest.mark.parametrize("noise", ["flexible", "fixed"])
def test_delta_has_the_requested_norm(dense_lookup: bool, noise: str) -> None:
    model = Tiny(TinyConfig(dense_lookup=dense_lookup), 1, 5, 8)
    _loss(model).backward()
    eps = 0.7
    scales = noise_scales(model, eps, noise)
    deltas = fast_gradient_deltas(model, scales)
    assert set(deltas) == {"playlist.weight", "song.weight", "bias.weight", "metric"}
    for name, param in model.named_parameters():
        want = eps * float(param.detach().std()) if noise == "flexible" else eps
        delta = deltas[name]
        if name in model.embedding_tables():
            touched = {"playlist.weight": [0, 2], "song.weight": [1, 3, 4, 6]}.get(
                name, [1, 3, 4, 6]
            )
            assert sorted(delta.rows.tolist()) == touched  # only rows the batch used
            norms = delta.values.reshape(len(touched), -1).norm(dim=1)
            assert torch.allclose(norms, torch.full_like(norms, want), rtol=1e-5)
        else:
            assert delta.rows is None
            assert float(delta.values.norm()) == pytest.approx(want, rel=1e-5)


def test_delta_follows_the_gradient_direction() -> None:
    model = Tiny(TinyConfig(), 1, 5, 8)
    _loss(model).backward()
    deltas = fast_gradient_deltas(model, noise_scales(model, 1.0, "fixed"))
    g = model.metric.grad
    assert torch.allclose(deltas["metric"].values, g / g.norm())
    # the adversarial direction raises the loss (first order)
    with torch.no_grad():
        clean = float(_loss(model))
        with perturbed(model, {k: _scaled(v, 1e-3) for k, v in deltas.items()}):
            raised = float(_loss(model))
    assert raised > clean


def _scaled(delta, factor: float):
    from masr.adversarial import Delta

    return Delta(values=delta.values * factor, rows=delta.rows)


def test_perturbed_touches_only_batch_rows_and_restores_exactly() -> None:
    model = Tiny(TinyConfig(), 1, 5, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _loss(model).backward()
    deltas = fast_gradient_deltas(model, noise_scales(model, 1.0, "flexible"))
    with perturbed(model, deltas):
        moved = model.song.weight.detach() - before["song.weight"]
        assert moved[[0, 2, 5, 7]].abs().max() == 0  # untouched songs
        assert bool((moved[[1, 3, 4, 6]].norm(dim=1) > 0).all())
        assert not torch.equal(model.metric.detach(), before["metric"])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_zero_gradient_rows_get_no_noise() -> None:
    model = Tiny(TinyConfig(), 1, 5, 8)
    model.distance(_batch([1]), torch.tensor([[2, 2]])).sum().mul(0.0).backward()
    deltas = fast_gradient_deltas(model, noise_scales(model, 1.0, "fixed"))
    assert all(float(d.values.abs().sum()) == 0.0 for d in deltas.values())


def test_unknown_noise_mode() -> None:
    with pytest.raises(ValueError, match="noise"):
        noise_scales(Tiny(TinyConfig(), 1, 2, 3), 1.0, "loud")


class _FirstStep(Exception):
    """Raised from the optimiser: the first step's gradients are in, nothing updated."""


@pytest.mark.parametrize("model_name", ["mdr", "mass"])
@pytest.mark.parametrize("noise", ["flexible", "fixed"])
def test_one_apr_step_is_eq_23_with_delta_from_eq_24(
    tmp_path, monkeypatch: pytest.MonkeyPatch, model_name: str, noise: str
) -> None:
    """The gradient the training loop hands Adam in an APR step equals, parameter by
    parameter, ∇L(Θ) + λ_δ ∇L(Θ + δ) (eq. 23), with δ = ε s(θ) g / ‖g‖ from the clean loss's
    gradient g (eq. 24: per touched row of a table, per tensor otherwise; s = std or 1) and L
    eq. 21 written as a loop over rows, the same negatives at Θ and at Θ + δ."""
    import copy

    import torch.nn.functional as F
    from conftest import write_planted

    import masr.train as train
    from masr.config import AdversarialConfig, TrainConfig
    from masr.dataset import load_prepared
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    eps, lam = 0.5, 0.7
    data = load_prepared(write_planted(tmp_path / "data"))
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    torch.manual_seed(3)
    model = (
        MDR(MDRConfig(dim=4, dropout=0.0), *sizes)
        if model_name == "mdr"
        else MASS(MASSConfig(dim=4, dropout=0.0), *sizes)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    start = copy.deepcopy(model.state_dict())
    calls: list[tuple] = []
    got: dict[str, Tensor] = {}
    real_loss = train.ranking_loss

    def recorded(model_, batch, positives, negatives, mode):  # noqa: ANN001, ANN202
        calls.append((batch, positives.clone(), negatives.clone()))
        return real_loss(model_, batch, positives, negatives, mode)

    def capture(self) -> None:  # noqa: ANN001
        for name, p in model.named_parameters():
            if p.grad is not None:
                got[name] = (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
        raise _FirstStep

    monkeypatch.setattr(train, "ranking_loss", recorded)
    monkeypatch.setattr(train.LazyAdam, "step", capture)
    config = TrainConfig(epochs=1, batch_size=16, lr=0.01, neg=4, valid_sample=0)
    with pytest.raises(_FirstStep):
        train.train_model(
            model, data, config, adversarial=AdversarialConfig(eps=eps, reg_adv=lam, noise=noise)
        )
    assert len(calls) == 2  # the clean loss and the loss at Θ + δ
    (batch, positives, negatives), (_, positives2, negatives2) = calls
    assert torch.equal(positives, positives2) and torch.equal(negatives, negatives2)

    reference = copy.deepcopy(model)
    reference.load_state_dict(start)
    reference.train()
    for module in reference.modules():
        if isinstance(module, nn.Embedding):
            module.sparse = False
    params = dict(reference.named_parameters())
    tables = {f"{n}.weight" for n, m in reference.named_modules() if isinstance(m, nn.Embedding)}

    def eq_21() -> Tensor:  # the closest of the row's negatives, the batch's mean
        o = reference.distance(batch, torch.cat([positives[:, None], negatives], 1))
        rows = [-F.logsigmoid(o[r, 1:].min() - o[r, 0]) for r in range(o.shape[0])]
        return sum(rows) / len(rows)

    def gradients() -> dict[str, Tensor]:
        grads = torch.autograd.grad(eq_21(), list(params.values()), allow_unused=True)
        return {
            n: torch.zeros_like(p) if g is None else g
            for (n, p), g in zip(params.items(), grads, strict=True)
        }

    clean = gradients()
    with torch.no_grad():
        for name, p in params.items():  # eq. 24, s(θ) taken from Θ as the epoch starts
            s = 1.0 if noise == "fixed" or p.numel() < 2 else float(p.std())
            g, delta = clean[name], torch.zeros_like(p)
            if name in tables:
                for r in range(p.shape[0]):
                    if float(g[r].norm()) > 0:
                        delta[r] = eps * s * g[r] / g[r].norm()
            elif float(g.norm()) > 0:
                delta = eps * s * g / g.norm()
            p.add_(delta)
    adversarial = gradients()
    for name in params:
        want = clean[name] + lam * adversarial[name]  # eq. 23
        have = got.get(name, torch.zeros_like(want))
        assert torch.allclose(have, want, rtol=1e-4, atol=1e-6), name
