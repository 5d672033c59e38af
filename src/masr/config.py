"""The typed settings every part of masr reads: one default and one check per setting.

Torch-free (the CLI builds its options, defaults and choices from this module before any heavy
import). Checkpoints and ``run.json`` store these dataclasses as plain dicts (``to_dict``) and
rebuild them with ``from_dict``; a config is checked when it is made, so an invalid one never
exists and no caller has to remember to validate it. Check messages name the CLI option.

* ``TrainConfig``: one gradient-training phase (BPR of eq. 21);
* ``AdversarialConfig``: what APR (eqs. 22-24) adds on top;
* ``RunOptions``: everything ``masr train`` decides for the runs of a plan, with the merge
  that ``--resume`` uses;
* ``ALPHA`` / ``check_alpha``: the fusion weight of eq. 20, for training, the models and export;
* ``EXPORT_CHUNK``: catalog songs per step of the exported graph's MASS loop;
* ``Columns``, ``ExportConfig``, ``ScoreConfig``: the input's id columns, ``masr export`` and
  ``masr score``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from masr.errors import MasrError, check_instance
from masr.seed import MAX_SEED

#: choices of the settings below (the CLI derives its enums from these tuples)
NEG_MODES = ("hardest", "pairs")  # BPR against the closest negative, or against each of them
LOSSES = ("bpr", "softmax")  # eq. 21 (CML: its hinge), or sampled softmax over shared negatives
NEG_SAMPLERS = ("uniform", "popularity", "mixed")  # how negatives are drawn from the catalog
SELECTIONS = ("sampled", "full")  # the validation protocol that picks the best epoch
BATCH_BY = ("row", "playlist")  # what an epoch shuffles (TrainConfig.batch_by)
NOISE_MODES = ("flexible", "fixed")  # APR noise norm: eps * std(parameter), or eps
ENTITIES = ("user", "playlist")  # whose vector ID-only baselines (mfbpr, cml, als) learn
DEVICES = ("auto", "cpu", "cuda")
SPLITS = ("test", "valid")  # held-out splits of a prepared dataset
PROTOCOLS = ("sampled", "full")  # evaluation protocols
#: how ``masr score`` runs: in this process, or as Ray Data batch inference over a cluster
SCORE_ENGINES = ("local", "ray")
#: what ``masr score`` writes: one CSV, or a directory of Parquet parts (the ray engine)
SCORE_FORMATS = ("csv", "parquet")

#: runs ``masr export`` can export: the fusions, or one part
EXPORT_KINDS = ("amasr", "masr", "mdr", "mass", "amdr", "amass")
#: the exported MDR user term of a user the model never saw: from the playlist's songs
#: ("members": the fold-in map of ``masr.foldin``, or their mean), or no user term ("drop")
UNKNOWN_USER_MODES = ("members", "drop")
#: how the export folds in a playlist MDR never saw: the maps fitted on the training playlists
#: (``masr.foldin``), or the plain mean of its songs' vectors
FOLD_IN_MODES = ("map", "mean")

#: eq. 20's weight of MDR in the MASR / AMASR fusion (MASS gets 1 - ALPHA): the paper's 0.5
ALPHA = 0.5
#: the weights ``masr train --alpha auto`` tries for eq. 20 on validation: MASS alone, three
#: fusions (the paper's 0.5 in the middle), MDR alone
ALPHA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
#: catalog songs per step of the exported graph's MASS loop: cache-sized, the fastest measured
#: on CPU (exported/README.md); a GPU wants at least the catalog size
EXPORT_CHUNK = 256


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in [0, 1], else the one error line every user of α raises (also
    for text or None given from Python: "--alpha '0.5': is not a number")."""
    problem = value_kind_problem(alpha, "float")
    if problem is not None:
        raise MasrError(f"--alpha {alpha!r}: {problem}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise MasrError(
            f"--alpha {alpha}: must be between 0 and 1 (eq. 20 weights MDR by α, MASS by 1-α)"
        )
    return float(alpha)


def _raise_first(checks: Iterable[tuple[str, bool, str]]) -> None:
    for option, ok, problem in checks:
        if not ok:
            raise MasrError(f"{option} {problem}")


def _list(choices: tuple[str, ...]) -> str:
    return ", ".join(choices)


def _finite(x: float) -> bool:
    return math.isfinite(x)


#: the largest float32: a rate, weight or temperature past it cannot reach the tensors
FLOAT32_MAX = 3.4028234663852886e38


#: what --time-limit takes
SECONDS_RULE = "must be a finite number of seconds >= 0 (0 = no limit)"


def _seconds(x: float) -> bool:
    """A time limit: finite and >= 0 (NaN and inf fail; inf would be written as Infinity, which
    is not JSON)."""
    return math.isfinite(x) and x >= 0


def _finite32(x: float) -> bool:
    return math.isfinite(x) and abs(x) <= FLOAT32_MAX


def value_kind_problem(value: Any, annotation: str) -> str | None:
    """Why ``value`` does not fit a config field annotated ``annotation`` ("int", "float",
    "str", "bool", "float | None" ...), or None when it fits: ints are integers (numpy's too,
    not bools), floats are real numbers (ints too, not bools; ranges are the checks'). For configs
    built in Python, where no command line has parsed the value: a string where a number
    belongs fails at once, not deep inside training."""
    kinds = [part.strip() for part in annotation.split("|")]
    if value is None:
        return None if "None" in kinds else "is None"
    if isinstance(value, bool):
        return None if "bool" in kinds else "is a bool"
    if "int" in kinds and isinstance(value, numbers.Integral):
        return None
    if "float" in kinds and isinstance(value, numbers.Real):
        return None
    if "str" in kinds and isinstance(value, str):
        return None
    if kinds[0] in ("int", "float", "str", "bool"):
        names = {"int": "an integer", "float": "a number", "str": "text", "bool": "true/false"}
        return "is not " + " or ".join(names[k] for k in kinds if k in names)
    return None  # another annotation (a dict, a tuple): its own checks


def check_kinds(config: Any, options: dict[str, str] | None = None) -> None:
    """One error line for the first field of ``config`` whose value is of the wrong kind
    (``value_kind_problem``), naming its command-line option; numpy integers become ints."""
    for f in fields(config):
        value = getattr(config, f.name)
        problem = value_kind_problem(value, str(f.type))
        if problem is not None:
            option = (options or {}).get(f.name, "--" + f.name.replace("_", "-"))
            # "--epochs '3'", or "--set window='3'" for an option name that ends in "="
            raise MasrError(f"{option}{'' if option.endswith('=') else ' '}{value!r}: {problem}")
        if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)):
            object.__setattr__(config, f.name, int(value))


def check_int(value: Any, option: str) -> None:
    """One error line for a count given from Python that is not an integer ("5", 2.5, None):
    "--full-sample '5': is not an integer", not a TypeError from the range check after it."""
    problem = value_kind_problem(value, "int")
    if problem is not None:
        raise MasrError(f"{option} {value!r}: {problem}")


def as_list(value: Any, one: type | tuple[type, ...] = str) -> list[Any]:
    """``value`` as a list, where a library argument takes several names or paths: a single
    one (a ``one``, e.g. a str or a Path) is a list of itself, not of its letters (QA:
    ``evaluate_runs(data, runs, "amasr")`` looked for runs "a", "m", "s", "r")."""
    return [value] if isinstance(value, one) else list(value)


C = TypeVar("C")


def _from_dict(cls: type[C], values: dict[str, Any]) -> C:
    """``cls(**values)`` keeping only ``cls``'s fields (older or newer files load too)."""
    check_instance(values, dict, f"{cls.__name__}.from_dict")  # None, a list: one line
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class TrainConfig:
    """One gradient-training phase (BPR; APR adds an ``AdversarialConfig``).

    Defaults: the paper's (d 64, lr 1e-3, 4 negatives) except where a search on the validation
    split chose better; see docs/training.md."""

    epochs: int = 50  # passes over the training rows
    batch_size: int = 1024  # training rows per step (paper: 256; docs/training.md)
    lr: float = 1e-3  # Adam learning rate
    reg: float = 0.0  # lambda_Theta of eq. 21 per batch of summed losses (touched params)
    #: "bpr": eq. 21 (the model's pairwise loss; CML's is a hinge); "softmax": cross-entropy of
    #: the positive against it plus ``neg`` negatives shared by the batch (logQ-corrected)
    loss: str = "bpr"
    neg: int = 4  # negatives per positive (bpr), or shared by the batch (softmax)
    neg_mode: str = "hardest"  # bpr: against the closest negative ("hardest") or all ("pairs")
    #: "uniform" over the catalog, "popularity" (proportional to training occurrences) or
    #: "mixed" (half of each)
    neg_sampler: str = "uniform"
    temperature: float = 1.0  # softmax: logits = -distance / temperature
    #: the validation protocol that picks the best epoch and that --patience watches
    select: str = "sampled"
    #: validation cases ranked under the full protocol each epoch (a seeded subset, the same
    #: every epoch; 0 = all); the sampled protocol always uses every case. The paper recipe
    #: only reports it, so 500 keeps its cost small (MASS on AOTM, 1 CPU core: 2,000 cases
    #: took 135-140 s an epoch, as long as the training); the fullrank recipe selects on it
    #: and ranks 2,000 (one standard error of an AOTM full hit@10 ≈ 0.0035)
    valid_sample: int = 500
    max_members: int = 50  # MASS member list cap (uniform sample when longer)
    #: member-reading models (MASS, FISM ...): each training row's member songs are left out
    #: independently with this probability (at least one kept); 0 = off, the paper's
    member_dropout: float = 0.0
    #: decay per step of an exponential moving average of the weights (Polyak averaging;
    #: ``masr.averaging``): validation, best.pt and so evaluation, export and scoring use the
    #: average; 0 = off (the live weights, the paper's)
    ema: float = 0.0
    patience: int = 5  # stop after this many epochs without a better validation; 0 = never
    #: seconds of training and validation per run: the step that passes it ends the epoch
    #: (validated, kept) and the run (torchrun: the epoch that passes it); a fixed budget per
    #: run, e.g. for equal-budget comparisons; 0 = no limit
    time_limit: float = 0.0
    seed: int = 0
    sparse: bool = True  # row-sparse gradients + lazy Adam for embedding tables
    #: member-reading models: rows of this many consecutive batches are sorted by playlist
    #: length before batching (then the batches are shuffled), so a batch pads its member
    #: lists to a similar length instead of to the longest playlist; 0 or 1 = plain shuffle
    sort_window: int = 50
    #: what an epoch shuffles: "row" (training rows, the paper's) or "playlist" (playlists,
    #: each one's rows kept together, so a batch holds whole playlists; MASS then scores its
    #: shared negatives once per playlist, ``MASS._playlist_scores``)
    batch_by: str = "row"

    def __post_init__(self) -> None:
        check_kinds(self)
        _raise_first(
            [
                ("--epochs", self.epochs >= 1, "must be >= 1"),
                ("--batch-size", self.batch_size >= 1, "must be >= 1"),
                ("--lr", self.lr > 0 and _finite32(self.lr), "must be a positive number (float32)"),
                ("--reg", self.reg >= 0 and _finite32(self.reg), "must be >= 0 (a float32)"),
                ("--loss", self.loss in LOSSES, f"must be one of {_list(LOSSES)}"),
                (
                    "--neg",
                    1 <= self.neg <= MAX_SONG_COUNT,
                    f"must be >= 1 and at most {MAX_SONG_COUNT:,}",
                ),
                ("--neg-mode", self.neg_mode in NEG_MODES, f"must be one of {_list(NEG_MODES)}"),
                (
                    "--neg-sampler",
                    self.neg_sampler in NEG_SAMPLERS,
                    f"must be one of {_list(NEG_SAMPLERS)}",
                ),
                (
                    "--temperature",
                    self.temperature > 0 and _finite32(self.temperature),
                    "must be a positive number (float32)",
                ),
                ("--select", self.select in SELECTIONS, f"must be one of {_list(SELECTIONS)}"),
                ("--valid-sample", self.valid_sample >= 0, "must be >= 0 (0 = every case)"),
                ("--max-members", self.max_members >= 1, "must be >= 1"),
                (
                    "--member-dropout",
                    0 <= self.member_dropout < 1 and _finite(self.member_dropout),
                    "must be in [0, 1)",
                ),
                ("--ema", 0 <= self.ema < 1 and _finite(self.ema), "must be in [0, 1) (0 = off)"),
                ("--patience", self.patience >= 0, "must be >= 0 (0 turns early stopping off)"),
                ("--time-limit", _seconds(self.time_limit), SECONDS_RULE),
                ("sort_window", self.sort_window >= 0, "must be >= 0"),
                ("--batch-by", self.batch_by in BATCH_BY, f"must be one of {_list(BATCH_BY)}"),
                ("--seed", 0 <= self.seed <= MAX_SEED, "must be in [0, 2^63 - 1]"),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``member_dropout``, ``ema`` and ``batch_by`` only when on (not "row"), so
        a run trained before they existed keeps its signature (and is reused)."""
        values = asdict(self)
        for name in ("member_dropout", "ema"):
            if not values[name]:
                del values[name]
        if values["batch_by"] == "row":
            del values["batch_by"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return _from_dict(cls, values)


@dataclass
class AdversarialConfig:
    """APR (eqs. 22-24): |delta| = eps * std(param) ("flexible") or eps ("fixed")."""

    epochs: int = 50  # APR epochs after the BPR pre-training (--adv-epochs)
    eps: float = 1.0  # epsilon of eqs. 23-24
    reg_adv: float = 1.0  # lambda_delta of eq. 23
    noise: str = "flexible"  # "flexible" (the paper's) or "fixed"
    #: Adam learning rate of the APR phase (--adv-lr); None = the BPR phase's (--lr), the paper's
    lr: float | None = None

    def __post_init__(self) -> None:
        check_kinds(self, {"epochs": "--adv-epochs", "lr": "--adv-lr"})
        _raise_first(
            [
                ("--adv-epochs", self.epochs >= 1, "must be >= 1"),
                (
                    "--adv-lr",
                    self.lr is None or (self.lr > 0 and _finite(self.lr)),
                    "must be a positive number",
                ),
                ("--eps", self.eps >= 0 and _finite(self.eps), "must be >= 0"),
                ("--reg-adv", self.reg_adv >= 0 and _finite(self.reg_adv), "must be >= 0"),
                ("--noise", self.noise in NOISE_MODES, f"must be one of {_list(NOISE_MODES)}"),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``lr`` only when set, so a run that follows --lr keeps the signature and
        files it had before --adv-lr existed (and is reused)."""
        values = asdict(self)
        if values["lr"] is None:
            del values["lr"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AdversarialConfig:
        return _from_dict(cls, values)


#: ``masr train`` option (its Python parameter name) -> where it lives in ``RunOptions``:
#: (section, field) with section "train", "adversarial", "model" or "" (RunOptions itself)
OPTION_PATHS: dict[str, tuple[str, str]] = {
    **{
        p: ("train", p)
        for p in (
            "epochs", "batch_size", "lr", "reg", "loss", "neg", "neg_mode", "neg_sampler",
            "temperature", "select", "valid_sample", "max_members", "member_dropout", "ema",
            "patience", "time_limit", "seed", "sparse", "batch_by",
        )
    },
    "adv_epochs": ("adversarial", "epochs"),
    "eps": ("adversarial", "eps"),
    "reg_adv": ("adversarial", "reg_adv"),
    "noise": ("adversarial", "noise"),
    "adv_lr": ("adversarial", "lr"),
    "dim": ("model", "dim"),
    "entity": ("model", "entity"),
    "alpha": ("", "alpha"),
    "device": ("", "device"),
    "recipe": ("", "recipe"),
}

#: Training recipes: values that ``--recipe NAME`` gives every option not set on the command
#: line, as {section: {field: value}} over ``RunOptions`` (sections "train", "adversarial" and
#: "model", the last applied to every model whose config has the field; "" for the fusions'
#: ``alpha``: a weight, or "auto" for ``alpha_search``).
#: "paper": the paper's recipe (eq. 21 against the closest of 4 uniform negatives, epochs chosen
#: by the sampled protocol) = the plain defaults of the configs above.
#: "fullrank": trained for whole-catalog ranking, what `masr score` does: sampled softmax over
#: negatives shared by the batch, half popularity and half uniform, logQ-corrected; epochs
#: chosen by full-ranking validation. Values from the validation-only search in
#: docs/training.md.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {},
    "fullrank": {
        "train": {
            "loss": "softmax",
            "neg": 1024,
            "neg_sampler": "mixed",
            "temperature": 0.1,
            "select": "full",
            "valid_sample": 2000,
        },
        # MODEL.NAME keys set one model's field (as ``--set mdr.init_std=...``). MDR's (and
        # AMDR's) embeddings start at N(0, 0.002²) instead of the 1/d rule: AMASR on AOTM
        # validation 0.701 / 0.0635 sampled / full hit@10 against 0.679 / 0.0615, the
        # sampled figure higher on every dataset measured, the full one within 1.6 standard
        # errors (docs/training.md, "The embedding initialisation scale")
        "model": {"dropout": 0.0, "mdr.init_std": 0.002},
        # APR's noise ε = 2 (flexible, eq. 24) for AMDR and AMASS: AMASR on AOTM validation
        # 0.7035 / 0.0615 → 0.7208 / 0.0660 sampled / full hit@10, AMDR 0.651 / 0.0575 →
        # 0.703 / 0.0655 (1.5, 3 and 4 lower); higher on the embedded data too
        # (docs/training.md, "APR's noise size under fullrank")
        "adversarial": {"eps": 2.0},
        # the fusions' α of eq. 20 chosen on validation (as --alpha auto) instead of the
        # paper's fixed 0.5; the paper leaves α to a development set and fixes 0.5 in its
        # experiments. On test splits read once after the choice (docs/training.md, "`--alpha
        # auto`"): AOTM-2011's CPU chain chose 0.75, AMASR full hit@10 0.0510 → 0.0593 and
        # sampled 0.711 → 0.722 (case by case: p = 0.0008); three time budgets, where MASS
        # gets an epoch or two, chose 0.75-1 (+0.009-0.010 full); the embedded data's six
        # fusions over three seeds kept 0.5 four times
        "": {"alpha": "auto"},
    },
}
#: Recipe values that replace the above on a CPU: 1,024 shared negatives make a MASS step 10-15x
#: the paper recipe's there, while on AOTM-2011 128 gave the same AMASR validation figure
#: (docs/training.md: 0.0640 full hit@10 at 128 on a CPU, 0.0655 at 1,024 on a GPU). MDR
#: (``mdr.neg``: MDR's runs, AMDR's too) keeps 1,024: its negatives cost one GEMM, and on AOTM
#: validation they lift AMDR by 0.0095-0.0120 full hit@10 over two seeds, AMASR by
#: 0.002-0.0075 (docs/training.md, "MDR's negatives on a CPU"). MASS keeps row batches:
#: ``--batch-by playlist`` makes an AOTM MASS epoch 4-5x cheaper on a CPU, but its MASS
#: reached 0.564 / 0.033 sampled / full validation hit@10 against 0.588 / 0.0355, its AMASR
#: 0.706 / 0.0605 against 0.721 / 0.0660 (docs/training.md, "Training rows scored once per
#: playlist").
CPU_RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "fullrank": {"train": {"neg": 128, "mdr.neg": 1024}}
}
#: the recipe ``masr train`` uses for masr's own models (MDR, MASS, their A-variants, fusions
#: and ablations) when --recipe is not given: the best on AOTM validation under full ranking,
#: with a sampled figure above the paper recipe's (docs/training.md). The baselines keep their
#: own defaults (the paper recipe's) unless --recipe names one.
DEFAULT_RECIPE = "fullrank"
BASELINE_RECIPE = "paper"


#: the model settings that have options of their own (``--dim``, ``--entity``): always in
#: ``RunOptions.model``, None when not given
MODEL_OPTIONS = frozenset(name for sec, name in OPTION_PATHS.values() if sec == "model")


def _unset(model: dict[str, Any], key: str) -> bool:
    """True when ``key`` is not among the model settings: absent, or None for an option that
    is always there (``MODEL_OPTIONS``). A ``--set NAME=none`` is a setting (None asks for the
    model's own default, e.g. ``init_std`` = 1/d) and keeps a recipe's value away."""
    return key not in model or (model[key] is None and key in MODEL_OPTIONS)


def _paths(explicit: set[str]) -> set[tuple[str, str]]:
    """The ``OPTION_PATHS`` (section, field) of the options given on the command line."""
    return {OPTION_PATHS[p] for p in explicit if p in OPTION_PATHS}


@dataclass
class RunOptions:
    """Everything ``masr train`` decides; each run takes the parts that apply to it."""

    train: TrainConfig = field(default_factory=TrainConfig)
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)
    #: model-config overrides (``dim``, ...), applied to every model whose config has that field
    model: dict[str, Any] = field(default_factory=dict)
    #: training values for one model's runs over ``train`` (model name -> TrainConfig fields),
    #: set by recipes' ``MODEL.NAME`` train keys (the CPU recipe's ``mdr.neg``); ``train_for``
    model_train: dict[str, dict[str, Any]] = field(default_factory=dict)
    alpha: float = ALPHA  # eq. 20's weight of MDR in the fusion
    #: ``--alpha auto``: each fusion's α is chosen on validation among ALPHA_GRID by the
    #: ``--select`` protocol (``alpha`` then unused)
    alpha_search: bool = False
    device: str = "auto"
    recipe: str = "paper"  # the recipe the values came from (RECIPES), for the record
    #: torch.compile the training forward pass on a CPU where a model has one (MASS); not part
    #: of a run's signature: the same computation up to float rounding
    compile: bool = True

    def __post_init__(self) -> None:
        kinds = (
            ("train", TrainConfig), ("adversarial", AdversarialConfig), ("model", dict),
            ("model_train", dict), ("alpha_search", bool), ("compile", bool),
        )
        for name, kind in kinds:  # a dict for a config, "no" for a flag: one line, not later
            check_instance(getattr(self, name), kind, f"RunOptions.{name}")
        self.alpha = check_alpha(self.alpha)
        if not isinstance(self.device, str) or not (
            self.device in DEVICES or self.device.startswith("cuda:")
        ):
            raise MasrError(f"--device must be one of {_list(DEVICES)}, not {self.device!r}")
        if self.recipe not in RECIPES:
            raise MasrError(f"--recipe must be one of {_list(tuple(RECIPES))}")

    def with_recipe(
        self, name: str, explicit: set[str] = frozenset(), device: str | None = None
    ) -> RunOptions:
        """These options with recipe ``name``'s values for every option not in ``explicit``
        (the ``OPTION_PATHS`` names given on the command line) and not already in ``model``
        (``--set``); on ``device`` "cpu" with ``CPU_RECIPES``' values over the recipe's.
        ``device`` None: these options' own device ("auto" counts as a GPU here, since this
        module does not import torch; the CLI passes the device it resolved)."""
        if name not in RECIPES:
            raise MasrError(f"--recipe must be one of {_list(tuple(RECIPES))}, not {name!r}")
        explicit = set(as_list(explicit))  # one option's name, not its letters
        unknown = sorted(explicit - set(OPTION_PATHS))
        if unknown:
            raise MasrError(
                f"with_recipe: {', '.join(unknown)} not among the options a recipe sets "
                f"({', '.join(sorted(OPTION_PATHS))})"
            )
        if device is None:
            device = "cuda" if self.device == "auto" else self.device
        recipe = RECIPES[name]
        if device == "cpu":
            cpu = CPU_RECIPES.get(name, {})
            recipe = {sec: {**recipe.get(sec, {}), **cpu.get(sec, {})} for sec in {*recipe, *cpu}}
        given = _paths(explicit)
        train: dict[str, Any] = {}
        model_train = {m: dict(v) for m, v in self.model_train.items()}
        for key, value in recipe.get("train", {}).items():
            # a MODEL.NAME value (``mdr.neg``) is for that model's runs; both yield to --NAME
            scope, dot, field_name = key.rpartition(".")
            if ("train", field_name) in given:
                continue
            if dot:
                model_train.setdefault(scope, {})[field_name] = value
            else:
                train[field_name] = value
        adversarial = {
            k: v for k, v in recipe.get("adversarial", {}).items()
            if ("adversarial", k) not in given
        }
        model = dict(self.model)
        for k, v in recipe.get("model", {}).items():
            # a MODEL.NAME value yields to --set NAME and --set MODEL.NAME alike
            plain = k.partition(".")[2] or k
            if ("model", plain) not in given and _unset(model, plain) and _unset(model, k):
                model[k] = v
        top: dict[str, Any] = {}
        if "alpha" in recipe.get("", {}) and ("", "alpha") not in given:
            alpha = recipe[""]["alpha"]
            top = {"alpha_search": True} if alpha == "auto" else {"alpha": check_alpha(alpha)}
        return replace(
            self,
            train=replace(self.train, **train),
            adversarial=replace(self.adversarial, **adversarial),
            model=model,
            model_train=model_train,
            recipe=name,
            **top,
        )

    def train_for(self, model: str) -> TrainConfig:
        """The training values of ``model``'s runs: ``train`` with its ``model_train`` over it."""
        values = self.model_train.get(model)
        return replace(self.train, **values) if values else self.train

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunOptions:
        check_instance(values, dict, "RunOptions.from_dict")  # None, a list: one line
        return cls(
            train=TrainConfig.from_dict(values.get("train", {})),
            adversarial=AdversarialConfig.from_dict(values.get("adversarial", {})),
            model=dict(values.get("model", {})),
            model_train={m: dict(v) for m, v in values.get("model_train", {}).items()},
            alpha=float(values.get("alpha", ALPHA)),
            alpha_search=bool(values.get("alpha_search", False)),
            device=str(values.get("device", "auto")),
            recipe=str(values.get("recipe", "paper")),
            compile=bool(values.get("compile", True)),
        )

    def merged(
        self, saved: RunOptions, explicit: set[str], settings: Collection[str] = ()
    ) -> RunOptions:
        """These options with every ``OPTION_PATHS`` value not named in ``explicit`` (the
        options given on the command line) taken from ``saved`` (``--resume``: an interrupted
        run continues with the options it was started with). Without ``--recipe`` in
        ``explicit`` the model settings are ``saved``'s too (its recipe's and its ``--set``
        ones), less those given again: ``settings``, the ``--set`` names of this command."""
        explicit, settings = set(as_list(explicit)), as_list(settings)  # not their letters
        sections: dict[str, dict[str, Any]] = {"train": {}, "adversarial": {}, "": {}}
        model = dict(self.model)
        if "recipe" not in explicit:
            again = {*settings} | {name for sec, name in _paths(explicit) if sec == "model"}
            model = {k: v for k, v in saved.model.items() if k not in again}
            model.update({k: v for k, v in self.model.items() if k in again})
            for name in MODEL_OPTIONS - model.keys():  # always present (None: not given)
                model[name] = self.model.get(name)
        for param, (section, name) in OPTION_PATHS.items():
            if param in explicit:
                continue
            if section == "model":
                if name in saved.model:
                    model[name] = saved.model[name]
            elif section:
                sections[section][name] = getattr(getattr(saved, section), name)
            else:
                sections[""][name] = getattr(saved, name)
                if name == "alpha":  # --alpha auto is the same option
                    sections[""]["alpha_search"] = saved.alpha_search
        given = _paths(explicit)
        model_train = {
            m: kept
            for m, values in saved.model_train.items()
            if (kept := {k: v for k, v in values.items() if ("train", k) not in given})
        }
        return replace(
            self,
            train=replace(self.train, **sections["train"]),
            adversarial=replace(self.adversarial, **sections["adversarial"]),
            model=model,
            model_train=model_train,
            **sections[""],
        )


@dataclass(frozen=True)
class Columns:
    """Names of the id columns in the input (``--user-col`` ...) and of its song-order column
    (``--position-col``: None = a column named ``position`` when the input has one)."""

    user: str = "user_id"
    playlist: str = "playlist_id"
    track: str = "track_id"
    position: str | None = None

    def __post_init__(self) -> None:
        check_kinds(self, {k: f"--{k}-col" for k in ("user", "playlist", "track", "position")})

    def as_dict(self) -> dict[str, str]:
        """The three id columns (what an export records for ``masr score``)."""
        return {"user": self.user, "playlist": self.playlist, "track": self.track}


@dataclass
class ExportConfig:
    """What ``masr export`` builds (the CLI fills it from its options)."""

    model: str | None = None  # one of EXPORT_KINDS; None: amasr when its parts exist, else masr
    alpha: float | None = None  # eq. 20's MDR weight; None: the fusion run's, else ALPHA
    chunk: int = EXPORT_CHUNK  # catalog songs per MASS step of the graph
    unknown_user: str = "members"  # MDR user term of an unknown user: UNKNOWN_USER_MODES
    fold_in: str = "map"  # MDR playlist vector of a new playlist: FOLD_IN_MODES
    data: Path | None = None  # prepared data for the id maps; None: found through run.json
    external_data: bool = False  # weights in NAME.onnx.weights even below the 2 GB limit
    candidates: int | None = None  # two-stage graph: MDR proposes N songs, the fusion re-ranks

    def validate(self) -> None:
        """Checked by ``export_model`` (the one consumer), not when made."""
        check_kinds(self)  # "256" for a chunk: one line, not a TypeError in the graph
        if self.model is not None and self.model not in EXPORT_KINDS:
            raise MasrError(f"--model {self.model}: choose one of {_list(EXPORT_KINDS)}")
        if self.alpha is not None:
            check_alpha(self.alpha)
        if self.chunk < 1:
            raise MasrError(f"--chunk {self.chunk}: must be >= 1")
        _check_song_count("--chunk", self.chunk)
        if self.candidates is not None and self.candidates < 1:
            raise MasrError(f"--candidates {self.candidates}: must be >= 1")
        _check_song_count("--candidates", self.candidates)
        if self.fold_in not in FOLD_IN_MODES:
            raise MasrError(f"--fold-in {self.fold_in}: choose one of {_list(FOLD_IN_MODES)}")
        if self.unknown_user not in UNKNOWN_USER_MODES:
            raise MasrError(
                f"unknown_user {self.unknown_user!r}: choose one of {UNKNOWN_USER_MODES}"
            )


#: the largest song count an option may give (the graphs hold counts as int64, ONNX Runtime
#: its shapes; a count past any catalog means the whole catalog anyway)
MAX_SONG_COUNT = 2**31 - 1
#: the most CPU threads or scoring workers asked for (no machine has more cores)
MAX_THREADS = 4096
#: the largest embedding size --dim takes (the GPU searches went to 512)
MAX_DIM = 65536


def _check_song_count(option: str, value: int | None) -> None:
    if value is not None and value > MAX_SONG_COUNT:
        raise MasrError(
            f"{option} {value}: at most {MAX_SONG_COUNT:,} (any count from the catalog's size "
            "up means the whole catalog)"
        )


@dataclass(frozen=True)
class ScoreConfig:
    """Options of ``masr score`` (the CLI fills it)."""

    k: int = 10  # songs per playlist
    batch_size: int | None = None  # playlists per ONNX Runtime call; None: 16 on CPU, 512 on CUDA
    device: str = "auto"  # "auto" (CUDA when it really works, else CPU), "cpu" or "cuda"
    #: the input's id columns; None: those of the data the model was trained on (recorded by
    #: ``masr export``), else user_id, playlist_id, track_id (``masr.score.input_columns``)
    columns: Columns | None = None
    read_rows: int = 200_000  # input rows per read chunk
    #: concurrent ONNX Runtime calls: threads on CPU (local) or Ray actors (ray); None: one per
    #: CPU core (local), one per CPU or GPU of the Ray cluster (ray)
    workers: int | None = None
    candidates: int | None = None  # two-stage exports: songs proposed; None: the export's
    engine: str = "local"  # "local" or "ray" (Ray Data over a cluster, masr.score_ray)
    out_format: str = "csv"  # "csv", or "parquet": a directory of parts (ray engine only)

    def validate(self) -> None:
        """Checked by ``score_file`` (the one consumer), not when made."""
        check_kinds(self)  # "10" for k: one line, not a TypeError
        if self.columns is not None:  # a dict: one line, not an AttributeError mid-read
            check_instance(self.columns, Columns, "ScoreConfig.columns")
        if self.k < 1:
            raise MasrError(f"--k {self.k}: must be >= 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise MasrError(f"--batch-size {self.batch_size}: must be >= 1")
        if self.device not in DEVICES:
            raise MasrError(f"--device {self.device}: choose one of {_list(DEVICES)}")
        if self.read_rows < 1:
            raise MasrError(f"--read-rows {self.read_rows}: must be >= 1")
        if self.workers is not None and not 1 <= self.workers <= MAX_THREADS:
            raise MasrError(f"--workers {self.workers}: must be >= 1 and at most {MAX_THREADS:,}")
        if self.candidates is not None and self.candidates < 1:
            raise MasrError(f"--candidates {self.candidates}: must be >= 1")
        _check_song_count("--candidates", self.candidates)
        if self.engine not in SCORE_ENGINES:
            raise MasrError(f"--engine {self.engine}: choose one of {_list(SCORE_ENGINES)}")
        if self.out_format not in SCORE_FORMATS:
            raise MasrError(f"--format {self.out_format}: choose one of {_list(SCORE_FORMATS)}")
        if self.out_format == "parquet" and self.engine != "ray":
            raise MasrError("--format parquet: needs --engine ray (the local engine writes CSV)")


#: embedding sizes of the paper's Figure 5
REPRODUCE_DIMS = (8, 16, 32, 64)
#: the fixed-noise APR settings (noise, eps) compared with the default flexible noise
REPRODUCE_APR = (("flexible", 0.5), ("fixed", 0.5), ("fixed", 1.0))


#: ``masr reproduce --entities``: train the baselines both ways, or at their default entity
ENTITY_CHOICES = ("both", "default")


@dataclass
class ReproduceConfig:
    """What ``masr reproduce`` runs: every run gets ``time_limit`` seconds of training and
    validation (checked at every step; 0 = no limit), at most ``epochs`` BPR / ``adv_epochs``
    APR epochs, and stops after ``patience`` epochs without a better validation (0 = never)."""

    time_limit: float = 300.0  # seconds per run (--time-limit); 0 = no limit
    epochs: int = 50  # BPR epochs per run at most
    adv_epochs: int = 50  # APR epochs per run at most
    patience: int = TrainConfig.patience  # early stopping of every run (--patience)
    dims: tuple[int, ...] = REPRODUCE_DIMS  # Figure 5's embedding sizes
    #: Figure 5's chain at each size: "masr" (mdr, mass and their fusion) or "amasr" (+ APR)
    dim_chain: str = "masr"
    full_sample: int = 0  # full-ranking test cases per model (0 = all; see masr evaluate)
    attention_cases: int = 500  # Figure 6's cases (0 = all)
    baselines: bool = True  # train Table 2's baselines too
    #: "both": every baseline with an --entity trains user- and playlist-based, and Table 2 keeps
    #: the one better on validation (the paper ran its baselines both ways, section 5.1);
    #: "default": each baseline's default entity only (half their cost)
    entities: str = "both"
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_kinds(self)  # "3" for epochs: one line, not a TypeError
        # sizes, each an integer: a str is not its digits ("16" was the sizes 1 and 6), 8.7 not 8
        sizes = [self.dims] if isinstance(self.dims, (str, numbers.Number)) else self.dims
        if isinstance(self.dims, str) or not isinstance(sizes, Iterable):
            raise MasrError(f"--dims {self.dims!r}: expected sizes like (8, 16, 32, 64)")
        for size in sizes:
            problem = value_kind_problem(size, "int")
            if problem is not None:
                raise MasrError(f"--dims {self.dims!r}: {size!r} {problem}")
        self.dims = tuple(int(d) for d in sizes)
        if len(set(self.dims)) != len(self.dims):
            raise MasrError(f"--dims {self.dims}: a size is given twice; give each once")
        _raise_first(
            [
                ("--time-limit", _seconds(self.time_limit), SECONDS_RULE),
                ("--epochs", self.epochs >= 1, "must be >= 1"),
                ("--adv-epochs", self.adv_epochs >= 1, "must be >= 1"),
                ("--patience", self.patience >= 0, "must be >= 0 (0 = never stop early)"),
                (
                    "--dims",
                    bool(self.dims) and min(self.dims) >= 1 and max(self.dims) <= MAX_DIM,
                    f"must be sizes in [1, {MAX_DIM:,}]",
                ),
                ("--dim-chain", self.dim_chain in ("masr", "amasr"), "must be masr or amasr"),
                ("--full-sample", self.full_sample >= 0, "must be >= 0 (0 = every case)"),
                ("--attention-cases", self.attention_cases >= 0, "must be >= 0"),
                ("--entities", self.entities in ENTITY_CHOICES, "must be both or default"),
                ("--device", self.device in DEVICES, f"must be one of {_list(DEVICES)}"),
                ("--seed", 0 <= self.seed <= MAX_SEED, "must be in [0, 2^63 - 1]"),
            ]
        )
