"""Training examples on the training device: negatives, member lists and batches.

Everything here is tensor code over the CSR layout of the training interactions (rows sorted by
playlist, then song), so sampling runs where training runs and never loops per example.

* Negatives (eq. 21's k^-) are drawn uniformly (from 62-bit integers: off by V / 2**62 at
  most) from the songs outside the playlist's training songs by inverting the complement's
  rank: with the playlist's songs sorted, m_0 < m_1 < ..., the r-th non-member is
  ``r + #{i : m_i - i <= r}``; one ``searchsorted`` over the global key
  ``playlist * V + (m_i - i)`` answers that count for a whole batch. No rejection rounds, no
  Python loop, and it stays exact for playlists that hold most of the catalog.
* Members (MASS's s_t, eq. 15-19) of a training row are the playlist's training songs minus the
  row's own (positive) song, capped at ``max_members`` by uniform sampling without replacement;
  in training, optionally each left out with a probability (member dropout, ``--member-dropout``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from masr.dataset import PreparedData
from masr.errors import MasrError
from masr.models.base import Batch


@dataclass
class TrainingIndex:
    """The training interactions on one device, with the keys the samplers search."""

    user: Tensor  # (N,) long, owner of each row's playlist
    playlist: Tensor  # (N,) long, sorted ascending
    song: Tensor  # (N,) long, ascending within each playlist
    indptr: Tensor  # (P+1,) long CSR offsets
    keys: Tensor  # (N,) long playlist * V + song, strictly ascending
    rank_keys: Tensor  # (N,) long playlist * V + (song - rank in playlist), non-decreasing
    playlist_user: Tensor  # (P,) long
    n_songs: int
    max_length: int  # longest training playlist
    seq_rank: Tensor  # (N,) long rank of each row in its playlist's sequence (0 = first song)
    seq_song: Tensor  # (N,) long songs in sequence order: seq_song[indptr[p] + k] = k-th song
    #: lazily built lookups (neighbourhoods), keyed by what they hold
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def check_negatives(self, where: object) -> None:
        """A MasrError when a playlist holds every catalog song: BPR draws each row's
        negatives among the songs outside its playlist, and there are none (sampled softmax,
        whose shared negatives a playlist's own songs are masked out of, and the fitted
        baselines need no such songs)."""
        full = int((self.indptr[1:] - self.indptr[:-1] >= self.n_songs).sum())
        if full:
            raise MasrError(
                f"{where}: {full} playlist(s) hold every catalog song, so --loss bpr has no "
                "negatives to draw for them; train with --loss softmax (the default recipe of "
                "masr's models), or give playlists with more songs between them"
            )

    @classmethod
    def from_data(cls, data: PreparedData, device: torch.device | str = "cpu") -> TrainingIndex:
        """Move ``data``'s training CSR to ``device`` and build the search keys."""
        v = data.n_songs
        playlist = torch.as_tensor(data.train_playlist, dtype=torch.long, device=device)
        song = torch.as_tensor(data.train_song, dtype=torch.long, device=device)
        indptr = torch.as_tensor(data.indptr, dtype=torch.long, device=device)
        lengths = indptr[1:] - indptr[:-1]  # (P,)
        if playlist.numel() == 0:
            raise MasrError(f"{data.path}: no training interactions")
        rank = torch.arange(playlist.numel(), device=device) - indptr[playlist]  # (N,)
        playlist_user = torch.as_tensor(data.playlist_user, dtype=torch.long, device=device)
        if data.train_rank is not None:
            seq_rank = torch.as_tensor(data.train_rank, dtype=torch.long, device=device)
        else:
            seq_rank = rank  # no order known: song index order
        seq_song = torch.empty_like(song)
        seq_song[indptr[playlist] + seq_rank] = song
        return cls(
            user=playlist_user[playlist],
            playlist=playlist,
            song=song,
            indptr=indptr,
            keys=playlist * v + song,
            rank_keys=playlist * v + (song - rank),
            playlist_user=playlist_user,
            n_songs=v,
            max_length=int(lengths.max()),
            seq_rank=seq_rank,
            seq_song=seq_song,
        )

    @property
    def n_rows(self) -> int:
        return int(self.playlist.numel())

    @property
    def device(self) -> torch.device:
        return self.playlist.device

    def lengths(self, playlists: Tensor) -> Tensor:
        """(B,) number of training songs of each playlist."""
        return self.indptr[playlists + 1] - self.indptr[playlists]


def is_training_pair(index: TrainingIndex, playlists: Tensor, songs: Tensor) -> Tensor:
    """Bool tensor shaped like ``songs``: is (playlist, song) a training interaction?

    ``playlists`` broadcasts against ``songs`` (e.g. (B, 1) against (B, K))."""
    query = playlists * index.n_songs + songs
    pos = torch.searchsorted(index.keys, query).clamp_(max=index.n_rows - 1)
    return index.keys[pos] == query


def member_pairs(index: TrainingIndex, playlists: Tensor, songs: Tensor) -> tuple[Tensor, Tensor]:
    """Where ``songs[j]`` (N,) is one of the training songs of ``playlists[i]`` (B,): the pairs
    (i (P,), j (P,)), in no particular order (the same pairs as ``is_training_pair`` finds on
    the (B, N) grid). A playlist holds a few songs of thousands of shared negatives, so a step
    closes its logits by index instead of reading a (B, N) mask (a masked fill over a
    1,024 x 1,024 step took 2.4 ms).

    It walks the batch's member lists (B x playlist length entries) instead of searching
    B x N keys: with thousands of shared negatives that is the difference between
    milliseconds and a large part of a step."""
    b, v = playlists.shape[0], index.n_songs
    dev = index.device
    uniq, inverse = torch.unique(songs, return_inverse=True)  # (U,), (N,)
    slot = torch.full((v,), -1, dtype=torch.long, device=dev)  # song -> its index in uniq
    slot[uniq] = torch.arange(uniq.numel(), device=dev)
    lengths = index.lengths(playlists)  # (B,)
    row = torch.repeat_interleave(torch.arange(b, device=dev), lengths)  # (T,)
    start = torch.repeat_interleave(index.indptr[playlists] - torch.cumsum(lengths, 0) + lengths,
                                    lengths)  # (T,) CSR offset of each entry's list minus its rank
    member = index.song[start + torch.arange(row.numel(), device=dev)]  # (T,)
    found = slot[member]  # (T,) -1 when the member is not among the songs
    keep = found >= 0
    hit_u, hit_row = found[keep], row[keep]  # (H,) unique song, row
    # a song drawn k times is k columns: columns grouped by unique song (CSR over inverse)
    columns = torch.argsort(inverse, stable=True)  # (N,)
    counts = torch.bincount(inverse, minlength=uniq.numel())  # (U,)
    first = torch.cumsum(counts, 0) - counts  # (U,) where each song's columns begin
    reps = counts[hit_u]  # (H,) >= 1
    rows = torch.repeat_interleave(hit_row, reps)  # (P,)
    begin = torch.repeat_interleave(first[hit_u] - (torch.cumsum(reps, 0) - reps), reps)  # (P,)
    cols = columns[begin + torch.arange(rows.numel(), device=dev)]  # (P,)
    return rows, cols


def sample_negatives(
    index: TrainingIndex, playlists: Tensor, n: int, generator: torch.Generator | None = None
) -> Tensor:
    """(B, n) songs drawn uniformly (with replacement) from the catalog songs that are *not*
    among each playlist's training songs (eq. 21's negatives k^-)."""
    b = playlists.shape[0]
    v = index.n_songs
    free = (v - index.lengths(playlists)).unsqueeze(1)  # (B, 1) songs outside the playlist
    # (B, n) rank among the non-members: a 62-bit integer reduced modulo each row's count
    # (off uniform by at most free / 2**62); a float32 draw has 24 bits, so past a few million
    # songs some would be drawn 8/7 as often as others, and past 2**24 some never
    raw = torch.randint(0, 2**62, (b, n), generator=generator, device=index.device)
    r = torch.remainder(raw, free)
    base = (playlists * v).unsqueeze(1)  # (B, 1)
    # members m_i with m_i - i <= r: each one shifts the r-th non-member one song up.
    below = torch.searchsorted(index.rank_keys, base + r, right=True)  # (B, n)
    return r + (below - index.indptr[playlists].unsqueeze(1))


class NegativeSampler:
    """Draws negative songs from the catalog: "uniform", "popularity" (proportional to each
    song's training occurrences, the law of in-batch negatives) or "mixed" (half of the draws
    from each). Draws are with replacement, on the index's device, from ``generator``.

    ``log_expected(songs, n)`` is log E[count of each song among n draws], the logQ correction
    of sampled softmax (Yi et al., RecSys 2019): with it, Σ_j exp(l_j - log E_j) over the draws
    is an unbiased estimate of Σ_v exp(l_v) over the catalog."""

    def __init__(self, index: TrainingIndex, mode: str):
        if mode not in ("uniform", "popularity", "mixed"):
            raise MasrError(f"--neg-sampler must be uniform, popularity or mixed, not {mode!r}")
        self.index, self.mode = index, mode
        v = index.n_songs
        counts = torch.bincount(index.song, minlength=v).to(torch.float64)  # (V,)
        self.popularity = (counts / counts.sum()).to(torch.float32)  # (V,)
        self._cdf = torch.cumsum(counts / counts.sum(), 0).to(torch.float64)  # (V,)
        self._cdf[-1] = 1.0

    def _uniform(self, shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
        return torch.randint(
            0, self.index.n_songs, shape, generator=generator, device=self.index.device
        )

    def _popular(self, shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
        u = torch.rand(shape, generator=generator, device=self.index.device, dtype=torch.float64)
        return torch.searchsorted(self._cdf, u, right=True).clamp_(max=self.index.n_songs - 1)

    def _split(self, n: int) -> tuple[int, int]:
        """(uniform draws, popularity draws) out of n."""
        if self.mode == "uniform":
            return n, 0
        if self.mode == "popularity":
            return 0, n
        return n // 2, n - n // 2

    def draw(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """(n,) songs shared by a batch (sampled softmax)."""
        n_uni, n_pop = self._split(n)
        return torch.cat([self._uniform((n_uni,), generator), self._popular((n_pop,), generator)])

    def log_expected(self, songs: Tensor, n: int) -> Tensor:
        """log of the expected number of times each of ``songs`` occurs among ``n`` draws."""
        n_uni, n_pop = self._split(n)
        expected = n_uni / self.index.n_songs + n_pop * self.popularity[songs]
        return torch.log(expected)

    def draw_per_row(
        self, playlists: Tensor, n: int, generator: torch.Generator | None = None
    ) -> Tensor:
        """(B, n) negatives for BPR, none of them a training song of the row's playlist:
        uniform ones as ``sample_negatives``; popularity draws that hit the playlist are drawn
        again (up to 3 times), then replaced by a uniform non-member."""
        b = playlists.shape[0]
        n_uni, n_pop = self._split(n)
        parts = []
        if n_uni:
            parts.append(sample_negatives(self.index, playlists, n_uni, generator))
        if n_pop:
            songs = self._popular((b, n_pop), generator)
            rows = playlists.unsqueeze(1).expand(b, n_pop)
            for _ in range(3):
                hit = is_training_pair(self.index, rows, songs)
                if not bool(hit.any()):
                    break
                songs = torch.where(hit, self._popular((b, n_pop), generator), songs)
            hit = is_training_pair(self.index, rows, songs)
            if bool(hit.any()):
                fallback = sample_negatives(self.index, playlists, n_pop, generator)
                songs = torch.where(hit, fallback, songs)
            parts.append(songs)
        return torch.cat(parts, dim=1)


def _gather_members(
    index: TrainingIndex, start: Tensor, offsets: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Songs at ``start + offsets`` where ``mask`` holds, 0 in padded slots."""
    flat = (start.unsqueeze(1) + offsets).clamp_(0, index.n_rows - 1)  # (B, L)
    members = torch.where(mask, index.song[flat], torch.zeros_like(flat))
    return members, mask


def sample_members(
    index: TrainingIndex,
    rows: Tensor,
    max_members: int,
    generator: torch.Generator | None = None,
    dropout: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Member songs of training rows ``rows`` (B,): the playlist's other training songs.

    Returns ``members`` (B, L) and ``member_mask`` (B, L) with L = min(max_members, the longest
    list in the batch), at least 1. Lists longer than ``max_members`` are a uniform sample
    without replacement; real members come first, padding (song 0, mask False) after.

    ``dropout`` p > 0 (member dropout, training only): each member is left out independently
    with probability p, except that a row with any member keeps at least one (the one with the
    largest draw); the kept members are then capped as above, and L shrinks to the longest
    kept list. The attention of eq. 18 renormalises over the kept members, so no rescaling."""
    playlists = index.playlist[rows]  # (B,)
    start = index.indptr[playlists]  # (B,)
    others = index.lengths(playlists) - 1  # (B,) members besides the positive
    own = rows - start  # (B,) the positive's offset inside its playlist
    longest = int(others.max()) if rows.numel() else 0
    if dropout > 0 and longest > 0:
        offsets, kept = _kept_members(index, others, longest, max_members, generator, dropout)
    else:
        width = max(1, min(max_members, longest))
        if longest <= max_members:
            # (B, L) every member, in order
            offsets = torch.arange(width, device=index.device).expand(rows.shape[0], width)
        else:
            # Uniform sample without replacement: the `width` smallest of random keys, where
            # slots past a row's length get key 2 (> any uniform draw): real members first.
            keys = torch.rand((rows.shape[0], longest), generator=generator, device=index.device)
            keys.masked_fill_(
                torch.arange(longest, device=index.device) >= others.unsqueeze(1), 2.0
            )
            offsets = keys.topk(width, dim=1, largest=False, sorted=True).indices  # (B, L)
        kept = others.clamp(max=width)
    slots = torch.arange(offsets.shape[1], device=index.device)  # (L,)
    mask = slots.unsqueeze(0) < kept.unsqueeze(1)  # (B, L)
    offsets = offsets + (offsets >= own.unsqueeze(1)).long()  # skip the positive itself
    return _gather_members(index, start, offsets, mask)


def _kept_members(
    index: TrainingIndex,
    others: Tensor,
    longest: int,
    max_members: int,
    generator: torch.Generator | None,
    dropout: float,
) -> tuple[Tensor, Tensor]:
    """Member dropout for ``sample_members``: offsets (B, L) of the kept members (first, in a
    uniform random order) among each row's ``others`` members, and how many are real (B,)."""
    n = others.shape[0]
    draws = torch.rand((n, longest), generator=generator, device=index.device)  # (B, longest)
    real = torch.arange(longest, device=index.device) < others.unsqueeze(1)
    draws.masked_fill_(~real, -1.0)
    # keep a member when its draw is >= p; the row's largest draw always (>= 1 member kept)
    keep = (draws >= dropout) | (draws == draws.max(1, keepdim=True).values)
    keep &= real
    kept = keep.sum(1).clamp(max=max_members)  # (B,)
    width = max(1, int(kept.max()))
    # the kept members' draws are uniform on [p, 1): the `width` largest are a uniform sample
    keys = draws.masked_fill(~keep, -2.0)
    return keys.topk(width, dim=1, largest=True, sorted=True).indices, kept


def playlist_members(
    index: TrainingIndex, playlists: Tensor, max_members: int | None = None
) -> tuple[Tensor, Tensor]:
    """All training songs of each playlist (evaluation and export): (B, L) members and mask,
    L = the longest list in the batch (at least 1), optionally capped at ``max_members``
    (keeping the first songs, deterministic)."""
    start = index.indptr[playlists]  # (B,)
    lengths = index.lengths(playlists)  # (B,)
    longest = int(lengths.max()) if playlists.numel() else 0
    if max_members is not None:
        longest = min(longest, max_members)
    width = max(1, longest)
    slots = torch.arange(width, device=index.device)
    mask = slots.unsqueeze(0) < lengths.unsqueeze(1)  # (B, L)
    return _gather_members(index, start, slots.expand(playlists.shape[0], width), mask)


def _no_members(index: TrainingIndex, n: int) -> tuple[Tensor, Tensor]:
    """An all-padding (n, 1) member list, for models that do not read members."""
    members = torch.zeros((n, 1), dtype=torch.long, device=index.device)
    return members, torch.zeros((n, 1), dtype=torch.bool, device=index.device)


def training_batch(
    index: TrainingIndex,
    rows: Tensor,
    *,
    uses_members: bool,
    max_members: int,
    generator: torch.Generator | None = None,
    member_dropout: float = 0.0,
) -> Batch:
    """The model input for training rows ``rows`` (B,); members only when the model reads
    them (otherwise an all-padding (B, 1) list, so no time is spent building it), each left
    out with probability ``member_dropout`` (``sample_members``)."""
    playlists = index.playlist[rows]
    if uses_members:
        members, mask = sample_members(index, rows, max_members, generator, member_dropout)
    else:
        members, mask = _no_members(index, rows.shape[0])
    return Batch(
        users=index.user[rows],
        playlists=playlists,
        members=members,
        member_mask=mask,
        source=index,
        rows=rows,
    )


def context_batch(
    index: TrainingIndex, playlists: Tensor, *, uses_members: bool = True
) -> Batch:
    """The model input for scoring songs for whole playlists (evaluation): every training song
    of the playlist is a member."""
    if uses_members:
        members, mask = playlist_members(index, playlists)
    else:
        members, mask = _no_members(index, playlists.shape[0])
    return Batch(
        users=index.playlist_user[playlists],
        playlists=playlists,
        members=members,
        member_mask=mask,
        source=index,
    )


def previous_songs(batch: Batch, width: int) -> tuple[Tensor, Tensor]:
    """The ``width`` songs before each row in its playlist's sequence (the sequential baselines'
    input): for a training row (``batch.rows``) the training songs that precede it; for a whole
    playlist (scoring, ``rows`` None) its last training songs. Returns ``songs`` (B, W), most
    recent in the last slot, and ``mask`` (B, W), False in the left padding (song 0)."""
    index = batch.source
    if index is None:
        raise MasrError("this model reads song order: build its batches with masr.sampling")
    start = index.indptr[batch.playlists]  # (B,)
    if batch.rows is not None:
        end = index.seq_rank[batch.rows]  # (B,) songs before the row
    else:
        end = index.lengths(batch.playlists)  # (B,) the whole playlist
    back = torch.arange(width, 0, -1, device=index.device)  # (W,) width .. 1
    rank = end.unsqueeze(1) - back  # (B, W) sequence rank of each slot
    mask = rank >= 0
    flat = (start.unsqueeze(1) + rank.clamp_min(0)).clamp_(max=index.n_rows - 1)
    songs = torch.where(mask, index.seq_song[flat], torch.zeros_like(flat))
    return songs, mask


def song_holders(index: TrainingIndex, entity: str) -> tuple[Tensor, Tensor]:
    """Who holds each song in training, as CSR: ``indptr`` (V+1,) and ``holders`` (H,) of
    playlists (``entity="playlist"``) or distinct users (``"user"``), ascending per song.
    Built once per index and cached."""
    key = ("holders", entity)
    if key not in index.cache:
        who = index.playlist if entity == "playlist" else index.user  # (N,)
        pairs = torch.unique(index.song * (int(who.max()) + 1) + who)  # sorted, distinct
        song, holder = pairs // (int(who.max()) + 1), pairs % (int(who.max()) + 1)
        counts = torch.bincount(song, minlength=index.n_songs)
        indptr = torch.zeros(index.n_songs + 1, dtype=torch.long, device=index.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        index.cache[key] = (indptr, holder)
    return index.cache[key]
