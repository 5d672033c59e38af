"""Benchmark training speed: seconds per training epoch of MDR and MASS on AOTM-2011.

    python benchmarks/bench_train.py [--models mdr,mass] [--batch-sizes 256,default]
                                     [--cores 2] [--max-seconds 120] [--skip-cuda]
                                     [--set dropout=0] [--dense-too] [--one-thread-too]
                                     [--recipes paper,fullrank] [--repeat 3]

--recipes times each `masr train --recipe` (masr.config.RECIPES: its loss, negatives, sampler
and model settings) in the same run, so their epochs compare on the same machine and load
(issue 11's target: the full-ranking recipe at most 2x the paper's epoch on a GPU).

Targets (issue 3): CPU (2 cores) MDR <= 4 s/epoch, MASS <= 30 s/epoch; GPU MDR <= 0.5 s,
MASS <= 2 s. The paper reports 173 s (MDR) and 375 s (MASS) per epoch on a GTX 1080 Ti.

The data is `masr prep` of ../shared/data/aotm2011.csv.gz (or $MASR_BENCH_DATA: a raw file, or a
folder `masr prep` wrote, used as it is), prepared once into bench-out/train-aotm/ and reused
while the input is unchanged. Each measurement is one
epoch of the real training loop (`masr.train.train_model`: sampling, forward, backward, lazy
Adam), validation excluded. On CPU the process is pinned to --cores cores with as many torch
threads (also 1 thread with --one-thread-too); an epoch still running after --max-seconds is
stopped and its time extrapolated from the steps done (marked "extrapolated"). --repeat N
times each configuration N times in turn (round-robin over the configurations, so a slow spell
of the machine touches all of them) and reports the median, with every figure kept: epochs on
a small shared CPU vary by 10-20% between identical runs. Figures go to bench-out/train.json
and a summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "aotm2011.csv.gz"
TARGETS = {("mdr", "cpu"): 4.0, ("mass", "cpu"): 30.0, ("mdr", "cuda"): 0.5, ("mass", "cuda"): 2.0}


class _Stop(Exception):
    """Raised from the progress hook when an epoch exceeds the time budget."""


def prepared(source: Path) -> Path:
    """``source`` itself when it is a prepared folder; else bench-out/train-aotm, (re)made when
    the input file changed."""
    from masr.prep import prepare

    if (source / "manifest.json").is_file():
        return source

    out = OUT / "train-aotm"
    stamp = f"{source.resolve()}:{source.stat().st_size}:{source.stat().st_mtime_ns}"
    stamp_file = OUT / "train-aotm.source"
    fresh = stamp_file.is_file() and stamp_file.read_text() == stamp
    if not fresh or not (out / "manifest.json").is_file():
        print(f"preparing {source} -> {out}", file=sys.stderr)
        prepare(source, out)
        stamp_file.write_text(stamp)
    return out


def one_epoch(
    model_name: str,
    data,
    device: str,
    batch_size: int,
    max_seconds: float,
    sparse: bool = True,
    settings: dict | None = None,
    recipe: str = "paper",
    compile: bool = False,
) -> dict:
    """Seconds of one training epoch (validation excluded); ``compile`` as `masr train
    --compile` (CPU: MASS's scores compiled, the compiling inside the timed epoch)."""
    import torch

    from masr.config import RunOptions, TrainConfig
    from masr.models import model_class
    from masr.train import TrainProgress, train_model

    torch.manual_seed(0)
    cls = model_class(model_name)
    fields = cls.config_class.__dataclass_fields__
    # the recipe's values as `masr train --recipe` gives them on this device
    options = RunOptions().with_recipe(recipe, set(), device)
    settings = {
        **{k: v for k, v in options.model.items() if k in fields and v is not None},
        **(settings or {}),
    }
    model = cls(cls.config_class(**settings), data.n_users, data.n_playlists, data.n_songs)
    steps_total = -(-len(data.train_song) // batch_size)

    class Clock(TrainProgress):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.done = 0

        def start(self, title: str, epochs: int, steps: int, first_epoch: int) -> None:
            if device == "cuda":
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def step(self, done: int, loss: float) -> None:  # called every 25 steps
            self.done = done
            if time.perf_counter() - self.t0 > max_seconds and done < steps_total:
                raise _Stop

    clock = Clock()
    config = TrainConfig(
        **{
            **options.train_for(model_name).to_dict(),  # the recipe's per-model values too
            "epochs": 1,
            "batch_size": batch_size,
            "sparse": sparse,
        }
    )
    try:
        result = train_model(
            model, data, config, device=device, progress=clock, compile=compile
        )
        seconds, extrapolated = result.history[0]["train_seconds"], False
    except _Stop:
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - clock.t0) / clock.done * steps_total
        extrapolated = True
    return {
        "model": model_name,
        "recipe": recipe,
        "compile": compile,
        "train": {k: v for k, v in config.to_dict().items() if k in ("loss", "neg", "neg_sampler")},
        "device": device,
        "batch_size": batch_size,
        "sparse": sparse,
        "settings": settings or {},
        "threads": torch.get_num_threads() if device == "cpu" else None,
        "steps_per_epoch": steps_total,
        "measured_steps": clock.done if extrapolated else steps_total,
        "seconds_per_epoch": round(seconds, 3),
        "extrapolated": extrapolated,
        "target_s": TARGETS.get((model_name, device)),
    }


def median_of(repeats: list[dict]) -> dict:
    """One configuration's result from its repeats: the median epoch (the lower middle one of
    an even count), with every repeat's seconds under "repeats"."""
    ordered = sorted(repeats, key=lambda r: r["seconds_per_epoch"])
    result = dict(ordered[(len(ordered) - 1) // 2])
    result["repeats"] = [r["seconds_per_epoch"] for r in repeats]
    result["extrapolated"] = any(r["extrapolated"] for r in repeats)
    return result


def implicit_epoch(data, threads: int) -> dict | None:
    """Seconds of one BPR epoch of `implicit` (the yardstick of issue 13; installed by the bench
    session only, never a masr dependency) on the same training rows: playlist x song, d = 64,
    its own sampling (one negative per row). None when `implicit` is not installed."""
    try:
        from implicit.cpu.bpr import BayesianPersonalizedRanking
    except ImportError:
        return None
    import numpy as np
    from scipy.sparse import csr_matrix

    rows = data.train_playlist
    matrix = csr_matrix(
        (np.ones(len(rows), dtype=np.float32), (rows, data.train_song)),
        shape=(data.n_playlists, data.n_songs),
    )
    model = BayesianPersonalizedRanking(
        factors=63, iterations=1, num_threads=threads, random_state=0
    )  # implicit adds a bias column: 63 + 1 = 64
    model.fit(matrix, show_progress=False)  # warm-up (allocations)
    t0 = time.perf_counter()
    model.fit(matrix, show_progress=False)
    return {"model": "implicit-bpr", "threads": threads,
            "seconds_per_epoch": round(time.perf_counter() - t0, 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mdr,mass")
    parser.add_argument(
        "--batch-sizes", default="256,default", help="comma list; 'default' = TrainConfig's"
    )
    parser.add_argument("--cores", type=int, default=2, help="CPU cores to pin to (0: all)")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--skip-cuda", action="store_true")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--one-thread-too", action="store_true", help="CPU: also 1 thread")
    parser.add_argument(
        "--compile", action="store_true", help="as masr train's default: MASS's scores compiled"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a model setting, as `masr train --set` (e.g. dropout=0); repeatable",
    )
    parser.add_argument(
        "--dense-too",
        action="store_true",
        help="also time dense embedding gradients + plain Adam (default: row-sparse + lazy Adam)",
    )
    parser.add_argument(
        "--no-huge-pages",
        action="store_true",
        help="leave PyTorch's CPU tensors on 4 KB pages (default: as the CLI, "
        "masr.system.tensor_huge_pages)",
    )
    parser.add_argument(
        "--no-keep-heap",
        action="store_true",
        help="leave glibc's default for large blocks (default: as the CLI, "
        "masr.system.keep_freed_heap)",
    )
    parser.add_argument(
        "--recipes",
        default="paper,fullrank",
        help="comma list of masr train recipes to time side by side",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time each configuration this many times, round-robin; report the median",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")

    source = Path(os.environ.get("MASR_BENCH_DATA", DEFAULT_DATA))
    if not source.is_file() and not (source / "manifest.json").is_file():
        print(f"bench_train: no data at {source} (set MASR_BENCH_DATA)", file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    from masr.system import HEAP_SWITCH, THP_SWITCH, keep_freed_heap, tensor_huge_pages

    if args.no_huge_pages:
        os.environ[THP_SWITCH] = "0"
    pages = "huge" if tensor_huge_pages() else "4 KB"  # before PyTorch loads
    if args.no_keep_heap:
        os.environ[HEAP_SWITCH] = "0"
    heap = "kept in the heap" if keep_freed_heap() else "glibc's default"
    print(f"bench_train: CPU tensors on {pages} pages; large blocks {heap}", file=sys.stderr)
    if args.cores and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > args.cores:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    import torch

    from masr.config import TrainConfig
    from masr.dataset import load_prepared
    from masr.models import parse_settings

    data = load_prepared(prepared(source))
    default_bs = TrainConfig().batch_size
    sizes = sorted(
        {default_bs if b == "default" else int(b) for b in args.batch_sizes.split(",") if b}
    )
    models = [m for m in args.models.split(",") if m]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    results = []
    plans: list[tuple[str, int | None]] = []
    if not args.skip_cpu:
        plans += [("cpu", cores)] + ([("cpu", 1)] if args.one_thread_too else [])
    if torch.cuda.is_available() and not args.skip_cuda:
        plans.append(("cuda", None))
    for device, threads in plans:
        if threads:
            torch.set_num_threads(threads)
        for model in models:
            runs = [
                (b, s, r)
                for r in args.recipes.split(",")
                for b in sizes
                for s in (True, False)[: 1 + args.dense_too]
            ]
            timed: dict[tuple, list[dict]] = {}
            for _ in range(args.repeat):  # round-robin: each repeat times every configuration
                for bs, sparse, recipe in runs:
                    settings = parse_settings([model], args.set)
                    timed.setdefault((bs, sparse, recipe), []).append(
                        one_epoch(
                            model, data, device, bs, args.max_seconds, sparse, settings, recipe,
                            args.compile,
                        )
                    )
            for (bs, sparse, recipe), repeats in timed.items():
                r = median_of(repeats)
                r["tensor_pages"], r["large_blocks"] = pages, heap
                results.append(r)
                mark = " (extrapolated)" if r["extrapolated"] else ""
                spread = (
                    f" (median of {len(repeats)}: {min(r['repeats']):.2f}-{max(r['repeats']):.2f})"
                    if len(repeats) > 1 else ""
                )
                print(
                    f"{model:5s} {device:4s} {recipe:8s} threads={r['threads']} batch={bs:6d} "
                    f"{'sparse' if sparse else 'dense '} {' '.join(args.set)}: "
                    f"{r['seconds_per_epoch']:8.2f} s/epoch{mark}{spread}  target {r['target_s']}",
                    file=sys.stderr,
                )
    yardstick = implicit_epoch(data, cores or 1) if not args.skip_cpu else None
    if yardstick is not None:
        for r in results:
            if r["device"] == "cpu" and yardstick["seconds_per_epoch"] > 0:
                r["ratio_to_implicit"] = round(
                    r["seconds_per_epoch"] / yardstick["seconds_per_epoch"], 1
                )
        print(
            f"implicit BPR, {yardstick['threads']} threads: "
            f"{yardstick['seconds_per_epoch']:.2f} s/epoch; masr CPU epochs are "
            + ", ".join(f"{r['model']} {r.get('ratio_to_implicit')}x" for r in results
                        if r["device"] == "cpu"),
            file=sys.stderr,
        )
    report = {
        "benchmark": "train",
        "implicit": yardstick,
        "what": "seconds per training epoch (validation excluded) per recipe",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "pinned_cores": cores,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "data": {
            "source": str(source),
            "train_rows": int(len(data.train_song)),
            "playlists": data.n_playlists,
            "songs": data.n_songs,
            "users": data.n_users,
        },
        "train_config": TrainConfig().to_dict(),
        "results": results,
    }
    (OUT / "train.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT / 'train.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
