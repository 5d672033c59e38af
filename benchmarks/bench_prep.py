"""Benchmark `masr prep`: wall time on AOTM-2011 and peak memory on a 30M-row synthetic input.

    python benchmarks/bench_prep.py [--repeat 3] [--big-rows 30000000] [--skip-big] [--skip-aotm]

Targets (issue 2): `masr prep aotm2011.csv.gz` (1.03M rows) in <= 5 s wall on 2 cores, and a
30M-row input with peak RSS <= 6 GB. Each run is a fresh `masr prep` process, measured from the
outside (wall clock, and the child's own peak RSS from os.wait4). The 30M-row CSV is generated
once into bench-out/ by the project's synthetic generator (not timed) and reused while its
settings match. Figures go to bench-out/prep.json and a summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "aotm2011.csv.gz"
ROWS_PER_USER = 67.4  # the generator's average rows per user at default settings


def run_prep(args: list[str]) -> dict:
    """One `masr prep` in a child process: wall seconds and the child's peak RSS."""
    cmd = [sys.executable, "-m", "masr_cli.main", "prep", *args]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"masr prep failed ({code}): {stderr.decode(errors='replace')[-2000:]}")
    return {
        "wall_s": round(wall, 3),
        "user_s": round(usage.ru_utime, 3),
        "sys_s": round(usage.ru_stime, 3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
    }


def bench_aotm(data: Path, repeat: int) -> dict:
    runs = [run_prep([str(data), "--out", str(OUT / "prep-aotm")]) for _ in range(repeat)]
    walls = [r["wall_s"] for r in runs]
    manifest = json.loads((OUT / "prep-aotm" / "manifest.json").read_text())
    return {
        "input": str(data),
        "rows": manifest["input"]["rows"],
        "runs": runs,
        "wall_s_min": min(walls),
        "wall_s_median": statistics.median(walls),
        "peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
        "target_wall_s": 5.0,
        "stats": manifest["stats"],
    }


def make_big_input(rows: int) -> Path:
    """A synthetic CSV of about ``rows`` rows (ids and positions only), generated once."""
    sys.path.insert(0, str(ROOT / "src"))
    from masr.synth import SynthConfig, write_synthetic

    users = max(1, round(rows / ROWS_PER_USER))
    path = OUT / f"synth-{users}u.csv"
    if not path.exists():
        print(
            f"generating {path} ({users:,} users, ~{rows:,} rows)...", file=sys.stderr, flush=True
        )
        start = time.perf_counter()
        n = write_synthetic(path, SynthConfig(users=users, seed=0, names=False))
        print(f"  {n:,} rows in {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    return path


def bench_big(rows: int) -> dict:
    path = make_big_input(rows)
    result = run_prep([str(path), "--out", str(OUT / "prep-big")])
    manifest = json.loads((OUT / "prep-big" / "manifest.json").read_text())
    return {
        "input": str(path),
        "input_mb": round(path.stat().st_size / 2**20, 1),
        "rows": manifest["input"]["rows"],
        **result,
        "target_peak_rss_mb": 6 * 1024,
        "stats": manifest["stats"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("MASR_BENCH_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-rows", type=int, default=30_000_000)
    ap.add_argument("--skip-aotm", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    args, _ = ap.parse_known_args()
    OUT.mkdir(exist_ok=True)
    previous = OUT / "prep.json"
    # a part skipped this time keeps its last figures
    result: dict = json.loads(previous.read_text()) if previous.exists() else {}
    result["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }
    if not args.skip_aotm:
        if not args.data.exists():
            print(f"skipping AOTM: {args.data} not found (set MASR_BENCH_DATA)", file=sys.stderr)
        else:
            result["aotm"] = a = bench_aotm(args.data, args.repeat)
            print(
                f"AOTM {a['rows']:,} rows: wall min {a['wall_s_min']:.2f}s median "
                f"{a['wall_s_median']:.2f}s (target <= 5 s), "
                f"peak RSS {a['peak_rss_mb_max']:.0f} MB",
                file=sys.stderr,
            )
    if not args.skip_big:
        result["big"] = b = bench_big(args.big_rows)
        print(
            f"synthetic {b['rows']:,} rows: wall {b['wall_s']:.1f}s, peak RSS "
            f"{b['peak_rss_mb']:.0f} MB (target <= 6144 MB)",
            file=sys.stderr,
        )
    result["machine"]["load_avg_at_end"] = os.getloadavg()
    (OUT / "prep.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
