"""masr: automatic playlist continuation with Mahalanobis distance-based recommenders.

Implements "Adversarial Mahalanobis Distance-based Attentive Song Recommender" (SIGIR 2019):
MDR, MASS, their fixed fusion MASR and the adversarially trained AMDR / AMASS / AMASR.

The library never imports the CLI (`masr_cli`), and importing `masr` never imports torch:
modules that need PyTorch import it themselves, so ONNX scoring runs without it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from masr.errors import MasrError
from masr.seed import set_seed

try:
    __version__ = version("masr")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["MasrError", "__version__", "set_seed"]
