"""The single place that seeds every random number generator masr uses."""

from __future__ import annotations

import numbers
import os
import random
import sys

import numpy as np

#: seeds are in [0, MAX_SEED]: what every generator masr seeds accepts (PyTorch's is 64-bit
#: signed on the way in; NumPy refuses negatives)
MAX_SEED = 2**63 - 1


def check_seed(seed: int, option: str = "--seed") -> None:
    """One clear MasrError for a seed that is not an integer (numpy's too, not a bool) or lies
    outside [0, MAX_SEED]: a seed given from Python as "1", 1.5 or None is refused before any
    generator is seeded, not as a TypeError from numpy after Python's was."""
    from masr.errors import MasrError

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise MasrError(f"{option} {seed!r}: is not an integer")
    if not 0 <= seed <= MAX_SEED:
        raise MasrError(f"{option} must be in [0, 2^63 - 1] (got {seed})")


def set_seed(seed: int, *, deterministic: bool = True) -> np.random.Generator:
    """Seed Python, NumPy and (when it is imported or importable) PyTorch.

    Returns a fresh ``numpy.random.Generator`` seeded with ``seed`` for callers that draw
    NumPy randomness explicitly. PyTorch is only seeded when it is already imported, so that
    torch-free code paths (ONNX scoring) never import it.
    """
    check_seed(seed)
    seed = int(seed)  # a numpy integer: Python's random.seed takes ints only
    random.seed(seed)
    np.random.seed(seed % (2**32))
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
    return np.random.default_rng(seed)
