"""Seconds of one per-epoch validation (``masr train``'s: all sampled cases, a seeded subset of
full-ranking cases) of an untrained model on prepared data, each protocol timed alone.

    python benchmarks/bench_validation.py --data aotm --model mdr --repeat 3
    python benchmarks/bench_validation.py --data aotm --model mass --full-sample 300

Without ``--data``: AOTM as bench_train.py prepares it (../shared/data/aotm2011.csv.gz, or
$MASR_BENCH_DATA: a raw file or a prepared folder).

The model is freshly initialised (``--init-std``, default 0.05, so that the distances are not
all alike); what is timed is evaluation's own work (distances, ranks, metrics), which does not
depend on training. The calls run one after another in one process, so the first one also
pays for first use (page faults, allocator growth); the table keeps every call. One thread
unless ``--threads`` says otherwise; pin the process (``taskset -c 0``) for paired runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a folder written by `masr prep`")
    parser.add_argument("--model", default="mdr")
    parser.add_argument("--repeat", type=int, default=3, help="calls per protocol")
    parser.add_argument("--full-sample", type=int, default=2000, help="full-ranking cases")
    parser.add_argument("--protocols", default="full,sampled")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--init-std", type=float, default=0.05)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    import torch

    from masr.dataset import load_prepared
    from masr.evaluate import evaluate_model
    from masr.models import model_class
    from masr.sampling import TrainingIndex
    from masr.system import keep_freed_heap, tensor_huge_pages

    tensor_huge_pages()  # as the CLI does
    keep_freed_heap()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.data is None:
        from bench_train import DEFAULT_DATA, prepared

        source = Path(os.environ.get("MASR_BENCH_DATA", DEFAULT_DATA))
        if not source.exists():
            print(f"bench_validation: no data at {source} (set MASR_BENCH_DATA)", file=sys.stderr)
            return 0
        args.data = prepared(source)
    data = load_prepared(args.data)
    cls = model_class(args.model)
    fields = cls.config_class.__dataclass_fields__
    settings = {"init_std": args.init_std} if "init_std" in fields else {}
    model = cls(cls.config_class(**settings), data.n_users, data.n_playlists, data.n_songs)
    model.eval()
    index = TrainingIndex.from_data(data)
    rows = []
    for protocol in args.protocols.split(","):
        seconds = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = evaluate_model(
                model, data, "valid", protocols=(protocol,), index=index,
                full_sample=args.full_sample, sample_seed=0,
            )
            seconds.append(round(time.perf_counter() - t0, 3))
        rows.append({
            "model": args.model, "protocol": protocol, "seconds": seconds,
            "cases": args.full_sample if protocol == "full" else len(data.valid),
            "hit@10": result[protocol]["hit@10"], "threads": args.threads,
        })
        print(f"{args.model:6s} {protocol:8s} {rows[-1]['cases']:>7,} cases: "
              f"{' / '.join(f'{s:.2f}' for s in seconds)} s  (hit@10 {rows[-1]['hit@10']:.4f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
