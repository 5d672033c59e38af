"""Fold-in of playlists MDR never saw: their vector p of eq. 11 from their songs (and user).

A new playlist has no learned p. The plain fold-in takes the mean of its songs' vectors, the
exact minimiser of Σ_t |B2 ⊙ (p - s_t)|², but training does not put a playlist's p there: the
softmax over the catalog also pushes p away from the songs that compete with its members, and
the user term shares the work. So the export can fold in with an affine map fitted, once, by
ridge least squares on every training playlist (its learned p against its songs' mean and its
user's vector):

    p ≈ [mean_t s_t, u, 1] · W_u         (a known user: (2d+1, d))
    p ≈ [mean_t s_t, 1] · W_0            (an unknown user: (d+1, d))

and, the same way, the user vector of a user MDR never saw from the songs of the playlist being
scored (fitted on every training playlist against its user's learned u):

    u ≈ [mean_t s_t, 1] · W_user          ((d+1, d))

All three are closed-form (about 1.5 s on one core at AOTM-2011's size, in ``masr export``),
and cost a small product each per new row in the scoring graph. On AOTM-2011 playlists held
out of training, full-ranking hit@10 rises from 0.0217 to 0.0355 for MDR, from 0.0318 to 0.0550
for AMDR and from 0.0365 to 0.0558 for the AMASR fusion (docs/training.md, "New playlists: a
learned fold-in").

Public API (NumPy only; the export and the benchmarks use it, scoring never needs it):
    fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, ridge=RIDGE)
        -> FoldInMaps | None     None when there are too few training playlists to fit
    fold_playlists(maps, mean, user, known_user) -> (B, d)    the maps applied: the reference
        the exported graph is tested against
    fold_users(maps, mean) -> (B, d)                         u of new users from their
        playlist's songs' mean
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the ridge penalty, relative to n × the inputs' mean variance (so it does not depend on the
#: scale the embeddings were trained to, nor on the number of playlists)
RIDGE = 1e-3
#: fit only from this many training playlists per fitted coefficient row (2d + 1): fewer, and
#: the plain mean is kept (a map from a handful of playlists would be noise)
MIN_PLAYLISTS_PER_ROW = 4


@dataclass
class FoldInMaps:
    """The fitted maps (float32) and what they were fitted on."""

    with_user: np.ndarray  # (2d + 1, d): [mean, u, 1] -> p
    without_user: np.ndarray  # (d + 1, d): [mean, 1] -> p
    playlists: int  # training playlists fitted on
    r2: float  # share of the learned p's variance the map with the user explains
    user: np.ndarray  # (d + 1, d): [mean, 1] -> u of a new user


def _ridge(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """[W; b] ((k + 1, d)) minimising |x W + b - y|² + λ |W|² (the intercept b not penalised),
    λ = ``ridge`` × the mean variance of x's columns × n: float64, centred first."""
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc = x - x_mean
    gram = xc.T @ xc  # (k, k)
    lam = ridge * float(np.trace(gram)) / gram.shape[0]
    gram[np.diag_indices_from(gram)] += max(lam, np.finfo(np.float64).tiny)
    w = np.linalg.solve(gram, xc.T @ (y - y_mean))  # (k, d)
    return np.concatenate([w, (y_mean - x_mean @ w)[None]], axis=0)


def _playlist_sums(
    song: np.ndarray, indptr: np.ndarray, train_song: np.ndarray, block: int = 1 << 16
) -> np.ndarray:
    """(P, d) float64 sum of each playlist's song vectors, ``block`` training rows at a time
    (AOTM's 0.9M rows gathered at once would be a 0.4 GB float64 copy)."""
    n_playlists, d = len(indptr) - 1, song.shape[1]
    sums = np.zeros((n_playlists, d), dtype=np.float64)
    start = 0
    while start < n_playlists:
        # the playlists whose rows fit the block (at least one, however long)
        end = int(np.searchsorted(indptr, indptr[start] + block, side="right")) - 1
        end = min(max(end, start + 1), n_playlists)
        lo = indptr[start]
        firsts = indptr[start:end]
        nonempty = indptr[start + 1 : end + 1] > firsts
        if nonempty.any():
            rows = song[train_song[lo : indptr[end]]].astype(np.float64)
            sums[start:end][nonempty] = np.add.reduceat(rows, firsts[nonempty] - lo, axis=0)
        start = end
    return sums


def fit_playlist_maps(
    song: np.ndarray,
    user: np.ndarray,
    playlist: np.ndarray,
    playlist_user: np.ndarray,
    indptr: np.ndarray,
    train_song: np.ndarray,
    ridge: float = RIDGE,
) -> FoldInMaps | None:
    """The fold-in maps of an MDR with song vectors ``song`` (V, d), user vectors ``user``
    (U, d) and playlist vectors ``playlist`` (P, d), from the training playlists: playlist j's
    songs are ``train_song[indptr[j]:indptr[j + 1]]`` and its user ``playlist_user[j]``.
    Playlists without training songs are left out (their p never trained); None when fewer
    than ``MIN_PLAYLISTS_PER_ROW`` × (2d + 1) are left."""
    n_playlists, d = playlist.shape
    lengths = np.diff(indptr)  # (P,)
    fitted = lengths > 0
    n = int(fitted.sum())
    if n < MIN_PLAYLISTS_PER_ROW * (2 * d + 1):
        return None
    mean = _playlist_sums(song, indptr, train_song)[fitted] / lengths[fitted, None]  # (n, d)
    u = user[playlist_user[fitted]].astype(np.float64)  # (n, d)
    target = playlist[fitted].astype(np.float64)  # (n, d)
    x_u = np.concatenate([mean, u], axis=1)  # (n, 2d)
    with_user = _ridge(x_u, target, ridge)  # (2d + 1, d)
    # p and u from the songs' mean alone: one solve for both targets (the columns of a ridge
    # solution are independent; λ depends on the inputs only)
    from_mean = _ridge(mean, np.concatenate([target, u], axis=1), ridge)  # (d + 1, 2d)
    without_user, user_map = from_mean[:, :d], from_mean[:, d:]
    residual = float(np.square(x_u @ with_user[:-1] + with_user[-1] - target).sum())
    spread = float(np.square(target - target.mean(0)).sum())
    return FoldInMaps(
        with_user=with_user.astype(np.float32),
        without_user=without_user.astype(np.float32),
        playlists=n,
        r2=1.0 - residual / spread if spread > 0 else 0.0,
        user=user_map.astype(np.float32),
    )


def fold_playlists(
    maps: FoldInMaps, mean: np.ndarray, user: np.ndarray, known_user: np.ndarray
) -> np.ndarray:
    """p (B, d) of new playlists from their songs' mean (B, d) and, where ``known_user`` (B,)
    holds, their user's vector ``user`` (B, d; other rows ignored)."""
    with_user = _affine(mean, user) @ maps.with_user
    without_user = _affine(mean) @ maps.without_user
    return np.where(known_user[:, None], with_user, without_user).astype(np.float32)


def fold_users(maps: FoldInMaps, mean: np.ndarray) -> np.ndarray:
    """u (B, d) of users MDR never saw, from the mean (B, d) of their playlist's songs."""
    return (_affine(mean) @ maps.user).astype(np.float32)


def _affine(*parts: np.ndarray) -> np.ndarray:
    """[parts..., 1] (B, k + 1) in float64: a map's input rows."""
    ones = np.ones((parts[0].shape[0], 1), dtype=np.float64)
    return np.concatenate([*(p.astype(np.float64) for p in parts), ones], axis=1)
