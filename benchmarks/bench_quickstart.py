"""Benchmark the README's main job: `masr prep && masr train --model amasr && masr export &&
masr score examples/playlists.csv`, as a newcomer runs it (no flags, the embedded data).

    python benchmarks/bench_quickstart.py [--cpu 0-1] [--json quickstart.json] [--keep DIR]

Each command runs in a fresh temporary folder as its own child process, pinned with taskset
to --cpu (default: every core of this process), with masr's automatic thread choice. Recorded
per command: wall and CPU seconds and peak RSS (``bench_mpd.run``); for the training, each run's
seconds from run.json (training and validation apart) and AMASR's validation hit@10 under both
protocols, the quality the speed must not cost (issue 13: at most 90 s end to end on 2 cores,
install excluded). Figures go to bench-out/<json>.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from bench_mpd import run

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"


def run_seconds(run_dir: Path) -> dict:
    """Training and validation seconds of one run, from its run.json."""
    info = json.loads((run_dir / "run.json").read_text())
    history = info.get("history", [])
    return {
        "epochs": len(history),
        "best_epoch": info.get("best", {}).get("epoch"),
        "train_s": round(sum(h.get("train_seconds", 0.0) for h in history), 1),
        "valid_s": round(sum(h.get("valid_seconds", 0.0) for h in history), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    parser.add_argument("--cpu", default=default_cpus, help="taskset core list")
    parser.add_argument("--json", default="quickstart.json", help="file name in bench-out/")
    parser.add_argument(
        "--keep", type=Path, help="work in this new folder and keep it (data/, runs/ ...), e.g. "
        "to evaluate baselines trained on the same data beside the AMASR it trained"
    )
    args = parser.parse_args()
    threads = len(args.cpu.split(",")) if "-" not in args.cpu else 2
    if args.keep is not None:
        args.keep.mkdir(parents=True)  # a new folder: the commands' default paths start empty
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="masr-quickstart-"))
    try:
        cwd = os.getcwd()
        os.chdir(work)  # the README's commands use their default paths: data/, runs/, exported/
        playlists = str(ROOT / "examples" / "playlists.csv")
        steps = {
            "prep": ["prep"],
            "train": ["train", "--model", "amasr"],
            "export": ["export"],
            "score": ["score", playlists, "--out", "recs.csv"],
        }
        result: dict = {
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus_pinned": args.cpu, "cpu_count": os.cpu_count(),
                        "load_average_before": os.getloadavg()},
            "steps": {},
        }
        for name, cmd in steps.items():
            result["steps"][name] = run(cmd, args.cpu, threads)
            print(json.dumps({name: result["steps"][name]}), file=sys.stderr, flush=True)
        result["total_wall_s"] = round(sum(s["wall_s"] for s in result["steps"].values()), 1)
        runs = work / "runs"
        parts = [r for r in ("mdr", "amdr", "mass", "amass") if (runs / r).is_dir()]
        result["runs"] = {r: run_seconds(runs / r) for r in parts}
        best = json.loads((runs / "amasr" / "run.json").read_text()).get("best", {})
        result["amasr_valid_hit10"] = {
            "sampled": best.get("valid", {}).get("hit@10"),
            "full": best.get("valid_full", {}).get("hit@10"),
        }
        os.chdir(cwd)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    OUT.mkdir(exist_ok=True)
    (OUT / args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("total_wall_s", "runs", "amasr_valid_hit10")}),
          file=sys.stderr)


if __name__ == "__main__":
    main()
