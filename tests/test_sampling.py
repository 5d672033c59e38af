"""Negatives and member lists sampled on the device (masr.sampling)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from masr.dataset import Cases, PreparedData
from masr.errors import MasrError
from masr.sampling import (
    TrainingIndex,
    context_batch,
    is_training_pair,
    playlist_members,
    sample_members,
    sample_negatives,
    training_batch,
)


def make_data(playlists: list[list[int]], n_songs: int) -> PreparedData:
    """A PreparedData holding only training rows (songs of each playlist, any order)."""
    lengths = np.array([len(p) for p in playlists], dtype=np.int64)
    indptr = np.zeros(len(playlists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    songs = np.concatenate([np.sort(np.asarray(p, dtype=np.int64)) for p in playlists])
    empty = Cases(*(np.zeros(0, dtype=np.int64),) * 3, np.zeros((0, 0), dtype=np.int64))
    return PreparedData(
        path=Path("mem"),
        manifest={"fingerprint": "test"},
        n_users=len(playlists),
        n_playlists=len(playlists),
        n_songs=n_songs,
        playlist_user=np.arange(len(playlists), dtype=np.int64),
        train_playlist=np.repeat(np.arange(len(playlists)), lengths),
        train_song=songs,
        indptr=indptr,
        valid=empty,
        test=empty,
    )


playlist_sets = st.integers(3, 30).flatmap(
    lambda v: st.tuples(
        st.just(v),
        st.lists(
            st.sets(st.integers(0, v - 1), min_size=1, max_size=v - 1).map(sorted),
            min_size=1,
            max_size=8,
        ),
    )
)


@settings(max_examples=60, deadline=None)
@given(playlist_sets, st.integers(0, 2**31 - 1))
def test_negatives_are_never_training_songs(case: tuple[int, list[list[int]]], seed: int) -> None:
    v, playlists = case
    index = TrainingIndex.from_data(make_data(playlists, v))
    g = torch.Generator().manual_seed(seed)
    who = torch.arange(len(playlists)).repeat(5)  # (B,)
    neg = sample_negatives(index, who, 7, g)  # (B, 7)
    assert neg.shape == (who.shape[0], 7)
    assert bool(((neg >= 0) & (neg < v)).all())
    for b, p in enumerate(who.tolist()):
        assert not set(neg[b].tolist()) & set(playlists[p])
    assert not bool(is_training_pair(index, who.unsqueeze(1), neg).any())


def test_negatives_are_uniform_over_the_complement() -> None:
    v = 10
    members = [1, 2, 5, 8]
    index = TrainingIndex.from_data(make_data([members, [0]], v))
    g = torch.Generator().manual_seed(0)
    draws = sample_negatives(index, torch.zeros(20_000, dtype=torch.long), 3, g).flatten()
    counts = torch.bincount(draws, minlength=v).numpy()
    assert counts[members].sum() == 0
    free = np.setdiff1d(np.arange(v), members)
    expected = draws.numel() / len(free)
    # 60k draws over 6 songs: each count within 3% of its expectation (~7 standard deviations)
    assert np.all(np.abs(counts[free] - expected) < 0.03 * expected)


def test_negatives_stay_uniform_past_float32_resolution() -> None:
    """A catalog of 2**25 + 1 songs, one playlist holding song 0: the 2**25 others are equally
    likely. A float32 draw (24 bits) scaled to the count reached even songs only (every draw
    odd); half of the draws are odd."""
    v = 2**25 + 1
    zero = torch.zeros(1, dtype=torch.long)
    index = TrainingIndex(
        user=zero, playlist=zero, song=zero, indptr=torch.tensor([0, 1]), keys=zero,
        rank_keys=zero, playlist_user=zero, n_songs=v, max_length=1, seq_rank=zero,
        seq_song=zero,
    )
    neg = sample_negatives(index, zero, 200_000, torch.Generator().manual_seed(0))[0]
    assert bool((neg >= 1).all()) and bool((neg < v).all())
    # 200k draws: the odd share is 0.5 ± 0.0011 (one standard deviation)
    assert abs(float((neg % 2 == 1).double().mean()) - 0.5) < 0.006
    # and the top half of the catalog gets its half
    assert abs(float((neg > v // 2).double().mean()) - 0.5) < 0.006


def test_negative_of_an_almost_full_playlist_is_exact() -> None:
    index = TrainingIndex.from_data(make_data([[0, 1, 2, 4], [3]], 5))
    neg = sample_negatives(index, torch.tensor([0, 0, 1]), 50, torch.Generator().manual_seed(1))
    assert bool((neg[:2] == 3).all())
    assert 3 not in neg[2].tolist()


def test_full_playlist_is_a_clear_error_for_bpr_only() -> None:
    """A playlist holding every catalog song has no BPR negatives: one line from
    ``check_negatives``; the index itself (evaluation, fitted baselines, sampled softmax) is
    fine."""
    index = TrainingIndex.from_data(make_data([[0, 1, 2], [0]], 3))
    with pytest.raises(MasrError, match="1 playlist.s. hold every catalog song, so --loss bpr"):
        index.check_negatives("data")


def test_members_exclude_the_positive_and_keep_the_rest() -> None:
    playlists = [[3, 7, 9, 11], [2], [0, 5]]
    index = TrainingIndex.from_data(make_data(playlists, 12))
    rows = torch.arange(index.n_rows)  # every training row once
    members, mask = sample_members(index, rows, max_members=10)
    assert members.shape == mask.shape == (7, 3)  # longest list: 4 - 1 members
    for r in range(index.n_rows):
        p = int(index.playlist[r])
        positive = int(index.song[r])
        got = members[r][mask[r]].tolist()
        assert sorted(got) == sorted(set(playlists[p]) - {positive})
        assert bool((members[r][~mask[r]] == 0).all())  # padding holds a valid index


def test_member_cap_samples_uniformly_without_replacement() -> None:
    songs = list(range(20))
    index = TrainingIndex.from_data(make_data([songs, [0]], 25))
    rows = torch.zeros(4000, dtype=torch.long)  # positive: song 0, members: 1..19
    g = torch.Generator().manual_seed(3)
    members, mask = sample_members(index, rows, max_members=5, generator=g)
    assert members.shape == (4000, 5) and bool(mask.all())
    sorted_members = members.sort(1).values
    assert bool((sorted_members[:, 1:] != sorted_members[:, :-1]).all())  # distinct
    assert bool(((members >= 1) & (members <= 19)).all())  # never the positive (song 0)
    counts = torch.bincount(members.flatten(), minlength=20)[1:].float()
    expected = 4000 * 5 / 19
    assert float((counts - expected).abs().max()) < 0.12 * expected


def test_playlist_members_and_batches() -> None:
    playlists = [[3, 7, 9], [2], [0, 5]]
    index = TrainingIndex.from_data(make_data(playlists, 12))
    members, mask = playlist_members(index, torch.tensor([2, 0, 1]))
    assert members.shape == (3, 3)
    assert [members[i][mask[i]].tolist() for i in range(3)] == [[0, 5], [3, 7, 9], [2]]
    batch = context_batch(index, torch.tensor([1, 2]), uses_members=False)
    assert batch.members.shape == (2, 1) and not bool(batch.member_mask.any())
    tb = training_batch(index, torch.tensor([0, 3]), uses_members=True, max_members=8)
    assert tb.users.tolist() == [0, 1] and tb.playlists.tolist() == [0, 1]
    assert tb.members.shape == (2, 2)
    assert not bool(tb.member_mask[1].any())  # a one-song playlist has no other member


def test_planted_training_pairs(planted: PreparedData) -> None:
    index = TrainingIndex.from_data(planted)
    assert bool(is_training_pair(index, index.playlist, index.song).all())
    assert int(index.max_length) == int(np.diff(planted.indptr).max())


def test_member_dropout_keeps_a_uniform_share_and_never_the_positive() -> None:
    songs = list(range(11))  # positive song 0 -> members 1..10
    index = TrainingIndex.from_data(make_data([songs, [3], [0, 5]], 12))
    rows = torch.cat([torch.zeros(6000, dtype=torch.long), torch.tensor([11, 12, 13])])
    g = torch.Generator().manual_seed(5)
    members, mask = sample_members(index, rows, max_members=50, generator=g, dropout=0.3)
    many, few = members[:6000], mask[:6000]
    kept = few.sum(1)
    assert int(kept.min()) >= 1 and members.shape[1] == int(mask.sum(1).max())
    assert abs(float(kept.float().mean()) - 10 * 0.7) < 0.1  # each member kept with 1 - p
    assert bool(((many[few] >= 1) & (many[few] <= 10)).all())  # never the positive
    for r in range(0, 6000, 997):  # real members first, distinct
        got = many[r][few[r]]
        assert bool(few[r][: int(kept[r])].all()) and got.unique().numel() == got.numel()
    counts = torch.bincount(many[few], minlength=11)[1:].float()
    assert float((counts - counts.mean()).abs().max()) < 0.05 * float(counts.mean())
    # the one-song playlist (row 11) has no member; rows 12-13 keep their only other member
    assert not bool(mask[6000].any())
    assert members[6001][mask[6001]].tolist() == [5] and members[6002][mask[6002]].tolist() == [0]


def test_member_dropout_with_a_cap_and_the_default_path() -> None:
    songs = list(range(30))
    index = TrainingIndex.from_data(make_data([songs, [0]], 31))
    rows = torch.zeros(3000, dtype=torch.long)
    g = torch.Generator().manual_seed(2)
    members, mask = sample_members(index, rows, max_members=8, generator=g, dropout=0.5)
    assert members.shape == (3000, 8) and int(mask.sum(1).min()) >= 1
    # 29 members, about 14.5 kept: nearly always capped at 8, distinct, never song 0
    assert float(mask.all(1).float().mean()) > 0.95
    real = members[mask]
    assert bool((real >= 1).all())
    ordered = members.sort(1).values
    assert bool((ordered[:, 1:] != ordered[:, :-1]).all())
    # p = 0 is the plain path, draw for draw
    a = sample_members(index, rows[:50], 8, torch.Generator().manual_seed(9))
    b = sample_members(index, rows[:50], 8, torch.Generator().manual_seed(9), dropout=0.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    tb = training_batch(
        index, rows[:4], uses_members=True, max_members=50, member_dropout=0.9,
        generator=torch.Generator().manual_seed(1),
    )
    assert int(tb.member_mask.sum(1).min()) >= 1 and tb.members.shape[1] < 29
