"""Benchmark two-stage scoring (`masr export --candidates N`) against exact AMASR scoring on an
AOTM-sized model: the overlap of the two top-10s and the speed-up.

    python benchmarks/bench_candidates.py [--playlists 256] [--candidates 200,1000] [--cores 1]

Model: MDR + MASS (α = 0.5) at AOTM-2011's sizes (14,066 users, 81,591 playlists, 64,077 songs,
d = 64) with random weights, as `bench_score.py` builds it. Playlists: all the playlists of
randomly drawn users of the real file (`../shared/data/aotm2011.csv.gz`, read in place; set
`MASR_BENCH_DATA`), else synthetic ones of AOTM's shape. Both graphs are scored by
`masr.score.Engine` as `masr score` runs them (one worker per pinned core, batches of 16); the
two-stage graph once per N (its `candidates` input, as `masr score --candidates` feeds it).

Overlap = mean over playlists of |two-stage top-10 ∩ exact top-10| / 10. The second stage is
exact on the candidates, so this is also the share of the exact top-10 that MDR's first stage
proposes. With random weights MDR and MASS are unrelated, so this overlap is a floor: with
trained parts, which rank alike, it is higher (measure with trained runs: masr export
--candidates N, then masr score against the exact export). Speed does not depend on training.
Figures go to bench-out/candidates.json, a summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_score import (  # noqa: E402  (a sibling script, not a package)
    AOTM_SIZES,
    DEFAULT_DATA,
    DIM,
    OUT,
    ROOT,
    build_models,
    describe,
    log,
    machine_facts,
    playlists_from_aotm,
    synthetic_playlists,
)


def timed(engine, plays: dict, k: int, repeat: int) -> tuple[float, float, np.ndarray]:
    """Best of ``repeat``: (wall s, CPU s, songs) of Engine.recommend over all the playlists."""
    users, playlists, members = plays["users"], plays["playlists"], plays["members"]
    engine.recommend(users[:8], playlists[:8], members[:8], k)  # warm-up
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        songs, _ = engine.recommend(users, playlists, members, k)
        best = min(best, (time.perf_counter() - start, time.process_time() - cpu))
    return best[0], best[1], songs


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Mean share of each row of ``b`` found in the same row of ``a``."""
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a, b, strict=True)]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("MASR_BENCH_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--playlists", type=int, default=256)
    ap.add_argument("--candidates", default="200,1000", help="comma list of N")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--cores", type=int, default=1, help="pin the process to this many CPUs")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    if hasattr(os, "sched_setaffinity") and args.cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ns = [int(n) for n in args.candidates.split(",")]

    import onnx

    from masr.export import build_graph, mass_weights, mdr_weights
    from masr.score import Engine

    sizes = dict(AOTM_SIZES)
    if args.data.exists():
        log(f"AOTM sample: all playlists of random users of {args.data}, ~{args.playlists}")
        plays, source = playlists_from_aotm(args.data, args.playlists, sizes), "aotm_sample"
    else:
        log(f"{args.data} not found: synthetic playlists of AOTM's shape instead")
        plays, source = synthetic_playlists(args.playlists, sizes), "aotm_shape"
    model = build_models(sizes)
    parts = (mdr_weights(model.mdr), mass_weights(model.mass))
    result: dict = {
        "machine": machine_facts(cores),
        "model": {**sizes, "dim": DIM, "alpha": 0.5, "weights": "random"},
        "workload": {"source": source, **describe(plays)},
        "k": args.k,
    }
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for name, n in (("exact", None), ("two_stage", max(ns))):
            path = Path(tmp) / f"{name}.onnx"
            onnx.save_model(build_graph(*parts, 0.5, candidates=n, **sizes), path)
            engines[name] = Engine(path, "cpu", batch_size=16)
        wall, cpu, exact = timed(engines["exact"], plays, args.k, args.repeat)
        n_plays = len(plays["users"])
        result["exact"] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                           "playlists_per_s": round(n_plays / wall, 1)}  # fmt: skip
        log(f"exact: {n_plays / wall:.1f} playlists/s ({wall:.2f} s wall, {cpu:.2f} s CPU)")
        result["two_stage"] = {}
        for n in ns:
            engine = engines["two_stage"]
            engine.candidates = n  # what masr score --candidates feeds
            wall_n, cpu_n, songs = timed(engine, plays, args.k, args.repeat)
            figures = {
                "wall_s": round(wall_n, 3),
                "cpu_s": round(cpu_n, 3),
                "playlists_per_s": round(n_plays / wall_n, 1),
                "speedup_wall": round(wall / wall_n, 2),
                "speedup_cpu": round(cpu / cpu_n, 2),
                "top10_overlap": round(overlap(songs, exact), 4),
            }
            result["two_stage"][str(n)] = figures
            log(f"N = {n}: {figures}")
        for engine in engines.values():
            engine.close()
    OUT.mkdir(exist_ok=True)
    (OUT / "candidates.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {OUT / 'candidates.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
