"""The runs directory: run names, how each run is made, reuse, and the AMASR chain.

A *run* is a trained model under ``runs/<run>/`` (``best.pt``, ``last.pt``, ``run.json``; see
docs/design.md). ``RUNS`` maps each run name to its model class and procedure:

* ``train``: gradient training (BPR, or the model's own ``loss``) from scratch; closed-form
  models (``trainable = False``) are ``fit`` instead;
* ``apr``: APR (eqs. 22-24) starting from the best checkpoint of the run ``start_from``
  (trained first when missing), as the paper's Step 1;
* ``fuse``: MASR (eq. 20) from the best checkpoints of the two ``parts`` (MDR-like, MASS-like),
  frozen; nothing is trained.

``train_run(name)`` makes a run and whatever it needs: ``amasr`` is mdr, mass, their fusion
masr, then amdr (APR from mdr), amass (APR from mass) and their fusion amasr. A needed run is
reused when it finished with the same data fingerprint and the same configuration (its
*signature*); the run asked for is always made again (or continued, with ``resume``).

This module imports torch only inside functions (the CLI imports it for its option defaults).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masr.atomic import atomic_file
from masr.errors import MasrError

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.models.base import Recommender
    from masr.train import TrainProgress

NEG_MODES = ("hardest", "pairs")
NOISE_MODES = ("flexible", "fixed")


@dataclass
class TrainConfig:
    """One gradient-training phase (BPR; APR adds an ``AdversarialConfig``).

    Defaults: the paper's (d 64, lr 1e-3, 4 negatives) except where a search on the validation
    split chose better; see docs/training.md."""

    epochs: int = 50  # passes over the training rows
    batch_size: int = 1024  # training rows per step (paper: 256; docs/training.md)
    lr: float = 1e-3  # Adam learning rate
    reg: float = 0.0  # lambda_Theta of eq. 21 per batch of summed losses (touched params)
    neg: int = 4  # uniform negatives per positive
    neg_mode: str = "hardest"  # "hardest": BPR against the closest negative; "pairs": all pairs
    max_members: int = 50  # MASS member list cap (uniform sample when longer)
    patience: int = 5  # stop after this many epochs without a better validation; 0 = never
    #: stop after the first epoch that ends past this many seconds of training and validation
    #: (a fixed budget per run, e.g. for equal-budget comparisons); 0 = no limit
    time_limit: float = 0.0
    seed: int = 0
    sparse: bool = True  # row-sparse gradients + lazy Adam for embedding tables
    #: member-reading models: rows of this many consecutive batches are sorted by playlist
    #: length before batching (then the batches are shuffled), so a batch pads its member
    #: lists to a similar length instead of to the longest playlist; 0 or 1 = plain shuffle
    sort_window: int = 50

    def validate(self) -> None:
        """MasrError naming the CLI option of the first bad value."""
        checks = [
            ("--epochs", self.epochs >= 1, "must be >= 1"),
            ("--batch-size", self.batch_size >= 1, "must be >= 1"),
            ("--lr", self.lr > 0 and math.isfinite(self.lr), "must be a positive number"),
            ("--reg", self.reg >= 0 and math.isfinite(self.reg), "must be >= 0"),
            ("--neg", self.neg >= 1, "must be >= 1"),
            ("--neg-mode", self.neg_mode in NEG_MODES, f"must be one of {', '.join(NEG_MODES)}"),
            ("--max-members", self.max_members >= 1, "must be >= 1"),
            ("--patience", self.patience >= 0, "must be >= 0 (0 turns early stopping off)"),
            ("--time-limit", self.time_limit >= 0, "must be >= 0 seconds (0 = no limit)"),
            ("sort_window", self.sort_window >= 0, "must be >= 0"),
        ]
        for option, ok, problem in checks:
            if not ok:
                raise MasrError(f"{option} {problem}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class AdversarialConfig:
    """APR (eqs. 22-24): |delta| = eps * std(param) ("flexible") or eps ("fixed")."""

    epochs: int = 50  # APR epochs after the BPR pre-training (--adv-epochs)
    eps: float = 1.0  # epsilon of eqs. 23-24
    reg_adv: float = 1.0  # lambda_delta of eq. 23
    noise: str = "flexible"  # "flexible" (the paper's) or "fixed"

    def validate(self) -> None:
        if self.epochs < 1:
            raise MasrError("--adv-epochs must be >= 1")
        if not (self.eps >= 0 and math.isfinite(self.eps)):
            raise MasrError("--eps must be >= 0")
        if not (self.reg_adv >= 0 and math.isfinite(self.reg_adv)):
            raise MasrError("--reg-adv must be >= 0")
        if self.noise not in NOISE_MODES:
            raise MasrError(f"--noise must be one of {', '.join(NOISE_MODES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AdversarialConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class RunSpec:
    """How a run is made: its model class (registry name) and procedure."""

    model: str
    procedure: str = "train"  # "train" (BPR / fit), "apr" or "fuse"
    start_from: str | None = None  # apr: the run whose best checkpoint it starts from
    parts: tuple[str, ...] = ()  # fuse: (MDR-like run, MASS-like run)
    also: tuple[str, ...] = ()  # runs made first alongside it (amasr also leaves masr)


#: run name -> how to make it. Baselines add one line each, e.g. ``"pop": RunSpec("pop")``.
RUNS: dict[str, RunSpec] = {
    "mdr": RunSpec("mdr"),
    "mass": RunSpec("mass"),
    "masr": RunSpec("masr", "fuse", parts=("mdr", "mass")),
    "amdr": RunSpec("mdr", "apr", start_from="mdr"),
    "amass": RunSpec("mass", "apr", start_from="mass"),
    "amasr": RunSpec("masr", "fuse", parts=("amdr", "amass"), also=("masr",)),
    # Baselines (issue 5): closed-form ones are fit, the others trained like mdr.
    "pop": RunSpec("pop"),
    "itemknn": RunSpec("itemknn"),
    "ease": RunSpec("ease"),
    "als": RunSpec("als"),
    "mfbpr": RunSpec("mfbpr"),
    "cml": RunSpec("cml"),
    "fism": RunSpec("fism"),
    "neumf": RunSpec("neumf"),
    "cmn": RunSpec("cmn"),
    "prme": RunSpec("prme"),
    "transrec": RunSpec("transrec"),
    "caser": RunSpec("caser"),
}


@dataclass
class RunOptions:
    """Everything ``masr train`` decides; each run takes the parts that apply to it."""

    train: TrainConfig = field(default_factory=TrainConfig)
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)
    #: model-config overrides (``dim``, ...), applied to every model whose config has that field
    model: dict[str, Any] = field(default_factory=dict)
    alpha: float = 0.5  # eq. 20's weight of MDR in the fusion
    device: str = "auto"

    def validate(self) -> None:
        self.train.validate()
        self.adversarial.validate()
        if not 0.0 <= self.alpha <= 1.0:
            raise MasrError("--alpha must be between 0 and 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunOptions:
        return cls(
            train=TrainConfig.from_dict(values.get("train", {})),
            adversarial=AdversarialConfig.from_dict(values.get("adversarial", {})),
            model=dict(values.get("model", {})),
            alpha=float(values.get("alpha", 0.5)),
            device=str(values.get("device", "auto")),
        )


@dataclass
class RunOutcome:
    """What ``train_run`` did with one run of the plan."""

    run: str
    action: str  # "trained", "resumed", "reused", "fitted", "fused"
    best_epoch: int
    valid: dict[str, float]
    seconds: float


def run_spec(name: str) -> RunSpec:
    if name not in RUNS:
        raise MasrError(f"--model {name}: unknown model; choose from {', '.join(RUNS)}")
    return RUNS[name]


def plan(name: str) -> list[str]:
    """The runs ``name`` needs, dependencies first; ``amasr``: mdr, mass, masr, amdr, amass,
    amasr (the paper's Steps: BPR models, their fusion, APR from them, the adversarial fusion)."""
    spec = run_spec(name)
    needs = [*spec.also, *([spec.start_from] if spec.start_from else spec.parts)]
    order: list[str] = []
    for dep in needs:
        for r in plan(dep):
            if r not in order:
                order.append(r)
    return [*order, name]


def model_config(name: str, overrides: dict[str, Any]) -> Any:
    """The typed config of run ``name``'s model with the overrides its config has fields for."""
    from masr.models import model_class

    cls = model_class(run_spec(name).model)
    names = {f.name for f in fields(cls.config_class)}
    return cls.config_class(**{k: v for k, v in overrides.items() if k in names and v is not None})


def signature(name: str, options: RunOptions, fingerprint: str) -> dict[str, Any]:
    """Everything that determines run ``name``'s result: equal signatures -> reusable run."""
    spec = run_spec(name)
    sig: dict[str, Any] = {"run": name, "model": spec.model, "procedure": spec.procedure}
    sig["data"] = fingerprint
    if spec.procedure == "fuse":
        sig["alpha"] = options.alpha
        sig["parts"] = [signature(p, options, fingerprint) for p in spec.parts]
        return sig
    sig["model_config"] = model_config(name, options.model).to_dict()
    sig["train"] = options.train.to_dict()
    if spec.procedure == "apr":
        sig["adversarial"] = options.adversarial.to_dict()
        sig["start"] = signature(spec.start_from or "", options, fingerprint)
    return sig


def _resumable(sig: dict[str, Any]) -> dict[str, Any]:
    """A signature without what --resume may change (epochs, patience, time limit)."""
    out = json.loads(json.dumps(sig))
    for key in ("train",):
        if key in out:
            out[key].pop("epochs", None)
            out[key].pop("patience", None)
            out[key].pop("time_limit", None)
    if "adversarial" in out:
        out["adversarial"].pop("epochs", None)
    return out


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two signatures (``old -> new``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += _differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [f"{prefix[:-1]} {old} -> {new}"]


def read_run_json(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "run.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_run_json(run_dir: Path, info: dict[str, Any]) -> None:
    with atomic_file(run_dir / "run.json", "w") as fh:
        json.dump(info, fh, indent=2, default=str)
        fh.write("\n")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def saved_options(runs_dir: str | Path, name: str) -> RunOptions | None:
    """The options the latest run of ``name``'s plan was made with (for ``--resume``)."""
    for run in reversed(plan(name)):
        info = read_run_json(Path(runs_dir) / run)
        if info is not None and isinstance(info.get("options"), dict):
            return RunOptions.from_dict(info["options"])
    return None


def available_runs(runs_dir: str | Path) -> list[str]:
    """Run names under ``runs_dir`` that have a best checkpoint, in table order."""
    from masr.evaluate import run_order

    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return run_order([p.name for p in runs_dir.iterdir() if (p / "best.pt").is_file()])


def load_run(
    runs_dir: str | Path, name: str, data: PreparedData | None = None, device: Any = "cpu"
) -> tuple[Recommender, dict[str, Any]]:
    """The best model of run ``name`` (checking it was made on ``data`` when given)."""
    from masr.checkpoint import load_model

    path = Path(runs_dir) / name / "best.pt"
    if not path.is_file():
        have = available_runs(runs_dir)
        raise MasrError(
            f"--model {name}: no trained run at {path}"
            + (f" (trained: {', '.join(have)})" if have else f"; run `masr train --model {name}`")
        )
    model, ckpt = load_model(path, device)
    if data is not None and ckpt.get("data_fingerprint") != data.fingerprint:
        raise MasrError(
            f"{path}: trained on other prepared data (fingerprint {ckpt.get('data_fingerprint')}, "
            f"{data.path} has {data.fingerprint}); retrain or pass the matching --data"
        )
    return model, ckpt


def train_run(
    name: str,
    data: PreparedData,
    runs_dir: str | Path,
    options: RunOptions | None = None,
    *,
    resume: bool = False,
    progress: TrainProgress | None = None,
    log: Callable[[str], None] | None = None,
) -> list[RunOutcome]:
    """Make run ``name`` (and the runs it needs) in ``runs_dir``; one outcome per planned run."""
    options = options or RunOptions()
    options.validate()
    from masr.train import resolve_device

    device = resolve_device(options.device)
    log = log or (lambda _msg: None)
    runs_dir = Path(runs_dir)
    outcomes = []
    for run in plan(name):
        outcomes.append(
            _make(run, run == name, data, runs_dir, options, device, resume, progress, log)
        )
    return outcomes


def _make(
    run: str,
    target: bool,
    data: PreparedData,
    runs_dir: Path,
    options: RunOptions,
    device: Any,
    resume: bool,
    progress: TrainProgress | None,
    log: Callable[[str], None],
) -> RunOutcome:
    spec = run_spec(run)
    run_dir = runs_dir / run
    sig = signature(run, options, data.fingerprint)
    info = read_run_json(run_dir)
    finished = (
        info is not None and info.get("status") == "finished" and (run_dir / "best.pt").is_file()
    )
    if finished and info is not None and info.get("signature") == sig and not target:
        best = info.get("best", {})
        log(f"{run}: reusing {run_dir} (same data and configuration)")
        return RunOutcome(run, "reused", best.get("epoch", 0), best.get("valid", {}), 0.0)

    if spec.procedure == "fuse":
        return _fuse(run, spec, data, runs_dir, options, sig, device, log)

    from masr.models import model_class

    cls = model_class(spec.model)
    if not cls.trainable:
        return _fit(run, spec, data, run_dir, options, sig, device, log)

    from masr.checkpoint import build_model, load_checkpoint
    from masr.train import train_model

    train_cfg = options.train
    adversarial = None
    if spec.procedure == "apr":
        adversarial = options.adversarial
        train_cfg = replace(options.train, epochs=options.adversarial.epochs)

    resume_state = None
    can_resume = (
        resume
        and info is not None
        and (run_dir / "last.pt").is_file()
        and _resumable(info.get("signature", {})) == _resumable(sig)
    )
    if resume and not can_resume and info is not None and (run_dir / "last.pt").is_file():
        changed = _differences(_resumable(info.get("signature", {})), _resumable(sig))
        raise MasrError(
            f"{run_dir / 'last.pt'}: cannot --resume, made with other data or options "
            f"({', '.join(changed[:4]) or 'unknown'}); pass the same options or drop --resume"
        )
    if can_resume:
        resume_state = load_checkpoint(run_dir / "last.pt")
        model = build_model(resume_state, device)
        log(f"{run}: resuming {run_dir} after epoch {resume_state['epoch']}")
    elif spec.procedure == "apr":
        start_dir = runs_dir / (spec.start_from or "")
        model, ckpt = load_run(runs_dir, spec.start_from or "", data, device)
        log(f"{run}: APR from {start_dir / 'best.pt'} (epoch {ckpt.get('epoch')})")
    else:
        from masr.seed import set_seed

        set_seed(options.train.seed, deterministic=False)  # the initialisation is seeded too
        model = cls(
            model_config(run, options.model), data.n_users, data.n_playlists, data.n_songs
        )

    if resume_state is None:
        _clear(run_dir)
    started = time.perf_counter()
    info = {
        "run": run,
        "model": spec.model,
        "procedure": spec.procedure,
        "status": "running",
        "signature": sig,
        "model_config": model.config.to_dict(),
        "train_config": train_cfg.to_dict(),
        "adversarial": adversarial.to_dict() if adversarial else None,
        "start_from": spec.start_from,
        "data": {"path": str(data.path), "fingerprint": data.fingerprint},
        "device": str(device),
        "options": options.to_dict(),
        "started": _now(),
        "history": list(resume_state["history"]) if resume_state else [],
    }
    _write_run_json(run_dir, info)

    def on_epoch(record: dict[str, Any]) -> None:
        info["history"].append(record)
        _write_run_json(run_dir, info)

    result = train_model(
        model,
        data,
        train_cfg,
        device=device,
        run_dir=run_dir,
        adversarial=adversarial,
        resume=resume_state,
        progress=progress,
        on_epoch=on_epoch,
        extras={"run": run},
        title=run,
    )
    info.update(
        status="finished",
        finished=_now(),
        best={"epoch": result.best_epoch, "valid": result.best_valid},
        stopped_early=result.stopped_early,
        stopped_by_time_limit=result.extra.get("stopped_by_time_limit", False),
        seconds=round(result.seconds, 3),
        wall_seconds=round(time.perf_counter() - started, 3),
    )
    _write_run_json(run_dir, info)
    return RunOutcome(
        run,
        "resumed" if resume_state else "trained",
        result.best_epoch,
        result.best_valid,
        result.seconds,
    )


def _clear(run_dir: Path) -> None:
    """Remove a previous run's files so that a fresh run never mixes with them."""
    if run_dir.exists():
        for name in ("best.pt", "last.pt", "run.json"):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def _valid_metrics(model: Recommender, data: PreparedData, device: Any) -> dict[str, float]:
    from masr.evaluate import evaluate_model

    return evaluate_model(model, data, "valid", device=device, protocols=("sampled",))["sampled"]


def _save_single(
    run: str,
    spec: RunSpec,
    model: Recommender,
    data: PreparedData,
    run_dir: Path,
    sig: dict[str, Any],
    device: Any,
    started: float,
    extra_info: dict[str, Any],
) -> RunOutcome:
    """Validate, write best.pt and run.json for a run made in one go (fit, fuse)."""
    from masr.checkpoint import save_checkpoint

    valid = _valid_metrics(model, data, device)
    seconds = time.perf_counter() - started
    _clear(run_dir)
    save_checkpoint(
        run_dir / "best.pt",
        model,
        data_fingerprint=data.fingerprint,
        run=run,
        epoch=0,
        valid=valid,
        best_epoch=0,
        best_valid=valid,
        seconds=seconds,
        **extra_info,
    )
    info = {
        "run": run,
        "model": spec.model,
        "procedure": spec.procedure,
        "status": "finished",
        "signature": sig,
        "model_config": model.config.to_dict(),
        "data": {"path": str(data.path), "fingerprint": data.fingerprint},
        "device": str(device),
        "finished": _now(),
        "history": [],
        "best": {"epoch": 0, "valid": valid},
        "seconds": round(seconds, 3),
        "wall_seconds": round(seconds, 3),
        **extra_info,
    }
    _write_run_json(run_dir, info)
    return RunOutcome(run, "fused" if spec.procedure == "fuse" else "fitted", 0, valid, seconds)


def _fit(
    run: str,
    spec: RunSpec,
    data: PreparedData,
    run_dir: Path,
    options: RunOptions,
    sig: dict[str, Any],
    device: Any,
    log: Callable[[str], None],
) -> RunOutcome:
    from masr.models import model_class
    from masr.seed import set_seed

    started = time.perf_counter()
    set_seed(options.train.seed, deterministic=False)
    cls = model_class(spec.model)
    model = cls(model_config(run, options.model), data.n_users, data.n_playlists, data.n_songs)
    model.to(device)
    log(f"{run}: fitting {cls.__name__} (closed form)")
    model.fit(data, device)
    model.eval()
    return _save_single(
        run, spec, model, data, run_dir, sig, device, started, {"options": options.to_dict()}
    )


def _fuse(
    run: str,
    spec: RunSpec,
    data: PreparedData,
    runs_dir: Path,
    options: RunOptions,
    sig: dict[str, Any],
    device: Any,
    log: Callable[[str], None],
) -> RunOutcome:
    from masr.models import model_class

    started = time.perf_counter()
    parts = [load_run(runs_dir, part, data, device)[0] for part in spec.parts]
    cls = model_class(spec.model)
    fused = cls.from_parts(*parts, alpha=options.alpha, parts=list(spec.parts))  # type: ignore[attr-defined]
    fused.to(device).eval()
    log(f"{run}: fusing {' + '.join(spec.parts)} with alpha {options.alpha} (eq. 20)")
    extra = {"parts": list(spec.parts), "alpha": options.alpha, "options": options.to_dict()}
    return _save_single(run, spec, fused, data, runs_dir / run, sig, device, started, extra)


def evaluate_runs(
    data: PreparedData,
    runs_dir: str | Path,
    names: Sequence[str] = ("all",),
    *,
    split: str = "test",
    device: str = "auto",
    protocols: Sequence[str] = ("sampled", "full"),
    full_sample: int = 0,
    sample_seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{run: {"sampled": metrics, "full": metrics}}`` for the named runs (``all`` = every
    run in ``runs_dir``), in table order; ``full_sample``: see ``evaluate_model``."""
    from masr.evaluate import evaluate_model, run_order
    from masr.sampling import TrainingIndex
    from masr.train import resolve_device

    log = log or (lambda _msg: None)
    runs_dir = Path(runs_dir)
    wanted: list[str] = []
    for n in names:
        if n == "all":
            found = available_runs(runs_dir)
            if not found:
                raise MasrError(
                    f"{runs_dir}: no trained runs; run `masr train --model amasr --runs {runs_dir}`"
                )
            wanted += [r for r in found if r not in wanted]
        elif n not in wanted:
            wanted.append(n)
    dev = resolve_device(device)
    index = TrainingIndex.from_data(data, dev)
    results = {}
    for run in run_order(wanted):
        model, _ = load_run(runs_dir, run, data, dev)
        t0 = time.perf_counter()
        results[run] = evaluate_model(
            model,
            data,
            split,
            protocols=protocols,
            index=index,
            full_sample=full_sample,
            sample_seed=sample_seed,
        )
        log(f"{run}: evaluated on {split} in {time.perf_counter() - t0:.1f} s")
    return results

