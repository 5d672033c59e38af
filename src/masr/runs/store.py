"""The runs directory on disk: ``run.json`` I/O, which runs exist, loading a run's best model.

Only reads and small atomic writes; never trains. Torch is imported inside ``load_run`` only.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masr.atomic import atomic_file
from masr.config import RunOptions
from masr.distributed import world
from masr.errors import MasrError
from masr.lock import live_holder
from masr.runs.registry import plan, run_order

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.models.base import Recommender


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _shape_problem(info: object) -> str | None:
    """What makes a parsed run.json not what ``masr train`` writes, in the fields the
    readers use (model, status, model_config and its dims, history, processes); None when
    they are all of the right kind."""
    if not isinstance(info, dict):
        return "not a JSON object"
    for key in ("run", "model", "procedure", "status"):
        if key in info and not isinstance(info[key], str):
            return f"{key} is not a name"
    if "signature" in info and not isinstance(info["signature"], dict):
        return "signature is not an object"
    config = info.get("model_config")
    if config is not None:
        if not isinstance(config, dict):
            return "model_config is not an object"
        for part in [config, *(v for v in config.values() if isinstance(v, dict))]:
            if "dim" in part and not _is_count(part["dim"]):
                return "model_config's dim is not a whole number above 0"
    history = info.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        return "history is not a list of epochs"
    for epoch in history:
        seconds = epoch.get("train_seconds", 0.0)
        if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                or not math.isfinite(seconds) or seconds < 0):
            return "history's train_seconds is not a number of seconds"
        if "processes" in epoch and not _is_count(epoch["processes"]):
            return "history's processes is not a whole number above 0"
    if "processes" in info and not _is_count(info["processes"]):
        return "processes is not a whole number above 0"
    return None


def parse_run_json(run_dir: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run's ``run.json`` and None; (None, None) when there is none; (None, why) when it is
    unreadable or not what ``masr train`` writes (``_shape_problem``), ``why`` a phrase for a
    warning ("unreadable (...)", "not what `masr train` writes (...)")."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return None, None
    try:
        info = json.loads(path.read_text())
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"unreadable ({' '.join(str(exc).split())})"
    problem = _shape_problem(info)
    if problem is not None:
        return None, f"not what `masr train` writes ({problem})"
    return info, None


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's ``run.json``; None when there is none, or it is unreadable or not what ``masr
    train`` writes (a damaged file: the run counts as not there)."""
    return parse_run_json(run_dir)[0]


def write_run_json(run_dir: Path, info: dict[str, Any]) -> None:
    """Write ``run.json`` atomically (rank 0 only under torchrun: ``masr.distributed``)."""
    if not world().is_main:
        return
    with atomic_file(run_dir / "run.json", "w") as fh:
        json.dump(info, fh, indent=2, default=str)
        fh.write("\n")


def now() -> str:
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
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return run_order([p.name for p in runs_dir.iterdir() if (p / "best.pt").is_file()])


#: held in ``runs/<run>/`` while the run is being made (``masr.lock``)
RUN_LOCK = ".lock"
#: the files ``masr train`` writes in ``runs/<run>/`` (and ``clear`` removes)
RUN_FILES = ("best.pt", "last.pt", "run.json")


def check_not_run_file(path: str | Path, option: str) -> None:
    """Refuse (MasrError) an output file that is one of a run folder's own files (QA:
    ``masr evaluate --json runs/mdr/best.pt`` replaced the checkpoint it had just read). A
    folder with another of ``RUN_FILES`` is a run folder (the file itself, e.g. a run.json an
    earlier ``--json`` wrote, does not make one); other names in it are left alone."""
    target = Path(path).resolve()
    others = [n for n in RUN_FILES if n != target.name]
    if target.name in RUN_FILES and any((target.parent / n).is_file() for n in others):
        raise MasrError(
            f"{option} {path}: a file of the run folder {target.parent}, which `masr train` "
            "writes; choose another name"
        )


#: run.json statuses of a run that did not finish: its best.pt is the best epoch so far
UNFINISHED = ("running", "interrupted", "failed")


def run_warnings(run_dir: str | Path) -> list[str]:
    """What a reader of the run in ``run_dir`` should be told (run.json read once):

    * the run did not finish (``UNFINISHED``: interrupted, failed, or killed while running);
    * a part it was made from (a fusion's MDR and MASS runs, an APR run's start, NeuMF's
      branches) has been trained again since, or continued to a better epoch
      (``earlier_parts``): this run's weights hold the former part.

    * its run.json is damaged (``parse_run_json``), so none of this can be told.

    Empty for a finished, current run or one without run.json (made elsewhere)."""
    run_dir = Path(run_dir)
    info, why = parse_run_json(run_dir)
    if why is not None:
        return [f"warning: {run_dir / 'run.json'}: {why}; whether the run finished, and what "
                "it was made from, cannot be told"]
    if info is None:
        return []
    notes = []
    if info.get("status", "finished") in UNFINISHED:
        epochs = len(info.get("history", []))
        name = info.get("run", run_dir.name)
        training = live_holder(run_dir / RUN_LOCK) if info.get("status") == "running" else None
        notes.append(
            f"warning: {run_dir} is being trained now by {training}, {epochs} epoch(s) so far: "
            "its best.pt is the best epoch so far and may change while it is read"
            if training else
            f"warning: {run_dir} is not finished ({info.get('status')}, after {epochs} "
            f"epoch(s)): its best.pt is the best epoch so far; `masr train --model {name} "
            "--resume` finishes it"
        )
    newer = earlier_parts(run_dir, info)
    if newer:
        notes.append(
            f"warning: {run_dir} was made from an earlier {' and '.join(newer)} (trained again "
            f"since); `masr train --model {run_dir.name}` makes it again from the current one"
        )
    return notes


def earlier_parts(run_dir: str | Path, info: dict[str, Any] | None = None) -> list[str]:
    """The parts the run in ``run_dir`` was made from (a fusion's MDR and MASS runs, an APR
    run's start, NeuMF's branches) that have been trained again since, or continued to a better
    epoch: its weights hold their former versions. Told by the parts' stamps it recorded
    (``made_from``: content, so a copied or synced folder is fine); for a run made before
    those existed, by the parts' best.pt file times against its start. ``info``: its run.json
    when already read."""
    from masr.runs.registry import RUNS

    run_dir = Path(run_dir)
    info = info if info is not None else read_run_json(run_dir) or {}
    made_from = info.get("made_from")
    if isinstance(made_from, dict):
        return [
            part for part, stamp in made_from.items()
            if (now_stamp := part_stamp(run_dir.parent / part)) is not None and now_stamp != stamp
        ]
    spec = RUNS.get(run_dir.name)
    # when it began: a trained run's start; a fusion or a fit is made in a moment
    began = info.get("started") or info.get("finished")
    if spec is None or not began:
        return []
    since = _dt.datetime.fromisoformat(began).timestamp() + 1.0  # whole seconds kept
    parts = list(spec.parts) or ([spec.start_from] if spec.start_from else [])
    return [  # a part's best.pt changes only when it is trained again or improves
        part for part in parts
        if (best := run_dir.parent / part / "best.pt").is_file() and best.stat().st_mtime > since
    ]


def checkpoint_damage(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is not whole, else None: "cut short" (torch.save writes a
    zip archive whose directory comes last, so a file cut short by a full disk or a stopped
    copy has none), or "ENTRY does not match its checksum" (a changed byte: torch.load checks no
    CRC and would load other weights; QA: --resume trained on from them). Torch-free."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception:  # OSError, BadZipFile, a damaged entry header
        return "cut short"
    return None if bad is None else f"{bad.partition('/')[2] or bad} does not match its checksum"


def intact_checkpoint(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` is whole (``checkpoint_damage``)."""
    return checkpoint_damage(path) is None


def part_stamp(run_dir: str | Path) -> dict[str, Any] | None:
    """What tells the weights in a run's best.pt apart, from its run.json: the best epoch and
    its validation figures. Recorded by the runs made from it (``made_from``: an APR run's
    start, a fusion's parts, NeuMF's branches), it is content, so unlike file times it survives
    a copied or synced runs folder; None for a run without run.json or a best epoch."""
    best = (read_run_json(run_dir) or {}).get("best")
    if not isinstance(best, dict):
        return None
    stamp: dict[str, Any] = {"epoch": best.get("epoch")}
    for protocol in ("valid", "valid_full"):
        for metric in ("hit@10", "ndcg@10"):
            stamp[f"{protocol} {metric}"] = (best.get(protocol) or {}).get(metric)
    return stamp


def part_stamps(runs_dir: str | Path, parts: list[str]) -> dict[str, Any]:
    """{part: part_stamp} of the runs a run is made from (``made_from`` in its run.json)."""
    return {part: part_stamp(Path(runs_dir) / part) for part in parts}


def load_run(
    runs_dir: str | Path,
    name: str,
    data: PreparedData | None = None,
    device: Any = "cpu",
    warn: Callable[[str], None] | None = None,
) -> tuple[Recommender, dict[str, Any]]:
    """The best model of run ``name`` (checking it was made on ``data`` when given); ``warn``
    gets the lines of ``run_warnings``. The model keeps the fingerprint of the data it was
    trained on (``model.data_fingerprint``): ``evaluate_model`` refuses other data with it."""
    from masr.checkpoint import load_model

    if data is not None:
        from masr.dataset import check_prepared

        check_prepared(data)
    if device != "cpu":  # "auto", "cuda", a torch.device: as training reads them
        from masr.train import resolve_device

        device = resolve_device(device)
    path = Path(runs_dir) / name / "best.pt"
    if not path.is_file():
        have = available_runs(runs_dir)
        raise MasrError(
            f"--model {name}: no trained run at {path}"
            + (f" (trained: {', '.join(have)})" if have else f"; run `masr train --model {name}`")
        )
    model, ckpt = load_model(path, device)  # with its data_fingerprint (build_model)
    if warn is not None:
        for note in run_warnings(path.parent):
            warn(note)
    if data is not None and ckpt.get("data_fingerprint") != data.fingerprint:
        raise MasrError(
            f"{path}: trained on other prepared data (fingerprint {ckpt.get('data_fingerprint')}, "
            f"{data.path} has {data.fingerprint}); retrain or pass the matching --data"
        )
    return model, ckpt


def clear(run_dir: Path) -> None:
    """Remove a previous run's files so that a fresh run never mixes with them (rank 0 only
    under torchrun)."""
    if not world().is_main:
        return
    if run_dir.exists():
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
