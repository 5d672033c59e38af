"""`masr train`: train a model (and what it needs) into the runs directory."""

from __future__ import annotations

import enum
import shlex
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from masr.config import (
    ALPHA,
    BASELINE_RECIPE,
    BATCH_BY,
    CPU_RECIPES,
    DEFAULT_RECIPE,
    ENTITIES,
    LOSSES,
    NEG_MODES,
    NEG_SAMPLERS,
    NOISE_MODES,
    OPTION_PATHS,
    RECIPES,
    SELECTIONS,
    AdversarialConfig,
    RunOptions,
    TrainConfig,
    check_alpha,
)
from masr.errors import MasrError
from masr.runs import RUNS
from masr_cli._common import (
    Device,
    Threads,
    choices,
    console,
    cpu_threads_line,
    governed,
    log_line,
)

if TYPE_CHECKING:  # the run machinery (torch) is imported when a command runs
    from masr.runs.make import RunOutcome

NAME = "train"

_T = TrainConfig()
_A = AdversarialConfig()

ModelName = choices("ModelName", tuple(RUNS))
NegMode = choices("NegMode", NEG_MODES)
Noise = choices("Noise", NOISE_MODES)
Entity = choices("Entity", ENTITIES)
Loss = choices("Loss", LOSSES)
NegSampler = choices("NegSampler", NEG_SAMPLERS)
Select = choices("Select", SELECTIONS)
BatchBy = choices("BatchBy", BATCH_BY)
Recipe = choices("Recipe", tuple(RECIPES))


def _recipe_text(name: str, cpu: bool = False) -> str:
    """``--loss softmax --neg 1024 ...``: what recipe ``name`` sets, as options (``cpu``: only
    what it sets otherwise on a CPU)."""
    recipe = CPU_RECIPES.get(name, {}) if cpu else RECIPES[name]
    values = {**recipe.get("train", {}), **recipe.get("adversarial", {}), **recipe.get("", {})}
    text = []
    for key, value in values.items():
        scope, dot, name = key.rpartition(".")
        text.append(f"--{name.replace('_', '-')} {value}" + (f" for {scope}" if dot else ""))
    text += [f"--set {k}={v}" for k, v in recipe.get("model", {}).items()]
    # commas keep a scoped value apart from the plain one ("--neg 128, --neg 1024 for mdr")
    return (", " if any(" for " in t for t in text) else " ").join(text)


#: masr's own models' (MDR, MASS) defaults for the model settings the fullrank recipe sets:
#: the paper's (``tests/test_cli_train.py`` checks them against the model configs, which the
#: help cannot import without torch)
_PAPER_MODEL = {"dropout": 0.2, "mdr.init_std": "none"}


def _paper_text() -> str:
    """``--loss bpr --neg 4 ...``: the options that, given with the default recipe, train what
    ``--recipe paper`` trains (every value the fullrank recipe sets, at the paper's)."""
    full = RECIPES["fullrank"]
    text = [f"--{k.replace('_', '-')} {getattr(_T, k)}" for k in full.get("train", {})]
    text += [f"--{k.replace('_', '-')} {getattr(_A, k)}" for k in full.get("adversarial", {})]
    text += [f"--alpha {ALPHA}"] if "alpha" in full.get("", {}) else []
    text += [f"--set {k}={_PAPER_MODEL[k]}" for k in full.get("model", {})]
    return " ".join(text)


def _recipe_default(section: str, field_name: str) -> str:
    """Help text for an option that the recipes set when it is not given: each recipe's value
    (with the CPU's where it differs), in place of a [default] that would show the paper's."""
    plain = getattr(_T if section == "train" else _A, field_name)
    parts = []
    for name, recipe in RECIPES.items():
        value = recipe.get(section, {}).get(field_name, plain)
        cpu = CPU_RECIPES.get(name, {}).get(section, {})
        text = f"{name} {value}"
        if field_name in cpu and cpu[field_name] != value:
            scoped = [f"{k.rpartition('.')[0]} {v}" for k, v in cpu.items()
                      if k.endswith(f".{field_name}")]
            text += f" ({cpu[field_name]} on a CPU" + "".join(f", {x}" for x in scoped) + ")"
        parts.append(text)
    return f" Default: the --recipe's ({'; '.join(parts)})."


def command(
    ctx: typer.Context,
    model: Annotated[
        ModelName,
        typer.Option(
            help="What to train. mdr/mass: BPR (eq. 21). amdr/amass: APR (eqs. 22-24) from the "
            "best mdr/mass checkpoint (trained first when missing). masr/amasr: the fusion of "
            "eq. 20 of mdr+mass / amdr+amass; amasr runs the whole chain and leaves all six "
            "runs evaluable. mdr_us, mdr_ps, mass_ups, mass_ps: the paper's Table 3 ablations "
            "(MASS's Table 4 attention: --set attention=...).",
        ),
    ] = "amasr",  # type: ignore[assignment]
    data: Annotated[
        Path, typer.Option(help="Prepared data directory (output of `masr prep`).")
    ] = Path("data"),
    runs: Annotated[
        Path,
        typer.Option(
            help="Runs directory: each run writes runs/<run>/best.pt and run.json (trained "
            "runs also last.pt, for --resume)."
        ),
    ] = Path("runs"),
    device: Annotated[
        Device, typer.Option(help="Training device; auto picks CUDA when present.")
    ] = Device.auto,
    seed: Annotated[
        int, typer.Option(help="Seeds initialisation, sampling and dropout (deterministic on CPU).")
    ] = _T.seed,
    epochs: Annotated[int, typer.Option(help="BPR epochs (maximum; see --patience).")] = _T.epochs,
    adv_epochs: Annotated[
        int, typer.Option(help="APR epochs of amdr/amass after the BPR pre-training.")
    ] = _A.epochs,
    adv_lr: Annotated[
        float | None,
        typer.Option(
            help="Adam learning rate of the APR phase (amdr/amass), which starts from the best "
            "BPR checkpoint (default: --lr, the paper's). A lower one keeps a large model's APR "
            "from overshooting its first epoch (docs/training.md).",
            show_default=False,
        ),
    ] = None,
    dim: Annotated[
        int | None,
        typer.Option(
            help="Embedding size d (default: the model's own: 64; als 128).", show_default=False
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Training rows per step.")] = _T.batch_size,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = _T.lr,
    reg: Annotated[
        float,
        typer.Option(
            help="L2 weight λ_Θ of eq. 21, per batch of summed losses as in the authors' code "
            "(on the parameters each step touches)."
        ),
    ] = _T.reg,
    recipe: Annotated[
        Recipe | None,
        typer.Option(
            help="Defaults for the options below that are not given on the command line. "
            "paper: the paper's recipe (BPR of eq. 21 against the closest of 4 uniform "
            "negatives, epochs chosen by the sampled protocol; the same as "
            f"{_paper_text()} with the default recipe). fullrank: trained for "
            f"whole-catalog ranking, what `masr score` does ({_recipe_text('fullrank')}; "
            f"on a CPU {_recipe_text('fullrank', cpu=True)}). Default: {DEFAULT_RECIPE} for "
            f"masr's own models, {BASELINE_RECIPE} for the baselines. See docs/training.md.",
            show_default=False,
        ),
    ] = None,
    loss: Annotated[
        Loss,
        typer.Option(
            help="bpr: eq. 21 (CML: its hinge). softmax: cross-entropy of the positive against "
            "--neg negatives shared by the batch, logits = -distance / --temperature, "
            "logQ-corrected, the playlist's own songs masked. The options not given keep the "
            "recipe's values (--loss bpr alone keeps fullrank's --neg: add --neg 4 for the "
            "paper's eq. 21, or use --recipe paper for the paper's whole recipe)."
            + _recipe_default("train", "loss"),
            show_default=False,
        ),
    ] = Loss(_T.loss),
    neg: Annotated[
        int,
        typer.Option(
            help="Negatives per positive (bpr), or shared by the batch (softmax)."
            + _recipe_default("train", "neg"),
            show_default=False,
        ),
    ] = _T.neg,
    neg_sampler: Annotated[
        NegSampler,
        typer.Option(
            help="How negatives are drawn: uniform over the catalog, popularity (proportional "
            "to training occurrences), or mixed (half of each)."
            + _recipe_default("train", "neg_sampler"),
            show_default=False,
        ),
    ] = NegSampler(_T.neg_sampler),
    temperature: Annotated[
        float,
        typer.Option(
            help="softmax: logits = -distance / temperature."
            + _recipe_default("train", "temperature"),
            show_default=False,
        ),
    ] = _T.temperature,
    select: Annotated[
        Select,
        typer.Option(
            help="Validation protocol that picks the best epoch and that --patience watches: "
            "sampled (the paper's 100 negatives) or full (whole-catalog ranking)."
            + _recipe_default("train", "select"),
            show_default=False,
        ),
    ] = Select(_T.select),
    valid_sample: Annotated[
        int,
        typer.Option(
            help="Validation cases ranked against the whole catalog each epoch (a seeded "
            "subset, the same every epoch); 0 = all."
            + _recipe_default("train", "valid_sample"),
            show_default=False,
        ),
    ] = _T.valid_sample,
    neg_mode: Annotated[
        NegMode,
        typer.Option(
            help="hardest: BPR against the closest of the --neg negatives (the authors' code); "
            "pairs: against each of them."
        ),
    ] = NegMode(_T.neg_mode),
    max_members: Annotated[
        int,
        typer.Option(help="MASS: at most this many member songs per row (sampled when longer)."),
    ] = _T.max_members,
    member_dropout: Annotated[
        float,
        typer.Option(
            help="MASS (and the other member-reading models): leave each member song of a "
            "training row out with this probability (at least one kept), a regulariser "
            "against memorising whole playlists; 0 = off (the paper's)."
        ),
    ] = _T.member_dropout,
    ema: Annotated[
        float,
        typer.Option(
            help="Average the weights over training (an exponential moving average with this "
            "decay per step, e.g. 0.999 ≈ the last 1,000 steps): validation picks among the "
            "averaged weights and best.pt holds them, so evaluate, export and score use "
            "them; 0 = off (the paper's).",
        ),
    ] = _T.ema,
    batch_by: Annotated[
        BatchBy,
        typer.Option(
            help="What an epoch shuffles: row (training rows, the paper's) or playlist "
            "(playlists, each one's rows kept together, so a batch holds whole playlists: "
            "MASS then builds its queries and member terms once per playlist instead of once "
            "per row under --loss softmax: AOTM-2011 epochs 4-5x cheaper on a CPU, but a MASS "
            "a little below row batches' on its validation; docs/training.md)."
        ),
    ] = BatchBy(_T.batch_by),
    patience: Annotated[
        int,
        typer.Option(
            help="Stop after this many epochs without a better validation hit@10; 0 = never."
        ),
    ] = _T.patience,
    time_limit: Annotated[
        float,
        typer.Option(
            help="Seconds of training and validation per run (each of mdr, mass, amdr, "
            "amass): the step that passes it ends the epoch, which is validated and kept, and "
            "the run; 0 = no limit. Gives every model the same budget. Room is kept for each "
            "epoch's validation (the first one's estimated before training); when it would "
            "take more than a quarter of the limit, or longer than the first epoch's "
            "training and a twentieth of the limit, fewer --valid-sample cases are ranked "
            "(stderr says how many).",
        ),
    ] = _T.time_limit,
    sparse: Annotated[
        bool,
        typer.Option(
            "--sparse-grads/--dense-grads",
            help="Embedding tables: row-sparse gradients with a lazy Adam (only the batch's rows "
            "move), or dense gradients with plain Adam (every row's moments decay each step). "
            "Dense is faster on a GPU at large batches (docs/training.md).",
        ),
    ] = _T.sparse,
    eps: Annotated[
        float,
        typer.Option(
            help="APR noise size ε (eqs. 23-24)." + _recipe_default("adversarial", "eps"),
            show_default=False,
        ),
    ] = _A.eps,
    reg_adv: Annotated[
        float, typer.Option(help="APR weight λ_δ of the adversarial loss (eq. 23).")
    ] = _A.reg_adv,
    noise: Annotated[
        Noise,
        typer.Option(help="APR noise norm: flexible = ε·std(parameter) (the paper's), fixed = ε."),
    ] = Noise(_A.noise),
    alpha: Annotated[
        str,
        typer.Option(
            metavar="<float|auto>",
            help="Fusion weight of MDR in MASR/AMASR (eq. 20); MASS gets 1-α. 'auto': chosen "
            "on the validation split among 0, 0.25, 0.5, 0.75 and 1 by the --select "
            "protocol (a tie keeps the weight nearest the paper's 0.5); run.json records "
            "every weight's figures, and masr export serves the chosen one. Not given: auto "
            "under the default recipe (fullrank), the paper's fixed 0.5 under --recipe paper.",
            show_default=False,
        ),
    ] = str(ALPHA),
    entity: Annotated[
        Entity | None,
        typer.Option(
            help="Baselines: model user -> song or playlist -> song (the paper ran both and "
            "reported the better). Default playlist for mfbpr, cml, als, neumf, cmn; user for "
            "the sequential prme, transrec, caser.",
            show_default=False,
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="NAME=VALUE",
            help="A model hyper-parameter, repeatable: e.g. --set shrink=10 --set alpha=0.75 "
            "(itemknn: alpha, shrink, neighbours; ease: reg; als: reg, confidence, iterations, "
            "cg_steps; mfbpr: song_bias; cml: margin; fism: alpha; neumf: layers (1-3); cmn: "
            "hops (1-4); caser: window or L (the paper searched 4-10); mdr, mass: dropout, "
            "init_std (none = 1/d), "
            "dropout_mode = element (the paper's, per element) or row (one mask per row and "
            "dimension, shared by its candidates: keeps the GEMM form of --loss softmax, "
            "docs/training.md), for mass also shared (one mask per row, candidate and "
            "dimension, shared by the members); mass: attention = mem-metric (the paper's), "
            "mem-dot, nonmem-metric, nonmem-dot or none (Table 4), song_init = random, svd or "
            "svd-split (a start from the training matrix's SVD, docs/training.md), "
            "query_init = reference or default; cml, transrec: max_norm; caser: horizontal, "
            "vertical, dropout; cmn: neighbours; prme: alpha; mfbpr, fism, neumf, cmn, prme, "
            "transrec, caser, als: init_std). "
            "MODEL.NAME=VALUE sets one model's runs only (--set mdr.init_std=none). `--reg` "
            "also sets ease/als's L2 weight.",
            show_default=False,
        ),
    ] = None,
    threads: Threads = 0,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile/--no-compile",
            help="On a CPU, run MASS's sampled-softmax scores and its per-epoch full-ranking "
            "validation through torch.compile (about 30% off a step, a third off a validation, "
            "after seconds of compiling; needs a C++ compiler, and trains on without it when "
            "compiling fails). Same computation up to float rounding. Not under a --time-limit "
            "below 90 s, where the compiling would not pay for itself (said on stderr). "
            "MASR_COMPILE=0 in the environment turns it off everywhere.",
        ),
    ] = True,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue interrupted runs from their last finished epoch (last.pt); --epochs, "
            "--adv-epochs, --patience and --time-limit may be raised, other options must "
            "match. An APR run whose pre-trained start then finds a better epoch starts again "
            "from it.",
        ),
    ] = False,
) -> None:
    """Train MDR, MASS, MASR or their adversarial versions, validating every epoch.

    Each epoch is validated on the validation split under both protocols; the best epoch (by
    hit@10, ndcg@10 breaking ties) under the protocol --select names (full ranking under
    masr's default recipe for its own models; sampled for the baselines and under --recipe
    paper) is kept as runs/<run>/best.pt, the last one with optimiser and RNG state as last.pt.
    Runs a model needs are reused when they exist for the same prepared data and options, so
    `masr train --model amasr` twice retrains nothing but the fusion.

    Examples:

      masr train --model amasr                 # the whole AMASR chain

      masr train --model mdr --epochs 20 --device cpu

      masr train --model amasr --resume        # after an interruption

      torchrun --nproc-per-node 2 -m masr_cli.main train --model amasr

    Under torchrun each process trains on its shard of every batch and the gradients are
    combined (torch.distributed: gloo on CPU, nccl on CUDA); rank 0 validates and writes.
    """
    from masr.config import MAX_DIM
    from masr.dataset import load_prepared
    from masr.runs import saved_options, train_run

    if dim is not None and not 1 <= dim <= MAX_DIM:
        raise MasrError(f"--dim {dim}: must be in [1, {MAX_DIM:,}]")
    alpha_auto, alpha_value = _alpha_option(alpha)
    options = RunOptions(
        train=TrainConfig(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            reg=reg,
            loss=loss.value,
            neg=neg,
            neg_mode=neg_mode.value,
            neg_sampler=neg_sampler.value,
            temperature=temperature,
            select=select.value,
            valid_sample=valid_sample,
            max_members=max_members,
            member_dropout=member_dropout,
            ema=ema,
            batch_by=batch_by.value,
            patience=patience,
            time_limit=time_limit,
            sparse=sparse,
            seed=seed,
        ),
        adversarial=AdversarialConfig(
            epochs=adv_epochs, eps=eps, reg_adv=reg_adv, noise=noise.value, lr=adv_lr
        ),
        model={"dim": dim, "entity": entity.value if entity else None},
        alpha=alpha_value,  # ALPHA with auto (unused then)
        alpha_search=alpha_auto,
        device=device.value,
        compile=compile_,
    )
    name = model.value if isinstance(model, enum.Enum) else str(model)
    if _given(ctx, "reg"):  # closed-form ease/als take --reg as their own L2 weight
        options.model["reg"] = reg
    settings: dict[str, object] = {}
    if set_:
        from masr.models import parse_settings
        from masr.runs import plan, run_spec

        settings = parse_settings([run_spec(r).model for r in plan(name)], set_)
        for key in ("dim", "entity", "reg"):  # also an option: two values would be a guess
            option = options.model.get(key)
            if key in settings and _given(ctx, key) and option != settings[key]:
                raise MasrError(
                    f"--{key} {option} and --set {key}={settings[key]}: two values for one "
                    "setting; give one"
                )
        options.model.update(settings)
    explicit = {p for p in OPTION_PATHS if _given(ctx, p)}
    from masr.runs import default_recipe
    from masr.train import resolve_device

    recipe_name = recipe.value if recipe is not None else default_recipe(name)
    options = options.with_recipe(recipe_name, explicit, resolve_device(options.device).type)
    if resume:
        saved = saved_options(runs, name)
        if saved is not None:
            given_again = {*settings, *(("reg",) if "reg" in options.model else ())}
            options = options.merged(saved, explicit, given_again)
    from masr.distributed import init_from_env, shutdown

    ranks = init_from_env(options.device)  # under torchrun: join the process group
    prepared = load_prepared(data)
    first_line = cpu_threads_line(threads, options.device)
    from masr.runs.registry import unused_options

    unused = unused_options(name, explicit, options.train.loss)
    if unused:  # said with the first line: a command that fails keeps its one error line
        names = ", ".join("--" + o.replace("_", "-") for o in unused)
        note = f"note: {names} not used by {name} (no run of it reads them)"
        first_line = f"{first_line}\n{note}" if first_line else note
    if ranks.distributed and ranks.is_main:
        first_line = f"{first_line}; " if first_line else ""
        first_line += f"data-parallel over {ranks.size} processes (torch.distributed)"
    try:
        with (
            RichProgress(first_line) if ranks.is_main else nullcontext() as progress,
            governed(threads, options.device, progress.say if ranks.is_main else None),
        ):
            outcomes = train_run(
                name,
                prepared,
                runs,
                options,
                resume=resume,
                progress=progress,
                log=progress.say if ranks.is_main else None,
            )
    finally:
        shutdown()
    if not ranks.is_main:
        return
    console.print(summary_table(name, options, outcomes))
    note = cases_note(outcomes, len(prepared.valid))
    if note:
        console.print(note, highlight=False)
    console.print(
        "[green]done[/green]: "
        + escape(
            f"{runs / name / 'best.pt'}; next: masr evaluate"
            # quoted for a shell: the command copies whole, spaces and all
            + ("" if data == Path("data") else f" --data {shlex.quote(str(data))}")
            + ("" if runs == Path("runs") else f" --runs {shlex.quote(str(runs))}")
        ),
        soft_wrap=True,  # one line: the command copies whole
        highlight=False,
    )


def summary_table(name: str, options: RunOptions, outcomes: list[RunOutcome]) -> Table:
    """The table ``masr train`` ends with: each run's action and best epoch (a fusion's α) and
    its validation figures under both protocols."""
    table = Table(
        title=f"masr train --model {name} (recipe {options.recipe}): validation, best epoch by "
        f"{options.train.select} ranking",
        # no outer border: eight columns fit 80 terminal columns with whole run names (QA:
        # neumf_gmf and neumf_mlp were both cut to "neumf_…")
        show_edge=False,
        pad_edge=False,
    )
    columns = ("run", "action", "best epoch", "sampled hit@10", "sampled ndcg@10", "full hit@10",
               "full ndcg@10", "seconds")
    longest = max((len(o.run) for o in outcomes), default=3)
    for col in columns:
        if col == "run":
            table.add_column(col, no_wrap=True, min_width=longest)
        else:
            table.add_column(col, justify="left" if col == "action" else "right")
    for o in outcomes:
        table.add_row(
            o.run,
            o.action,
            # a fusion has no epochs: its row shows the weight of eq. 20 it serves; a
            # closed-form fit (pop, itemknn, ...) has none either (QA: "0" read as a bad epoch)
            f"α {o.alpha:g}" if o.alpha is not None else str(o.best_epoch or "—"),
            *(f"{m.get(k, float('nan')):.4f}" for m in (o.valid, o.valid_full)
              for k in ("hit@10", "ndcg@10")),
            f"{o.seconds:.1f}",
        )
    return table


def cases_note(outcomes: list[RunOutcome], n_valid: int) -> str | None:
    """A note under the summary table when its rows' full-ranking figures rank fewer than all
    validation cases (``--valid-sample``), or different numbers of them (a time limit cuts a
    run's; a fusion ranks as many as the fewest of its parts), which makes them differ by
    sampling noise too; None when every row ranks every case."""
    cases = {o.run: min(o.valid_sample, n_valid) or n_valid for o in outcomes}
    counts = set(cases.values())
    if counts == {n_valid}:
        return None
    if len(counts) == 1:
        return (
            f"note: the full-ranking figures above rank {counts.pop():,} of the {n_valid:,} "
            "validation cases (--valid-sample); `masr evaluate --split valid` ranks them all"
        )
    return (
        "note: the full-ranking figures above rank different numbers of the "
        f"{n_valid:,} validation cases ("
        + ", ".join(f"{run} {n:,}" for run, n in cases.items())
        + "), so they differ by sampling noise too"
    )


def _given(ctx: typer.Context, param: str) -> bool:
    """Was ``param`` set on the command line (or the environment), not left at its default?"""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name != "DEFAULT"


class RichProgress:
    """``masr.train.TrainProgress`` drawn with rich on stderr: epochs and steps of the current
    run, the running loss, and one line per epoch with the validation metrics."""

    def __init__(self, first_line: str = "") -> None:
        self._first_line = first_line  # printed once, when the first training phase starts
        self._live = False
        self._bars = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._epochs: Any = None
        self._steps: Any = None
        self._title = ""
        self._total = 0

    def __enter__(self) -> RichProgress:
        self._live = False  # the bars start with the first training phase, so that a run that
        return self  # fails before training leaves its one error line alone on stderr

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._bars.__exit__(*exc)  # type: ignore[arg-type]

    def say(self, message: str) -> None:
        """One log line on stderr, after the first line if not said yet (a run that only fits,
        fuses or reuses says its thread choice too)."""
        self._say_first_line()
        log_line(message)

    def _say_first_line(self) -> None:
        for line in self._first_line.splitlines():
            log_line(line)
        self._first_line = ""

    def start(self, title: str, epochs: int, steps: int, first_epoch: int) -> None:
        # bars only on a terminal: elsewhere (a log file, a pipe) rich draws nothing of a
        # transient bar but leaves a blank line where it stopped, before any error line
        if not self._live and console.is_terminal:
            self._bars.__enter__()
            self._live = True
        self._say_first_line()
        self._title, self._total = title, epochs
        self._epochs = self._bars.add_task(
            f"{title} epochs", total=epochs, completed=first_epoch - 1, info=""
        )
        self._steps = self._bars.add_task(f"{title} epoch {first_epoch}", total=steps, info="")

    def step(self, done: int, loss: float) -> None:
        self._bars.update(self._steps, completed=done, info=f"loss {loss:.4f}")

    def epoch(self, record: dict[str, Any]) -> None:
        valid = record["valid"]
        star = " [green]best[/green]" if record.get("best") else ""
        full = record.get("valid_full", {})
        full_text = f" | full hit@10 {full['hit@10']:.4f}" if full else ""
        console.print(
            f"{self._title} epoch {record['epoch']}/{self._total}  loss {record['loss']:.4f}  "
            f"valid hit@10 {valid['hit@10']:.4f} ndcg@10 {valid['ndcg@10']:.4f}{full_text}  "
            f"({record['train_seconds'] + record['valid_seconds']:.1f} s){star}",
            soft_wrap=True,  # one line per epoch, whatever the terminal's width (grep, logs)
        )
        self._bars.update(
            self._epochs,
            completed=record["epoch"],
            info=f"hit@10 {valid['hit@10']:.4f}",
        )
        self._bars.reset(self._steps, description=f"{self._title} epoch {record['epoch'] + 1}")

    def finish(self) -> None:
        for task in (self._epochs, self._steps):
            if task is not None:
                self._bars.remove_task(task)
        self._epochs = self._steps = None


def _alpha_option(text: str) -> tuple[bool, float]:
    """``--alpha``: "auto" (chosen on validation) or a weight in [0, 1]."""
    if text.strip().lower() == "auto":
        return True, ALPHA
    try:
        value = float(text)
    except ValueError:
        raise MasrError(
            f"--alpha {text}: a number between 0 and 1, or auto (chosen on validation)"
        ) from None
    return False, check_alpha(value)
