"""Gradient training of any trainable ``Recommender``: BPR (eq. 21) and APR (eqs. 22-24).

The loop knows the model only through the contract in ``masr.models.base``: it samples a batch
of training rows, their negatives and (for models that read them) member lists on the training
device, asks ``model.distance`` for the positive and negative distances, and minimises

    BPR  (eq. 21):  softplus(o+ - o-) = -log sigmoid(o- - o+)     (model.loss == "bpr")
    hinge (CML):    relu(margin + o+ - o-)                          (model.loss == "hinge")

averaged over the batch, against either the hardest (closest) of the ``neg`` negatives
(``neg_mode="hardest"``, as the authors' code) or every (positive, negative) pair
(``neg_mode="pairs"``). ``loss="softmax"`` minimises instead the sampled-softmax cross-entropy
of each positive against ``neg`` negatives shared by the batch (``softmax_loss``: logits
-distance / temperature, logQ-corrected, the playlist's own songs masked), which trains for
the whole-catalog ranking that ``masr score`` does. Negatives are drawn uniformly, by
popularity or half of each (``neg_sampler``, ``masr.sampling.NegativeSampler``).

The L2 term lambda * ||Theta||^2 of eq. 21, taken per batch of summed
losses as the reference does, enters as the gradient 2 * lambda * Theta / batch_size of the
parameters a step touches (Adam's coupled weight decay; for tables only the batch's rows).

APR adds lambda_delta * L(Theta + delta) with delta from ``masr.adversarial`` (eq. 24),
recomputed for every batch from the current parameters.

Embedding tables are trained with row-sparse gradients and a lazy Adam (moments and weights of
rows outside the batch stay untouched), which keeps a step's cost proportional to the batch
instead of to the catalog; see docs/training.md for the measurements.

Every epoch ends with validation under both protocols (sampled on every case, full ranking on
a seeded subset of ``valid_sample`` cases, the same every epoch); the protocol ``select`` names
picks the best epoch (hit@10, then ndcg@10) and is what ``patience`` watches. ``best.pt`` is
written when it improved, ``last.pt`` every epoch (optimiser and RNG state, for ``resume``).
With ``ema`` (``masr.averaging``) the validated and kept weights are a moving average of the
trained ones, whose state ``last.pt`` also holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from masr.adversarial import fast_gradient_deltas, noise_scales, perturbed
from masr.averaging import WeightAverage
from masr.checkpoint import save_checkpoint
from masr.compiled import MIN_COMPILE_BUDGET, compile_pays, compile_scores
from masr.config import AdversarialConfig, TrainConfig
from masr.dataset import PreparedData
from masr.distributed import (
    barrier,
    from_main,
    reduce_gradients,
    shard,
    sum_over_ranks,
    world,
)
from masr.errors import MasrError
from masr.evaluate import (
    better,
    evaluate_model,
    full_batch_size,
    full_ranks,
    padded_slots,
    sampled_batch_size,
    sampled_ranks,
    subsample_cases,
)
from masr.models.base import Batch, Recommender
from masr.sampling import (
    NegativeSampler,
    TrainingIndex,
    member_pairs,
    sample_negatives,
    training_batch,
)
from masr.system import poll_threads

__all__ = [
    "AdversarialConfig",
    "LazyAdam",
    "TrainConfig",
    "TrainProgress",
    "TrainResult",
    "ranking_loss",
    "resolve_device",
    "train_model",
]

class TrainProgress:
    """Progress hooks; the CLI draws rich bars with them. The default does nothing."""

    def start(self, title: str, epochs: int, steps: int, first_epoch: int) -> None:
        """A phase begins: ``epochs`` epochs of ``steps`` steps, starting at ``first_epoch``."""

    def step(self, done: int, loss: float) -> None:
        """``done`` steps of the current epoch finished; ``loss`` is their running mean."""

    def epoch(self, record: dict[str, Any]) -> None:
        """An epoch finished: ``record`` as stored in the history (loss, valid metrics, ...)."""

    def finish(self) -> None:
        """The phase ended (finished, stopped early or interrupted)."""


@dataclass
class TrainResult:
    best_epoch: int
    best_valid: dict[str, float]
    history: list[dict[str, Any]]
    stopped_early: bool
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


class LazyAdam:
    """Adam that updates only the rows present in a sparse gradient (dense gradients: plain Adam).

    ``weight_decay`` is coupled (added to the gradient, as in torch.optim.Adam) and, for sparse
    gradients, applied to the touched rows only. Written out rather than subclassing
    torch.optim.Optimizer, whose first use imports torch._dynamo (seconds per process); the
    state is plain tensors and ints, so ``state_dict`` goes into a weights_only checkpoint."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        self.params: list[Tensor] = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.steps = [0] * len(self.params)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        (b1, b2), eps, wd = self.betas, self.eps, self.weight_decay
        for i, p in enumerate(self.params):
            grad = p.grad
            if grad is None:
                continue
            self.steps[i] += 1
            t = self.steps[i]
            m, v = self.exp_avg[i], self.exp_avg_sq[i]
            # lr/(1-β1^t) · m / (√v/√(1-β2^t) + ε) = a · m / (√v + ε̂), a = lr √(1-β2^t)/(1-β1^t)
            # and ε̂ = ε √(1-β2^t): the same value up to rounding in fewer passes
            root_bc2 = math.sqrt(1 - b2**t)
            step, eps_hat = self.lr * root_bc2 / (1 - b1**t), eps * root_bc2
            if grad.is_sparse:
                grad = grad.coalesce()
                rows, g = grad.indices()[0], grad.values()  # (R,), (R, ...)
                if wd:
                    g = g + wd * p.index_select(0, rows)
                # m ← β1 m + (1-β1) g as one lerp; every pass in place (index_add_'s alpha is a
                # slower path than the multiply)
                m_rows = m.index_select(0, rows).lerp_(g, 1 - b1)
                v_rows = v.index_select(0, rows).mul_(b2).addcmul_(g, g, value=1 - b2)
                m.index_copy_(0, rows, m_rows)
                v.index_copy_(0, rows, v_rows)
                denom = v_rows.sqrt_().add_(eps_hat)
                p.index_add_(0, rows, m_rows.div_(denom).mul_(-step))
            else:
                if wd:
                    grad = grad.add(p, alpha=wd)
                m.lerp_(grad, 1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                denom = v.sqrt().add_(eps_hat)
                p.addcdiv_(m, denom, value=-step)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "exp_avg": [t.detach().cpu() for t in self.exp_avg],
            "exp_avg_sq": [t.detach().cpu() for t in self.exp_avg_sq],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["steps"]) != len(self.params):
            raise MasrError("last.pt: optimiser state does not match the model; cannot resume")
        self.steps = [int(s) for s in state["steps"]]
        for j, (m, v) in enumerate(zip(state["exp_avg"], state["exp_avg_sq"], strict=True)):
            self.exp_avg[j].copy_(m)
            self.exp_avg_sq[j].copy_(v)


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` (CUDA when present), ``cpu`` or ``cuda``; MasrError when CUDA is missing. A
    ``torch.device`` is taken as it is, once a CUDA one is checked the same way (QA: a notebook's
    ``torch.device("cuda")`` on a CPU machine was an AssertionError from inside torch)."""
    if isinstance(device, torch.device):
        if device.type == "cuda" and not torch.cuda.is_available():
            raise MasrError(f"--device {device}: no CUDA device is available (use --device cpu)")
        return device
    if not isinstance(device, str):
        raise MasrError(f"--device must be auto, cpu or cuda, not {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MasrError(f"--device {device}: no CUDA device is available (use --device cpu)")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise MasrError(f"--device must be auto, cpu or cuda, not {device!r}")
    return torch.device(device)


def ranking_loss(
    model: Recommender, batch: Batch, positives: Tensor, negatives: Tensor, neg_mode: str
) -> Tensor:
    """Mean eq. 21 (or hinge) loss of positives (B,) against negatives (B, K)."""
    songs = torch.cat([positives.unsqueeze(1), negatives], dim=1)  # (B, 1+K)
    o = model.distance(batch, songs)  # (B, 1+K) distances, lower = better
    o_pos, o_neg = o[:, :1], o[:, 1:]  # (B, 1), (B, K)
    if neg_mode == "hardest":
        o_neg = o_neg.min(dim=1, keepdim=True).values  # (B, 1) the closest negative
    diff = o_pos - o_neg  # (B, K') we want o- > o+
    if model.loss == "hinge":
        margin = float(getattr(model.config, "margin", 1.0))
        return F.relu(margin + diff).mean()
    return F.softplus(diff).mean()  # eq. 21: -log sigmoid(o- - o+)


def softmax_loss(
    model: Recommender,
    batch: Batch,
    positives: Tensor,
    negatives: Tensor,
    log_expected: Tensor | None,
    closed: tuple[Tensor, Tensor],
    temperature: float,
) -> Tensor:
    """Mean sampled-softmax cross-entropy of positives (B,) against negatives (N,) shared by
    the batch, with logits -distance / temperature.

    Each negative's logit is corrected by ``log_expected`` (N,), log E[its count among the
    draws] (logQ, Yi et al. 2019), so that the summed exp(logits) of the negatives estimates
    the catalog's without bias; the positive's logit is left as it is. Negatives that are one
    of the row's playlist's training songs (``closed``: the (row (P,), negative (P,)) pairs of
    ``masr.sampling.member_pairs``, its positive included) are masked out: a song is never its
    own negative. With every catalog song once as a negative
    and no correction this is the full softmax over the songs outside the playlist."""
    o = model.distance_own_shared(batch, positives, negatives)  # (B, 1+N), column 0 the positive
    # logits -o / τ, each negative's lowered by log E[its count]; the positive's left as it is
    shift = -F.pad(log_expected, (1, 0)) if log_expected is not None else o.new_zeros(())
    rows, cols = closed
    flat = rows * o.shape[1] + cols + 1  # (P,) the closed negatives' places in o (B, 1+N)
    return _SharedSoftmaxCE.apply(o, shift.to(o.dtype), flat, 1.0 / temperature)


class _SharedSoftmaxCE(torch.autograd.Function):
    """``softmax_loss``'s cross-entropy in one autograd node: from the distances o (B, 1+N)
    (column 0 the positive), the logit shift (1+N,) and the closed negatives (their flat
    indices into o (P,); never column 0), the mean
    of logsumexp(logits) - logits[:, 0] with logits = shift - o / τ (closed ones -inf); the
    gradient ∂/∂o = (e_0 - softmax(logits)) / (τ B) is written out in the logits' storage.
    The same value and gradient as masked_fill + F.cross_entropy, without their (B, 1+N)
    intermediates (tests/test_fullrank.py compares both in float64).

    The forward keeps exp(logits - max) (B, 1+N) and its row sums s for the backward, so the
    exponentials are taken once per step, not twice (logsumexp and softmax): one exp pass is
    1.5-2.3 ms of a 25 ms AOTM MDR step at 1,024 negatives on one CPU core."""

    @staticmethod
    def forward(ctx: Any, o: Tensor, shift: Tensor, closed: Tensor, scale: float) -> Tensor:  # noqa: D102
        logits = torch.add(shift, o, alpha=-scale)  # (B, 1+N)
        logits.view(-1).index_fill_(0, closed, float("-inf"))
        top = logits.amax(dim=1, keepdim=True)  # (B, 1); finite: the positive is never closed
        first = logits[:, 0] - top[:, 0]  # (B,) the positive's logit, shifted
        e = logits.sub_(top).exp_()  # (B, 1+N) exp(logits - max), in the logits' storage
        total = e.sum(dim=1)  # (B,) s
        ctx.save_for_backward(e, total)
        ctx.scale = scale
        # logsumexp - logit_0 = log s + max - logit_0
        return (total.log() - first).mean()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:  # noqa: D102
        e, total = ctx.saved_tensors
        e[:, 0] -= total  # e / s - e_0 = softmax - e_0; the closed negatives get 0
        # ∂loss/∂logits = (softmax - e_0) / B, and ∂logits/∂o = -1/τ
        coef = (grad * (-ctx.scale / e.shape[0])) / total.unsqueeze(1)  # (B, 1)
        return e.mul_(coef), None, None, None


def _step_loss(
    model: Recommender,
    batch: Batch,
    positives: Tensor,
    index: TrainingIndex,
    sampler: NegativeSampler,
    config: TrainConfig,
    generator: torch.Generator,
    part: slice | None = None,
) -> Callable[[], Tensor]:
    """The loss of one step as a function of the current parameters: negatives are drawn once
    here, so APR's second evaluation (eq. 23, at Θ + δ) sees the same ones.

    ``part`` (data-parallel training, ``masr.distributed``): the loss covers only these rows of
    the batch, but the negatives are drawn for the whole batch first, so that every rank's
    sampling generator stays in step."""
    if config.loss == "softmax":
        negatives = sampler.draw(config.neg, generator)  # (N,) shared by the batch
        log_expected = sampler.log_expected(negatives, config.neg)  # (N,)
        if part is not None:
            batch, positives = batch.select(part), positives[part]
        closed = member_pairs(index, batch.playlists, negatives)  # ((P,), (P,))
        return lambda: softmax_loss(
            model, batch, positives, negatives, log_expected, closed, config.temperature
        )
    if config.neg_sampler == "uniform":
        per_row = sample_negatives(index, batch.playlists, config.neg, generator)  # (B, K)
    else:
        per_row = sampler.draw_per_row(batch.playlists, config.neg, generator)  # (B, K)
    if part is not None:
        batch, positives, per_row = batch.select(part), positives[part], per_row[part]
    return lambda: ranking_loss(model, batch, positives, per_row, config.neg_mode)


def _set_sparse(model: nn.Module, sparse: bool) -> dict[nn.Embedding, bool]:
    """Switch every embedding to (row-)sparse gradients; returns the previous flags."""
    before = {m: m.sparse for m in model.modules() if isinstance(m, nn.Embedding)}
    for module in before:
        module.sparse = sparse or module.sparse
    return before


def _sortish(
    order: Tensor, row_lengths: Tensor, config: TrainConfig, generator: torch.Generator
) -> Tensor:
    """Reorder a shuffled ``order`` (N,) so that each window of ``sort_window`` batches is
    sorted by playlist length, then shuffle the batches: batches stay random samples of rows
    but each pads its member lists to a similar length (less wasted MASS work)."""
    n, b = order.shape[0], config.batch_size
    window = b * config.sort_window
    key = row_lengths[order]  # (N,)
    chunk = torch.arange(n, device=order.device) // window  # (N,)
    by_length = torch.argsort(chunk * (int(key.max()) + 1) + key, stable=True)  # (N,)
    sorted_rows = order[by_length]
    full = n // b  # whole batches are shuffled; the short remainder stays last
    batches = sorted_rows[: full * b].view(full, b)
    batches = batches[torch.randperm(full, generator=generator, device=order.device)]
    return torch.cat([batches.flatten(), sorted_rows[full * b :]])


def _epoch_order(
    model: Recommender,
    row_lengths: Tensor,
    config: TrainConfig,
    generator: torch.Generator,
    playlists: Tensor | None = None,
) -> Tensor:
    """One epoch's order of the N training rows (N,): shuffled (with ``config.batch_by``
    "playlist", the playlists (N,) of the rows are, each one's rows kept together), and for
    member-reading models length-sorted within windows (``_sortish``)."""
    n_rows = row_lengths.shape[0]
    if config.batch_by == "playlist" and playlists is not None and n_rows:
        # playlists in a random order, each one's rows together: the stable sort below keeps
        # them together within a length, so batches hold whole playlists
        rank = torch.randperm(
            int(playlists.max()) + 1, generator=generator, device=row_lengths.device
        )
        order = torch.argsort(rank[playlists], stable=True)  # (N,)
    else:
        order = torch.randperm(n_rows, generator=generator, device=row_lengths.device)  # (N,)
    if model.uses_members and config.sort_window > 1:
        order = _sortish(order, row_lengths, config, generator)
    return order


def _batch_for(
    model: Recommender,
    index: TrainingIndex,
    rows: Tensor,
    config: TrainConfig,
    generator: torch.Generator,
) -> Batch:
    """The training batch of ``rows`` (B,) as ``model`` reads it (members when it uses them)."""
    return training_batch(
        index,
        rows,
        uses_members=model.uses_members,
        max_members=config.max_members,
        generator=generator,
        member_dropout=config.member_dropout,
    )


#: a run with --time-limit keeps at most this share of its budget for one epoch's validation;
#: when it would take more, the full-ranking validation ranks fewer cases (``fit_validation``)
VALID_SHARE = 0.25
#: ... but never fewer than this many (one standard error of a hit@10 near 0.05: ≈ 0.015)
MIN_VALID_SAMPLE = 200
#: ... and, decided once the first epoch has trained, at most this many times as long as that
#: epoch's training: where ranking the whole catalog is dear (MASS on a catalog of 108K songs:
#: 2,000 cases took 3.5x its training epoch on a CPU core with 156-case batches, 1.5x with
#: today's 16), a budget buys epochs, not checks
VALID_EPOCH_RATIO = 1.0
#: ... unless it takes less than this share of the limit (cheap validations stay whole)
VALID_FREE_SHARE = 0.05


def estimate_validation(
    model: Recommender,
    data: PreparedData,
    index: TrainingIndex,
    config: TrainConfig,
    probe_sampled: int = 256,
    probe_full: int = 64,
) -> tuple[float, float]:
    """Seconds one epoch's validation should take: (sampled protocol on every validation case,
    full ranking on the ``config.valid_sample`` cases). Each protocol ranks a few of its cases
    twice, the first time untimed (it pays any compiling, which the first validation would
    pay otherwise), the second timed and scaled by the work: the case count, or for models
    that read members the mean of the case count's ratio and the ratio of the member slots
    their batches fill, each padded to its longest playlist (``masr.evaluate.padded_slots``,
    in batches of the size validation uses)."""

    def scale(probe: Any, every: Any, batch: int) -> float:
        by_cases = len(every) / len(probe)
        if not model.uses_members:
            return by_cases
        # MASS's cost is part per case (its queries against the whole catalog) and part per
        # member slot: as much of each, the measured middle (docs/training.md, "Evaluation")
        by_slots = padded_slots(every, index, batch) / padded_slots(probe, index, batch)
        return 0.5 * (by_cases + by_slots)

    cases = data.valid
    full_cases = subsample_cases(cases, config.valid_sample, config.seed)
    plan = (
        (
            sampled_ranks,
            subsample_cases(cases, probe_sampled, config.seed + 1),
            cases,
            sampled_batch_size(model, cases, index),
        ),
        (
            full_ranks,
            subsample_cases(full_cases, probe_full, config.seed + 1),
            full_cases,
            full_batch_size(model, index),
        ),
    )
    was_training = model.training
    model.eval()
    estimates = []
    try:
        for rank, probe, every, batch in plan:
            if not len(probe):
                estimates.append(0.0)
                continue
            rank(model, probe, index, batch)
            t0 = time.perf_counter()
            rank(model, probe, index, batch)
            seconds = time.perf_counter() - t0
            estimates.append(seconds * scale(probe, every, batch))
    finally:
        model.train(was_training)
    return estimates[0], estimates[1]


def fit_validation(
    config: TrainConfig,
    sampled_seconds: float,
    full_seconds: float,
    n_full: int,
    train_seconds: float | None = None,
) -> int:
    """How many full-ranking validation cases a run with ``config.time_limit`` ranks per epoch:
    ``n_full`` (its ``valid_sample``, all of them when 0), or fewer when one epoch's validation,
    estimated at ``sampled_seconds`` + ``full_seconds``, would take more than ``VALID_SHARE``
    of the limit, or, given the first epoch's ``train_seconds``, more than
    ``VALID_EPOCH_RATIO`` times them and ``VALID_FREE_SHARE`` of the limit (never fewer than
    ``MIN_VALID_SAMPLE``)."""
    if not config.time_limit or full_seconds <= 0:
        return n_full
    room = VALID_SHARE * config.time_limit
    if train_seconds is not None:
        free = VALID_FREE_SHARE * config.time_limit
        room = min(room, max(VALID_EPOCH_RATIO * train_seconds, free))
    if sampled_seconds + full_seconds <= room:
        return n_full
    keep = int(n_full * max(room - sampled_seconds, 0.0) / full_seconds)
    return min(n_full, max(MIN_VALID_SAMPLE, keep))


def _fit_to_epoch(
    config: TrainConfig,
    estimate: tuple[float, float, int],
    train_seconds: float,
    cut: bool,
    log: Callable[[str], None],
    name: str,
) -> TrainConfig:
    """``config`` with the full-ranking validation cases (``valid_sample``) a time-limited
    run ranks every epoch, fitted after its first epoch's training (``fit_validation`` with
    ``train_seconds``; the estimate's cases, whole, when the limit cut that epoch)."""
    est_sampled, est_full, n_full = estimate
    if cut:
        return config
    keep = fit_validation(config, est_sampled, est_full, n_full, train_seconds)
    if keep >= n_full:
        return config
    log(
        f"{name}: ranking {n_full:,} validation cases against the whole catalog would take "
        f"about {est_sampled + est_full:.0f} s of each epoch, against {train_seconds:.0f} s of "
        f"training (--time-limit {config.time_limit:g} s); ranking {keep:,} instead "
        "(--valid-sample, or no --time-limit)"
    )
    return replace(config, valid_sample=keep)


def _rng_state(generator: torch.Generator) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "sampler": generator.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _load_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def saved_time_limit(state: dict[str, Any]) -> float:
    """The --time-limit a checkpoint's run was made with (0: none)."""
    return float((state.get("train_config") or {}).get("time_limit") or 0.0)


def spent_time_limit(state: dict[str, Any], config: TrainConfig) -> bool:
    """Whether the run a ``last.pt`` ``state`` holds has spent ``config.time_limit``, as a run
    that goes on decides to stop: no room for an epoch beside its last validation (the end
    of an epoch in ``train_model``), or its last epoch cut by a limit not raised since."""
    history = state.get("history") or []
    if not config.time_limit or not history:
        return False
    last = history[-1]
    cut = "steps" in last and config.time_limit <= saved_time_limit(state)
    no_room = float(state.get("seconds", 0.0)) + float(last.get("valid_seconds", 0.0))
    return cut or no_room >= config.time_limit


def train_model(
    model: Recommender,
    data: PreparedData,
    config: TrainConfig,
    *,
    device: torch.device | str = "cpu",
    run_dir: str | Path | None = None,
    adversarial: AdversarialConfig | None = None,
    resume: dict[str, Any] | None = None,
    progress: TrainProgress | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    extras: dict[str, Any] | None = None,
    title: str | None = None,
    compile: bool = False,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place with BPR (or APR when ``adversarial`` is given).

    ``run_dir`` receives ``best.pt`` (the best validation epoch) and ``last.pt`` (every epoch,
    with optimiser and RNG state); ``resume`` is a loaded ``last.pt`` to continue from;
    ``extras`` is stored in both checkpoints. ``compile``: on a CPU, the model's scores
    (training steps and per-epoch validation) through ``torch.compile`` where it has them
    (``Recommender.compile_scores``; the same computation up to float rounding; off with
    $MASR_COMPILE=0). The model ends holding its best weights.

    With ``config.time_limit``, the first epoch keeps room for its validation, estimated
    before training (``estimate_validation``; later epochs keep as long as the last validation
    took), and when that validation would take more than ``VALID_SHARE`` of the limit, the
    full-ranking validation ranks fewer cases (``fit_validation``; ``log`` says so, and
    ``TrainResult.extra["valid_sample"]`` and the checkpoints' train config say how many).
    A resumed run whose time is already spent trains no further epoch: no room for an epoch
    beside its last validation, or its last epoch cut by a limit not raised since
    (``spent_time_limit``)."""
    if not model.trainable:
        raise MasrError(f"--model {model.name}: not trained by gradient descent (it has fit())")
    device = torch.device(device)
    progress = progress or TrainProgress()
    log = log or (lambda _msg: None)
    extras = dict(extras or {})
    run_dir = Path(run_dir) if run_dir is not None else None

    # Global RNGs (dropout) are the caller's: a run is seeded once, before its model is built
    # (masr.seed.set_seed in masr.runs.make); the sampling generator is seeded here.
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed)
    index = TrainingIndex.from_data(data, device)
    model.to(device)
    sparse_before = _set_sparse(model, config.sparse)
    compiled = compile_scores(model, compile, device)
    if compiled and not compile_pays(config.time_limit):
        model.compile_scores(False)  # nothing was compiled yet: compiling happens on first use
        compiled = False
        log(
            f"{title or model.name}: --time-limit {config.time_limit:g} s is too short for "
            f"compiling to pay (under {MIN_COMPILE_BUDGET:g} s); training eagerly"
        )
    # eq. 21 per batch: sum of the batch's losses + lambda * ||theta||^2; the loop minimises
    # the batch *mean*, so the L2 gradient 2 * lambda * theta is divided by the batch size
    # (Adam's coupled weight decay, as the reference's weight_decay with its summed loss).
    wd = 2 * config.reg / config.batch_size
    optimizer = LazyAdam(model.parameters(), lr=config.lr, weight_decay=wd)
    # --ema: validation, best.pt and so everything downstream see the average of the weights
    average = WeightAverage(optimizer.params, config.ema) if config.ema else None

    history: list[dict[str, Any]] = []
    best_epoch, best_valid, bad_epochs, first_epoch = 0, {}, 0, 1
    best_full: dict[str, float] = {}  # full-protocol validation of the best epoch
    best_selected: dict[str, float] = {}  # the protocol config.select names, of the best epoch
    best_state: dict[str, Tensor] | None = None
    elapsed = 0.0
    if resume is not None:
        model.load_state_dict(resume["state_dict"])
        optimizer.load_state_dict(resume["optimizer"])
        if average is not None:
            if "weight_average" not in resume:
                raise MasrError("last.pt holds no weight average (--ema); cannot resume")
            average.load_state_dict(resume["weight_average"])
        _load_rng_state(resume["rng"], generator)
        history = list(resume["history"])
        best_epoch, best_valid = int(resume["best_epoch"]), dict(resume["best_valid"])
        best_full = dict(resume.get("best_valid_full", {}))
        best_selected = best_full if config.select == "full" else best_valid
        bad_epochs, first_epoch = int(resume["bad_epochs"]), int(resume["epoch"]) + 1
        elapsed = float(resume.get("seconds", 0.0))
        # the validation cases the run began with (fit_validation may have cut them)
        saved_sample = (resume.get("train_config") or {}).get("valid_sample")
        if saved_sample is not None:
            config = replace(config, valid_sample=int(saved_sample))

    ranks = world()
    if ranks.distributed:
        # dropout masks differ per rank: fork each rank's global generator from the common one
        fork = int(torch.randint(0, 2**62, (1,)))
        torch.manual_seed(fork + ranks.rank)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(fork + ranks.rank)
    params = [p for p in model.parameters() if p.requires_grad]
    sparse_ids = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse
    }
    if config.loss != "softmax":
        index.check_negatives(data.path)
    sampler = NegativeSampler(index, config.neg_sampler)
    n_rows = index.n_rows
    steps = math.ceil(n_rows / config.batch_size)
    row_lengths = index.lengths(index.playlist)  # (N,) training songs of each row's playlist
    scales: dict[str, Tensor] = {}
    stopped_early = config.patience > 0 and bad_epochs >= config.patience
    out_of_time = False
    if resume is not None and first_epoch <= config.epochs and spent_time_limit(resume, config):
        # nothing more fits, not even one step (QA: each --resume trained one more)
        stopped_early = out_of_time = True
    # one process checks --time-limit at every step; ranks under torchrun only at epoch ends
    # (they must all run the same steps)
    limit, cut_in_epoch = config.time_limit, bool(config.time_limit) and not ranks.distributed
    first_reserve = 0.0  # room kept for the first epoch's validation
    first_estimate = None  # (sampled, full seconds, cases) of that validation, to fit it
    if cut_in_epoch and not history:
        t_probe = time.perf_counter()
        est_sampled, est_full = estimate_validation(model, data, index, config)
        n_valid = len(data.valid)  # subsample_cases's count: all unless 0 < valid_sample < n
        n_full = config.valid_sample if 0 < config.valid_sample < n_valid else n_valid
        keep = fit_validation(config, est_sampled, est_full, n_full)
        if keep < n_full:
            log(
                f"{title or model.name}: ranking {n_full:,} validation cases against the whole "
                f"catalog would take about {est_full:.{1 if est_full < 10 else 0}f} s of each "
                f"epoch (--time-limit "
                f"{limit:g} s); ranking {keep:,} instead (--valid-sample, or a longer "
                "--time-limit)"
            )
            config = replace(config, valid_sample=keep)
            est_full *= keep / n_full
        first_reserve = est_sampled + est_full
        first_estimate = (est_sampled, est_full, keep)
        elapsed += time.perf_counter() - t_probe  # the probe is validation work of this run
    progress.start(title or model.name, config.epochs, steps, first_epoch)
    try:
        for epoch in range(first_epoch, config.epochs + 1):
            if stopped_early:
                break
            t0 = time.perf_counter()
            model.train()
            if adversarial is not None:
                # s(Theta) of eq. 23-24, from the parameters as this epoch starts
                scales = noise_scales(model, adversarial.eps, adversarial.noise)
            order = _epoch_order(model, row_lengths, config, generator, index.playlist)  # (N,)
            total = torch.zeros((), device=device)
            done = steps  # steps of this epoch actually run (fewer when the time limit cuts it)
            # keep room for this epoch's validation: as long as the last one took
            reserve = history[-1].get("valid_seconds", 0.0) if history else first_reserve
            for step in range(steps):
                poll_threads()  # --threads 0: leave cores that other work has taken since
                if cut_in_epoch and step and elapsed + time.perf_counter() - t0 + reserve >= limit:
                    done, out_of_time = step, True  # --time-limit ends mid-epoch too
                    progress.step(step, float(total) / step)
                    break
                rows = order[step * config.batch_size : (step + 1) * config.batch_size]  # (B,)
                batch = _batch_for(model, index, rows, config, generator)
                positives = index.song[rows]  # (B,)
                part = shard(rows.numel()) if ranks.distributed else None
                n_local = rows.numel() if part is None else len(range(rows.numel())[part])
                step_loss = _step_loss(
                    model, batch, positives, index, sampler, config, generator, part
                )
                optimizer.zero_grad()
                if n_local:
                    loss = step_loss()
                    loss.backward()
                    if adversarial is not None and adversarial.reg_adv > 0:
                        deltas = fast_gradient_deltas(model, scales)  # eq. 24, delta from 0
                        with perturbed(model, deltas):
                            adv = step_loss()  # the same loss, negatives and members at Θ + δ
                            (adversarial.reg_adv * adv).backward()  # eq. 23's second term
                        loss = loss + adversarial.reg_adv * adv.detach()
                else:  # a last batch with fewer rows than ranks: this rank adds nothing
                    loss = torch.zeros((), device=device)
                if part is not None:
                    # the whole batch's gradient on every rank (dense all-reduce, sparse gather)
                    reduce_gradients(params, sparse_ids, n_local, rows.numel())
                    loss = loss * (n_local * ranks.size / rows.numel())  # summed: the batch mean
                optimizer.step()
                model.after_step()
                if average is not None:
                    average.step()
                total += loss.detach()
                if (step + 1) % 25 == 0 or step + 1 == steps:
                    progress.step(step + 1, float(total) / (step + 1))
            train_seconds = time.perf_counter() - t0
            mean_loss = sum_over_ranks(float(total) / done) / ranks.size
            if not math.isfinite(mean_loss):
                raise MasrError(
                    f"training diverged at epoch {epoch} (loss {mean_loss}); try a smaller --lr"
                )
            if first_estimate is not None:  # the first epoch of a --time-limit run
                config = _fit_to_epoch(config, first_estimate, train_seconds, done < steps, log,
                                       title or model.name)
                first_estimate = None
            t1 = time.perf_counter()
            # --ema: the averaged weights are what is validated and kept (best.pt), the live
            # ones what trains on and what last.pt resumes
            with average.applied() if average is not None else nullcontext():
                both = None
                if ranks.is_main:  # every rank holds the same weights: rank 0 validates for all
                    both = evaluate_model(
                        model,
                        data,
                        "valid",
                        device=device,
                        protocols=("sampled", "full"),
                        index=index,
                        full_sample=config.valid_sample,
                        sample_seed=config.seed,
                    )
                both = from_main(both)
                valid = both["sampled"]
                record = {
                    "epoch": epoch,
                    "loss": mean_loss,
                    "valid": {"hit@10": valid["hit@10"], "ndcg@10": valid["ndcg@10"]},
                    "valid_full": {k: both["full"][k] for k in ("hit@10", "ndcg@10")},
                    "train_seconds": round(train_seconds, 3),
                    "valid_seconds": round(time.perf_counter() - t1, 3),
                    # torchrun's processes that trained this epoch: a --resume may change them
                    "processes": ranks.size,
                }
                if done < steps:
                    record["steps"] = f"{done}/{steps}"  # the epoch the time limit cut
                elapsed += time.perf_counter() - t0
                selected = both[config.select]  # picks the best epoch; what patience watches
                improved = best_epoch == 0 or better(selected, best_selected)
                if improved:
                    best_epoch, best_valid, bad_epochs = epoch, valid, 0
                    best_selected, best_full = selected, both["full"]
                    if run_dir is None:  # otherwise best.pt holds them
                        best_state = {
                            k: v.detach().clone() for k, v in model.state_dict().items()
                        }
                else:
                    bad_epochs += 1
                record["best"] = improved
                history.append(record)
                meta = {
                    **extras,
                    "train_config": config.to_dict(),
                    "adversarial": adversarial.to_dict() if adversarial else None,
                    "history": history,
                    "best_epoch": best_epoch,
                    "best_valid": best_valid,
                    "best_valid_full": best_full,
                    "seconds": elapsed,
                }
                if run_dir is not None and improved:
                    save_checkpoint(
                        run_dir / "best.pt",
                        model,
                        data_fingerprint=data.fingerprint,
                        epoch=epoch,
                        valid=valid,
                        **meta,
                    )
            if run_dir is not None:
                resume_state = {} if average is None else {"weight_average": average.state_dict()}
                save_checkpoint(
                    run_dir / "last.pt",
                    model,
                    data_fingerprint=data.fingerprint,
                    epoch=epoch,
                    valid=valid,
                    optimizer=optimizer.state_dict(),
                    rng=_rng_state(generator),
                    bad_epochs=bad_epochs,
                    **resume_state,
                    **meta,
                )
            progress.epoch(record)
            if on_epoch is not None:
                on_epoch(record)
            stopped_early = config.patience > 0 and bad_epochs >= config.patience
            # no room left for another epoch's training beside its validation: stop here (what
            # spent_time_limit says of a resumed run)
            no_room = limit and elapsed + record["valid_seconds"] >= limit
            if limit and ranks.distributed:
                # rank 0's clock decides for all: each rank's own differs (rank 1's counts the
                # wait while rank 0 writes checkpoints), and a rank that stopped alone left the
                # others waiting in the next step's all-reduce (QA: --time-limit under torchrun
                # hung)
                no_room = from_main(bool(no_room))
            if out_of_time or (no_room and epoch < config.epochs):
                stopped_early = out_of_time = True
    finally:
        progress.finish()
        for module, flag in sparse_before.items():
            module.sparse = flag
        if compiled:
            model.compile_scores(False)

    # leave the model holding its best weights (rank 0 wrote them: wait for it)
    barrier()
    if run_dir is not None and (run_dir / "best.pt").is_file():
        from masr.checkpoint import load_checkpoint

        model.load_state_dict(load_checkpoint(run_dir / "best.pt")["state_dict"])
    elif best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        best_epoch=best_epoch,
        best_valid=best_valid,
        history=history,
        stopped_early=stopped_early,
        seconds=elapsed,
        extra={
            "stopped_by_time_limit": out_of_time,
            "best_valid_full": best_full,
            "valid_sample": config.valid_sample,
        },
    )
