"""The search behind `masr train --recipe fullrank` (docs/training.md), on the validation split.

    python benchmarks/search_fullrank.py --data DIR --model mdr --grid mdr [--time-limit 600]
                                         [--threads 1] [--out bench-out/fullrank.jsonl]

Each point is one `masr train --model M` (the CLI, in a child process) into its own runs
directory, with the options the point names on top of `--recipe paper` or `--recipe fullrank`.
Read from run.json: the best epoch's validation hit@10 / ndcg@10 under both protocols (sampled:
the paper's 100 stored negatives, every case; full: whole catalog, the seeded --valid-sample
cases), the epoch it came from, epochs run, seconds per epoch and whether the time limit ended
it, plus the per-epoch history. The test split is never read. One JSON line per point is
appended to --out as soon as the point ends, so a long search can be stopped and read.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FR = ["--recipe", "fullrank"]
#: grid name -> point name -> the options of the point
GRIDS: dict[str, dict[str, list[str]]] = {
    "mdr": {
        "paper": ["--recipe", "paper"],
        "fullrank": FR,
        "fullrank tau 0.05": [*FR, "--temperature", "0.05"],
        "fullrank tau 0.2": [*FR, "--temperature", "0.2"],
        "fullrank tau 0.5": [*FR, "--temperature", "0.5"],
        "fullrank uniform": [*FR, "--neg-sampler", "uniform"],
        "fullrank popularity": [*FR, "--neg-sampler", "popularity"],
        "fullrank neg 256": [*FR, "--neg", "256"],
        "fullrank lr 3e-3": [*FR, "--lr", "0.003"],
        "fullrank dim 128": [*FR, "--dim", "128"],
        "fullrank dropout 0.2": [*FR, "--set", "dropout=0.2"],
    },
    "mass": {
        "paper": ["--recipe", "paper"],
        "fullrank": FR,
        "fullrank init 0.1": [*FR, "--set", "init_std=0.1"],
        "fullrank lr 3e-3": [*FR, "--lr", "0.003"],
        "fullrank tau 0.05": [*FR, "--temperature", "0.05"],
        "fullrank tau 0.2": [*FR, "--temperature", "0.2"],
        "fullrank neg 256": [*FR, "--neg", "256"],
        "fullrank default init": [*FR, "--set", "query_init=default"],
    },
    # the GPU pass (benchmarks/device_fullrank.sh): sizes a CPU cannot afford
    "gpu": {
        "paper": ["--recipe", "paper"],
        "fullrank": FR,
        "fullrank neg 4096": [*FR, "--neg", "4096"],
        "fullrank tau 0.05": [*FR, "--temperature", "0.05"],
        "fullrank tau 0.2": [*FR, "--temperature", "0.2"],
        "fullrank dim 256": [*FR, "--dim", "256"],
        "fullrank lr 3e-3": [*FR, "--lr", "0.003"],
        "fullrank init 0.1": [*FR, "--set", "init_std=0.1"],
    },
}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", default="mdr")
    ap.add_argument("--grid", default=None, help=f"one of {', '.join(GRIDS)} (default: --model)")
    ap.add_argument("--only", default="", help="comma list of point names (default: all)")
    ap.add_argument("--extra", default="", help="options added to every point, space-separated")
    ap.add_argument("--time-limit", default="0")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=Path, default=ROOT / "bench-out" / "fullrank-runs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "fullrank.jsonl")
    args = ap.parse_args(argv)
    only = [p for p in args.only.split(",") if p]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name, options in GRIDS[args.grid or args.model].items():
        if only and name not in only:
            continue
        options = [*options, *args.extra.split()]
        runs = args.runs / args.data.name / args.model / name.replace(" ", "_")
        cmd = [sys.executable, "-m", "masr_cli.main", "train", "--model", args.model,
               "--data", str(args.data), "--runs", str(runs), "--device", args.device,
               "--threads", args.threads, "--time-limit", args.time_limit, *options]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(f"{name}: failed: {proc.stderr.strip()[-800:]}", file=sys.stderr)
            continue
        info = json.loads((runs / args.model / "run.json").read_text())
        best, history = info["best"], info["history"]
        row = {
            "model": args.model,
            "point": name,
            "options": options,
            "data": str(args.data),
            "valid_sampled": best["valid"],
            "valid_full": best.get("valid_full", {}),
            "best_epoch": best["epoch"],
            "epochs_run": len(history),
            "epoch_seconds": round(sum(h["train_seconds"] for h in history) / len(history), 2),
            "stopped_by_time_limit": info.get("stopped_by_time_limit", False),
            "wall_seconds": round(wall, 1),
            "history": [
                {"epoch": h["epoch"], "loss": round(h["loss"], 5), "valid": h["valid"],
                 "valid_full": h.get("valid_full")}
                for h in history
            ],
        }
        with args.out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(
            f"{args.model:5s} {name:28s} sampled {best['valid']['hit@10']:.4f} full "
            f"{row['valid_full'].get('hit@10', float('nan')):.4f} epoch {best['epoch']}/"
            f"{len(history)} {row['epoch_seconds']} s/epoch",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
