"""Run names: how each run is made, what it needs, what determines it, and its table label.

A *run* is a trained model under ``runs/<run>/`` (``best.pt``, ``last.pt``, ``run.json``; see
docs/design.md). ``RUNS`` maps each run name to its model class and procedure:

* ``train``: gradient training (BPR, or the model's own ``loss``) from scratch; closed-form
  models (``trainable = False``) are ``fit`` instead;
* ``apr``: APR (eqs. 22-24) starting from the best checkpoint of the run ``start_from``
  (trained first when missing), as the paper's Step 1;
* ``fuse``: MASR (eq. 20) from the best checkpoints of the two ``parts`` (MDR-like, MASS-like),
  frozen; nothing is trained;
* ``pretrained``: gradient training like ``train``, starting from the best checkpoints of its
  ``parts`` combined by the model class's ``from_branches`` (NeuMF: the GMF and MLP branches
  trained alone first, NCF section 3.4.1).

A run may fix model settings (``RunSpec.settings``): the ablations of the paper's Table 3 are
runs of their own (``mdr_us`` is MDR with ``terms="us"``), so their checkpoints never overwrite
the paper's models; ``--set`` cannot contradict a fixed setting.

A run's *signature* is everything that determines its result; equal signatures make a finished
run reusable. The labels and order of the paper's Table 2 live here too, so that listing runs
(the store) never needs the report. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

from masr.config import BASELINE_RECIPE, DEFAULT_RECIPE, RunOptions
from masr.errors import MasrError


@dataclass(frozen=True)
class RunSpec:
    """How a run is made: its model class (registry name) and procedure."""

    model: str
    procedure: str = "train"  # "train" (BPR / fit), "apr", "fuse" or "pretrained"
    start_from: str | None = None  # apr: the run whose best checkpoint it starts from
    parts: tuple[str, ...] = ()  # fuse: (MDR-like run, MASS-like run); pretrained: branches
    also: tuple[str, ...] = ()  # runs made first alongside it (amasr also leaves masr)
    #: model-config fields this run fixes, e.g. (("terms", "us"),): they override the defaults,
    #: a contradicting --set is an error, and they are part of the run's signature
    settings: tuple[tuple[str, Any], ...] = ()


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
    # NeuMF++ (NCF section 3.4.1): each branch trained alone, then the fused model from both
    "neumf_gmf": RunSpec("neumf", settings=(("branch", "gmf"),)),
    "neumf_mlp": RunSpec("neumf", settings=(("branch", "mlp"),)),
    "neumf": RunSpec("neumf", "pretrained", parts=("neumf_gmf", "neumf_mlp")),
    "cmn": RunSpec("cmn"),
    "prme": RunSpec("prme"),
    "transrec": RunSpec("transrec"),
    "caser": RunSpec("caser"),
    # Table 3's ablations (section 5.3): MDR with one term of eq. 11, MASS with other contexts
    "mdr_us": RunSpec("mdr", settings=(("terms", "us"),)),
    "mdr_ps": RunSpec("mdr", settings=(("terms", "ps"),)),
    "mass_ups": RunSpec("mass", settings=(("context", "user+playlist"),)),
    "mass_ps": RunSpec("mass", settings=(("context", "playlist"),)),
}


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
    """The typed config of run ``name``'s model with the overrides its config has fields for
    (``MODEL.NAME`` keys for this run's model over plain ``NAME`` keys)."""
    from masr.models import model_class

    spec = run_spec(name)
    cls = model_class(spec.model)
    names = {f.name for f in fields(cls.config_class)}
    values = {k: v for k, v in overrides.items() if k in names and v is not None}
    # MODEL.NAME overrides (``--set mdr.dropout=0.7``) win over NAME for that model's runs
    for key, value in overrides.items():
        scope, dot, field_name = key.partition(".")
        if dot and scope == spec.model and field_name in names and value is not None:
            values[field_name] = value
    for key, fixed in spec.settings:
        if values.get(key, fixed) != fixed:
            raise MasrError(
                f"--set {key}={values[key]}: run {name} fixes {key}={fixed} "
                f"(train --model {spec.model} --set {key}={values[key]} instead)"
            )
        values[key] = fixed
    return cls.config_class(**values)


def signature(name: str, options: RunOptions, fingerprint: str) -> dict[str, Any]:
    """Everything that determines run ``name``'s result: equal signatures -> reusable run."""
    from masr.models import model_class

    spec = run_spec(name)
    sig: dict[str, Any] = {"run": name, "model": spec.model, "procedure": spec.procedure}
    if spec.settings:
        sig["settings"] = dict(spec.settings)
    sig["data"] = fingerprint
    if spec.procedure == "fuse":
        sig["alpha"] = "auto" if options.alpha_search else options.alpha
        sig["parts"] = [signature(p, options, fingerprint) for p in spec.parts]
        return sig
    sig["model_config"] = model_config(name, options.model).to_dict()
    sig["train"] = options.train_for(spec.model).to_dict()
    if not model_class(spec.model).uses_members:
        sig["train"].pop("member_dropout", None)  # changes nothing for these models
    if spec.procedure == "apr":
        sig["adversarial"] = options.adversarial.to_dict()
        sig["start"] = signature(spec.start_from or "", options, fingerprint)
    if spec.procedure == "pretrained":
        sig["parts"] = [signature(p, options, fingerprint) for p in spec.parts]
    return sig


def upgraded(old: Any, new: Any) -> Any:
    """``old``, a signature an earlier masr wrote, with the config fields it predates filled in
    from ``new`` where ``new`` holds them at their default: a field is added to a config with
    the default that keeps what the code did before it existed (MASS's ``song_init="random"``),
    so such a run was made the same way and stays reusable after an upgrade instead of being
    trained again. A field the older run lacks but that ``new`` sets to anything else is left
    missing, so that difference still counts. At every level (an APR run's ``start``, a
    fusion's ``parts``)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return old
    from masr.config import AdversarialConfig, TrainConfig
    from masr.models import REGISTRY, model_class

    out = dict(old)
    sections: dict[str, Any] = {"train": TrainConfig, "adversarial": AdversarialConfig}
    if new.get("model") in REGISTRY:
        sections["model_config"] = model_class(str(new["model"])).config_class
    for section, cls in sections.items():
        was, now = out.get(section), new.get(section)
        if not (isinstance(was, dict) and isinstance(now, dict)):
            continue
        filled = dict(was)
        for f in fields(cls):
            predates = f.name not in filled and f.name in now  # a field added since
            if predates and f.default is not MISSING and now[f.name] == f.default:
                filled[f.name] = now[f.name]
        out[section] = filled
    if isinstance(out.get("start"), dict):
        out["start"] = upgraded(out["start"], new.get("start"))
    if isinstance(out.get("parts"), list) and isinstance(new.get("parts"), list):
        out["parts"] = [upgraded(o, n) for o, n in zip(out["parts"], new["parts"], strict=False)]
    return out


def same_signature(old: Any, new: dict[str, Any]) -> bool:
    """True when a run made with signature ``old`` is the run ``new`` asks for (``upgraded``),
    the training values it does not read aside (``read_by_run``)."""
    return read_by_run(upgraded(old, new)) == read_by_run(new)


#: training values that only runs of member-reading models read (MASS, FISM, ...): MDR trained
#: with --max-members 3 or 50 is the same run, to its last loss digit (QA)
MEMBER_TRAIN_FIELDS = ("max_members", "member_dropout", "sort_window")


def read_by_run(sig: Any) -> Any:
    """A signature without the training values its run does not read, at every level: those of
    the other training loss (``LOSS_OPTIONS``: --temperature without softmax, --neg-mode
    without bpr) and ``MEMBER_TRAIN_FIELDS`` for models that read no members. A run made with
    --neg-mode pairs under softmax is the run asked for with --neg-mode hardest, so it is
    reused (and resumed) rather than trained again to identical losses. The signatures stored
    stay whole: only comparisons read them through this."""
    if not isinstance(sig, dict):
        return sig
    out = json.loads(json.dumps(sig))
    _drop_unread(out)
    return out


def _drop_unread(sig: dict[str, Any]) -> None:
    from masr.models import REGISTRY, model_class

    train = sig.get("train")
    if isinstance(train, dict):
        loss = train.get("loss", "bpr")
        for key, only in LOSS_OPTIONS.items():
            if only != loss:
                train.pop(key, None)
        model = sig.get("model")
        if model in REGISTRY and not model_class(str(model)).uses_members:
            for key in MEMBER_TRAIN_FIELDS:
                train.pop(key, None)
    if isinstance(sig.get("start"), dict):
        _drop_unread(sig["start"])
    for part in sig.get("parts", []) if isinstance(sig.get("parts"), list) else []:
        if isinstance(part, dict):
            _drop_unread(part)


def resumable(sig: dict[str, Any]) -> dict[str, Any]:
    """A signature without what --resume may change (epochs, patience, time limit) and what
    its run does not read (``read_by_run``), at every level: an APR run's ``start`` and a
    fusion's ``parts`` are signatures of their own."""
    out = read_by_run(sig)
    _drop_resumable(out)
    return out


def _drop_resumable(sig: dict[str, Any]) -> None:
    for key in ("epochs", "patience", "time_limit"):
        sig.get("train", {}).pop(key, None)
    sig.get("adversarial", {}).pop("epochs", None)
    if isinstance(sig.get("start"), dict):
        _drop_resumable(sig["start"])
    for part in sig.get("parts", []):
        if isinstance(part, dict):
            _drop_resumable(part)


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two signatures (``old -> new``); lists of as
    many entries (a fusion's or NeuMF's ``parts``) entry by entry, each named by its run."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            out += differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (was, now) in enumerate(zip(old, new, strict=True)):
            same_run = isinstance(was, dict) and isinstance(now, dict) and "run" in was
            name = was["run"] if same_run and was.get("run") == now.get("run") else i
            out += differences(was, now, f"{prefix}{name}.")
        return out
    return [] if old == new else [f"{prefix[:-1]} {old} -> {new}"]


def read_differences(
    old: Any, new: Any, view: Callable[[Any], Any] | None = None
) -> list[str]:
    """The ``differences`` between two signatures that count for their run (those between
    ``view(old)`` and ``view(new)``; ``view``: ``read_by_run``, or ``resumable``), with the
    values each signature records: a run made under softmax and asked for under bpr differs
    in ``train.loss softmax -> bpr``, not also in a ``train.neg_mode None -> hardest`` that
    only the view's leaving out unread values makes (QA)."""
    view = view or read_by_run
    counted = differences(view(old), view(new))
    keys = {line.split(" ", 1)[0] for line in counted}
    whole = [line for line in differences(old, new) if line.split(" ", 1)[0] in keys]
    return whole or counted


# --- the paper's Table 2: labels and order ----------------------------------------------

#: the paper's baselines (a)-(h) in its order, then the other baselines masr ships
PAPER_BASELINES = (
    ("mfbpr", "MF-BPR"),
    ("cml", "CML"),
    ("neumf", "NeuMF++"),
    ("fism", "FISM"),
    ("cmn", "CMN++"),
    ("prme", "PRME"),
    ("transrec", "TransRec"),
    ("caser", "Caser"),
)
#: the paper's baselines masr does not implement yet: listed as "not yet run" (none left)
NOT_YET_RUN: tuple[str, ...] = ()
EXTRA_BASELINES = (
    ("pop", "Popularity"),
    ("itemknn", "item-kNN"),
    ("ease", "EASE"),
    ("als", "ALS"),
    ("neumf_gmf", "GMF (NeuMF++'s pre-training)"),
    ("neumf_mlp", "MLP (NeuMF++'s pre-training)"),
)
OURS = (
    ("mdr", "MDR"),
    ("mass", "MASS"),
    ("masr", "MASR"),
    ("amdr", "AMDR"),
    ("amass", "AMASS"),
    ("amasr", "AMASR"),
)
IMPROVED = ("masr", "amasr")
#: the paper's Table 3 ablations (``mdr`` and ``mass`` are its MDR_ups and MASS_us)
ABLATIONS = (
    ("mdr_us", "MDR_us"),
    ("mdr_ps", "MDR_ps"),
    ("mass_ups", "MASS_ups"),
    ("mass_ps", "MASS_ps"),
)
#: Table 3's rows in the paper's order: (run, label)
TABLE3 = (
    ("mdr_us", "MDR_us"),
    ("mdr_ps", "MDR_ps"),
    ("mdr", "MDR_ups (MDR)"),
    ("mass", "MASS_us (MASS)"),
    ("mass_ps", "MASS_ps"),
    ("mass_ups", "MASS_ups"),
)


def default_recipe(name: str) -> str:
    """The recipe ``masr train --model name`` uses when --recipe is not given: masr's own
    models (``OURS``, ``ABLATIONS``) take ``DEFAULT_RECIPE``, the baselines their own defaults."""
    run_spec(name)  # a MasrError for a name that is no run
    return DEFAULT_RECIPE if name in dict(OURS + ABLATIONS) else BASELINE_RECIPE


def run_order(names: Sequence[str]) -> list[str]:
    """Run names in table order: paper baselines, other baselines, unknown names, ours, then
    the ablations."""
    known = [n for n, _ in PAPER_BASELINES + EXTRA_BASELINES]
    ours = [n for n, _ in OURS + ABLATIONS]
    rank = {n: i for i, n in enumerate(known)}
    first = sorted((n for n in names if n in rank), key=rank.__getitem__)
    middle = sorted(n for n in names if n not in rank and n not in ours)
    last = [n for n in ours if n in names]
    return first + middle + last


#: command-line options (``OPTION_PATHS`` names) of gradient training, and of APR
TRAINING_OPTIONS = (
    "epochs", "batch_size", "lr", "loss", "neg", "neg_mode", "neg_sampler", "temperature",
    "select", "valid_sample", "max_members", "member_dropout", "ema", "patience", "time_limit",
    "sparse", "batch_by",
)
APR_OPTIONS = ("adv_epochs", "eps", "reg_adv", "noise", "adv_lr")


#: options that only one training loss reads
LOSS_OPTIONS = {"temperature": "softmax", "neg_mode": "bpr"}


def unused_options(name: str, given: set[str], loss: str | None = None) -> list[str]:
    """The options in ``given`` (``OPTION_PATHS`` names set on the command line) that no run of
    ``name``'s plan reads: training options for closed-form models (pop, itemknn, ease, als),
    APR's without an APR run, --entity for models without one, --dim for models without a
    size, --alpha without a fusion, --max-members and --member-dropout without a trained model
    that reads members, and with the training ``loss`` known, --temperature
    without softmax and --neg-mode without bpr. ``masr train`` says them on stderr rather
    than ignoring them silently."""
    from masr.models import model_class

    runs = [run_spec(r) for r in plan(name)]
    classes = [model_class(spec.model) for spec in runs]
    fields_of = [{f.name for f in fields(cls.config_class)} for cls in classes]
    trained = any(cls.trainable for cls in classes)
    unused = []
    for option in sorted(given):
        if option in TRAINING_OPTIONS and not trained:
            unused.append(option)
        elif option in APR_OPTIONS and not any(s.procedure == "apr" for s in runs):
            unused.append(option)
        elif option in MEMBER_TRAIN_FIELDS and not any(
            cls.trainable and cls.uses_members for cls in classes
        ):  # no trained run reads member lists (read_by_run leaves them out too)
            unused.append(option)
        elif option in ("entity", "dim") and not any(option in f for f in fields_of):
            unused.append(option)
        elif option == "alpha" and not any(s.procedure == "fuse" for s in runs):
            unused.append(option)  # eq. 20's weight: only a fusion (masr, amasr) has one
        elif loss is not None and LOSS_OPTIONS.get(option, loss) != loss:
            unused.append(option)
    return unused
