"""Validate the eq. 20 fusion of two checkpoints that no runs folder holds together.

    python benchmarks/fuse_checkpoints.py MDR.pt MASS.pt --data aotm [--alpha 0.5]
        [--split valid] [--full-sample 2000] [--sample-seed 0] [--threads 1] [--device cpu]

`masr train --model masr|amasr` fuses the parts of one runs folder when their signatures match
the options given; this checks a fusion of parts trained with different options (an AMDR and
an AMASS with different APR budgets, a checkpoint still training) without retraining either.
Prints one JSON line: both protocols' hit@10 and ndcg@10 of the fusion and of each part, on
the same cases (`--full-sample` seeded as `masr train --valid-sample` and `masr evaluate
--full-sample` draw them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mdr", help="an MDR-class checkpoint (mdr or amdr best.pt)")
    parser.add_argument("mass", help="a MASS-class checkpoint (mass or amass best.pt)")
    parser.add_argument("--data", required=True, help="the prepared data both were trained on")
    parser.add_argument("--alpha", type=float, default=0.5, help="eq. 20's weight of MDR")
    parser.add_argument("--split", default="valid", choices=("valid", "test"))
    parser.add_argument("--full-sample", type=int, default=2000)
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="0 = torch's default")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (as masr's --device)")
    args = parser.parse_args(argv)

    import torch

    from masr.checkpoint import load_model
    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.models.masr import MASR
    from masr.train import resolve_device

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    data = load_prepared(args.data)
    mdr, mdr_ckpt = load_model(args.mdr)
    mass, mass_ckpt = load_model(args.mass)
    fused = MASR.from_parts(mdr, mass, alpha=args.alpha, parts=["mdr", "mass"]).eval()
    out: dict[str, object] = {
        "mdr": args.mdr, "mdr_epoch": mdr_ckpt.get("epoch"),
        "mass": args.mass, "mass_epoch": mass_ckpt.get("epoch"),
        "alpha": args.alpha, "split": args.split, "full_sample": args.full_sample,
        "device": str(device),
    }
    for name, model in (("fusion", fused), ("mdr_part", mdr.eval()), ("mass_part", mass.eval())):
        started = time.perf_counter()
        metrics = evaluate_model(
            model, data, args.split, device=device, full_sample=args.full_sample,
            sample_seed=args.sample_seed, compile=True,
        )
        out[name] = {
            f"{protocol} {metric}": round(metrics[protocol][metric], 4)
            for protocol in ("sampled", "full")
            for metric in ("hit@10", "ndcg@10")
        }
        out[name]["seconds"] = round(time.perf_counter() - started, 1)  # type: ignore[index]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
