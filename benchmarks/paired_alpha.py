"""Eq. 20's fusion of two checkpoints at several weights α, compared case by case.

    python benchmarks/paired_alpha.py AMDR.pt AMASS.pt --data aotm --split test
        [--alpha 0.5 --alpha 0.75 --alpha 1] [--base 0.5] [--full-sample 3000] [--threads 1]

Scores the MASS-class checkpoint once and each weight's fusion from its distances (as
`masr train --alpha auto` does), on the same cases: every sampled case, and `--full-sample`
full-ranking cases drawn as `masr evaluate --full-sample` draws them. Prints one JSON object:
each weight's hit@10 and ndcg@10 under both protocols, and each weight against `--base` (the
paper's 0.5 by default) with `masr.significance.paired`: the difference, its 95% interval and
McNemar's exact p-value on the cases only one of the two gets right.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def compare(
    mdr: Any, mass: Any, data: Any, alphas: list[float], base: float, split: str,
    full_sample: int, sample_seed: int = 0,
) -> dict[str, Any]:
    """The figures above for loaded models ``mdr`` and ``mass`` on prepared ``data``."""
    from masr.evaluate import evaluate_model_and
    from masr.models.masr import FusionOnMass
    from masr.significance import paired

    weights = sorted({*alphas, base})
    on_top = {f"{a:g}": FusionOnMass(mdr, a) for a in weights}
    ranks: dict[str, dict[str, Any]] = {}
    metrics = evaluate_model_and(
        mass, on_top, data, split, full_sample=full_sample, sample_seed=sample_seed,
        ranks_out=ranks,
    )

    def short(m: dict[str, float]) -> dict[str, float]:
        return {k: round(m[k], 4) for k in ("hit@10", "ndcg@10")}

    out: dict[str, Any] = {"split": split, "full_sample": full_sample, "base": base}
    out["alpha"] = {
        name: {protocol: short(m) for protocol, m in metrics[name].items()} for name in on_top
    }
    out["against_base"] = {
        name: {protocol: paired(ranks[name][protocol], ranks[f"{base:g}"][protocol])
               for protocol in ranks[name]}
        for name in on_top if name != f"{base:g}"
    }
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mdr", help="an MDR-class checkpoint (mdr or amdr best.pt)")
    parser.add_argument("mass", help="a MASS-class checkpoint (mass or amass best.pt)")
    parser.add_argument("--data", required=True, help="the prepared data both were trained on")
    parser.add_argument("--alpha", type=float, action="append", help="weights (repeatable)")
    parser.add_argument("--base", type=float, default=0.5, help="the weight compared against")
    parser.add_argument("--split", default="valid", choices=("valid", "test"))
    parser.add_argument("--full-sample", type=int, default=2000)
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="0 = torch's default")
    args = parser.parse_args(argv)

    import torch

    from masr.checkpoint import load_model
    from masr.dataset import load_prepared

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    data = load_prepared(args.data)
    mdr, mass = (load_model(path)[0].eval() for path in (args.mdr, args.mass))
    result = compare(mdr, mass, data, args.alpha or [0.75, 1.0], args.base, args.split,
                     args.full_sample, args.sample_seed)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
