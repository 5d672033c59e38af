"""Benchmark `masr export` and `masr score` of an AMASR model at Million-Playlist-Dataset size.

    python benchmarks/bench_mpd_export.py [--data DIR | --playlists 1000000] [--sample 64]
                                          [--candidates 1000] [--bulk 2000 8000] [--cpu 0]
                                          [--json mpd-export.json]

DIR is MPD-shaped prepared data; without --data the benchmark makes it first (`masr synth
--playlists P --songs 2.26P`, then `masr prep --user-col playlist_id`, as `bench_mpd.py` does;
about 5 minutes and 7 GB of memory at MPD's 1M playlists on one core).
No GPU or CPU can train an AMASR chain at that size inside a benchmark, so the runs hold
**random weights** (seeded; embeddings, metrics, biases and query layers all perturbed so that
scores are spread out), written as `masr train` writes them (runs/amdr, runs/amass: best.pt +
run.json). What is measured is the export path, not the quality:

1. `masr export` (exact graph): wall and CPU seconds, peak RSS, the sizes of the `.onnx` and of
   `masr.onnx.weights` (ONNX external data past protobuf's 2 GB);
2. `masr score` of --sample known playlists (their training songs as input) with that export,
   and the same playlists' top-10 from the PyTorch MASR of the same checkpoints
   (``MASR.full_distance``, members excluded): the share of rows whose top-10 lists are
   identical, in order;
3. `masr export --candidates N` (two-stage graph) and `masr score` with it on the same sample:
   speed-up and the overlap of its top-10 with the exact one;
4. two-stage `masr score` of --bulk playlists (each size a fresh process): throughput and peak
   RSS, to show that memory does not grow with the input (the input streams in batches).

Every masr command is a child process pinned with taskset (one core by default), its peak RSS
from os.wait4 through a small shim (``bench_mpd.run``: a child of this big process would report
this process's peak). Figures go to bench-out/<json>.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch
from bench_mpd import run  # a pinned masr child, its peak RSS measured apart from ours

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"


def make_random_runs(data_dir: Path, runs: Path, dim: int, seed: int) -> dict:
    """runs/amdr and runs/amass with seeded random weights at the data's sizes."""
    from masr.checkpoint import save_checkpoint
    from masr.dataset import load_prepared
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    data = load_prepared(data_dir)
    sizes = (data.n_users, data.n_playlists, data.n_songs)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    parts = {"amdr": MDR(MDRConfig(dim=dim), *sizes), "amass": MASS(MASSConfig(dim=dim), *sizes)}
    for run_name, model in parts.items():
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "metric" in name:
                    p.uniform_(0.5, 1.5, generator=gen)
                elif "bias" in name:
                    p.normal_(0.0, 0.1, generator=gen)
                elif "query" in name:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.05)
                else:  # embedding tables: spread out so that distances differ
                    p.normal_(0.0, 0.3, generator=gen)
        run_dir = runs / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(run_dir / "best.pt", model, data_fingerprint=data.fingerprint, epoch=1)
        info = {"run": run_name, "data": {"path": str(data_dir), "fingerprint": data.fingerprint}}
        (run_dir / "run.json").write_text(json.dumps(info))
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
    return {"users": sizes[0], "playlists": sizes[1], "songs": sizes[2], "dim": dim,
            "parameters": params}


def write_playlists(data_dir: Path, rows: np.ndarray, path: Path) -> None:
    """The training songs of prepared playlists ``rows`` as a `masr score` input (original ids)."""
    wanted = pl.DataFrame({"playlist_idx": rows.astype(np.int32)})
    train = pl.scan_parquet(data_dir / "train.parquet").join(wanted.lazy(), on="playlist_idx")
    playlists = pl.scan_parquet(data_dir / "playlists.parquet")
    users = pl.scan_parquet(data_dir / "users.parquet")
    songs = pl.scan_parquet(data_dir / "songs.parquet").select("song_idx", "track_id")
    out = (
        train.join(playlists, on="playlist_idx")
        .join(users, on="user_idx")
        .join(songs, on="song_idx")
        .sort("playlist_idx", "position")
        .select("user_id", "playlist_id", "track_id")
        .collect()
    )
    out.write_csv(path)


def read_top(path: Path) -> dict[str, list[str]]:
    recs = pl.read_csv(path, schema_overrides={"playlist_id": pl.Utf8, "track_id": pl.Utf8})
    grouped = recs.sort("playlist_id", "rank").group_by("playlist_id", maintain_order=True)
    return {p: list(t) for p, t in grouped.agg("track_id").iter_rows()}


def torch_top(runs: Path, data_dir: Path, rows: np.ndarray, k: int) -> dict[str, list[str]]:
    """Top-k of the PyTorch MASR of the same checkpoints (members excluded), original ids."""
    from masr.checkpoint import load_model
    from masr.dataset import load_prepared
    from masr.models.base import Batch
    from masr.models.masr import MASR

    data = load_prepared(data_dir)
    mdr, _ = load_model(runs / "amdr" / "best.pt")
    mass, _ = load_model(runs / "amass" / "best.pt")
    model = MASR.from_parts(mdr, mass, alpha=0.5, parts=("amdr", "amass")).eval()
    pid = pl.read_parquet(data_dir / "playlists.parquet").sort("playlist_idx")["playlist_id"]
    tid = pl.read_parquet(data_dir / "songs.parquet").sort("song_idx")["track_id"]
    out: dict[str, list[str]] = {}
    for start in range(0, len(rows), 16):
        chunk = rows[start : start + 16]
        lengths = np.diff(data.indptr)[chunk]
        members = np.full((len(chunk), lengths.max()), -1)
        for i, p in enumerate(chunk):
            members[i, : lengths[i]] = data.playlist_songs(p)
        m = torch.from_numpy(members)
        users = torch.from_numpy(data.playlist_user[chunk].astype(np.int64))
        batch = Batch(users, torch.from_numpy(chunk.astype(np.int64)), m.clamp_min(0), m >= 0)
        with torch.no_grad():
            dist = model.full_distance(batch).double()
        dist[torch.arange(len(chunk))[:, None].expand_as(m)[m >= 0], m[m >= 0]] = float("inf")
        top = torch.topk(-dist, k).indices.numpy()
        for i, p in enumerate(chunk):
            out[pid[int(p)]] = [tid[int(s)] for s in top[i]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="MPD-shaped prepared data (else made)")
    parser.add_argument("--playlists", type=int, default=1_000_000, help="size made without --data")
    parser.add_argument("--work", type=Path, default=OUT / "mpd-export", help="runs and exports")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--sample", type=int, default=64, help="playlists checked against torch")
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--bulk", type=int, nargs="*", default=[2000, 8000])
    parser.add_argument("--cpu", default="0", help="taskset core list (default: core 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep runs and exports")
    parser.add_argument("--json", default="mpd-export.json", help="file name in bench-out/")
    args = parser.parse_args()
    threads = len(args.cpu.split(",")) if "-" not in args.cpu else 2
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result: dict = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus_pinned": args.cpu, "threads": threads, "cpu_count": os.cpu_count()},
        "data": str(args.data),
    }
    if args.data is None:
        src, args.data = work / "mpd.parquet", work / "data"
        songs = str(round(2.26 * args.playlists))
        cmd = ["synth", "--playlists", str(args.playlists), "--songs", songs, "--out", str(src)]
        result["synth"] = run(cmd, args.cpu, threads)
        cmd = ["prep", str(src), "--user-col", "playlist_id", "--out", str(args.data)]
        result["prep"] = run(cmd, args.cpu, threads)
        src.unlink()
        result["data"] = str(args.data)
    t0 = time.perf_counter()
    result["model"] = make_random_runs(args.data, work / "runs", args.dim, args.seed)
    result["model"]["make_runs_s"] = round(time.perf_counter() - t0, 1)
    log = lambda what: print(json.dumps({k: result[k] for k in what}), file=sys.stderr)  # noqa: E731
    log(["model"])

    exact, two = work / "exact" / "masr.onnx", work / "two" / "masr.onnx"
    runs = str(work / "runs")
    result["export_exact"] = run(["export", "--runs", runs, "--out", str(exact)], args.cpu, threads)
    result["export_exact"]["files_mb"] = {
        p.name: round(p.stat().st_size / 2**20, 1) for p in sorted(exact.parent.iterdir())
    }
    log(["export_exact"])
    cmd = ["export", "--runs", runs, "--out", str(two), "--candidates", str(args.candidates)]
    result["export_two_stage"] = run(cmd, args.cpu, threads)
    log(["export_two_stage"])

    n_playlists = result["model"]["playlists"]
    rng = np.random.default_rng(args.seed)
    sample = np.sort(rng.choice(n_playlists, args.sample, replace=False))
    sample_csv = work / "sample.csv"
    write_playlists(args.data, sample, sample_csv)
    scored = {}
    for name, model in (("exact", exact), ("two_stage", two)):
        recs = work / f"recs-{name}.csv"
        cmd = ["score", str(sample_csv), "--model", str(model), "--out", str(recs)]
        if name == "two_stage":
            cmd += ["--candidates", str(args.candidates)]
        scored[name] = run(cmd, args.cpu, threads)
        scored[name]["playlists_per_s"] = round(args.sample / scored[name]["wall_s"], 2)
    result["score_sample"] = scored
    log(["score_sample"])

    want = torch_top(work / "runs", args.data, sample, 10)
    got, got_two = read_top(work / "recs-exact.csv"), read_top(work / "recs-two_stage.csv")
    same = [got.get(p) == t for p, t in want.items()]
    overlap = [len(set(got_two.get(p, [])) & set(got[p])) / 10 for p in got]
    result["parity"] = {
        "playlists": len(want),
        "identical_top10_share": float(np.mean(same)),
        "two_stage_top10_overlap_with_exact": round(float(np.mean(overlap)), 4),
    }
    log(["parity"])

    bulk = []
    for size in args.bulk:
        rows = np.sort(rng.choice(n_playlists, size, replace=False))
        csv = work / f"bulk-{size}.csv"
        write_playlists(args.data, rows, csv)
        cmd = ["score", str(csv), "--model", str(two), "--candidates", str(args.candidates),
               "--out", str(work / f"bulk-{size}-recs.csv")]
        one = {"playlists": size, **run(cmd, args.cpu, threads)}
        one["playlists_per_s"] = round(size / one["wall_s"], 1)
        bulk.append(one)
        print(json.dumps(one), file=sys.stderr)
    result["score_bulk_two_stage"] = bulk
    OUT.mkdir(exist_ok=True)
    (OUT / args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
