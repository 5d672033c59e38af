"""Model registry: name -> class, imported lazily so that listing names never imports torch."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from masr.models.base import Recommender

# The paper's models. The adversarial variants (amdr, amass, amasr) are the same classes
# trained with APR; `masr.runs` maps run names to classes and training procedures.
PAPER_MODELS = {
    "mdr": "masr.models.mdr:MDR",
    "mass": "masr.models.mass:MASS",
    "masr": "masr.models.masr:MASR",
}
# Baselines (issue 5).
BASELINES = {
    "pop": "masr.models.pop:Popularity",
    "itemknn": "masr.models.itemknn:ItemKNN",
    "ease": "masr.models.ease:EASE",
    "mfbpr": "masr.models.mfbpr:MFBPR",
    "cml": "masr.models.cml:CML",
    "fism": "masr.models.fism:FISM",
    "als": "masr.models.als:ALS",
}
REGISTRY = {**PAPER_MODELS, **BASELINES}


def model_class(name: str) -> type[Recommender]:
    """The class registered under ``name`` (``mdr``, ``mass``, ``itemknn`` ...)."""
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(import_module(module), attr)
