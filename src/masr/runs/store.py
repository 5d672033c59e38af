"""The runs directory on disk: ``run.json`` I/O, which runs exist, loading a run's best model.

Only reads and small atomic writes; never trains. Torch is imported inside ``load_run`` only.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masr.atomic import atomic_file
from masr.config import RunOptions
from masr.distributed import world
from masr.errors import MasrError
from masr.runs.registry import plan, run_order

if TYPE_CHECKING:
    from masr.dataset import PreparedData
    from masr.models.base import Recommender


def read_run_json(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "run.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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


def clear(run_dir: Path) -> None:
    """Remove a previous run's files so that a fresh run never mixes with them (rank 0 only
    under torchrun)."""
    if not world().is_main:
        return
    if run_dir.exists():
        for name in ("best.pt", "last.pt", "run.json"):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
