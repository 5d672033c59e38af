"""The models' tensors as float32 NumPy arrays: all the graph builders ever see of a model.

They come from the models' public ``export_weights()`` (``masr.models.mdr.MDR``,
``masr.models.mass.MASS``), which name and document each tensor with its equation; the export
never reads a model's attributes, so renaming them inside a model cannot break it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor


class ExportsWeights(Protocol):
    """A model that hands over its named tensors (MDR, MASS)."""

    name: str

    def export_weights(self) -> dict[str, Tensor]: ...


@dataclass
class MDRWeights:
    """MDR's tensors (eq. 11), float32."""

    user: np.ndarray  # (n_users, d) u
    playlist: np.ndarray  # (n_playlists, d) p
    song: np.ndarray  # (V, d) s
    song_bias: np.ndarray  # (V,) θ_s
    metric_user: np.ndarray  # (d,) B1
    metric_playlist: np.ndarray  # (d,) B2


@dataclass
class MASSWeights:
    """MASS's tensors (eqs. 12-19), float32; ``att_*`` is the attention memory. The query
    matrices come split: W [u; s] = W_u u + W_s s."""

    user: np.ndarray  # (n_users, d) U
    song: np.ndarray  # (V, d) S
    query_user: np.ndarray  # (d, d) W1_u
    query_song: np.ndarray  # (d, d) W1_s
    query_bias: np.ndarray  # (d,) b1
    metric: np.ndarray  # (d,) B3
    song_bias: np.ndarray  # (V,) b_s
    att_user: np.ndarray  # (n_users, d) U^(a)
    att_song: np.ndarray  # (V, d) S^(a)
    att_query_user: np.ndarray  # (d, d) W2_u
    att_query_song: np.ndarray  # (d, d) W2_s
    att_query_bias: np.ndarray  # (d,) b2
    att_metric: np.ndarray  # (d,) B4


W = TypeVar("W", MDRWeights, MASSWeights)


def _np(t: Tensor) -> np.ndarray:
    """A float32 NumPy view of ``t`` where it is one already (a copy otherwise): the export
    reads the model's tables once, without a second copy (do not change the model meanwhile)."""
    return t.detach().to("cpu").float().numpy()


def _weights(cls: type[W], model: ExportsWeights) -> W:
    """``cls`` filled from ``model.export_weights()``; a missing or extra name is an error."""
    tensors = model.export_weights()
    names = {f.name for f in fields(cls)}
    if set(tensors) != names:
        raise ValueError(
            f"{model.name}.export_weights() gives {sorted(tensors)}, the export needs "
            f"{sorted(names)}"
        )
    return cls(**{name: _np(t) for name, t in tensors.items()})


def mdr_weights(model: ExportsWeights) -> MDRWeights:
    """The tensors of an ``masr.models.mdr.MDR``."""
    return _weights(MDRWeights, model)


def mass_weights(model: ExportsWeights) -> MASSWeights:
    """The tensors of an ``masr.models.mass.MASS``."""
    return _weights(MASSWeights, model)
