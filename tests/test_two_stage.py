"""The two-stage graph (masr export --candidates N): MDR's eq. 11 proposes N songs per playlist,
eq. 20's fusion re-ranks them. Against a PyTorch reference of the same two-stage computation,
and equal to the exact graph once N covers the catalog."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export import (
    ALPHA,
    FUSED,
    MAPS,
    MASS_PART,
    MDR_PART,
    N_PLAYLISTS,
    N_SONGS,
    N_USERS,
    fused_session,
    reference,
)
from test_export import run as run_exact

from masr.export import build_graph, mdr_weights
from masr.models.base import Batch
from masr.models.masr import MASR


def two_stage_graph(n: int, alpha: float = ALPHA, fold_in=None):  # noqa: ANN001
    return fused_session(fold_in, alpha, candidates=n)


def run(sess, users, playlists, members, k: int, n: int | None = None):
    feed = {
        "users": np.asarray(users, dtype=np.int64),
        "playlists": np.asarray(playlists, dtype=np.int64),
        "members": np.asarray(members, dtype=np.int64).reshape(len(users), -1),
        "k": np.array(k, dtype=np.int64),
    }
    if n is not None:  # else the graph's default, the export's N
        feed["candidates"] = np.array(n, dtype=np.int64)
    return tuple(sess.run(["songs", "scores"], feed))


def two_stage_reference(cheap: np.ndarray, fused: np.ndarray, n: int, k: int):
    """The same computation, spelled out: the N smallest MDR distances (members +inf) are the
    candidates, the K smallest fused distances among them the answer. (songs, -distances)."""
    cand = np.argsort(cheap, axis=1, kind="stable")[:, :n]
    on_cand = np.take_along_axis(fused, cand, axis=1)
    on_cand[~np.isfinite(np.take_along_axis(cheap, cand, axis=1))] = np.inf
    pos = np.argsort(on_cand, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(cand, pos, axis=1), -np.take_along_axis(on_cand, pos, axis=1)


def assert_same(got, want) -> None:
    songs, scores = got
    want_songs, want_scores = want
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)
    finite = np.isfinite(want_scores)
    np.testing.assert_array_equal(songs[finite], want_songs[finite])


USERS = [0, 0, 3, 1, 3, 0, 4]
PLAYLISTS = [0, 1, 2, 3, 4, 5, 8]
MEMBERS = [[1, 2, 3, -1], [4, -1, -1, -1], [5, 6, 7, 8], [9, 1, -1, -1], [2, 2, 10, -1],
           [11, 12, 13, 14], [0, -1, 15, -1]]  # fmt: skip


def test_matches_pytorch_models_doing_the_same_two_stages() -> None:
    """MDR.full_distance proposes, MASR.full_distance (eq. 20) re-ranks the proposals."""
    m = torch.tensor(MEMBERS)
    batch = Batch(torch.tensor(USERS), torch.tensor(PLAYLISTS), m.clamp_min(0), m >= 0)
    rows = torch.arange(len(USERS))[:, None].expand_as(m)[m >= 0]
    with torch.no_grad():
        cheap = MDR_PART.full_distance(batch).double()
        fused = MASR.from_parts(MDR_PART, MASS_PART, alpha=ALPHA).full_distance(batch).double()
    cheap[rows, m[m >= 0]] = float("inf")
    fused[rows, m[m >= 0]] = float("inf")
    for n in (3, 8, 15):
        want = two_stage_reference(cheap.numpy(), fused.numpy(), n, 5)
        got = run(two_stage_graph(n), USERS, PLAYLISTS, MEMBERS, 5)
        assert got[0].shape == (len(USERS), min(5, n))
        assert_same(got, want)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda b: st.tuples(
            st.lists(st.integers(-1, N_USERS - 1), min_size=b, max_size=b),
            st.lists(st.integers(-1, N_PLAYLISTS - 1), min_size=b, max_size=b),
            st.integers(1, 5).flatmap(
                lambda n: st.lists(
                    st.lists(st.integers(-1, N_SONGS - 1), min_size=n, max_size=n),
                    min_size=b,
                    max_size=b,
                )
            ),
            st.integers(1, N_SONGS + 3),  # N, past the catalog too
            st.integers(1, 8),  # K
        )
    )
)
def test_any_batch_with_fold_in_matches_the_reference(case) -> None:
    """Unknown users and playlists, rows without members, N below K or past the catalog."""
    users, playlists, members, n, k = case
    cheap = reference(MDR_PART, None, 1.0, users, playlists, members)  # eq. 11 with fold-in
    fused = reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members)
    got = run(TWO_STAGE, users, playlists, members, k, n)
    assert got[0].shape[1] == min(k, n, N_SONGS)
    assert_same(got, two_stage_reference(cheap, fused, min(n, N_SONGS), k))
    # new playlists through fold-in maps: both stages see the mapped vector
    cheap = reference(MDR_PART, None, 1.0, users, playlists, members, maps=MAPS)
    fused = reference(MDR_PART, MASS_PART, ALPHA, users, playlists, members, maps=MAPS)
    got = run(TWO_STAGE_MAPS, users, playlists, members, k, n)
    assert_same(got, two_stage_reference(cheap, fused, min(n, N_SONGS), k))


TWO_STAGE = two_stage_graph(6)
TWO_STAGE_MAPS = two_stage_graph(6, fold_in=MAPS)


@pytest.mark.parametrize("n", [N_SONGS, N_SONGS + 50])
def test_candidates_covering_the_catalog_give_the_exact_graph(n: int) -> None:
    exact = run_exact(FUSED, USERS, PLAYLISTS, MEMBERS, 10)
    by_default = run(two_stage_graph(n), USERS, PLAYLISTS, MEMBERS, 10)  # the export's N
    overridden = run(TWO_STAGE, USERS, PLAYLISTS, MEMBERS, 10, n)  # N given at run time
    for got in (by_default, overridden):
        np.testing.assert_array_equal(got[0], exact[0])
        np.testing.assert_allclose(got[1], exact[1], rtol=1e-5, atol=1e-5)


def test_mass_only_fusion_still_proposes_by_mdr_and_excludes_members() -> None:
    """α = 0: the first stage is MDR unweighted, the second MASS alone; members stay out."""
    songs, scores = run(two_stage_graph(N_SONGS, alpha=0.0), USERS, PLAYLISTS, MEMBERS, N_SONGS)
    mass_only = reference(None, MASS_PART, 0.0, USERS, PLAYLISTS, MEMBERS)
    assert not np.isnan(scores).any()
    assert_same((songs, scores), two_stage_reference(mass_only, mass_only, N_SONGS, N_SONGS))


def test_one_part_has_no_two_stage_graph() -> None:
    with pytest.raises(ValueError, match="needs both parts"):
        build_graph(
            mdr_weights(MDR_PART), None, 1.0, n_users=N_USERS, n_playlists=N_PLAYLISTS,
            n_songs=N_SONGS, candidates=5,
        )  # fmt: skip


def test_a_batch_without_member_columns_ranks_as_all_padding() -> None:
    """members of shape (B, 0), a batch of playlists without a known song as a consumer may
    build it (QA: a Reshape failed in the exact graphs, the two-stage graph gave NaN): the same
    songs and scores as one padding column, in the fusion, MASS alone and two stages."""
    from test_export import session

    from masr.export import mass_weights

    mass_only = session(
        build_graph(
            None, mass_weights(MASS_PART), 0.0, n_users=N_USERS, n_playlists=N_PLAYLISTS,
            n_songs=N_SONGS, chunk=5,
        )
    )
    users = np.array([0, -1, 3], dtype=np.int64)
    playlists = np.array([1, -1, -1], dtype=np.int64)
    for sess in (FUSED, mass_only, two_stage_graph(6)):
        got = {}
        for width in (0, 1):
            feed = {
                "users": users, "playlists": playlists,
                "members": np.full((3, width), -1, dtype=np.int64),
                "k": np.array(4, dtype=np.int64),
            }
            got[width] = sess.run(["songs", "scores"], feed)
        assert np.isfinite(got[0][1]).all()
        np.testing.assert_array_equal(got[0][0], got[1][0])
        np.testing.assert_allclose(got[0][1], got[1][1], rtol=1e-6)
