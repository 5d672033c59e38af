"""masr.foldin: the maps that fold a new playlist into MDR, against plain least squares."""

from __future__ import annotations

import numpy as np
import pytest

from masr.foldin import MIN_PLAYLISTS_PER_ROW, fit_playlist_maps, fold_playlists, fold_users

D, N_USERS, N_SONGS = 3, 7, 40


def tables(n_playlists: int, seed: int = 0):
    """Random song and user vectors, playlists of 1-6 songs each with a user: (song, user,
    playlist_user, indptr, train_song, means (P, d))."""
    rng = np.random.default_rng(seed)
    song = rng.normal(size=(N_SONGS, D)).astype(np.float32)
    user = rng.normal(size=(N_USERS, D)).astype(np.float32)
    lengths = rng.integers(1, 7, size=n_playlists)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    train_song = np.concatenate([rng.choice(N_SONGS, size=n, replace=False) for n in lengths])
    playlist_user = rng.integers(0, N_USERS, size=n_playlists)
    bounds = zip(indptr[:-1], indptr[1:], strict=True)
    means = np.stack([song[train_song[a:b]].mean(0) for a, b in bounds])
    return song, user, playlist_user, indptr, train_song, means


def test_an_affine_relation_is_recovered_exactly() -> None:
    """Playlists whose learned p is exactly A·mean + C·u + b: the map with the user finds it
    (up to the tiny ridge), the map without the user is plain least squares on [mean, 1]."""
    song, user, playlist_user, indptr, train_song, means = tables(200)
    rng = np.random.default_rng(1)
    a, c, b = rng.normal(size=(D, D)), rng.normal(size=(D, D)), rng.normal(size=D)
    u = user[playlist_user]
    playlist = (means @ a + u @ c + b).astype(np.float32)
    maps = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, ridge=1e-9)
    assert maps is not None and maps.playlists == 200 and maps.r2 == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(maps.with_user, np.vstack([a, c, b]), atol=1e-4)
    x = np.hstack([means, np.ones((200, 1))])
    lstsq = np.linalg.lstsq(x, playlist.astype(np.float64), rcond=None)[0]
    np.testing.assert_allclose(maps.without_user, lstsq, atol=1e-4)
    got = fold_playlists(maps, means, u, np.ones(200, dtype=bool))
    np.testing.assert_allclose(got, playlist, atol=1e-4)


def test_the_user_map_is_least_squares_from_the_playlists_songs() -> None:
    """A new user's u from the songs of the playlist scored: fitted on every training playlist
    against its user's vector (users with several playlists count once per playlist)."""
    song, user, playlist_user, indptr, train_song, means = tables(200)
    playlist = np.zeros((200, D), dtype=np.float32)
    maps = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, ridge=1e-12)
    assert maps is not None and maps.user is not None
    x = np.hstack([means, np.ones((200, 1))])
    lstsq = np.linalg.lstsq(x, user[playlist_user].astype(np.float64), rcond=None)[0]
    np.testing.assert_allclose(maps.user, lstsq, atol=1e-4)
    np.testing.assert_allclose(fold_users(maps, means[:5]), x[:5] @ lstsq, atol=1e-4)


def test_the_ridge_shrinks_the_slopes_but_not_the_intercept() -> None:
    song, user, playlist_user, indptr, train_song, means = tables(200)
    playlist = np.full((200, D), 5.0, dtype=np.float32) + 0.01 * means.astype(np.float32)
    loose = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, 1e-9)
    tight = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, 1e3)
    assert loose is not None and tight is not None
    assert np.abs(tight.with_user[:-1]).max() < 0.01 * np.abs(loose.with_user[:-1]).max()
    np.testing.assert_allclose(tight.with_user[-1], playlist.mean(0), atol=1e-3)


def test_playlists_without_training_songs_are_left_out() -> None:
    """A playlist with no training row never trained its p: its (random) vector must not pull
    the fit; the rows of the others decide it alone."""
    song, user, playlist_user, indptr, train_song, means = tables(100)
    playlist = (means @ np.eye(D) + 1.0).astype(np.float32)
    # append 20 empty playlists with wild vectors
    indptr_e = np.concatenate([indptr, np.full(20, indptr[-1])])
    playlist_e = np.vstack([playlist, np.full((20, D), 1e3, dtype=np.float32)])
    users_e = np.concatenate([playlist_user, np.zeros(20, dtype=playlist_user.dtype)])
    maps = fit_playlist_maps(song, user, playlist_e, users_e, indptr_e, train_song, 1e-9)
    base = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song, 1e-9)
    assert maps is not None and base is not None and maps.playlists == 100
    np.testing.assert_allclose(maps.with_user, base.with_user, atol=1e-6)


def test_too_few_playlists_give_no_maps() -> None:
    enough = MIN_PLAYLISTS_PER_ROW * (2 * D + 1)
    for n, fitted in ((enough - 1, False), (enough, True)):
        song, user, playlist_user, indptr, train_song, means = tables(n)
        playlist = means.astype(np.float32)
        maps = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song)
        assert (maps is not None) == fitted


def test_folding_picks_the_map_by_whether_the_user_is_known() -> None:
    song, user, playlist_user, indptr, train_song, means = tables(120)
    rng = np.random.default_rng(2)
    playlist = rng.normal(size=(120, D)).astype(np.float32)
    maps = fit_playlist_maps(song, user, playlist, playlist_user, indptr, train_song)
    assert maps is not None
    mean, u = means[:4], user[playlist_user[:4]]
    known = np.array([True, False, True, False])
    got = fold_playlists(maps, mean, u, known)
    ones = np.ones((4, 1))
    with_user = np.hstack([mean, u, ones]) @ maps.with_user
    without = np.hstack([mean, ones]) @ maps.without_user
    np.testing.assert_allclose(got, np.where(known[:, None], with_user, without), rtol=1e-5)


def test_playlist_sums_in_blocks_equal_a_loop() -> None:
    """The playlists' song sums, gathered a block of rows at a time: empty playlists, one
    longer than a block, every block size."""
    from masr.foldin import _playlist_sums

    rng = np.random.default_rng(3)
    for block in (1, 2, 3, 5, 64):
        lengths = rng.integers(0, 7, size=25)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        train_song = rng.integers(0, N_SONGS, size=indptr[-1])
        song = rng.normal(size=(N_SONGS, D)).astype(np.float32)
        want = np.stack([song[train_song[a:b]].astype(np.float64).sum(0)
                         for a, b in zip(indptr[:-1], indptr[1:], strict=True)])
        np.testing.assert_allclose(_playlist_sums(song, indptr, train_song, block), want)
