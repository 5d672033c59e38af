"""Full-ranking hit@10 of two trained runs blended: are their hits complementary?

    python benchmarks/blend.py --data DIR --run RUNS_DIR:NAME --run RUNS_DIR:NAME \\
        [--weight W ...] [--split valid] [--full-sample 2000] [--seed 0] [--json out.json]

``by_popularity.py`` found that masr's learned models and item-kNN win on different songs (the
learned ones on the long tail, item-kNN on the popular ones). This measures what one blend of
the two would give, on the same seeded full-ranking cases as ``masr evaluate --full-sample``
and the per-epoch validation: each run's distances to every catalog song are standardised per
case (``--method z``: z-scores over the catalog) or turned into reciprocal ranks (``--method
rrf``: −1 / (60 + rank), reciprocal rank fusion) and mixed as W · first + (1 − W) · second,
then ranked as ``masr evaluate`` ranks (ties against
the held-out song). It also prints how many cases each run alone gets right, both, or neither.
A research measurement on the validation split (the test split is for final figures only), not
a scoring path of the product.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from masr.dataset import load_prepared
from masr.evaluate import full_ranks, subsample_cases
from masr.sampling import TrainingIndex

sys.path.insert(0, str(Path(__file__).resolve().parent))
from by_popularity import load_named_run  # noqa: E402  (a sibling script, not a package)


def standardised(dist: torch.Tensor) -> torch.Tensor:
    """Per-row z-scores of ``dist`` (B, V) over its finite entries (the songs that compete);
    the excluded songs stay +inf. A row with no spread gets zeros."""
    finite = torch.isfinite(dist)
    n = finite.sum(1, keepdim=True).clamp(min=1)
    zeroed = torch.where(finite, dist, torch.zeros_like(dist))
    mean = zeroed.sum(1, keepdim=True) / n
    spread = torch.where(finite, (dist - mean).square(), torch.zeros_like(dist))
    var = spread.sum(1, keepdim=True) / n
    z = (dist - mean) / var.sqrt().clamp(min=1e-12)
    return torch.where(finite, z, torch.full_like(dist, float("inf")))


#: reciprocal rank fusion's constant (Cormack et al. 2009)
RRF_K = 60.0


def reciprocal_ranks(dist: torch.Tensor, k: float = RRF_K) -> torch.Tensor:
    """Per-row −1 / (k + rank) of ``dist`` (B, V) (rank 1 = nearest; ties broken by position):
    reciprocal rank fusion's term, negated so that lower is better like a distance."""
    ranks = torch.empty_like(dist)
    order = dist.argsort(dim=1, stable=True)
    positions = torch.arange(1, dist.shape[1] + 1, dtype=dist.dtype, device=dist.device)
    ranks.scatter_(1, order, positions.expand_as(dist).contiguous())
    return -1.0 / (k + ranks)


class Blend:
    """Two models' distances mixed with ``weight`` on the first, after turning each into
    z-scores (``method`` "z") or reciprocal ranks ("rrf"): what ``full_ranks`` reads of a
    model (``uses_members``, ``full_distance``), nothing else."""

    def __init__(self, first: object, second: object, weight: float, method: str = "z") -> None:
        self.first, self.second, self.weight = first, second, weight
        self.transform = standardised if method == "z" else reciprocal_ranks
        self.uses_members = first.uses_members or second.uses_members

    def full_distance(self, batch: object) -> torch.Tensor:
        a = self.first.full_distance(batch)
        b = self.second.full_distance(batch)
        # the playlist's own songs are excluded by full_ranks afterwards; transform over all
        # songs here (the handful of members barely moves a mean or a rank over ~64K songs)
        return self.weight * self.transform(a) + (1.0 - self.weight) * self.transform(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="prepared data directory (masr prep)")
    parser.add_argument("--run", action="append", required=True, metavar="RUNS_DIR:NAME")
    parser.add_argument("--weight", action="append", type=float, default=[], metavar="W",
                        help="weight of the first run in the blend; repeatable (default 0.5)")
    parser.add_argument("--method", action="append", choices=["z", "rrf"], default=[],
                        help="z-scores or reciprocal ranks (k 60) before mixing; repeatable "
                        "(default z)")
    parser.add_argument("--split", default="valid", choices=["valid", "test"])
    parser.add_argument("--full-sample", type=int, default=2000, help="cases (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case draw")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if len(args.run) != 2:
        parser.error("give exactly two --run")
    weights = args.weight or [0.5]
    if any(not 0.0 <= w <= 1.0 for w in weights):
        parser.error("--weight: each must be in [0, 1]")

    data = load_prepared(args.data)
    cases = subsample_cases(
        data.valid if args.split == "valid" else data.test, args.full_sample, args.seed
    )
    index = TrainingIndex.from_data(data, torch.device("cpu"))
    models, names = [], []
    for spec in args.run:
        try:
            name, model = load_named_run(spec, data)
        except ValueError as err:
            parser.error(str(err))
        models.append(model)
        names.append(name)

    ranks = [np.asarray(full_ranks(m, cases, index)) for m in models]
    hit_a, hit_b = ranks[0] < 10, ranks[1] < 10
    out: dict[str, object] = {
        "split": args.split, "cases": len(cases), "seed": args.seed, "runs": args.run,
        "hit@10": {names[0]: float(hit_a.mean()), names[1]: float(hit_b.mean())},
        "overlap": {
            "both": float((hit_a & hit_b).mean()),
            f"{names[0]} only": float((hit_a & ~hit_b).mean()),
            f"{names[1]} only": float((~hit_a & hit_b).mean()),
            "either": float((hit_a | hit_b).mean()),
        },
        "blend hit@10": {},
    }
    for method in args.method or ["z"]:
        for w in weights:
            blended = Blend(models[0], models[1], w, method)
            blend_ranks = np.asarray(full_ranks(blended, cases, index))
            key = f"{w:g}" if method == "z" else f"{method} {w:g}"
            out["blend hit@10"][key] = float((blend_ranks < 10).mean())  # type: ignore[index]
            print(f"blend ({method}) {w:g} · {names[0]} + {1 - w:g} · {names[1]}: full hit@10 "
                  f"{(blend_ranks < 10).mean():.4f}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
