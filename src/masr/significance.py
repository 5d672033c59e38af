"""Uncertainty of the evaluation figures: standard errors and paired comparisons.

Every run of one ``masr evaluate`` is scored on the same cases (all sampled cases, and the same
seeded full-ranking cases), so two runs are compared case by case:

    h_i  = 1 if case i's held-out song ranks in the top 10 (hit@10), g_i its ndcg@10 gain
    Δ    = mean_i (a_i - b_i),  SE(Δ) = std_i(a_i - b_i) / √n,  95 % CI = Δ ± 1.96 SE(Δ)
    McNemar's exact test for hit@10: of the cases where exactly one run hits (b where only
    the first does, c where only the second), under "equally good" b ~ Binomial(b + c, 1/2);
    two-sided p = min(1, 2 P(X ≤ min(b, c))).

Public API:
    standard_errors(ranks) -> {"hit@10": se, "ndcg@10": se}       one run, one protocol
    mcnemar_p(b, c) -> float                                       exact two-sided p-value
    paired(ranks_a, ranks_b) -> dict                                one pair, one protocol
    interval_text(m) -> "+0.0123 ± 0.0045"                         Δ and its 95% half-width
    comparisons(results, ranks, baselines, ours) -> list[dict]      the pairs ``masr evaluate
        --significance`` reports: each of masr's models against the best baseline of each
        protocol, and the paper's orderings (A-variant against plain, fusion against its
        better part)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: the cutoff of the compared figures (the paper's Table 2)
CUTOFF = 10
#: two-sided 95 % normal quantile
Z95 = 1.959963984540054
#: the paper's orderings (section 5): (run, against, or the better of these on the protocol)
ORDERINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("amdr", ("mdr",)),
    ("amass", ("mass",)),
    ("amasr", ("masr",)),
    ("masr", ("mdr", "mass")),
    ("amasr", ("amdr", "amass")),
)


def _hits_gains(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hit@10, ndcg@10 gain) per case from 0-based ranks, as ``evaluate.metrics_from_ranks``."""
    ranks = np.asarray(ranks, dtype=np.int64)
    hit = ranks < CUTOFF
    gain = np.where(hit, 1.0 / np.log2(ranks + 2.0), 0.0)
    return hit.astype(np.float64), gain


def _se(values: np.ndarray) -> float:
    n = values.size
    return float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


def standard_errors(ranks: np.ndarray) -> dict[str, float]:
    """Standard errors of hit@10 and ndcg@10 over the cases (their means)."""
    hit, gain = _hits_gains(ranks)
    return {f"hit@{CUTOFF}": _se(hit), f"ndcg@{CUTOFF}": _se(gain)}


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant cases: 2·P(X ≤ min(b, c))
    for X ~ Binomial(b + c, 1/2), at most 1 (1 when there is no discordant case)."""
    n, k = int(b) + int(c), min(int(b), int(c))
    if n == 0:
        return 1.0
    # log P(X = j) = log C(n, j) - n log 2, with log C(n, j) built up term by term
    # (log C(n, j) = log C(n, j - 1) + log(n - j + 1) - log j), summed in log space: n may be
    # 10^5, where the probabilities underflow
    j = np.arange(1, k + 1, dtype=np.float64)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log(n - j + 1) - np.log(j))])
    log_pmf = log_comb - n * math.log(2.0)
    top = log_pmf.max()
    tail = math.exp(top) * float(np.exp(log_pmf - top).sum())
    return min(1.0, 2.0 * tail)


def paired(ranks_a: np.ndarray, ranks_b: np.ndarray) -> dict[str, Any]:
    """Run a against run b on the same cases (ranks in the same case order): for hit@10 and
    ndcg@10 each run's figure, Δ = a - b, its 95 % interval, and for hit@10 McNemar's p with
    the discordant counts."""
    ranks_a, ranks_b = np.asarray(ranks_a), np.asarray(ranks_b)
    if ranks_a.shape != ranks_b.shape:
        from masr.errors import MasrError

        raise MasrError(f"paired: {ranks_a.shape} and {ranks_b.shape} cases differ; compare "
                        "ranks of the same cases")
    (hit_a, gain_a), (hit_b, gain_b) = _hits_gains(ranks_a), _hits_gains(ranks_b)
    out: dict[str, Any] = {"cases": int(ranks_a.size)}
    for name, a, b in (("hit", hit_a, hit_b), ("ndcg", gain_a, gain_b)):
        diff = a - b
        delta, se = float(diff.mean()) if diff.size else 0.0, _se(diff)
        out[f"{name}@{CUTOFF}"] = {
            "a": float(a.mean()) if a.size else 0.0,
            "b": float(b.mean()) if b.size else 0.0,
            "delta": delta,
            "se": se,
            "ci95": [delta - Z95 * se, delta + Z95 * se],
        }
    only_a = int(((hit_a > 0) & (hit_b == 0)).sum())
    only_b = int(((hit_b > 0) & (hit_a == 0)).sum())
    out[f"hit@{CUTOFF}"].update(only_a=only_a, only_b=only_b, p=mcnemar_p(only_a, only_b))
    return out


def interval_text(m: Mapping[str, Any]) -> str:
    """One of ``paired``'s figures as text: Δ ± the half-width of its 95% interval."""
    lo, hi = m["ci95"]
    half = (hi - lo) / 2
    if not math.isfinite(half):  # fewer than two cases: no interval
        return f"{m['delta']:+.4f} (one case: no interval)"
    return f"{m['delta']:+.4f} ± {half:.4f}"


def comparisons(
    results: Mapping[str, Mapping[str, Any]],
    ranks: Mapping[str, Mapping[str, np.ndarray]],
    baselines: Sequence[str],
    ours: Sequence[str],
) -> list[dict[str, Any]]:
    """The paired comparisons of one evaluation, per protocol: every run of ``ours`` (masr's
    models, ``masr.runs.registry.OURS``) present against the best of ``baselines`` on that
    protocol (by hit@10, then ndcg@10), then the paper's ``ORDERINGS`` whose runs are present
    (against the better of the named runs). Each entry: {"run", "against", "why", "protocol",
    **paired(...)}."""
    out: list[dict[str, Any]] = []
    protocols = [p for p in ("sampled", "full") if any(p in r for r in ranks.values())]

    def best(names: Sequence[str], protocol: str) -> str | None:
        have = [n for n in names if protocol in ranks.get(n, {}) and protocol in results.get(n, {})]
        if not have:
            return None
        return max(
            have,
            key=lambda n: (results[n][protocol][f"hit@{CUTOFF}"],
                           results[n][protocol][f"ndcg@{CUTOFF}"]),
        )

    for protocol in protocols:
        pairs: list[tuple[str, str, str]] = []
        top = best(baselines, protocol)
        if top is not None:
            pairs += [(run, top, "best baseline") for run in ours if protocol in ranks.get(run, {})]
        for run, against in ORDERINGS:
            other = best(against, protocol)
            if protocol in ranks.get(run, {}) and other is not None:
                why = "paper's ordering" if len(against) == 1 else "paper's ordering (better part)"
                pairs.append((run, other, why))
        for run, other, why in pairs:
            entry = {"run": run, "against": other, "why": why, "protocol": protocol}
            entry.update(paired(ranks[run][protocol], ranks[other][protocol]))
            out.append(entry)
    return out
