"""The runs directory: run names and plans (``registry``), files on disk (``store``) and making
runs (``make``). Torch-free to import; see docs/design.md for the layout of ``runs/<run>/``."""

from masr.runs.make import RunOutcome, train_run
from masr.runs.registry import (
    RUNS,
    RunSpec,
    default_recipe,
    model_config,
    plan,
    run_spec,
    signature,
)
from masr.runs.store import available_runs, load_run, read_run_json, saved_options

__all__ = [
    "RUNS",
    "RunOutcome",
    "RunSpec",
    "available_runs",
    "default_recipe",
    "load_run",
    "model_config",
    "plan",
    "read_run_json",
    "run_spec",
    "saved_options",
    "signature",
    "train_run",
]
