"""Shared helpers for the baselines (issue 5): entity choice, member matrices, memory checks.

The closed-form baselines (pop, itemknn, ease, als) compute their state in ``fit`` rather than
by gradient steps, and some of it (a sparse similarity matrix, a V x V weight matrix) has a size
known only after fitting. ``FittedBuffers`` lets ``build_model`` rebuild such a model from a
checkpoint: the named buffers take the shape of the tensors being loaded instead of failing
``load_state_dict``'s shape check.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from masr.config import ENTITIES
from masr.errors import MasrError
from masr.models.base import Batch

# torch marks CSR tensors "beta" with a UserWarning on first use; the operations used here
# (CSR @ dense, sampled_addmm, CSR @ CSR) are the stable core of it.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

Entity = Literal["user", "playlist"]


def check_entity(model: str, entity: str) -> None:
    """Refuse an unknown ``entity`` with a one-line MasrError naming the option."""
    if entity not in ENTITIES:
        raise MasrError(f"{model}: --entity must be 'user' or 'playlist', not {entity!r}")


def entity_count(entity: str, n_users: int, n_playlists: int) -> int:
    """Rows of the entity table: users (user -> song) or playlists (playlist -> song)."""
    return n_users if entity == "user" else n_playlists


def entity_index(entity: str, batch: Batch) -> Tensor:
    """(B,) the batch's user or playlist indices, whichever the model is built on."""
    return batch.users if entity == "user" else batch.playlists


class FittedBuffers:
    """Mixin for ``Recommender`` subclasses whose buffers are sized by ``fit``."""

    #: Buffer names whose shape follows the loaded state dict.
    resizable_buffers: ClassVar[tuple[str, ...]] = ()

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for name in self.resizable_buffers:
            loaded = state_dict.get(prefix + name)
            if isinstance(loaded, Tensor):
                # Re-registering keeps it a buffer; the copy in super() then fits exactly.
                self.register_buffer(name, torch.empty_like(loaded))
        super()._load_from_state_dict(state_dict, prefix, *args)  # type: ignore[misc]


def sq_dist(x: Tensor, y: Tensor) -> Tensor:
    """(B, V) |x - y|^2 = |x|^2 - 2 x.y + |y|^2 as one GEMM, rounding clamped at 0."""
    return ((x * x).sum(1, keepdim=True) - 2.0 * (x @ y.t()) + (y * y).sum(1)).clamp_min(0.0)


def sparse_coo(indices: Tensor, values: Tensor, shape: tuple[int, ...]) -> Tensor:
    """COO tensor from indices we built ourselves (in range by construction: no checks)."""
    return torch.sparse_coo_tensor(indices, values, shape, check_invariants=False)


def sparse_csr(crow: Tensor, col: Tensor, values: Tensor, shape: tuple[int, ...]) -> Tensor:
    """CSR tensor from arrays of a valid CSR matrix (no invariant checks)."""
    return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def member_indicator_sparse(
    batch: Batch, n_songs: int, dtype: torch.dtype = torch.float32
) -> Tensor:
    """(B, V) sparse CSR 0/1 matrix of each row's member songs (duplicates counted once)."""
    rows = torch.arange(batch.members.shape[0], device=batch.members.device)
    rows = rows[:, None].expand_as(batch.members)[batch.member_mask]  # (M,)
    cols = batch.members[batch.member_mask]  # (M,)
    values = torch.ones(rows.shape[0], dtype=dtype, device=rows.device)
    coo = sparse_coo(torch.stack([rows, cols]), values, (batch.members.shape[0], n_songs))
    coo = coo.coalesce()
    coo = sparse_coo(coo.indices(), coo.values().clamp(max=1), coo.shape).coalesce()
    return coo.to_sparse_csr()


def human_bytes(n_bytes: float) -> str:
    """Human-readable size, e.g. ``'15.3 GiB'``, ``'36.0 KiB'``, ``'1000 B'``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{int(n_bytes)} B"


def interaction_matrix(
    rows: np.ndarray,
    songs: np.ndarray,
    n_rows: int,
    n_songs: int,
    device: torch.device,
    *,
    binary: bool = True,
) -> Tensor:
    """(n_rows, V) sparse CSR float32 matrix with a 1 (or the count when ``binary=False``)
    per (row, song) pair of training interactions."""
    idx = torch.stack(
        [torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(songs, dtype=torch.long)]
    )
    vals = torch.ones(idx.shape[1], dtype=torch.float32)
    coo = sparse_coo(idx, vals, (n_rows, n_songs)).coalesce()
    if binary:
        coo = sparse_coo(coo.indices(), torch.ones_like(coo.values()), coo.shape).coalesce()
    return coo.to_sparse_csr().to(device)
