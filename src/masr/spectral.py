"""A start for the song tables from the training data: the truncated SVD of the playlist × song
matrix (``song_init="svd"``, e.g. ``masr train --model amasr --set mass.song_init=svd``).

MASS compares a candidate's query with the playlist's member songs (eqs. 12-19), and from a
random start its song table knows nothing of which songs go together: on AOTM-2011 its first
epoch ranks the catalog no better than popularity does. The left and right singular vectors of the
training matrix put songs that share playlists near each other from the first step (PureSVD,
Cremonesi et al., RecSys 2010), so training starts from an item-based solution and refines it
(docs/training.md, "A start from the training matrix's SVD").

    X[p, s] = [s in playlist p] · n_s^(-β)        n_s = training playlists holding s, β = 0.5
    X ≈ U diag(σ) Vᵀ                              rank k (torch.svd_lowrank: k + 8 random
                                                  directions, 4 power iterations)
    playlists: U diag(σ)^½ (P, k)   songs: V diag(σ)^½ (V, k)

β damps the popular songs, whose column would otherwise fill the first factors. The factors
are deterministic for a seed: the randomised SVD draws from a forked generator seeded with it,
and the global one is left as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from masr.dataset import PreparedData

#: the song inits a model config accepts: "random" (N(0, σ²), the paper's); "svd" (rank d, each
#: coordinate shifted to be non-negative); "svd-split" (rank d/2, each factor split into its
#: positive and negative parts: non-negative with no shift)
SONG_INITS = ("random", "svd", "svd-split")
#: n_s^(-β): the popularity damping of the training matrix's columns
POPULARITY_DAMPING = 0.5
#: random directions beyond the k kept (the randomised SVD's oversampling)
OVERSAMPLE = 8


def training_factors(
    data: PreparedData, k: int, beta: float = POPULARITY_DAMPING, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """(playlist factors (P, k), song factors (V, k)), float32 on the CPU, of the rank-k
    truncated SVD of the popularity-damped training matrix (module docstring). Columns past the
    matrix's rank (k > min(P, V)) are zero."""
    rows = torch.as_tensor(data.train_playlist, dtype=torch.long)
    cols = torch.as_tensor(data.train_song, dtype=torch.long)
    n_p, n_s = data.n_playlists, data.n_songs
    counts = torch.bincount(cols, minlength=n_s).to(torch.float32).clamp_min(1.0)
    x = torch.sparse_coo_tensor(
        torch.stack([rows, cols]), counts[cols].pow(-beta), (n_p, n_s), check_invariants=False
    ).coalesce()  # indices in range by construction; duplicates (none after prep) would add up
    rank = min(k, n_p, n_s)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # OVERSAMPLE more random directions than kept: the top k come out more accurate
        u, sigma, v = torch.svd_lowrank(x, q=min(rank + OVERSAMPLE, n_p, n_s), niter=4)
    u, sigma, v = u[:, :rank], sigma[:rank], v[:, :rank]
    half = sigma.clamp_min(0.0).sqrt()
    playlists = torch.zeros(n_p, k, dtype=torch.float32)
    songs = torch.zeros(n_s, k, dtype=torch.float32)
    playlists[:, :rank] = u * half
    songs[:, :rank] = v * half
    return playlists, songs


def split_signs(factors: Tensor, width: int) -> Tensor:
    """(V, width) non-negative rows [max(f, 0), max(-f, 0)] from factors (V, k), 2k <= width,
    zero-padded: no coordinate is negative and no row gets an offset (|row| = |f|). For two
    songs the squared distance is |f_a - f_b|² less 2 |f_a,j| |f_b,j| for every coordinate j
    where their signs differ, so songs close in the factors stay close."""
    n, k = factors.shape
    if 2 * k > width:
        raise ValueError(f"split_signs: 2 * {k} factors do not fit in {width} coordinates")
    out = torch.zeros(n, width, dtype=factors.dtype)
    out[:, :k] = factors.clamp_min(0.0)
    out[:, k : 2 * k] = factors.neg().clamp_min(0.0)
    return out


def song_start(data: PreparedData, dim: int, init: str, seed: int = 0) -> Tensor | None:
    """The (V, dim) non-negative song table a ``song_init`` asks for, None for "random".
    "svd": the rank-dim factors, each coordinate shifted by its minimum over the catalog
    (shifting both sides changes no distance, but every row gets an offset); "svd-split":
    the rank-dim/2 factors through ``split_signs`` (no offset, but distances between songs of
    opposite signs shrink; with dim 1 the positive part alone)."""
    if init == "svd":
        _, songs = training_factors(data, dim, seed=seed)
        return songs - songs.min(0).values  # every coordinate >= 0
    if init == "svd-split":
        _, factors = training_factors(data, max(dim // 2, 1), seed=seed)
        return split_signs(factors, dim) if dim >= 2 else factors.clamp_min(0.0)
    return None
