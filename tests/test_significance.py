"""Standard errors and paired comparisons (`masr evaluate --significance`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from masr.evaluate import metrics_from_ranks
from masr.significance import comparisons, interval_text, mcnemar_p, paired, standard_errors


def _mcnemar_reference(b: int, c: int) -> float:
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, j) for j in range(k + 1)) / 2**n)


@pytest.mark.parametrize(
    ("b", "c"),
    [(0, 0), (3, 0), (0, 7), (5, 5), (10, 2), (2, 10), (40, 61), (300, 350), (900, 1000)],
)
def test_mcnemar_exact_p_matches_the_binomial_sum(b: int, c: int) -> None:
    assert mcnemar_p(b, c) == pytest.approx(_mcnemar_reference(b, c), rel=1e-9, abs=1e-300)


def test_mcnemar_stays_finite_where_the_probabilities_underflow() -> None:
    """80,000 sampled-protocol cases: 2^-n underflows, the log-space sum does not."""
    p = mcnemar_p(40_000, 40_500)
    assert 0.05 < p < 0.2
    assert mcnemar_p(40_000, 42_000) < 1e-10


def test_paired_against_a_slow_loop() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 40, 500), rng.integers(0, 40, 500)
    got = paired(a, b)
    for name, value in (("hit", lambda r: float(r < 10)),
                        ("ndcg", lambda r: 1 / math.log2(r + 2) if r < 10 else 0.0)):
        diffs = [value(x) - value(y) for x, y in zip(a, b, strict=True)]
        mean = sum(diffs) / len(diffs)
        se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
        m = got[f"{name}@10"]
        assert m["delta"] == pytest.approx(mean) and m["se"] == pytest.approx(se)
        assert m["ci95"] == pytest.approx([mean - 1.959964 * se, mean + 1.959964 * se])
        assert m["a"] == pytest.approx(metrics_from_ranks(a)[f"{name}@10"])
        assert m["b"] == pytest.approx(metrics_from_ranks(b)[f"{name}@10"])
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x < 10 <= y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y < 10 <= x)
    assert (got["hit@10"]["only_a"], got["hit@10"]["only_b"]) == (only_a, only_b)
    assert got["hit@10"]["p"] == pytest.approx(_mcnemar_reference(only_a, only_b))
    se = standard_errors(a)
    hits = (a < 10).astype(float)
    assert se["hit@10"] == pytest.approx(hits.std(ddof=1) / math.sqrt(a.size))
    from masr.errors import MasrError

    with pytest.raises(MasrError, match="cases differ"):  # one line, not a ValueError
        paired(a, b[:-1])
    assert interval_text({"delta": 0.0123, "ci95": [0.0023, 0.0223]}) == "+0.0123 ± 0.0100"


def test_intervals_and_tests_hold_their_level_under_no_difference() -> None:
    """Two runs equally good (independent hits, p = 0.3, 400 cases), 2,000 repetitions: the
    95% interval holds 0 about 95% of the time and McNemar rejects at 5% at most about 5%."""
    rng = np.random.default_rng(1)
    covered = rejected = 0
    trials = 2000
    for _ in range(trials):
        a = np.where(rng.random(400) < 0.3, 0, 50)
        b = np.where(rng.random(400) < 0.3, 0, 50)
        m = paired(a, b)["hit@10"]
        covered += m["ci95"][0] <= 0 <= m["ci95"][1]
        rejected += m["p"] < 0.05
    assert abs(covered / trials - 0.95) < 0.015
    assert rejected / trials < 0.06  # exact test: conservative


def test_comparisons_pick_the_best_baseline_and_the_papers_orderings() -> None:
    rng = np.random.default_rng(2)
    names = ("pop", "itemknn", "mdr", "mass", "masr", "amdr", "amass", "amasr")
    ranks = {n: {"sampled": rng.integers(0, 30, 200), "full": rng.integers(0, 300, 50)}
             for n in names}
    results = {n: {p: metrics_from_ranks(r) for p, r in v.items()} for n, v in ranks.items()}
    ours = ["mdr", "mass", "masr", "amdr", "amass", "amasr"]
    out = comparisons(results, ranks, ["pop", "itemknn"], ours)
    for protocol in ("sampled", "full"):
        best = max(("pop", "itemknn"), key=lambda n: (results[n][protocol]["hit@10"],
                                                      results[n][protocol]["ndcg@10"]))
        rows = [e for e in out if e["protocol"] == protocol]
        vs_baseline = [e for e in rows if e["why"] == "best baseline"]
        assert [e["run"] for e in vs_baseline] == ["mdr", "mass", "masr", "amdr", "amass", "amasr"]
        assert {e["against"] for e in vs_baseline} == {best}
        orderings = [(e["run"], e["against"]) for e in rows if e["why"] != "best baseline"]
        better = max(("amdr", "amass"), key=lambda n: (results[n][protocol]["hit@10"],
                                                       results[n][protocol]["ndcg@10"]))
        assert orderings[:3] == [("amdr", "mdr"), ("amass", "mass"), ("amasr", "masr")]
        assert orderings[4] == ("amasr", better)
        for e in rows:
            assert e["hit@10"]["delta"] == pytest.approx(
                results[e["run"]][protocol]["hit@10"] - results[e["against"]][protocol]["hit@10"]
            )
    # only what was evaluated is compared
    few = {n: ranks[n] for n in ("itemknn", "amasr")}
    got = comparisons({n: results[n] for n in few}, few, ["itemknn"], ours)
    assert [(e["run"], e["against"]) for e in got] == [("amasr", "itemknn")] * 2


def test_json_keeps_tiny_p_values() -> None:
    """The JSON rounds figures to 6 decimals, but a p-value of 1e-50 (16 against 239
    discordant cases) stays a p-value, not 0."""
    from masr.report import to_jsonable

    p = mcnemar_p(16, 239)
    assert 0 < p < 1e-40
    out = to_jsonable({"run": {"hit@10": 0.123456789, "se": 3.2e-7}, "_paired": [{"p": p}]})
    assert out["_paired"][0]["p"] == pytest.approx(p, rel=1e-5) and out["_paired"][0]["p"] > 0
    assert out["run"] == {"hit@10": 0.123457, "se": 3.2e-7}
    assert to_jsonable({"x": 0.0, "y": 1.0, "z": -0.00012345678}) == {
        "x": 0.0, "y": 1.0, "z": -0.000123
    }
