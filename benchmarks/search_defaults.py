"""The searches behind `masr train`'s defaults (docs/training.md), on the validation split only.

    python benchmarks/search_defaults.py [--data bench-out/search-data] [--models mdr,mass]
                                         [--only NAME,...] [--threads 1]

Each point is one `masr train --model M` (the CLI, in a child process) into its own runs
directory under bench-out/search/, with the defaults except the options the point names. Read
from each run's run.json: the best validation hit@10 / ndcg@10 (sampled protocol), the epoch
it came from, the epochs run and the wall time. The test split is never read. Without --data
the embedded dataset is prepared (`masr prep`, seed 0). Results go to bench-out/search.json and
a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"

#: name -> the options that differ from the defaults
POINTS: dict[str, list[str]] = {
    "defaults": [],
    "batch 256, lr 1e-3 (paper)": ["--batch-size", "256", "--lr", "0.001"],
    "batch 4096, lr 3e-3": ["--batch-size", "4096", "--lr", "0.003"],
    "batch 4096, lr 1e-2": ["--batch-size", "4096", "--lr", "0.01"],
    "neg-mode pairs": ["--neg-mode", "pairs"],
    "reg 1e-4": ["--reg", "0.0001"],
    "reg 1e-2": ["--reg", "0.01"],
    "patience 0 (all 50 epochs)": ["--patience", "0"],
    "dropout 0": ["--set", "dropout=0"],
}


def masr(*args: str) -> None:
    cmd = [sys.executable, "-m", "masr_cli.main", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])}: {proc.stderr.strip()[-1500:]}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--models", default="mdr,mass")
    ap.add_argument("--only", default="", help="comma list of point names (default: all)")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--tag", default="", help="results go to bench-out/search-TAG.json")
    args = ap.parse_args(argv)
    data = args.data
    if data is None:
        data = OUT / "search-data"
        if not (data / "manifest.json").is_file():
            masr("prep", "--out", str(data))
    only = [p for p in args.only.split(",") if p]
    results = []
    for model in [m for m in args.models.split(",") if m]:
        for name, extra in POINTS.items():
            if only and name not in only:
                continue
            runs = OUT / "search" / model / name.replace(" ", "_").replace(",", "")
            start = time.perf_counter()
            masr("train", "--model", model, "--data", str(data), "--runs", str(runs),
                 "--device", "cpu", "--threads", args.threads, "--recipe", "paper", *extra)
            wall = time.perf_counter() - start
            info = json.loads((runs / model / "run.json").read_text())
            valid = info["best"]["valid"]
            row = {
                "model": model,
                "point": name,
                "options": extra,
                "valid_hit@10": round(valid["hit@10"], 4),
                "valid_ndcg@10": round(valid["ndcg@10"], 4),
                "best_epoch": info["best"]["epoch"],
                "epochs_run": len(info["history"]),
                "wall_seconds": round(wall, 1),
            }
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    OUT.mkdir(exist_ok=True)
    name = "search" + (f"-{args.tag}" if args.tag else "")
    (OUT / f"{name}.json").write_text(json.dumps({"data": str(data), "results": results}, indent=2))
    print("| model | point | valid hit@10 | valid ndcg@10 | best epoch / run | wall (s) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['point']} | {r['valid_hit@10']:.4f} | {r['valid_ndcg@10']:.4f} "
            f"| {r['best_epoch']} / {r['epochs_run']} | {r['wall_seconds']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
