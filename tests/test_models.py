"""MDR, MASS, MASR (eqs. 11, 12-19, 20) against slow, obvious references on tiny tensors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from masr.checkpoint import build_model, load_model, save_checkpoint
from masr.errors import MasrError
from masr.models import model_class
from masr.models.base import Batch
from masr.models.masr import MASR, MASRConfig
from masr.models.mass import MASS, MASSConfig, masked_softmin, weighted_pairwise_sq
from masr.models.mdr import MDR, MDRConfig, mahalanobis_sq

N_USERS, N_PLAYLISTS, N_SONGS, DIM = 5, 9, 23, 4


def perturbed(model: torch.nn.Module, seed: int = 0, scale: float = 0.5) -> torch.nn.Module:
    """Move every parameter off its (often symmetric) initial value, in eval mode, in double."""
    gen = torch.Generator().manual_seed(seed)
    model = model.double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.eval()


def make_mdr(seed: int = 0, **kw) -> MDR:
    torch.manual_seed(seed)
    return perturbed(MDR(MDRConfig(dim=DIM, **kw), N_USERS, N_PLAYLISTS, N_SONGS), seed)


def make_mass(seed: int = 0, **kw) -> MASS:
    torch.manual_seed(seed)
    return perturbed(MASS(MASSConfig(dim=DIM, **kw), N_USERS, N_PLAYLISTS, N_SONGS), seed)


def make_batch(
    seed: int = 0, rows: int = 6, slots: int = 5, empty_rows: tuple[int, ...] = (1,)
) -> Batch:
    """Random rows; some users repeat (exercises MASS's per-user grouping); row 1 has no member."""
    gen = torch.Generator().manual_seed(seed)
    users = torch.randint(0, 3, (rows,), generator=gen)
    playlists = torch.randint(0, N_PLAYLISTS, (rows,), generator=gen)
    members = torch.randint(0, N_SONGS, (rows, slots), generator=gen)
    mask = torch.rand(rows, slots, generator=gen) < 0.7
    mask[:, 0] = True
    for r in empty_rows:
        mask[r] = False
    members = torch.where(mask, members, torch.zeros_like(members))  # padding holds index 0
    return Batch(users, playlists, members, mask)


def candidates(batch: Batch, n: int = 4, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, N_SONGS, (batch.users.shape[0], n), generator=gen)


# --- slow references: Python loops over rows, candidates, members and dimensions ------------
def ref_sq_dist(metric: list[float], x: list[float], y: list[float]) -> float:
    """|B ⊙ (x - y)|², one dimension at a time."""
    return sum((b * (xi - yi)) ** 2 for b, xi, yi in zip(metric, x, y, strict=True))


def ref_mdr(model: MDR, batch: Batch, songs: torch.Tensor) -> list[list[float]]:
    b1, b2 = model.metric_user.tolist(), model.metric_playlist.tolist()
    out = []
    for r in range(songs.shape[0]):
        u = model.user_emb.weight[batch.users[r]].tolist()
        p = model.playlist_emb.weight[batch.playlists[r]].tolist()
        row = []
        for k in songs[r].tolist():
            s = model.song_emb.weight[k].tolist()
            theta = model.song_bias.weight[k, 0].item()
            row.append(ref_sq_dist(b1, u, s) + ref_sq_dist(b2, p, s) + theta)  # eq. 11
        out.append(row)
    return out


def ref_query(lin: torch.nn.Linear, u: list[float], s: list[float]) -> list[float]:
    """Eq. 12 / 16: ReLU(W [u; s] + b), one output unit at a time."""
    x = u + s
    weight, bias = lin.weight.tolist(), lin.bias.tolist()
    return [
        max(0.0, sum(w * xi for w, xi in zip(weight[i], x, strict=True)) + bias[i])
        for i in range(len(bias))
    ]


def ref_mass_parts(
    model: MASS, batch: Batch, r: int, k: int
) -> tuple[list[float], list[float], float]:
    """(d² to each real member (eqs. 14-15), attention α (eqs. 16-18), o (eq. 19)) for row r,
    candidate k."""
    user = int(batch.users[r])
    real = [
        int(t)
        for t, keep in zip(batch.members[r].tolist(), batch.member_mask[r].tolist(), strict=True)
        if keep
    ]
    q = ref_query(
        model.query, model.user_emb.weight[user].tolist(), model.song_emb.weight[k].tolist()
    )
    q_att = ref_query(
        model.att_query,
        model.att_user_emb.weight[user].tolist(),
        model.att_song_emb.weight[k].tolist(),
    )
    b3, b4 = model.metric.tolist(), model.att_metric.tolist()
    d_out = [ref_sq_dist(b3, q, model.song_emb.weight[t].tolist()) for t in real]
    d_att = [ref_sq_dist(b4, q_att, model.att_song_emb.weight[t].tolist()) for t in real]
    expo = [math.exp(-x) for x in d_att]
    alpha = [e / sum(expo) for e in expo]
    bias = model.song_bias.weight[k, 0].item()
    o = sum(a * x for a, x in zip(alpha, d_out, strict=True)) + bias  # eq. 19 as a distance
    return d_out, alpha, o


def ref_mass(model: MASS, batch: Batch, songs: torch.Tensor) -> list[list[float]]:
    return [
        [ref_mass_parts(model, batch, r, k)[2] for k in songs[r].tolist()]
        for r in range(songs.shape[0])
    ]


def all_songs(batch: Batch) -> torch.Tensor:
    return torch.arange(N_SONGS).expand(batch.users.shape[0], -1)


# --- MDR ---------------------------------------------------------------------------------------
def test_mdr_distance_matches_eq_11() -> None:
    """Both ways of MDR's song terms: per catalog song and gathered (no gradients, at least a
    catalog's worth of candidates: 6 x 4 >= 23) and from the candidates' rows (gradients on,
    or fewer candidates)."""
    model, batch = make_mdr(), make_batch()
    songs = candidates(batch)
    with torch.no_grad():
        got = model.distance(batch, songs)
        few = model.distance(batch, songs[:, :2])
    with_grad = model.distance(batch, songs)
    want = torch.tensor(ref_mdr(model, batch, songs), dtype=got.dtype)
    assert torch.allclose(got, want, atol=1e-10)
    assert torch.allclose(few, want[:, :2], atol=1e-10)
    assert torch.allclose(with_grad.detach(), want, atol=1e-10)


def test_mdr_full_distance_equals_distance_over_all_songs() -> None:
    model, batch = make_mdr(), make_batch()
    with torch.no_grad():
        full = model.full_distance(batch)
        direct = model.distance(batch, all_songs(batch))
        from_vectors = model.full_distance_from_vectors(
            model.user_emb(batch.users), model.playlist_emb(batch.playlists)
        )
    assert full.shape == (6, N_SONGS)
    assert torch.allclose(full, direct, atol=1e-10)
    assert torch.allclose(from_vectors, direct, atol=1e-10)


def test_mdr_init_follows_documented_choice() -> None:
    torch.manual_seed(0)
    model = MDR(MDRConfig(dim=64), 50, 50, 400)
    assert torch.equal(model.metric_user, torch.ones(64)) and torch.equal(
        model.metric_playlist, torch.ones(64)
    )
    assert torch.count_nonzero(model.song_bias.weight) == 0
    std = model.song_emb.weight.std().item()
    assert abs(std - 1 / 64) < 0.1 / 64  # N(0, (1/d)²)


# --- MASS --------------------------------------------------------------------------------------
def test_mass_attention_and_member_distances_match_eqs_14_to_18() -> None:
    model, batch = make_mass(), make_batch()
    songs = candidates(batch)
    with torch.no_grad():
        alpha = model.attention(batch, songs)  # (B, C, L)
        q = model._queries(model.query, model.user_emb(batch.users), model.song_emb(songs))
        d_out = model._member_dist(q, model.song_emb(batch.members), model.metric)
    for r in range(songs.shape[0]):
        slots = [t for t in range(batch.members.shape[1]) if batch.member_mask[r, t]]
        for c, k in enumerate(songs[r].tolist()):
            ref_d, ref_alpha, _ = ref_mass_parts(model, batch, r, k)
            assert alpha[r, c, slots].tolist() == pytest.approx(ref_alpha, abs=1e-10)
            assert d_out[r, c, slots].tolist() == pytest.approx(ref_d, abs=1e-9)
            assert alpha[r, c].sum().item() == pytest.approx(1.0 if slots else 0.0)
            assert torch.all(
                alpha[r, c, [t for t in range(batch.members.shape[1]) if t not in slots]] == 0
            )


def test_mass_distance_matches_eq_19() -> None:
    for init in ("reference", "default"):
        model, batch = make_mass(query_init=init), make_batch(seed=3)
        songs = candidates(batch)
        with torch.no_grad():
            got = model.distance(batch, songs)
        assert torch.allclose(
            got, torch.tensor(ref_mass(model, batch, songs), dtype=got.dtype), atol=1e-9
        )


def test_mass_query_init_reference_is_minus_identity_identity() -> None:
    model = MASS(MASSConfig(dim=3), 2, 2, 4)
    eye = torch.eye(3)
    assert torch.equal(model.query.weight, torch.cat([-eye, eye], 1))
    assert torch.equal(model.att_query.weight, torch.cat([-eye, eye], 1))
    with pytest.raises(MasrError, match="query_init"):
        MASSConfig(query_init="xavier")


def test_mass_full_distance_equals_distance_over_all_songs() -> None:
    model, batch = make_mass(), make_batch(rows=9)
    with torch.no_grad():
        direct = model.distance(batch, all_songs(batch))
        for chunk in (5, 23, 100):
            full = model.full_distance(batch, chunk=chunk)
            assert full.shape == (9, N_SONGS)
            assert torch.allclose(full, direct, atol=1e-9)
        from_vectors = model.full_distance_from_vectors(
            model.user_emb(batch.users),
            model.att_user_emb(batch.users),
            batch.members,
            batch.member_mask,
            chunk=7,
        )
    assert torch.allclose(from_vectors, direct, atol=1e-9)


def test_mass_catalog_halves_follow_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's song halves kept between full-ranking calls are the ones of the current
    weights: an in-place change (an optimiser step, APR's perturbation), a load or training
    mode makes them be computed again; with gradients, while tracing or above the size bound
    they are not kept at all."""
    import masr.models.mass as mass_module

    model, batch = make_mass(), make_batch(rows=9)
    with torch.no_grad():
        first = model.full_distance(batch, chunk=5)
        kept = model._halves
        assert kept is not None and kept[0].shape == (N_SONGS, DIM)
        assert torch.equal(model.full_distance(batch, chunk=5), first)
        assert model._halves is kept  # the same tables, not computed again
        for param in (model.song_emb.weight, model.query.weight, model.att_query.bias):
            param.add_(0.25)
            moved = model.full_distance(batch, chunk=5)
            assert model._halves is not kept
            kept = model._halves
            assert torch.allclose(moved, model.distance(batch, all_songs(batch)), atol=1e-9)
        model.load_state_dict(make_mass(seed=3).state_dict())
        assert torch.allclose(
            model.full_distance(batch), model.distance(batch, all_songs(batch)), atol=1e-9
        )
    model.train()
    assert model._halves is None
    model.eval()
    model.full_distance(batch)  # gradients on: nothing kept
    assert model._halves is None
    monkeypatch.setattr(mass_module, "CATALOG_HALVES_MAX", N_SONGS * DIM)  # two tables: over
    with torch.no_grad():
        bounded = model.full_distance(batch, chunk=5)
    assert model._halves is None
    with torch.no_grad():
        assert torch.allclose(bounded, model.distance(batch, all_songs(batch)), atol=1e-9)


def test_mass_grouped_rows_equal_separate_rows() -> None:
    """full_distance_grouped (G users, R playlists each) = one row at a time."""
    model, batch = make_mass(), make_batch(rows=4)
    users = torch.tensor([2, 0])
    members = batch.members.view(2, 2, -1)
    mask = batch.member_mask.view(2, 2, -1)
    with torch.no_grad():
        grouped = model.full_distance_grouped(
            model.user_emb(users), model.att_user_emb(users), members, mask
        )
        for g in range(2):
            for r in range(2):
                row = Batch(
                    users[g : g + 1], users[g : g + 1], members[g, r : r + 1], mask[g, r : r + 1]
                )
                assert torch.allclose(
                    grouped[g, r], model.distance(row, all_songs(row))[0], atol=1e-9
                )


def test_mass_padding_never_changes_a_score() -> None:
    model, batch = make_mass(), make_batch()
    songs = candidates(batch)
    gen = torch.Generator().manual_seed(7)
    extra = 4
    padded = Batch(
        batch.users,
        batch.playlists,
        torch.cat([batch.members, torch.randint(0, N_SONGS, (6, extra), generator=gen)], 1),
        torch.cat([batch.member_mask, torch.zeros(6, extra, dtype=torch.bool)], 1),
    )
    # padding in the middle too: move slot 0 behind a padded slot
    shuffled = torch.randperm(padded.members.shape[1], generator=gen)
    moved = Batch(
        padded.users, padded.playlists, padded.members[:, shuffled], padded.member_mask[:, shuffled]
    )
    with torch.no_grad():
        base = model.distance(batch, songs)
        for other in (padded, moved):
            assert torch.allclose(model.distance(other, songs), base, atol=1e-12)
            assert torch.allclose(model.full_distance(other), model.full_distance(batch), atol=1e-9)


def test_mass_padding_gets_no_gradient_and_empty_rows_are_finite() -> None:
    model = make_mass().train()
    model.config.dropout = 0.0
    batch = make_batch()
    unused = 22  # song index used by no real member and no candidate
    members = torch.where(batch.member_mask, batch.members, torch.full_like(batch.members, unused))
    batch = Batch(batch.users, batch.playlists, members, batch.member_mask)
    songs = candidates(batch) % 20
    out = model.distance(batch, songs)
    assert torch.isfinite(out).all()
    bias = model.song_bias.weight[songs[1], 0]
    assert torch.allclose(out[1], bias)  # no member: the song bias alone
    out.sum().backward()
    for p in model.parameters():
        assert torch.isfinite(p.grad).all()
    assert torch.all(model.song_emb.weight.grad[unused] == 0)
    assert torch.all(model.att_song_emb.weight.grad[unused] == 0)


def test_gemm_slots_rule() -> None:
    """On a CPU the member slots are laid out 16 wide up to 16, then in multiples of 8;
    elsewhere as given."""
    from masr.models.mass import gemm_slots

    cpu = torch.device("cpu")
    assert [gemm_slots(n, cpu) for n in (0, 1, 5, 15, 16, 17, 24, 25, 50)] == [
        16, 16, 16, 16, 16, 24, 24, 32, 56,
    ]
    assert gemm_slots(5, torch.device("meta")) == 5


@pytest.mark.parametrize("attention", ["mem-metric", "mem-dot", "none"])
def test_mass_gemm_slot_padding_changes_no_score_nor_gradient(
    attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GEMM-form paths (shared negatives, full ranking) with the slots padded for speed
    and without: the same scores and parameter gradients in float64, and no embedding row
    gets a gradient entry that the unpadded layout does not give it."""
    import masr.models.mass as mass_module

    torch.manual_seed(0)
    model = MASS(MASSConfig(dim=DIM, dropout=0.0, attention=attention), N_USERS, N_PLAYLISTS,
                 N_SONGS).double().train()
    for emb in (m for m in model.modules() if isinstance(m, torch.nn.Embedding)):
        emb.sparse = True
    batch = make_batch(rows=7, slots=5)
    own, shared = torch.arange(7) % N_SONGS, torch.tensor([3, 9, 11])

    def run() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        out = model.distance_own_shared(batch, own, shared)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out).double()).sum().backward()
        with torch.no_grad():
            full = model.full_distance(batch)
        return out, full, [p.grad.coalesce() if p.grad.is_sparse else p.grad
                           for p in model.parameters()]

    assert mass_module.gemm_slots(5, torch.device("cpu")) == 16
    padded = run()
    monkeypatch.setattr(mass_module, "gemm_slots", lambda n, device: n)
    plain = run()
    assert torch.allclose(padded[0], plain[0], atol=1e-10)
    assert torch.allclose(padded[1], plain[1], atol=1e-10)
    for a, b in zip(padded[2], plain[2], strict=True):
        if a.is_sparse:
            assert torch.equal(a.indices(), b.indices())
            a, b = a.values(), b.values()
        assert torch.allclose(a, b, atol=1e-10)


def test_masked_softmin_all_padding_row_is_zero_not_nan() -> None:
    dist = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.1, 9.0]])
    mask = torch.tensor([[False, False, False], [True, False, True]])
    alpha = masked_softmin(dist, mask)
    assert torch.equal(alpha[0], torch.zeros(3))
    e = torch.exp(-torch.tensor([0.5, 9.0]))
    assert torch.allclose(alpha[1], torch.tensor([e[0] / e.sum(), 0.0, e[1] / e.sum()]))


def test_mass_embedding_tables_cover_both_memories() -> None:
    model = MASS(MASSConfig(dim=2), 2, 2, 3)
    assert model.embedding_tables() == {
        "user_emb.weight",
        "song_emb.weight",
        "song_bias.weight",
        "att_user_emb.weight",
        "att_song_emb.weight",
    }


# --- dropout, determinism ------------------------------------------------------------------------
def test_shared_dropout_distance_matches_a_loop() -> None:
    """dropout_mode "shared": Σ_j w_cj (q_cj - s_tj)² with one weight vector per candidate."""
    gen = torch.Generator().manual_seed(4)
    q, members = (
        torch.randn(2, 3, 4, generator=gen, dtype=torch.float64),
        torch.randn(2, 5, 4, generator=gen, dtype=torch.float64),
    )
    weights = torch.rand(2, 3, 4, generator=gen, dtype=torch.float64) * (
        torch.rand(2, 3, 4, generator=gen) > 0.3
    )
    got = weighted_pairwise_sq(q, members, weights)
    for b in range(2):
        for c in range(3):
            for t in range(5):
                want = sum(
                    float(weights[b, c, j]) * float(q[b, c, j] - members[b, t, j]) ** 2
                    for j in range(4)
                )
                assert got[b, c, t].item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_keep_has_the_requested_rate_and_keeps_the_expectation(p: float) -> None:
    from masr.models.mdr import dropout_keep

    torch.manual_seed(0)
    keep, p_eff = dropout_keep((400, 50, 64), p, torch.device("cpu"), torch.float64)
    assert abs(p_eff - p) <= 1 / 65536 and set(keep.unique().tolist()) <= {0.0, 1.0}
    assert keep.mean().item() == pytest.approx(1 - p, abs=0.005)  # 1.28M draws: sd ~0.0005
    # no visible correlation between neighbouring elements (they share a 64-bit draw)
    flat = keep.flatten()
    corr = torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()
    assert abs(corr) < 0.01
    # the same law as inverted dropout on B ⊙ (x - y) before squaring (the reference's order):
    # m = 0 or 1/(1-p), so E[(m z)^2] = z^2 / (1-p); compared with torch's own dropout
    diff, metric = torch.randn(3, 4, 16, dtype=torch.float64), torch.rand(16, dtype=torch.float64)
    exact = mahalanobis_sq(diff, metric)
    ours = torch.stack([mahalanobis_sq(diff, metric, p, True) for _ in range(4000)])
    torchs = torch.stack(
        [F.dropout(diff * metric, p, True).square().sum(-1) for _ in range(4000)]
    )
    assert torch.allclose(ours.mean(0), exact / (1 - p), rtol=0.03)
    assert torch.allclose(ours.mean(0), torchs.mean(0), rtol=0.04)
    assert torch.allclose(ours.std(0), torchs.std(0), rtol=0.1)


@pytest.mark.parametrize(
    "x_shape, y_shape",
    [((6, 1, 8), (6, 5, 8)), ((4, 5, 1, 8), (4, 1, 7, 8)), ((3, 8), (3, 8))],
    ids=["mdr", "mass", "same-shape"],
)
def test_dropped_pairwise_sq_is_plain_autograd_with_the_same_mask(x_shape, y_shape) -> None:
    """The fused dropout distance (issue 13) computes what the plain autograd formula computes:
    same values and gradients, and the same mask for the same generator state."""
    from masr.models.mdr import dropped_pairwise_sq, dropped_square_sum

    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(x_shape, dtype=torch.float64, generator=gen)
    y0 = torch.randn(y_shape, dtype=torch.float64, generator=gen)
    weight = None
    results = []
    for fused in (True, False):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        torch.manual_seed(7)
        out = dropped_pairwise_sq(x, y, 0.3) if fused else dropped_square_sum(x - y, 0.3)
        if weight is None:
            weight = torch.randn(out.shape, dtype=torch.float64, generator=gen)
        (out * weight).sum().backward()
        results.append((out.detach(), x.grad, y.grad))
    (o1, gx1, gy1), (o2, gx2, gy2) = results
    assert o1.shape == torch.broadcast_shapes(x_shape, y_shape)[:-1]
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gx1, gx2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gy1, gy2, rtol=1e-12, atol=1e-12)
    # the mask really drops: some terms differ from the undropped distance
    assert not torch.allclose(o1, (x0 - y0).square().sum(-1) / 0.49)


def test_dropped_pairwise_sq_gradient_by_finite_differences() -> None:
    """Gradients of the fused function against central differences, with the mask held fixed
    (the same seed before every evaluation)."""
    from masr.models.mdr import dropped_pairwise_sq

    x = torch.randn(2, 3, 1, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 1, 5, 4, dtype=torch.float64, requires_grad=True)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(3)
        return (dropped_pairwise_sq(a, b, 0.25) * torch.arange(30.0).view(2, 3, 5)).sum()

    f(x, y).backward()
    h = 1e-6
    for t, g in ((x, x.grad), (y, y.grad)):
        flat = t.detach().flatten()
        for i in range(flat.numel()):
            plus, minus = flat.clone(), flat.clone()
            plus[i] += h
            minus[i] -= h
            args = [plus.view(t.shape), y.detach()] if t is x else [x.detach(), plus.view(t.shape)]
            args_m = (
                [minus.view(t.shape), y.detach()] if t is x else [x.detach(), minus.view(t.shape)]
            )
            numeric = (f(*args) - f(*args_m)).item() / (2 * h)
            assert g.flatten()[i].item() == pytest.approx(numeric, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "factory",
    [
        make_mdr,
        lambda: make_mdr(dropout_mode="row"),
        make_mass,
        lambda: make_mass(dropout_mode="shared"),
        lambda: make_mass(dropout_mode="row"),
    ],
)
def test_dropout_only_in_train_mode(factory) -> None:
    model, batch = factory(), make_batch(empty_rows=())
    songs = candidates(batch)
    with torch.no_grad():
        first, second = model.distance(batch, songs), model.distance(batch, songs)
        assert torch.equal(first, second)  # eval: deterministic
        model.train()
        torch.manual_seed(1)
        noisy = model.distance(batch, songs)
        torch.manual_seed(1)
        again = model.distance(batch, songs)
    assert torch.equal(noisy, again)  # train: random, but reproducible by seed
    assert not torch.allclose(noisy, first)


def test_mdr_row_dropout_matches_a_loop_on_every_path() -> None:
    """dropout_mode "row": one 0/1 mask per (row, dimension) and term, shared by the row's
    candidates: o = Σ_x Σ_j (m_xj B_xj (x_j - s_j))² / (1-p)² + θ_s, the same on the per-row
    path (``distance``) and the GEMM forms of shared negatives, values and gradients."""
    from masr.models.mdr import dropout_keep

    model, batch = make_mdr(dropout=0.4, dropout_mode="row"), make_batch(empty_rows=())
    model.train()
    rows, gen = batch.users.shape[0], torch.Generator().manual_seed(7)
    own, shared = torch.randint(0, N_SONGS, (rows,), generator=gen), torch.arange(0, N_SONGS, 3)
    songs = torch.cat([own.unsqueeze(1), shared.expand(rows, -1)], dim=1)  # (B, 1 + N)
    torch.manual_seed(3)
    masks = [dropout_keep((rows, DIM), 0.4, torch.device("cpu"), torch.float64) for _ in "up"]
    want = torch.zeros(songs.shape, dtype=torch.float64)
    with torch.no_grad():
        for r in range(rows):
            u = model.user_emb.weight[batch.users[r]]
            pl = model.playlist_emb.weight[batch.playlists[r]]
            for c in range(songs.shape[1]):
                s = model.song_emb.weight[songs[r, c]]
                for (keep, p), x, metric in zip(
                    masks, (u, pl), (model.metric_user, model.metric_playlist), strict=True
                ):
                    want[r, c] += float(((keep[r] * metric * (x - s)) ** 2).sum()) / (1 - p) ** 2
                want[r, c] += float(model.song_bias.weight[songs[r, c], 0])
    outputs, grads = [], []
    for path in (
        lambda: model.distance(batch, songs),
        lambda: model.distance_own_shared(batch, own, shared),
        lambda: torch.cat(
            [model.distance(batch, own.unsqueeze(1)), model.distance_shared(batch, shared)], 1
        ),
    ):
        model.zero_grad()
        torch.manual_seed(3)
        out = path()
        if len(outputs) == 2:  # two calls, two draws: only the first column uses the masks
            out = out[:, :1]
        out.sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert torch.allclose(outputs[0], want, atol=1e-10)
    assert torch.allclose(outputs[1], want, atol=1e-10)
    assert torch.allclose(outputs[2], want[:, :1], atol=1e-10)
    for g0, g1 in zip(grads[0], grads[1], strict=True):
        assert torch.allclose(g0, g1, atol=1e-10)
    model.eval()  # no dropout outside training: the plain metric
    with torch.no_grad():
        assert torch.allclose(
            model.distance_own_shared(batch, own, shared),
            torch.tensor(ref_mdr(model, batch, songs), dtype=torch.float64),
            atol=1e-10,
        )


def test_mass_row_dropout_matches_a_loop_on_every_path() -> None:
    """dropout_mode "row": one 0/1 mask per (row, dimension) for each metric (B3, then B4),
    shared by the row's candidates and members; the per-row path and the GEMM form of shared
    negatives give the loop's values and the same gradients."""
    from masr.models.mdr import dropout_keep

    model, batch = make_mass(dropout=0.4, dropout_mode="row"), make_batch()
    model.train()
    rows, gen = batch.users.shape[0], torch.Generator().manual_seed(7)
    own, shared = torch.randint(0, N_SONGS, (rows,), generator=gen), torch.arange(0, N_SONGS, 3)
    songs = torch.cat([own.unsqueeze(1), shared.expand(rows, -1)], dim=1)  # (B, 1 + N)
    torch.manual_seed(3)
    (k_out, p_out), (k_att, p_att) = (
        dropout_keep((rows, DIM), 0.4, torch.device("cpu"), torch.float64) for _ in "oa"
    )
    reference = make_mass(dropout=0.4, dropout_mode="row")  # the same weights, eval mode
    want = []
    with torch.no_grad():
        b3, b4 = model.metric.clone(), model.att_metric.clone()
        for r in range(rows):  # eq. 19 with row r's masked metrics m ⊙ B / (1-p)
            reference.metric.copy_(k_out[r] * b3 / (1 - p_out))
            reference.att_metric.copy_(k_att[r] * b4 / (1 - p_att))
            want.append([ref_mass_parts(reference, batch, r, k)[2] for k in songs[r].tolist()])
    outputs, grads = [], []
    for path in (
        lambda: model.distance(batch, songs),
        lambda: model.distance_own_shared(batch, own, shared),
    ):
        model.zero_grad()
        torch.manual_seed(3)
        out = path()
        out.sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for out in outputs:
        assert torch.allclose(out, torch.tensor(want, dtype=out.dtype), atol=1e-10)
    for g0, g1 in zip(grads[0], grads[1], strict=True):
        assert torch.allclose(g0, g1, atol=1e-10)


def test_mass_train_path_without_dropout_equals_eval() -> None:
    model, batch = make_mass(dropout=0.0), make_batch()
    songs = candidates(batch)
    with torch.no_grad():
        eval_out = model.distance(batch, songs)
        assert torch.allclose(model.train().distance(batch, songs), eval_out, atol=1e-12)


# --- MASR ----------------------------------------------------------------------------------------
def test_masr_fuses_eq_20_and_is_frozen() -> None:
    mdr, mass, batch = make_mdr(1), make_mass(2), make_batch()
    songs = candidates(batch)
    model = MASR.from_parts(mdr, mass, alpha=0.3, parts={"mdr": "amdr", "mass": "amass"})
    assert model.config.parts == {"mdr": "amdr", "mass": "amass"} and model.config.alpha == 0.3
    assert not any(p.requires_grad for p in model.parameters()) and not model.trainable
    model.train()
    assert not model.training and not model.mass.training  # never trained: no dropout
    with torch.no_grad():
        o_mdr, o_mass = mdr.distance(batch, songs), mass.distance(batch, songs)
        expected = [
            [0.3 * a + 0.7 * b for a, b in zip(ra, rb, strict=True)]
            for ra, rb in zip(ref_mdr(mdr, batch, songs), ref_mass(mass, batch, songs), strict=True)
        ]
        got = model.distance(batch, songs)
        assert torch.allclose(got, torch.tensor(expected, dtype=got.dtype), atol=1e-9)
        assert torch.allclose(got, 0.3 * o_mdr + 0.7 * o_mass)
        full = model.full_distance(batch, chunk=6)
        assert torch.allclose(full, model.distance(batch, all_songs(batch)), atol=1e-9)
        users = batch.users
        vectors = model.full_distance_from_vectors(
            mdr.user_emb(users),
            mdr.playlist_emb(batch.playlists),
            mass.user_emb(users),
            mass.att_user_emb(users),
            batch.members,
            batch.member_mask,
        )
        assert torch.allclose(vectors, full, atol=1e-9)
        half = model.with_alpha(0.5)
        assert half.config.alpha == 0.5
        assert torch.allclose(half.distance(batch, songs), 0.5 * o_mdr + 0.5 * o_mass)
        # the ends of eq. 20 (what --alpha auto may choose): one part alone, exactly
        everything = all_songs(batch)
        for alpha, part in ((0.0, mass), (1.0, mdr)):
            end = model.with_alpha(alpha)
            assert torch.allclose(end.distance(batch, songs), part.distance(batch, songs))
            assert torch.allclose(
                end.full_distance(batch, chunk=6), part.distance(batch, everything), atol=1e-9
            )


def test_masr_rejects_alpha_outside_unit_interval() -> None:
    with pytest.raises(MasrError, match="alpha"):
        MASRConfig(alpha=1.5)


def test_masr_parts_accept_a_pair_of_run_names() -> None:
    model = MASR.from_parts(make_mdr(), make_mass(), 0.5, ["amdr", "amass"])
    assert model.config.parts == {"mdr": "amdr", "mass": "amass"}


@pytest.mark.parametrize(
    ("config", "option"),
    [
        (lambda: MDRConfig(dim=0), "--dim"),
        (lambda: MASSConfig(dropout=1.0), "--dropout"),
        (lambda: MDRConfig(init_std=-1.0), "init_std"),
        (lambda: MASSConfig(dropout_mode="rows"), "dropout_mode"),
        (lambda: MDRConfig(dropout_mode="shared"), "dropout_mode"),
    ],
)
def test_configs_reject_impossible_settings(config, option: str) -> None:
    with pytest.raises(MasrError, match=option):
        config()


# --- checkpoints and registry --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mdr", "mass", "masr"])
def test_checkpoint_round_trip_gives_identical_outputs(tmp_path: Path, name: str) -> None:
    if name == "masr":
        model = MASR.from_parts(
            make_mdr(1).float(), make_mass(2).float(), 0.4, {"mdr": "mdr", "mass": "amass"}
        )
    else:
        model = (make_mdr if name == "mdr" else make_mass)(seed=5).float()
    assert model_class(name) is type(model)
    batch = make_batch()
    songs = candidates(batch)
    path = tmp_path / "best.pt"
    save_checkpoint(path, model, data_fingerprint="abc")
    loaded, ckpt = load_model(path)
    assert ckpt["model"] == name and type(loaded) is type(model) and not loaded.training
    assert loaded.config == model.config
    with torch.no_grad():
        assert torch.equal(loaded.distance(batch, songs), model.distance(batch, songs))
        assert torch.equal(loaded.full_distance(batch), model.full_distance(batch))
    assert type(build_model(ckpt)) is type(model)
