"""Making runs: train, APR, fit or fuse a run and whatever its plan needs first.

``train_run(name)`` makes a run and the runs it needs: ``amasr`` is mdr, mass, their fusion
masr, then amdr (APR from mdr), amass (APR from mass) and their fusion amasr. A needed run is
reused when it finished with the same data fingerprint and the same configuration (its
*signature*, ``masr.runs.registry``); the run asked for is always made again (or continued,
with ``resume``). A run being made is locked (``runs/<run>/.lock``, ``masr.lock``), so a second
``masr train`` needing it stops at once; a reused run is only read and never locked. Each run
is seeded once, before its model is built (``masr.seed.set_seed``).

This module imports torch only inside functions (the CLI imports the package for its options).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masr.atomic import remove_temp_entries
from masr.config import RunOptions
from masr.distributed import barrier, world
from masr.errors import MasrError, check_instance
from masr.lock import locked
from masr.runs.registry import (
    RunSpec,
    model_config,
    plan,
    read_differences,
    resumable,
    run_spec,
    same_signature,
    signature,
    upgraded,
)
from masr.runs.store import (
    RUN_LOCK,
    UNFINISHED,
    checkpoint_damage,
    clear,
    earlier_parts,
    intact_checkpoint,
    load_run,
    now,
    parse_run_json,
    part_stamps,
    read_run_json,
    write_run_json,
)

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.models.base import Recommender
    from masr.train import TrainProgress


def how_to_go_on(command: str, saved: bool) -> str:
    """What continues a run interrupted under ``command`` ("masr train", or "masr reproduce",
    which trains an unfinished run again when it is run again); ``saved``: an epoch was saved
    to resume from."""
    if command == "masr train":
        return ("`masr train ... --resume` with the same options continues it" if saved
                else "`masr train` with the same options starts it again")
    return f"the same `{command}` command {'continues it' if saved else 'starts it again'}"


@dataclass
class RunOutcome:
    """What ``train_run`` did with one run of the plan."""

    run: str
    action: str  # "trained", "resumed", "reused", "fitted", "fused"
    best_epoch: int
    valid: dict[str, float]  # sampled-protocol validation of the best epoch
    seconds: float
    valid_full: dict[str, float] = field(default_factory=dict)  # full ranking, same epoch
    alpha: float | None = None  # a fusion's eq. 20 weight (given, or chosen on validation)
    #: the full-ranking validation cases ``valid_full`` ranked (``--valid-sample``; 0: all):
    #: a --time-limit may cut a run's, and a fusion ranks as many as the fewest of its parts
    valid_sample: int = 0


def train_run(
    name: str,
    data: PreparedData,
    runs_dir: str | Path,
    options: RunOptions | None = None,
    *,
    resume: bool = False,
    progress: TrainProgress | None = None,
    log: Callable[[str], None] | None = None,
    command: str = "masr train",
) -> list[RunOutcome]:
    """Make run ``name`` (and the runs it needs) in ``runs_dir``; one outcome per planned run.
    ``command``: the command that called, named by each run's lock and by an interrupted run's
    line on how to go on (``how_to_go_on``)."""
    from masr.dataset import check_prepared

    check_prepared(data)
    options = RunOptions() if options is None else options  # checked when made (masr.config)
    check_instance(options, RunOptions, "train_run(options=...)")  # a dict: one line
    check_model_overrides(options.model)
    check_runs_dir(runs_dir, data)
    if len(data.valid) == 0:
        raise MasrError(
            f"{data.path}: no validation cases ({data.no_cases()}), and masr train validates "
            "every run on them"
            + ("; prepare more playlists, or try another masr prep --seed"
               if data.cases_loaded else "")
        )
    from masr.train import resolve_device

    device = resolve_device(options.device)
    log = log or (lambda _msg: None)
    runs_dir = Path(runs_dir)
    outcomes = []
    for run in plan(name):
        outcomes.append(
            _make(
                run, run == name, data, runs_dir, options, device, resume, progress, log,
                command,
            )
        )
        barrier()  # under torchrun: rank 0's files of this run are written before any rank reads
    return outcomes


def check_runs_dir(runs_dir: str | Path, data: PreparedData) -> None:
    """Refuse (MasrError) a runs folder that is a file or lies below one, or lies inside the
    prepared data folder, which ``masr prep`` replaces whole. Not whether anything can be made
    there: a folder of finished runs is only read (reused), so it may be read-only."""
    from masr.atomic import check_not_inside, check_output_dir

    check_output_dir(runs_dir, "--runs", creatable=False)
    check_not_inside(runs_dir, data.path, "--runs")


def check_model_overrides(overrides: dict[str, Any]) -> None:
    """``RunOptions.model`` as ``masr train --set`` would take it: each NAME a field of some
    model's config (MODEL.NAME: of that model's), each value of that field's kind; a
    MasrError names the first one that is not. Options built in Python otherwise keep a typo
    (``{"dimm": 8}``) without a word, and a string where a number belongs fails deep in
    training."""
    if not overrides:
        return
    from dataclasses import fields

    from masr.config import value_kind_problem
    from masr.models import REGISTRY, model_class

    kinds: dict[str, dict[str, str]] = {}  # model -> field -> annotation
    for name in REGISTRY:
        config_class = model_class(name).config_class
        kinds[name] = {f.name: str(f.type) for f in fields(config_class)}
    for key, value in overrides.items():
        scope, dot, field_name = key.rpartition(".")
        if dot and scope not in kinds:
            raise MasrError(f"--set {key}={value}: no model is called {scope!r}")
        owners = [kinds[scope]] if dot else list(kinds.values())
        annotations = {a[field_name] for a in owners if field_name in a}
        if not annotations:
            raise MasrError(
                f"--set {key}={value}: no "
                + (f"{scope} setting" if dot else "model setting")
                + f" is called {field_name!r}"
            )
        problems = [value_kind_problem(value, a) for a in annotations]
        if value is not None and all(problems):  # None: the model's own default
            raise MasrError(f"--set {key}={value!r}: {problems[0]}")


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
    command: str,
) -> RunOutcome:
    run_dir = runs_dir / run
    sig = signature(run, options, data.fingerprint)
    reused = None if target else _reused(run, run_dir, sig, log)
    if reused is not None:  # only read: never locked, so concurrent chains can share it
        return reused
    # under torchrun only rank 0 writes, so only rank 0 locks
    lock = locked(run_dir / RUN_LOCK, command) if world().is_main else nullcontext()
    with lock:
        # made meanwhile? (and if not reusable, why: said once, here)
        reused = None if target else _reused(run, run_dir, sig, log, say_why=log)
        if reused is not None:
            return reused
        if world().is_main and remove_temp_entries(run_dir):
            log(f"{run}: removed the temporary files of an earlier, killed masr train")
        info, why = parse_run_json(run_dir)  # read again, under the lock
        if why is not None and resume and (run_dir / "last.pt").is_file():
            # --resume asked to keep last.pt's epochs: refused, not trained over (QA: a cut
            # run.json made the run again from the start, its last.pt lost)
            raise MasrError(
                f"{run_dir / 'run.json'}: {why}; --resume cannot tell what {run} was made "
                f"with; {_restart_advice(run, target)}"
            )
        if why is not None:  # said before its checkpoints are replaced
            log(f"warning: {run_dir / 'run.json'}: {why}; {run} is made again from the start")
        return _build(
            run, data, runs_dir, options, sig, info, device, resume, progress, log,
            target=target, command=command,
        )


def reusable(
    run_dir: Path, sig: dict[str, Any], say_why: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """The run.json of the run in ``run_dir`` when it can be reused for signature ``sig``: it
    finished with that signature, its best.pt is whole (``checkpoint_damage``) and the parts
    it was made from are the ones there now (``earlier_parts``). Else None; ``say_why`` hears
    why for a finished run of that signature that cannot be."""
    info = read_run_json(run_dir)
    if (
        info is None
        or info.get("status") != "finished"
        or not (run_dir / "best.pt").is_file()
        or not same_signature(info.get("signature"), sig)
    ):
        return None
    say = say_why or (lambda _msg: None)
    damage = checkpoint_damage(run_dir / "best.pt")
    if damage is not None:
        say(f"{run_dir.name}: {run_dir / 'best.pt'} is damaged ({damage}); making it again")
        return None
    newer = earlier_parts(run_dir, info)
    if newer:
        say(f"{run_dir.name}: made from an earlier {' and '.join(newer)} (trained again "
            "since); making it again from the current one")
        return None
    return info


def _reused(
    run: str,
    run_dir: Path,
    sig: dict[str, Any],
    log: Callable[[str], None],
    say_why: Callable[[str], None] | None = None,
) -> RunOutcome | None:
    """The outcome of reusing run ``run`` when it is ``reusable``, else None."""
    info = reusable(run_dir, sig, say_why)
    if info is None:
        return None
    best = info.get("best", {})
    log(f"{run}: reusing {run_dir} (same data and configuration)")
    return RunOutcome(
        run, "reused", best.get("epoch", 0), best.get("valid", {}), 0.0,
        best.get("valid_full", {}), info.get("alpha"),
        int((info.get("train_config") or {}).get("valid_sample", info.get("valid_sample")) or 0),
    )


def _build(
    run: str,
    data: PreparedData,
    runs_dir: Path,
    options: RunOptions,
    sig: dict[str, Any],
    info: dict[str, Any] | None,
    device: Any,
    resume: bool,
    progress: TrainProgress | None,
    log: Callable[[str], None],
    *,
    target: bool,
    command: str,
) -> RunOutcome:
    """Train, APR, fit or fuse run ``run`` (its lock held by ``_make``; ``target``: the run the
    command named, not one its plan needs first)."""
    spec = run_spec(run)
    run_dir = runs_dir / run
    if spec.procedure == "fuse":
        return _fuse(run, spec, data, runs_dir, options, sig, device, log)

    from masr.models import model_class
    from masr.seed import set_seed

    # the one seeding of a run: initialisation, then sampling and dropout follow from it
    # (a resumed run restores its saved RNG states instead)
    set_seed(options.train.seed, deterministic=False)

    cls = model_class(spec.model)
    if not cls.trainable:
        return _fit(run, spec, data, run_dir, options, sig, device, log)

    from masr.checkpoint import build_model, load_checkpoint
    from masr.train import train_model

    train_cfg = options.train_for(spec.model)
    adversarial = None
    if spec.procedure == "apr":
        adversarial = options.adversarial
        apr_lr = options.adversarial.lr or train_cfg.lr  # --adv-lr, else --lr
        train_cfg = replace(train_cfg, epochs=options.adversarial.epochs, lr=apr_lr)

    resume_state = None
    # the run on disk's signature, with the fields an earlier masr did not record filled in
    made = upgraded(info.get("signature", {}), sig) if info is not None else {}
    # made with what --resume may not change (data, model, options the run reads) as asked
    same_kind = info is not None and resumable(made) == resumable(sig)
    can_resume = resume and same_kind and (run_dir / "last.pt").is_file()
    if resume and not can_resume and info is not None and (run_dir / "last.pt").is_file():
        changed = read_differences(made, sig, resumable)
        raise MasrError(
            f"{run_dir / 'last.pt'}: cannot --resume, made with other data or options "
            f"({', '.join(changed[:4]) or 'unknown'}); pass the same options or drop --resume"
        )
    # the parts an APR or pre-trained run starts from, by their best epochs: a part that went
    # on training (a raised --epochs or --time-limit) and found a better epoch invalidates the
    # run that started from its old best, which then starts again rather than resume
    start_epochs = _start_epochs(runs_dir, spec)
    recorded = (info or {}).get("start_epochs")
    if can_resume and recorded is not None and recorded != start_epochs:
        log(
            f"{run}: {', '.join(start_epochs or {})} changed since this run began (best epochs "
            f"{recorded} -> {start_epochs}); starting it again from the new best"
        )
        can_resume = False
    best_problem = _best_problem(run_dir) if can_resume else None  # best.pt read once
    if can_resume and not target and info.get("status") == "finished" and best_problem:
        can_resume = False  # a finished part whose best.pt is gone: made again, as `reusable`
        # said ("making it again"; QA: then resumed, and failed on that best.pt at the end;
        # review: a raised --epochs changed the signature and it was refused mid-chain)
    if resume and (target or info is not None) and not (run_dir / "last.pt").is_file():
        # the run named, or a part begun before that stopped in its first epoch (a part never
        # begun just starts: a chain interrupted early would say this of every later part)
        log(f"{run}: nothing to resume in {run_dir} (no last.pt); training it from the start")
    if can_resume:
        try:
            resume_state = load_checkpoint(run_dir / "last.pt")
        except MasrError as exc:  # cut short or changed: what is left is to start again
            raise MasrError(f"{exc}; {_restart_advice(run, target)}") from None
        if best_problem is not None:
            _refuse_without_best(run, run_dir, best_problem, resume_state, target)
        _check_resumable(run, run_dir, resume_state, train_cfg, spec.procedure == "apr")
        model = build_model(resume_state, device)
        log(f"{run}: resuming {run_dir} after epoch {resume_state['epoch']}")
    elif spec.procedure == "apr":
        start_dir = runs_dir / (spec.start_from or "")
        model, ckpt = _load_part(runs_dir, spec.start_from or "", data, options, device)
        log(f"{run}: APR from {start_dir / 'best.pt'} (epoch {ckpt.get('epoch')})")
    elif spec.procedure == "pretrained":
        branches = [_load_part(runs_dir, p, data, options, device)[0] for p in spec.parts]
        model = cls.from_branches(*branches).to(device)  # type: ignore[attr-defined]
        log(f"{run}: starting from the pre-trained {' + '.join(spec.parts)}")
    else:
        model = cls(
            model_config(run, options.model), data.n_users, data.n_playlists, data.n_songs
        )
        model.init_from_data(data, seed=options.train.seed)  # e.g. MASS's song_init="svd"

    if resume_state is None:
        if not resume and info is not None and info.get("status") in UNFINISHED:
            done = len(info.get("history", []))
            # said only where --resume would have: saved epochs, not more than asked for, every
            # value the run reads the same (QA: said after --temperature 0.5 too), and the
            # parts it started from at the best epochs they had then
            would = (  # the cheap conditions first: the checkpoints are read whole
                command == "masr train"
                and done <= train_cfg.epochs
                and same_kind
                and (recorded is None or recorded == start_epochs)
                and intact_checkpoint(run_dir / "last.pt")  # what --resume needs (QA: said
                and intact_checkpoint(run_dir / "best.pt")  # of a last.pt cut short)
            )
            log(f"{run}: starting again; the unfinished run in {run_dir} ({done} epoch(s)) is "
                "replaced" + (" (--resume would have continued it)" if would else ""))
        if info is not None and info.get("status") == "finished":
            # say so before a finished run (maybe hours of training) is overwritten
            changed = read_differences(made, sig)
            if changed:
                why = f": other data or options ({', '.join(changed[:4])})"
            elif target:
                why = ": asked for"
            elif not (run_dir / "best.pt").is_file():
                why = ": its best.pt is missing"
            else:  # a part whose best.pt is damaged, or made from earlier parts: said above
                why = ""  # (QA: "asked for" of a part the command did not name)
            log(f"{run}: replacing the finished run in {run_dir}{why}")
        clear(run_dir)
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
        "start_from": spec.start_from or (list(spec.parts) or None),
        "start_epochs": start_epochs,
        "made_from": part_stamps(runs_dir, list(start_epochs or {})),
        "data": {"path": str(data.path), "fingerprint": data.fingerprint},
        "device": str(device),
        # data-parallel processes (torchrun), each on its shard of every batch: epoch times
        # of runs with other counts do not compare
        "processes": world().size,
        "options": options.to_dict(),
        "started": now(),
        "history": list(resume_state["history"]) if resume_state else [],
    }
    write_run_json(run_dir, info)

    def on_epoch(record: dict[str, Any]) -> None:
        info["history"].append(record)
        write_run_json(run_dir, info)

    try:
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
            compile=options.compile,
            log=log,
        )
        # finishing inside the try: a Ctrl-C or SIGTERM while the final run.json is written
        # (QA: it left status "running" and no --resume hint) marks the run interrupted
        log(f"{run}: {stop_reason(result, train_cfg)}")
        # the full-ranking validation cases it ranked (a --time-limit may have cut them)
        info["train_config"]["valid_sample"] = result.extra["valid_sample"]
        info.update(
            status="finished",
            finished=now(),
            best={
                "epoch": result.best_epoch,
                "valid": result.best_valid,
                "valid_full": result.extra.get("best_valid_full", {}),
            },
            stopped_early=result.stopped_early,
            stopped_by_time_limit=result.extra.get("stopped_by_time_limit", False),
            seconds=round(result.seconds, 3),
            wall_seconds=round(time.perf_counter() - started, 3),
        )
        write_run_json(run_dir, info)
    except BaseException as exc:  # Ctrl-C, SIGTERM, an error: the run says it did not finish
        if world().is_main:
            stopped = isinstance(exc, KeyboardInterrupt)
            # stopped or failed between last.pt and run.json (a progress hook that raised):
            # run.json counts the epochs last.pt holds, what --resume continues
            held = _held_history(run_dir / "last.pt")
            if held is not None and len(held) > len(info["history"]):
                info["history"] = held
            info["status"] = "interrupted" if stopped else "failed"
            info["stopped"] = now()
            try:  # best effort: on a full disk this write fails too, and must not hide why
                write_run_json(run_dir, info)
            except (OSError, MasrError):
                pass
            if stopped and (run_dir / "last.pt").is_file():
                log(f"{run}: interrupted after {len(info['history'])} epoch(s); "
                    f"{how_to_go_on(command, saved=True)}")
            elif stopped:  # no epoch saved: a new command starts it again, --resume or not
                log(f"{run}: interrupted in its first epoch (nothing saved to resume from); "
                    f"{how_to_go_on(command, saved=False)}")
        raise
    return RunOutcome(
        run,
        "resumed" if resume_state else "trained",
        result.best_epoch,
        result.best_valid,
        result.seconds,
        result.extra.get("best_valid_full", {}),
        valid_sample=int(result.extra["valid_sample"]),
    )


def stop_reason(result: Any, config: Any) -> str:
    """Why a training run ended, in one phrase for the log: the time limit, early stopping
    (no better validation epoch for ``patience`` epochs) or the last epoch."""
    epochs = len(result.history)
    best = f"best epoch {result.best_epoch}"
    if result.extra.get("stopped_by_time_limit"):
        # the epoch the limit cut, said (QA: "after 2 epoch(s)" of which the second ran 44 of
        # its 57 steps, recorded in run.json alone)
        steps = (result.history[-1] if result.history else {}).get("steps")
        cut = f", the last cut at step {steps}" if steps else ""
        return (
            f"stopped by --time-limit {config.time_limit:g} after {epochs} epoch(s){cut}; {best}"
        )
    if result.stopped_early:
        return (
            f"stopped early after {epochs} epoch(s): no better {config.select}-ranking "
            f"validation in the last {config.patience} (--patience); {best}"
        )
    return f"trained its {epochs} epoch(s); {best}"


def _held_history(last: Path) -> list[dict[str, Any]] | None:
    """The epochs a run's ``last.pt`` holds (what --resume continues), None without a readable
    one; read when a run stops unfinished."""
    if not last.is_file():
        return None
    import torch

    try:  # mapped, not read: the weights of a large model stay on disk (SIGTERM's grace time)
        state = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        return list(state.get("history", []))
    except BaseException:  # noqa: BLE001 - damaged, or a second Ctrl-C: run.json's count stands
        return None


def _restart_advice(run: str, target: bool) -> str:
    """The way out of a --resume refused for ``run``: the run the command named is trained from
    the start without --resume; a part of a chain alone, so that the chain's other unfinished
    runs keep their epochs (review: dropping --resume restarted them all)."""
    if target:
        return f"without --resume, {run} is trained from the start"
    return (
        f"train {run} again alone (masr train --model {run} with the same options, without "
        "--resume), then --resume continues the rest"
    )


def _best_problem(run_dir: Path) -> str | None:
    """Why a run's best.pt cannot be resumed with: "missing" or "damaged (...)"; None when
    whole (``checkpoint_damage``, which reads it through)."""
    best = run_dir / "best.pt"
    if not best.is_file():
        return "missing"
    damage = checkpoint_damage(best)
    return None if damage is None else f"damaged ({damage})"


def _refuse_without_best(
    run: str, run_dir: Path, problem: str, state: dict[str, Any], target: bool
) -> None:
    """Refuse a --resume whose best.pt is missing or damaged (``problem``): it alone holds the
    best epoch so far (last.pt the last one), so a resumed run that found no better epoch ended
    on it (QA: best.pt cut short, --resume trained on, then failed at the end with no advice,
    the run marked failed, and every later --resume the same)."""
    epoch = state.get("best_epoch")
    holds = f" (epoch {epoch})" if epoch else ""
    raise MasrError(
        f"{run_dir / 'best.pt'}: {problem}; --resume needs the best epoch so far{holds} it "
        "holds; " + _restart_advice(run, target)
    )


def _check_resumable(
    run: str, run_dir: Path, state: dict[str, Any], config: Any, apr: bool
) -> None:
    """Refuse a --resume whose --epochs (--adv-epochs) is below the epochs ``last.pt`` holds,
    or whose --time-limit, lowered (or set on a run made without one), is below the seconds
    already spent: the run would keep what it trained beyond them and be recorded as made with
    the lower value, so a later command reusing it would get a run its options do not make
    (QA). A raised --epochs or --time-limit continues."""
    from masr.train import saved_time_limit

    trained = int(state.get("epoch", 0))
    option = "--adv-epochs" if apr else "--epochs"
    if trained > config.epochs:
        raise MasrError(
            f"{run}: {option} {config.epochs} (given, or saved with the run --resume continues) "
            f"is below the {trained} epoch(s) {run_dir} has trained; --resume continues with "
            f"{option} {trained} or more (drop --resume to train it again)"
        )
    history = state.get("history") or []
    if config.patience > 0 and all("best" in h for h in history):
        # a lowered --patience: the run must not hold epochs it would have stopped before
        # (QA: --patience 4 to epoch 11, then --resume --patience 2 recorded a patience-2 run
        # of 11 epochs; one made with --patience 2 stops after 9)
        bad, stops, needed = 0, None, 1  # needed: the least patience that trains them all
        for done, record in enumerate(history, 1):
            bad = 0 if record["best"] else bad + 1
            if done < len(history):
                needed = max(needed, bad + 1)
                if bad >= config.patience and stops is None:
                    stops = done
        if stops is not None:
            raise MasrError(
                f"{run}: --patience {config.patience} (given, or saved with the run --resume "
                f"continues) would have stopped {run_dir} after epoch {stops}, and it has "
                f"trained {len(history)}; --resume continues with --patience {needed} or more "
                "(drop --resume to train it again)"
            )
    spent = float(state.get("seconds", 0.0))
    before = saved_time_limit(state)
    lowered = before == 0 or config.time_limit < before  # a raised limit just trains on
    if config.time_limit and lowered and spent > config.time_limit:
        raise MasrError(
            f"{run}: --time-limit {config.time_limit:g} (given, or saved with the run --resume "
            f"continues) is below the {spent:.1f} s {run_dir} has trained; --resume continues "
            "with a longer limit or none (drop --resume to train it again)"
        )


def _start_epochs(runs_dir: Path, spec: Any) -> dict[str, Any] | None:
    """{part: its best epoch} of the runs an APR (``start_from``) or pre-trained (``parts``)
    run starts from; None for a run that starts from nothing."""
    if spec.procedure == "apr":
        parts = [spec.start_from or ""]
    elif spec.procedure == "pretrained":
        parts = list(spec.parts)
    else:
        return None
    return {
        part: (read_run_json(runs_dir / part) or {}).get("best", {}).get("epoch")
        for part in parts
    }


def _load_part(
    runs_dir: Path, part: str, data: PreparedData, options: RunOptions, device: Any
) -> tuple[Recommender, dict[str, Any]]:
    """A run this plan made or reused a moment ago. Runs are locked only while made, not while
    read, so another ``masr train`` may have made it again since, with other options: refused
    rather than built upon."""
    info = read_run_json(runs_dir / part) or {}
    if not same_signature(info.get("signature"), signature(part, options, data.fingerprint)):
        raise MasrError(
            f"{runs_dir / part}: made again by another masr train while this one ran, with "
            "other options; run this one again"
        )
    return load_run(runs_dir, part, data, device)


def _valid_metrics(
    model: Recommender, data: PreparedData, device: Any, options: RunOptions
) -> dict[str, dict[str, float]]:
    """Both protocols on the validation split, full ranking on the same seeded subset of
    cases as the trained runs' per-epoch validation."""
    return _validate(model, {}, data, device, options)[""]


def _validate(
    model: Recommender, on_top: dict[str, Any], data: PreparedData, device: Any,
    options: RunOptions,
) -> dict[str, dict[str, dict[str, float]]]:
    """``_valid_metrics`` of ``model`` (key "") and of every ``on_top`` entry derived from its
    distances (``evaluate.evaluate_model_and``)."""
    from masr.compiled import compile_pays
    from masr.evaluate import evaluate_model_and

    return evaluate_model_and(
        model,
        on_top,
        data,
        "valid",
        device=device,
        full_sample=options.train.valid_sample,
        sample_seed=options.train.seed,
        compile=options.compile and compile_pays(options.train.time_limit),
    )


def _save_single(
    run: str,
    spec: RunSpec,
    model: Recommender,
    data: PreparedData,
    run_dir: Path,
    sig: dict[str, Any],
    device: Any,
    started: float,
    options: RunOptions,
    extra_info: dict[str, Any],
    metrics: dict[str, dict[str, float]] | None = None,
) -> RunOutcome:
    """Validate (unless ``metrics`` holds the validation figures already), write best.pt and
    run.json for a run made in one go (fit, fuse)."""
    from masr.checkpoint import save_checkpoint

    both = metrics or _valid_metrics(model, data, device, options)
    valid, valid_full = both["sampled"], both["full"]
    seconds = time.perf_counter() - started
    clear(run_dir)
    save_checkpoint(
        run_dir / "best.pt",
        model,
        data_fingerprint=data.fingerprint,
        run=run,
        epoch=0,
        valid=valid,
        best_epoch=0,
        best_valid=valid,
        best_valid_full=valid_full,
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
        "finished": now(),
        "history": [],
        "best": {"epoch": 0, "valid": valid, "valid_full": valid_full},
        "valid_sample": options.train.valid_sample,  # the full-ranking cases valid_full ranked
        "seconds": round(seconds, 3),
        "wall_seconds": round(seconds, 3),
        **extra_info,
    }
    write_run_json(run_dir, info)
    action = "fused" if spec.procedure == "fuse" else "fitted"
    return RunOutcome(
        run, action, 0, valid, seconds, valid_full, extra_info.get("alpha"),
        options.train.valid_sample,
    )


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

    started = time.perf_counter()
    cls = model_class(spec.model)
    model = cls(model_config(run, options.model), data.n_users, data.n_playlists, data.n_songs)
    model.to(device)
    log(f"{run}: fitting {cls.__name__} (closed form)")
    model.fit(data, device)
    model.eval()
    return _save_single(
        run, spec, model, data, run_dir, sig, device, started, options,
        {"options": options.to_dict()},
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
    parts = [_load_part(runs_dir, part, data, options, device)[0] for part in spec.parts]
    cls = model_class(spec.model)
    fused = cls.from_parts(*parts, alpha=options.alpha, parts=list(spec.parts))  # type: ignore[attr-defined]
    fused.to(device).eval()
    # validated on as many full-ranking cases as the fewest its parts ranked (a --time-limit
    # may have cut theirs), so that the fusion's validation costs what theirs did
    sample = _parts_valid_sample(runs_dir, spec.parts, options.train.valid_sample)
    if sample != options.train.valid_sample:
        options = replace(options, train=replace(options.train, valid_sample=sample))
    metrics = None
    extra: dict[str, Any] = {
        "parts": list(spec.parts),
        "made_from": part_stamps(runs_dir, list(spec.parts)),
    }
    if options.alpha_search:
        alpha, metrics, tried = choose_alpha(fused, data, device, options)
        fused = fused.with_alpha(alpha).to(device).eval()
        extra["alpha_search"] = {"protocol": options.train.select, "grid": tried}
        protocol = options.train.select
        log(
            f"{run}: α of eq. 20 chosen on validation, {protocol} hit@10 by α: "
            + ", ".join(f"{a}: {m[protocol]['hit@10']:.4f}" for a, m in tried.items())
            + f" -> α {alpha:g}"
        )
    log(f"{run}: fusing {' + '.join(spec.parts)} with alpha {fused.config.alpha:g} (eq. 20)")
    extra.update(alpha=fused.config.alpha, options=options.to_dict())
    outcome = _save_single(
        run, spec, fused, data, runs_dir / run, sig, device, started, options, extra, metrics
    )
    full = options.train.select == "full"
    cases = sample if full and 0 < sample < len(data.valid) else len(data.valid)
    parts_best = {}
    for part in spec.parts:
        best = (read_run_json(runs_dir / part) or {}).get("best") or {}
        value = (best.get("valid_full") if full else best.get("valid")) or {}
        if "hit@10" in value:
            parts_best[part] = float(value["hit@10"])
    fused_value = (outcome.valid_full if full else outcome.valid).get("hit@10")
    if fused_value is not None and not options.alpha_search:
        note = fusion_note(run, options.alpha, float(fused_value), parts_best, cases,
                           "full" if full else "sampled")
        if note:
            log(note)
    return outcome


def choose_alpha(
    fused: Any, data: PreparedData, device: Any, options: RunOptions
) -> tuple[float, dict[str, dict[str, float]], dict[str, dict[str, dict[str, float]]]]:
    """``--alpha auto``: eq. 20 at every weight of ALPHA_GRID on the validation split (both
    protocols, full ranking on the runs' seeded cases), the MASS part's distances computed once.
    Returns the weight best under the ``--select`` protocol (hit@10, then ndcg@10; a tie goes
    to the weight nearest the paper's 0.5), its metrics and every weight's {protocol: metrics}
    keyed by the weight as text."""
    from masr.config import ALPHA, ALPHA_GRID
    from masr.models.masr import FusionOnMass

    mdr, mass = fused.parts()
    on_top = {f"{a:g}": FusionOnMass(mdr, a) for a in ALPHA_GRID}
    tried = _validate(mass, on_top, data, device, options)
    tried.pop("")  # MASS alone: the same as weight 0
    protocol = options.train.select

    def key(a: float) -> tuple[float, float, float]:
        m = tried[f"{a:g}"][protocol]
        return (m["hit@10"], m["ndcg@10"], -abs(a - ALPHA))

    best = max(ALPHA_GRID, key=key)
    return best, tried[f"{best:g}"], tried


def fusion_note(
    run: str, alpha: float, fused: float, parts: dict[str, float], cases: int, protocol: str
) -> str | None:
    """A note when the fusion's validation hit@10 is below its better part's by more than two
    standard errors (of a hit rate over ``cases``): typically a part trained too briefly (a
    short --time-limit) pulling eq. 20's fixed α down. None otherwise."""
    if not parts or cases <= 0:
        return None
    part, best = max(parts.items(), key=lambda kv: kv[1])
    error = math.sqrt(max(best * (1 - best), 1e-12) / cases)
    if fused >= best - 2 * error:
        return None
    return (
        f"note: {run} (α {alpha:g}) is below its {part} part on validation ({protocol} hit@10 "
        f"{fused:.4f} against {best:.4f}, more than two standard errors); a part trained too "
        f"briefly weighs the fusion down. `masr evaluate --split valid --alpha 0.75 --alpha 1` "
        f"compares other weights of eq. 20, `masr export --alpha A` serves one, and "
        f"`masr train --alpha auto` chooses one on validation"
    )


def _parts_valid_sample(runs_dir: Path, parts: Sequence[str], default: int) -> int:
    """The smallest full-ranking validation sample the trained ``parts`` recorded in their
    run.json (0 = every case counts as the largest), ``default`` when none is smaller."""
    sizes = [default]
    for part in parts:
        info = read_run_json(runs_dir / part) or {}
        size = (info.get("train_config") or {}).get("valid_sample")
        if isinstance(size, int):
            sizes.append(size)
    positive = [n for n in sizes if n > 0]
    return min(positive) if positive else 0
