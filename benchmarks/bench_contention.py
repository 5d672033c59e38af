"""Benchmark training on a machine that gets busy after the start: `masr train --model mass`
on the embedded data, on two cores, while other work takes the second one.

    python benchmarks/bench_contention.py [--cpu 0,1] [--epochs 3] [--delay 3] [--spin 600]

Three runs, each a fresh child process pinned to --cpu: "quiet" (nothing else runs, automatic
threads), "auto" (automatic threads: the start finds the machine quiet; --delay seconds later
a busy loop starts on the last core of --cpu for --spin seconds) and "fixed" (the same, with
`--threads` = the cores: the count the start picks on a quiet machine, kept to the end as it
was before masr.system.ThreadGovernor). Recorded per run: wall seconds, each epoch's seconds
and the stderr lines on threads; the losses must match between runs (the thread count does
not change what is computed). Figures go to bench-out/<json>.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
EPOCH = re.compile(r"epoch (\d+)/\d+\s+loss (\S+).*\(([\d.]+) s\)")


def masr(args: list[str], cpus: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    return subprocess.run(
        ["taskset", "-c", cpus, sys.executable, "-m", "masr_cli.main", *args],
        capture_output=True, text=True, env=env, check=False,
    )


def one_run(mode: str, data: Path, work: Path, args: argparse.Namespace) -> dict:
    cores = args.cpu.split(",")
    cmd = ["train", "--model", "mass", "--data", str(data), "--runs", str(work / mode),
           "--epochs", str(args.epochs)]
    if mode == "fixed":
        cmd += ["--threads", str(len(cores))]
    spin = None
    if mode != "quiet":  # the other work: a busy loop on the last core, from --delay seconds in
        loop = (f"import time\ntime.sleep({args.delay})\nend = time.monotonic() + {args.spin}\n"
                "while time.monotonic() < end: pass")
        spin = subprocess.Popen(["taskset", "-c", cores[-1], sys.executable, "-c", loop])
    start = time.perf_counter()
    done = masr(cmd, args.cpu)
    wall = time.perf_counter() - start
    if spin is not None:
        spin.kill()
        spin.wait()
    if done.returncode != 0:
        raise SystemExit(f"{mode}: masr train failed: {done.stderr[-2000:]}")
    epochs = [m.groups() for m in map(EPOCH.search, done.stderr.splitlines()) if m]
    result = {
        "wall_s": round(wall, 2),
        "epoch_s": [float(s) for _, _, s in epochs],
        "losses": [loss for _, loss, _ in epochs],
        "thread_lines": [ln.strip() for ln in done.stderr.splitlines() if "thread" in ln.lower()],
    }
    print(f"{mode}: {wall:.1f} s, epochs {result['epoch_s']} s; "
          + " | ".join(result["thread_lines"]), file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    parser.add_argument("--cpu", default=default_cpus, help="taskset core list (comma-separated)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--delay", type=float, default=3.0, help="seconds before the other work")
    parser.add_argument("--spin", type=float, default=600.0, help="seconds the other work runs")
    parser.add_argument("--json", default="contention.json", help="file name in bench-out/")
    args = parser.parse_args()
    if len(args.cpu.split(",")) < 2:
        raise SystemExit("--cpu: give at least two cores (the last one gets busy)")
    with tempfile.TemporaryDirectory(prefix="masr-contention-") as tmp:
        work = Path(tmp)
        prepared = masr(["prep", "--out", str(work / "data")], args.cpu)
        if prepared.returncode != 0:
            raise SystemExit(f"masr prep failed: {prepared.stderr[-2000:]}")
        runs = {mode: one_run(mode, work / "data", work, args)
                for mode in ("quiet", "auto", "fixed")}
    losses = {tuple(r["losses"]) for r in runs.values()}
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus_pinned": args.cpu, "cpu_count": os.cpu_count()},
        "setup": {"epochs": args.epochs, "delay_s": args.delay, "spin_s": args.spin},
        "runs": runs,
        "same_losses": len(losses) == 1,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"same losses in every run: {report['same_losses']}; wrote bench-out/{args.json}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
