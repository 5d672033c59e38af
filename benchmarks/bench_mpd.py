"""Benchmark `masr synth --playlists` + `masr prep` at Million-Playlist-Dataset shape.

    python benchmarks/bench_mpd.py [--playlists 15000 75000 150000] [--cpu 1] [--keep]
                                    [--json mpd.json]

For each size: `masr synth --playlists P --songs 2.26P --out mpd-P.parquet`, then
`masr prep mpd-P.parquet --user-col playlist_id` (MPD has no users: each playlist is its own),
each a fresh child process pinned to the cores of --cpu (taskset) with POLARS_MAX_THREADS and
the BLAS/OpenMP pools set to that many threads. Wall seconds, CPU seconds and the child's peak
RSS (os.wait4) go to bench-out/mpd.json, with a linear fit of time and memory against rows and
the extrapolation to MPD's 66.3M rows. Inputs are deleted after each size unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
MPD_ROWS = 66_346_428  # the Million Playlist Dataset's rows


#: A tiny parent for the measured command. Linux carries a process's peak RSS across fork and
#: exec, so a child started straight from a big benchmark process would report the benchmark's
#: own peak; started from this shim (a few MB) it reports its own. Prints the child's rusage.
SHIM = (
    "import json, os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "cpu = usage.ru_utime + usage.ru_stime\n"
    "print(json.dumps({'cpu_s': cpu, 'maxrss_kib': usage.ru_maxrss}), file=sys.stderr)\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run(args: list[str], cpus: str, threads: int) -> dict:
    """One masr command in a pinned child process: wall seconds, CPU seconds, peak RSS."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    for var in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    cmd = ["taskset", "-c", cpus, sys.executable, "-m", "masr_cli.main", *args]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", SHIM, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=env, check=False,
    )
    wall = time.perf_counter() - start
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {stderr[-2000:]}")
    usage = json.loads(stderr.strip().splitlines()[-1])
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage["cpu_s"], 2),
        "peak_rss_mb": round(usage["maxrss_kib"] / 1024, 1),  # Linux: KiB
    }


def one_size(playlists: int, cpus: str, threads: int, keep: bool) -> dict:
    src = OUT / f"mpd-{playlists}.parquet"
    data = OUT / f"mpd-{playlists}-prep"
    songs = round(2.26 * playlists)
    synth = run(
        ["synth", "--playlists", str(playlists), "--songs", str(songs), "--out", str(src)],
        cpus,
        threads,
    )
    prep = run(["prep", str(src), "--user-col", "playlist_id", "--out", str(data)], cpus, threads)
    manifest = json.loads((data / "manifest.json").read_text())
    row = {
        "playlists": playlists,
        "songs": songs,
        "rows": manifest["input"]["rows"],
        "input_mb": round(src.stat().st_size / 2**20, 1),
        "synth": synth,
        "prep": prep,
        "stats": manifest["stats"],
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    if not keep:
        src.unlink()
        shutil.rmtree(data)
    return row


def fit(rows: list[dict], step: str, key: str) -> dict:
    """Least-squares line of ``key`` against input rows, and its value at MPD's size."""
    x = np.array([r["rows"] for r in rows], dtype=float)
    y = np.array([r[step][key] for r in rows], dtype=float)
    slope, intercept = np.polyfit(x, y, 1) if len(x) > 1 else (y[0] / x[0], 0.0)
    return {
        "per_million_rows": round(slope * 1e6, 3),
        "intercept": round(intercept, 2),
        "at_mpd_rows": round(slope * MPD_ROWS + intercept, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--playlists", type=int, nargs="+", default=[15_000, 75_000, 150_000])
    parser.add_argument("--cpu", default="1", help="taskset core list (default: core 1)")
    parser.add_argument("--keep", action="store_true", help="keep the inputs and outputs")
    parser.add_argument("--json", default="mpd.json", help="file name in bench-out/")
    args = parser.parse_args()
    threads = len(args.cpu.split(",")) if "-" not in args.cpu else 2
    OUT.mkdir(exist_ok=True)
    rows = [one_size(p, args.cpu, threads, args.keep) for p in args.playlists]
    result = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus_pinned": args.cpu,
            "threads": threads,
            "cpu_count": os.cpu_count(),
        },
        "sizes": rows,
        "fits": {
            f"{step}_{key}": fit(rows, step, key)
            for step in ("synth", "prep")
            for key in ("wall_s", "cpu_s", "peak_rss_mb")
        },
    }
    (OUT / args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["fits"], indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
