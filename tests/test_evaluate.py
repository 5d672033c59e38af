"""Evaluation protocols on hand-made distances (masr.evaluate)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from masr.dataset import Cases, PreparedData
from masr.evaluate import evaluate_model, metric_names, metrics_from_ranks
from masr.models.base import Batch, ModelConfig, Recommender
from masr.report import COLUMNS, comparison_rows, plot_hit_curves
from masr.runs.registry import NOT_YET_RUN, run_order


@dataclass
class TableConfig(ModelConfig):
    pass


class TableModel(Recommender):
    """Distances read from a fixed (P, V) table: D[playlist, song]."""

    name = "table"
    config_class = TableConfig
    trainable = False

    def __init__(self, table: Tensor):
        super().__init__(TableConfig(), 1, table.shape[0], table.shape[1])
        self.register_buffer("table", table.float())

    def distance(self, batch: Batch, songs: Tensor) -> Tensor:
        return self.table[batch.playlists.unsqueeze(1), songs]

    def full_distance(self, batch: Batch, chunk: int = 8192) -> Tensor:
        return self.table[batch.playlists]


class MemberTable(TableModel):
    """The same distances, but declared as reading members: evaluation batches by length."""

    uses_members = True


def data_with(
    train: list[list[int]], n_songs: int, test_song: list[int], negatives: list[list[int]]
) -> PreparedData:
    lengths = np.array([len(p) for p in train], dtype=np.int64)
    indptr = np.zeros(len(train) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    k = max(len(n) for n in negatives)
    neg = np.full((len(negatives), k), -1, dtype=np.int64)
    for i, n in enumerate(negatives):
        neg[i, : len(n)] = n
    p = np.arange(len(train), dtype=np.int64)
    cases = Cases(playlist=p, user=np.zeros_like(p), song=np.asarray(test_song), negatives=neg)
    return PreparedData(
        path=Path("mem"),
        manifest={"fingerprint": "x"},
        n_users=1,
        n_playlists=len(train),
        n_songs=n_songs,
        playlist_user=np.zeros(len(train), dtype=np.int64),
        train_playlist=np.repeat(p, lengths),
        train_song=np.concatenate([np.sort(t) for t in map(np.asarray, train)]),
        indptr=indptr,
        valid=cases,
        test=cases,
    )


def test_metrics_from_ranks_by_hand() -> None:
    m = metrics_from_ranks(np.array([0, 1, 4, 10]))
    assert list(m) == metric_names()
    assert m["hit@1"] == 0.25 and m["hit@2"] == 0.5 and m["hit@5"] == 0.75 and m["hit@10"] == 0.75
    assert m["ndcg@1"] == pytest.approx(0.25)
    assert m["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(6)) / 4)
    assert metrics_from_ranks(np.array([], dtype=np.int64))["hit@10"] == 0.0


def test_sampled_protocol_ties_count_against_and_padding_is_ignored() -> None:
    # playlist 0: held-out song 5 at distance 1.0; negatives 1 (0.5, better), 2 (1.0, a tie),
    # 3 (2.0); padding -1 would be song 0 at distance 0.0 if it were not ignored.
    table = torch.tensor([[0.0, 0.5, 1.0, 2.0, 9.0, 1.0, 9.0]])
    data = data_with([[4, 6]], 7, [5], [[1, 2, 3, -1]])
    m = evaluate_model(TableModel(table), data, protocols=("sampled",))["sampled"]
    assert m["hit@2"] == 0.0 and m["hit@3"] == 1.0  # rank 2: one better, one tie
    assert m["ndcg@3"] == pytest.approx(1 / math.log2(4))


def test_constant_model_never_hits() -> None:
    data = data_with([[0], [1]], 30, [5, 6], [list(range(10, 30)), list(range(10, 20))])
    result = evaluate_model(TableModel(torch.zeros(2, 30)), data)
    assert result["sampled"]["hit@10"] == 0.0
    assert result["full"]["hit@10"] == 0.0


def test_full_protocol_excludes_training_songs_only() -> None:
    # playlist 0 trains on songs 0 and 1 (the two closest: ignored); held-out song 4 at 3.0;
    # song 2 is closer (counts), song 3 ties (counts), song 5 is further.
    table = torch.tensor([[0.0, 1.0, 2.0, 3.0, 3.0, 5.0]])
    data = data_with([[0, 1]], 6, [4], [[5]])
    full = evaluate_model(TableModel(table), data, protocols=("full",))["full"]
    assert full["hit@2"] == 0.0 and full["hit@3"] == 1.0
    sampled = evaluate_model(TableModel(table), data, protocols=("sampled",))["sampled"]
    assert sampled["hit@1"] == 1.0


def test_nan_distance_is_the_worst() -> None:
    table = torch.tensor([[0.0, 1.0, float("nan"), 2.0]])
    data = data_with([[0]], 4, [2], [[1, 3]])
    result = evaluate_model(TableModel(table), data)
    assert result["sampled"]["hit@2"] == 0.0 and result["full"]["hit@2"] == 0.0


def test_full_ranks_read_nan_as_the_worst_distance_on_both_sides() -> None:
    """The full protocol counts without cleaning the (B, V) distances: NaN and ±inf among the
    songs and as the held-out song's own distance rank as ``_clean`` orders them (NaN after
    +inf, ±inf at the ends of the float range; slow reference)."""
    from masr.evaluate import full_ranks
    from masr.sampling import TrainingIndex

    nan, inf = float("nan"), float("inf")
    table = torch.tensor(
        [
            [0.0, nan, 2.0, 1.0, inf, 3.0],  # held-out song 3 at 1.0: NaN and inf are behind it
            [nan, 1.0, 0.5, nan, 2.0, 0.0],  # held-out song 0 is NaN: every other song counts
            [0.0, 1.0, inf, nan, 2.0, 0.0],  # held-out song 2 at +inf: the NaN is behind it
            [-inf, 1.0, nan, 0.0, -inf, 2.0],  # held-out song 4 at -inf: ties with song 0 only
        ]
    )
    train = [[5], [2], [0], [1]]
    test = [3, 0, 2, 4]
    data = data_with(train, 6, test, [[0]] * 4)
    ranks = full_ranks(TableModel(table), data.test, TrainingIndex.from_data(data))
    clean = torch.nan_to_num(table, nan=inf).numpy()
    for i in range(len(test)):
        others = [s for s in range(6) if s not in train[i] and s != test[i]]
        assert ranks[i] == sum(clean[i, s] <= clean[i, test[i]] for s in others), i
    assert ranks.tolist() == [1, 4, 3, 1]
    # a target at the largest float: +inf counts with it (cleaned to that value), NaN does not
    big = torch.finfo(torch.float32).max
    table = torch.tensor([[0.0, inf, big, nan, 1.0, big]])
    data = data_with([[0]], 6, [2], [[1]])
    ranks = full_ranks(TableModel(table), data.test, TrainingIndex.from_data(data))
    assert ranks.tolist() == [3]  # songs 1 (+inf), 4 and 5 (a tie); not 3 (NaN)


def test_full_ranking_batches_agree() -> None:
    rng = np.random.default_rng(0)
    n_play, v = 23, 40
    train = [
        sorted(rng.choice(v, size=rng.integers(1, 6), replace=False).tolist())
        for _ in range(n_play)
    ]
    test = [int(rng.choice(np.setdiff1d(np.arange(v), t))) for t in train]
    negs = [
        np.setdiff1d(np.arange(v), t + [s])[:10].tolist()
        for t, s in zip(train, test, strict=True)
    ]
    data = data_with(train, v, test, negs)
    table = torch.as_tensor(rng.integers(0, 5, size=(n_play, v)))  # many ties
    from masr.evaluate import full_ranks, sampled_ranks
    from masr.sampling import TrainingIndex

    index = TrainingIndex.from_data(data)
    model = TableModel(table)
    for fn in (full_ranks, sampled_ranks):
        want = fn(model, data.test, index, 100)
        assert np.array_equal(fn(model, data.test, index, 4), want)
        # member-reading models are batched by playlist length; ranks come back in case order
        assert np.array_equal(fn(MemberTable(table), data.test, index, 4), want)
    # slow obvious reference for the full protocol
    ranks = full_ranks(model, data.test, index)
    for i in range(n_play):
        d = table[i].numpy()
        others = [s for s in range(v) if s not in train[i] and s != test[i]]
        assert ranks[i] == sum(d[s] <= d[test[i]] for s in others)


def test_full_sample_ranks_a_seeded_subset_of_cases() -> None:
    from masr.evaluate import full_ranks, subsample_cases
    from masr.sampling import TrainingIndex

    rng = np.random.default_rng(1)
    n_play, v = 30, 25
    train = [sorted(rng.choice(v, size=3, replace=False).tolist()) for _ in range(n_play)]
    test = [int(np.setdiff1d(np.arange(v), t)[0]) for t in train]
    data = data_with(train, v, test, [[0]] * n_play)
    model = TableModel(torch.as_tensor(rng.random((n_play, v))))
    sub = subsample_cases(data.test, 7, seed=3)
    assert len(sub) == 7 and np.all(np.diff(sub.playlist) > 0)  # distinct, in case order
    assert np.array_equal(sub.playlist, subsample_cases(data.test, 7, seed=3).playlist)
    assert subsample_cases(data.test, 0) is data.test
    assert subsample_cases(data.test, 99) is data.test
    # the metrics are those of the drawn cases, and the sampled protocol keeps every case
    index = TrainingIndex.from_data(data)
    got = evaluate_model(model, data, full_sample=7, sample_seed=3)
    assert got["full"] == metrics_from_ranks(full_ranks(model, sub, index))
    assert got["sampled"] == evaluate_model(model, data)["sampled"]


def _res(h: float, n: float) -> dict[str, dict[str, float]]:
    m = dict.fromkeys(metric_names(), 0.0) | {"hit@10": h, "ndcg@10": n}
    return {"sampled": m, "full": {**m, "hit@10": h / 10, "ndcg@10": n / 10}}


def test_comparison_rows_follow_table_2() -> None:
    results = {
        "amasr": _res(0.6, 0.4),
        "mdr": _res(0.5, 0.3),
        "pop": _res(0.4, 0.2),
        "cml": _res(0.5, 0.25),
        "neumf": _res(0.3, 0.1),
    }
    rows = comparison_rows(results)
    labels = [(r.group, r.run) for r in rows]
    assert labels[:2] == [("baseline", "cml"), ("baseline", "neumf")]  # paper order: (b), (c)
    assert {r.run for r in rows if r.values is None} == set(NOT_YET_RUN) == set()
    assert [r.run for r in rows if r.group == "ours"] == ["mdr", "amasr"]
    (imp,) = [r for r in rows if r.group == "improvement"]
    assert imp.run == "amasr"
    assert imp.values == pytest.approx([20.0, 60.0, 20.0, 60.0])  # vs cml hit, cml ndcg
    assert len(imp.values) == len(COLUMNS)


def test_alpha_variants_sit_beside_their_fusion_never_among_baselines() -> None:
    """`masr evaluate --alpha`: amasr@α=… rows follow AMASR and do not count as the best
    baseline of the improvement row."""
    results = {
        "pop": _res(0.4, 0.2),
        "amasr": _res(0.6, 0.4),
        "amasr@α=0.25": _res(0.9, 0.9),
        "amasr@α=0.75": _res(0.5, 0.3),
    }
    rows = comparison_rows(results)
    assert [r.run for r in rows if r.group == "baseline"] == ["pop"]
    assert [(r.run, r.label) for r in rows if r.group == "ours"] == [
        ("amasr", "AMASR"), ("amasr@α=0.25", "AMASR α=0.25"), ("amasr@α=0.75", "AMASR α=0.75")
    ]
    (imp,) = [r for r in rows if r.group == "improvement"]
    assert imp.values == pytest.approx([50.0, 100.0, 50.0, 100.0])  # vs pop, not the variant


def test_no_improvement_rows_without_baselines() -> None:
    rows = comparison_rows({"masr": _res(0.5, 0.3)})
    assert not [r for r in rows if r.group == "improvement"]


def test_run_order() -> None:
    order = run_order(["amasr", "zzz", "mdr", "pop", "mfbpr"])
    assert order == ["mfbpr", "pop", "zzz", "mdr", "amasr"]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_hit_curves({"mdr": _res(0.5, 0.3)}, tmp_path / "hits.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mass_ranks_do_not_depend_on_the_batch_size(planted: PreparedData) -> None:
    """Member-reading models are evaluated in length-ordered batches of at most 256 cases on a
    CPU (less member padding): the same ranks as one large batch, both protocols (float64, so
    padding cannot flip a tie by rounding)."""
    from masr.evaluate import full_ranks, sampled_ranks
    from masr.models.mass import MASS, MASSConfig
    from masr.sampling import TrainingIndex

    torch.manual_seed(0)
    model = MASS(
        MASSConfig(dim=8, init_std=0.3), planted.n_users, planted.n_playlists, planted.n_songs
    ).double().eval()
    index = TrainingIndex.from_data(planted)
    for ranks in (full_ranks, sampled_ranks):
        small = ranks(model, planted.valid, index, batch_size=3)
        default = ranks(model, planted.valid, index)
        large = ranks(model, planted.valid, index, batch_size=4096)
        assert np.array_equal(small, large) and np.array_equal(default, large), ranks.__name__


def test_a_fusion_beside_its_mass_run_scores_as_it_does_alone(
    planted: PreparedData, tmp_path: Path
) -> None:
    """`masr evaluate` scores a fusion from its MASS run's distances, computed once for both
    (eq. 20 on top): the same figures, α variants included, as the fusion evaluated on its own;
    a fusion whose MASS part is not that run's weights is evaluated on its own."""
    from masr.checkpoint import save_checkpoint
    from masr.models.masr import MASR
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig
    from masr.report import evaluate_runs

    sizes = (planted.n_users, planted.n_playlists, planted.n_songs)
    torch.manual_seed(0)
    models = {
        "mdr": MDR(MDRConfig(dim=8, init_std=0.3), *sizes),
        "mass": MASS(MASSConfig(dim=8, init_std=0.3), *sizes),
        "amdr": MDR(MDRConfig(dim=8, init_std=0.3), *sizes),
        "amass": MASS(MASSConfig(dim=8, init_std=0.3), *sizes),
    }
    models["masr"] = MASR.from_parts(models["mdr"], models["mass"], parts=["mdr", "mass"])
    # amasr's MASS is not the amass run's weights (as after retraining amass alone)
    other = MASS(MASSConfig(dim=8, init_std=0.3), *sizes)
    models["amasr"] = MASR.from_parts(models["amdr"], other, parts=["amdr", "amass"])
    runs = tmp_path / "runs"
    for name, model in models.items():
        save_checkpoint(runs / name / "best.pt", model, data_fingerprint=planted.fingerprint)

    logged: list[str] = []
    kwargs = {"device": "cpu", "full_sample": 40, "split": "valid", "alphas": [0.3]}
    together = evaluate_runs(planted, runs, ["all"], log=logged.append, **kwargs)
    assert list(together) == [
        "mdr", "mass", "masr", "masr@α=0.3", "amdr", "amass", "amasr", "amasr@α=0.3"
    ]
    assert any(line.startswith("mass: evaluated") and "masr, masr@α=0.3" in line for line in logged)
    assert not any(line.startswith("amass: evaluated") and "with" in line for line in logged)
    for fusion in ("masr", "amasr"):
        alone = evaluate_runs(planted, runs, [fusion], **kwargs)
        for key in (fusion, f"{fusion}@α=0.3"):
            assert together[key] == alone[key], key
        assert together[fusion]["full"] != together["mass"]["full"]  # not the part's figures


def test_padded_slots_counts_each_length_sorted_batch_at_its_longest() -> None:
    from types import SimpleNamespace

    import torch

    from masr.dataset import Cases
    from masr.evaluate import padded_slots

    # playlists 0..4 with 1, 2, 3, 10 and 0 training songs (0 counts as one slot)
    index = SimpleNamespace(indptr=torch.tensor([0, 1, 3, 6, 16, 16]))
    playlist = np.array([3, 0, 2, 1, 4])
    cases = Cases(playlist=playlist, user=playlist, song=playlist,
                  negatives=np.zeros((5, 1), dtype=np.int64))
    # sorted lengths 1, 1, 2, 3, 10: batches (1, 1), (2, 3), (10)
    assert padded_slots(cases, index, 2) == 1 * 2 + 3 * 2 + 10 * 1
    assert padded_slots(cases, index, 5) == 10 * 5
    assert padded_slots(cases, index, 1) == 1 + 1 + 2 + 3 + 10


def test_plot_of_many_runs_keeps_its_legend_beside_the_curves(tmp_path: Path, monkeypatch) -> None:
    """Twenty-two runs: one legend for both panels, outside every panel, and no two of the
    first twenty runs drawn alike (colour and marker); masr's own solid, baselines dashed."""
    pytest.importorskip("matplotlib")
    import masr.figures

    names = ["pop", "itemknn", "ease", "mfbpr", "cml", "fism", "als", "neumf", "cmn", "prme",
             "transrec", "caser", "mdr", "mass", "masr", "amdr", "amass", "amasr"]
    names += [f"extra{i}" for i in range(4)]
    results = {name: _res(0.3 + 0.01 * i, 0.1) for i, name in enumerate(names)}
    figures = []
    real = masr.figures.save_png

    def keep(fig, path, **kwargs):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        figures.append((fig.legends[0].get_window_extent(renderer),
                        [ax.get_window_extent(renderer) for ax in fig.axes],
                        [(line.get_label(), line.get_color(), line.get_marker(),
                          line.get_linestyle()) for line in fig.axes[0].lines]))
        return real(fig, path, **kwargs)

    monkeypatch.setattr(masr.figures, "save_png", keep)
    out = plot_hit_curves(results, tmp_path / "hits.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ((legend, panels, lines),) = figures
    assert len(panels) == 2 and not any(legend.overlaps(panel) for panel in panels)
    assert len(lines) == len(names)
    assert len({(colour, marker) for _, colour, marker, _ in lines[:20]}) == 20
    style = {label: dash for label, _, _, dash in lines}
    assert style["amasr"] == "-" and style["itemknn"] == "--"
