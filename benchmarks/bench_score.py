"""Benchmark `masr score`: exact full-catalog AMASR top-10 on an AOTM-sized model, ONNX Runtime
against PyTorch eager on the same batches.

    python benchmarks/bench_score.py [--playlists 1024] [--cores 2] [--batch-size 32]
        [--chunk 256] [--device cpu] [--torch-playlists 256] [--torch-device cpu[,cuda]]
        [--skip-torch]

Model: MDR + MASS (α = 0.5) with the sizes of AOTM-2011 as `masr prep` makes it (14,066 users,
81,591 playlists, 64,077 songs, d = 64) and random weights: speed does not depend on training.
The process is pinned to --cores CPUs (the issue's target is for 2 cores). Workloads:
* aotm_sample: all the playlists of randomly drawn AOTM users until there are --playlists (a
  whole export scored at once has ~5.8 playlists per user), their songs mapped to song indices
  by popularity rank (songs outside the 64,077 most frequent dropped); synthetic playlists of
  the same shape when the file is missing;
* members_12: the issue's setting, 12 members per playlist, AOTM's playlists per user.
Each is scored by ONNX Runtime as `masr score` runs it (masr.score.Engine: one single-threaded
call per core side by side), with its ids and again as new playlists of new users (fold-in);
playlists per second (wall) and per CPU-second (load-independent). Then, on the first
--torch-playlists playlists, ONNX Runtime and PyTorch eager (MASR.full_distance, the models'
GEMM form, + member exclusion + top-k, --cores threads) on the same batches, with the agreement
of their top-K (--torch-device cuda: PyTorch on the GPU too; with --device cuda, ONNX Runtime's
CPU provider is also run on those playlists, for parity across providers). Targets (issue 4):
>= 200 playlists/s on 2 CPU cores with ONNX Runtime; ONNX Runtime >= 1.0x PyTorch. Figures go
to bench-out/score.json, a summary to stderr.

    python benchmarks/bench_score.py --quality-runs RUNS --quality-data DATA [--quality-cases N]

Quality instead (a trained model is needed): the test playlists' training songs are written as a
CSV and scored through `masr score` (the CLI, in a child process) with their real ids, with new
playlist ids, and with new playlist and user ids; hit@10 / ndcg@10 of the held-out test song
from the CSV, against the full-ranking hit@10 of `masr evaluate` (masr.evaluate.full_ranks) on
the same cases. New users are tried both ways (the MDR user term from the playlist's songs, or
dropped) and, in PyTorch, from all of that user's songs. Figures go to
bench-out/score_quality.json (--quality-name).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "aotm2011.csv.gz"
#: AOTM-2011 after `masr prep` with default settings.
AOTM_SIZES = {"n_users": 14_066, "n_playlists": 81_591, "n_songs": 64_077}
DIM = 64


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def playlists_from_aotm(
    path: Path, n: int, sizes: dict[str, int], seed: int = 0
) -> dict[str, np.ndarray]:
    """All playlists of randomly drawn users until there are ``n`` (as when a whole export is
    scored: ~5.8 playlists per user), in file order; user / playlist indices by first
    appearance, member songs by popularity rank (only the ``n_songs`` most frequent tracks)."""
    import polars as pl

    rows = pl.read_csv(
        path, schema_overrides={c: pl.String for c in ("user_id", "playlist_id", "track_id")}
    ).select("user_id", "playlist_id", "track_id")
    popular = (
        rows.group_by("track_id")
        .len()
        .sort(["len", "track_id"], descending=[True, False])
        .head(sizes["n_songs"])
        .with_row_index("song")
    )
    owners = rows.unique("playlist_id", keep="first", maintain_order=True)
    per_user = owners.group_by("user_id", maintain_order=True).len()
    shuffled = per_user.sample(fraction=1.0, shuffle=True, seed=seed)
    take = int(np.searchsorted(shuffled["len"].cum_sum().to_numpy(), n)) + 1
    chosen = shuffled["user_id"].head(take).implode()
    rows = rows.filter(pl.col("user_id").is_in(chosen))
    rows = rows.join(popular.select("track_id", "song"), on="track_id", how="left")
    grouped = rows.group_by("playlist_id", maintain_order=True).agg(
        pl.col("user_id").first(),
        pl.col("song").drop_nulls().unique(maintain_order=True).cast(pl.Int64).alias("members"),
    )
    users = grouped["user_id"].rank("dense").cast(pl.Int64).to_numpy() - 1
    return {
        "users": users % sizes["n_users"],
        "playlists": np.arange(grouped.height, dtype=np.int64) % sizes["n_playlists"],
        "members": [np.asarray(m, dtype=np.int64) for m in grouped["members"].to_list()],
    }


def synthetic_playlists(
    n: int, sizes: dict[str, int], members: int | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """AOTM's shape: ~5.8 playlists per user (geometric), and ``members`` songs per playlist
    (None: geometric with AOTM's mean of ~12.6)."""
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(n), rng.geometric(1 / 5.8, n))[:n] % sizes["n_users"]
    if members is None:
        lengths = np.clip(rng.geometric(1 / 12.6, n), 1, 54)
    else:
        lengths = np.full(n, members)
    members = [rng.choice(sizes["n_songs"], size=k, replace=False) for k in lengths]
    return {"users": users, "playlists": np.arange(n) % sizes["n_playlists"], "members": members}


def build_models(sizes: dict[str, int], seed: int = 0):
    import torch

    from masr.models.masr import MASR
    from masr.models.mass import MASS, MASSConfig
    from masr.models.mdr import MDR, MDRConfig

    torch.manual_seed(seed)
    mdr = MDR(MDRConfig(dim=DIM), **sizes)
    mass = MASS(MASSConfig(dim=DIM, query_init="default"), **sizes)
    with torch.no_grad():  # move the metrics and biases off their constant initial values
        for p in (*mdr.parameters(), *mass.parameters()):
            p.add_(0.05 * torch.randn_like(p))
    return MASR.from_parts(mdr, mass, alpha=0.5).eval()


def time_engine(
    engine, plays: dict, k: int, repeat: int = 1
) -> tuple[dict, np.ndarray, np.ndarray]:
    """Best of ``repeat`` runs of Engine.recommend: wall and process CPU seconds."""
    users, playlists, members = plays["users"], plays["playlists"], plays["members"]
    engine.recommend(users[:8], playlists[:8], members[:8], k)  # warm-up
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        songs, scores = engine.recommend(users, playlists, members, k)
        best = min(best, (time.perf_counter() - start, time.process_time() - cpu))
    wall, cpu = best
    n = len(users)
    figures = {
        "playlists": n,
        "seconds": round(wall, 3),
        "playlists_per_s": round(n / wall, 1),
        "cpu_seconds": round(cpu, 3),
        "playlists_per_cpu_s": round(n / cpu, 1),
    }
    return figures, songs, scores


def time_torch(model, plays: dict, k: int, batch_size: int, threads: int, device: str = "cpu"):
    """PyTorch eager on the batches masr.score forms: MASR.full_distance, members excluded,
    on ``device`` (the model is moved there; CUDA is synchronised before the clock stops)."""
    import torch

    from masr.models.base import Batch
    from masr.score import pad, plan_batches

    users, playlists, members = plays["users"], plays["playlists"], plays["members"]
    torch.set_num_threads(threads)
    dev = torch.device(device)
    model = model.to(dev)
    batches = plan_batches(users, np.array([len(m) for m in members]), batch_size)
    songs = np.zeros((len(users), k), dtype=np.int64)
    scores = np.zeros((len(users), k), dtype=np.float32)

    def run(rows):
        m = torch.from_numpy(pad(members, rows)).to(dev)
        mask = m >= 0
        batch = Batch(
            torch.from_numpy(users[rows]).to(dev),
            torch.from_numpy(playlists[rows]).to(dev),
            m.clamp_min(0),
            mask,
        )
        dist = model.full_distance(batch)  # (B, V), eq. 20
        row = torch.arange(len(rows), device=dev)[:, None].expand_as(m)
        dist[row[mask], m[mask]] = float("inf")
        best = torch.topk(dist, k, dim=1, largest=False)
        return best.indices.cpu().numpy(), -best.values.cpu().numpy()

    with torch.inference_mode():
        run(batches[0][:8])  # warm-up
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for rows in batches:
            songs[rows], scores[rows] = run(rows)  # .cpu() waits for the GPU
        seconds = time.perf_counter() - start
    model.to("cpu")
    figures = {
        "playlists": len(users),
        "seconds": round(seconds, 3),
        "playlists_per_s": round(len(users) / seconds, 1),
        "device": device,
        "threads": threads,
    }
    return figures, songs, scores


def subset(plays: dict, n: int) -> dict:
    """The first ``n`` playlists (whole users stay whole only approximately: fine for timing)."""
    return {key: value[:n] for key, value in plays.items()}


def describe(plays: dict) -> dict:
    lengths = np.array([len(m) for m in plays["members"]])
    return {
        "playlists": len(lengths),
        "users": int(len(np.unique(plays["users"]))),
        "mean_members": round(float(lengths.mean()), 2),
        "max_members": int(lengths.max()),
    }


def _hits(recs_path: Path, want: dict[str, str], k: int = 10) -> dict[str, float]:
    """hit@k and ndcg@k of each playlist's held-out track in a `masr score` CSV."""
    import polars as pl

    recs = pl.read_csv(recs_path, infer_schema=False)
    held = pl.DataFrame({"playlist_id": list(want), "track_id": list(want.values())})
    found = held.join(recs, on=["playlist_id", "track_id"], how="left")
    rank = found["rank"].cast(pl.Int64).fill_null(10**9).to_numpy()
    hit = rank <= k
    return {
        f"hit@{k}": round(float(hit.mean()), 4),
        f"ndcg@{k}": round(float(np.where(hit, 1 / np.log2(rank + 1.0), 0).mean()), 4),
    }


def quality(args) -> int:
    """`masr score` on the test playlists vs `masr evaluate` (module docstring)."""
    import subprocess

    import polars as pl
    import torch

    from masr.dataset import Cases, load_prepared
    from masr.evaluate import full_ranks, metrics_from_ranks
    from masr.export import ExportConfig, export_model, load_sources, resolve_sources
    from masr.models.masr import MASR
    from masr.sampling import TrainingIndex

    data = load_prepared(args.quality_data)
    rng = np.random.default_rng(0)
    pick = np.sort(rng.permutation(len(data.test))[: args.quality_cases])
    t = data.test
    cases = Cases(t.playlist[pick], t.user[pick], t.song[pick], t.negatives[pick])
    kind, sources = resolve_sources(args.quality_runs, args.quality_model)
    mdr, mass, fused_alpha, _, _ = load_sources(sources)
    if mdr is not None and mass is not None:
        alpha = fused_alpha if fused_alpha is not None else 0.5
        model = MASR.from_parts(mdr, mass, alpha=alpha).eval()
    else:  # one part: its own distance
        alpha, model = None, (mdr if mdr is not None else mass).eval()
    index = TrainingIndex.from_data(data, "cpu")
    start = time.perf_counter()
    reference = metrics_from_ranks(full_ranks(model, cases, index))
    result: dict = {
        "runs": str(args.quality_runs),
        "model": kind,
        "data": str(args.quality_data),
        "cases": len(cases),
        "evaluate_full": {"hit@10": reference["hit@10"], "ndcg@10": reference["ndcg@10"]},
        "evaluate_seconds": round(time.perf_counter() - start, 1),
    }
    log(f"{kind}: masr evaluate (full ranking), {len(cases)} test cases: {result['evaluate_full']}")

    songs = data.table("songs").sort("song_idx")["track_id"].to_numpy()
    users = data.table("users").sort("user_idx")["user_id"].to_numpy()
    plays = data.table("playlists").sort("playlist_idx")["playlist_id"].to_numpy()
    lengths = np.diff(data.indptr)[cases.playlist]
    rows_p = np.repeat(cases.playlist, lengths)
    rows_s = np.concatenate([data.playlist_songs(p) for p in cases.playlist])
    variants = {
        "known_ids": (users[data.playlist_user[rows_p]], plays[rows_p]),
        "new_playlist_ids": (
            users[data.playlist_user[rows_p]],
            np.char.add("new-", plays[rows_p].astype(str)),
        ),
        "new_playlist_and_user_ids": (
            np.char.add("new-", users[data.playlist_user[rows_p]].astype(str)),
            np.char.add("new-", plays[rows_p].astype(str)),
        ),
    }
    held_song = songs[cases.song]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for mode in ("members", "drop"):
            onnx_path = tmp / f"{mode}.onnx"
            export_model(
                args.quality_runs,
                onnx_path,
                ExportConfig(model=kind, alpha=alpha, unknown_user=mode, data=data.path),
            )
            for name, (user_col, playlist_col) in variants.items():
                if mode == "drop" and name != "new_playlist_and_user_ids":
                    continue  # the mode only matters for unknown users
                csv = tmp / f"{name}.csv"
                pl.DataFrame(
                    {"user_id": user_col, "playlist_id": playlist_col, "track_id": songs[rows_s]}
                ).write_csv(csv)
                out = tmp / f"{name}-{mode}.recs.csv"
                cmd = [sys.executable, "-m", "masr_cli.main", "score", str(csv), "--model"]
                cmd += [str(onnx_path), "--k", "10", "--out", str(out)]
                start = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"masr score failed: {proc.stderr[-2000:]}")
                seconds = time.perf_counter() - start
                ids = playlist_col[np.r_[0, np.cumsum(lengths)[:-1]]]  # one per case
                first = dict(zip(ids, held_song, strict=True))
                figures = {**_hits(out, first), "seconds": round(seconds, 1)}
                key = name if name != "new_playlist_and_user_ids" else f"{name} ({mode})"
                result[key] = figures
                log(f"  masr score, {key}: {figures}")

    # an unknown user's MDR vector from all of the user's songs (not in the graph): PyTorch
    if mdr is None:
        return _write_quality(result, reference, args.quality_name)
    with torch.no_grad():
        S = mdr.song_emb.weight
        owner = torch.as_tensor(data.playlist_user[cases.playlist])
        train_user = torch.as_tensor(data.train_user)
        user_sum = torch.zeros(data.n_users, S.shape[1]).index_add_(
            0, train_user, S[torch.as_tensor(data.train_song)]
        )
        user_count = torch.bincount(train_user, minlength=data.n_users).clamp_min(1)
        u_all = user_sum[owner] / user_count[owner, None]  # mean over all the user's songs
        members = [torch.as_tensor(data.playlist_songs(p)) for p in cases.playlist]
        width = max(len(m) for m in members)
        m = torch.stack(
            [torch.nn.functional.pad(x, (0, width - len(x)), value=-1) for x in members]
        )
        mask = m >= 0
        p_mean = (S[m.clamp_min(0)] * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        ranks = []
        for lo in range(0, len(cases), 64):
            sl = slice(lo, lo + 64)
            d = mdr.full_distance_from_vectors(u_all[sl], p_mean[sl])
            if mass is not None:
                d_mass = mass.full_distance_from_vectors(
                    mass.user_emb.weight.mean(0).expand(m[sl].shape[0], -1),
                    mass.att_user_emb.weight.mean(0).expand(m[sl].shape[0], -1),
                    m[sl].clamp_min(0),
                    mask[sl],
                )
                d = alpha * d + (1 - alpha) * d_mass  # eq. 20
            d[torch.arange(d.shape[0])[:, None].expand_as(m[sl])[mask[sl]], m[sl][mask[sl]]] = (
                float("inf")
            )
            target = torch.as_tensor(cases.song[sl])[:, None]
            ranks.append(((d <= d.gather(1, target)).sum(1) - 1).numpy())  # ties against it
        all_songs = metrics_from_ranks(np.concatenate(ranks))
    key = "new_playlist_and_user_ids (all of the user's songs, PyTorch)"
    result[key] = {
        "hit@10": round(all_songs["hit@10"], 4),
        "ndcg@10": round(all_songs["ndcg@10"], 4),
    }
    log(f"  {key}: {result[key]}")
    return _write_quality(result, reference, args.quality_name)


def _write_quality(result: dict, reference: dict, name: str) -> int:
    result["known_ids_minus_evaluate_hit@10"] = round(
        result["known_ids"]["hit@10"] - reference["hit@10"], 4
    )
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {OUT / name}.json")
    return 0


def machine_facts(cores: int | None) -> dict:
    """What the figures were measured on (shared with bench_candidates)."""
    return {
        "cpus_visible": os.cpu_count(),
        "cores_used": cores,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=Path(os.environ.get("MASR_BENCH_DATA", DEFAULT_DATA))
    )
    ap.add_argument("--playlists", type=int, default=1024)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--cores", type=int, default=2, help="pin the process to this many CPUs")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=None, help="export chunk (default: export's)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-playlists", type=int, default=256, help="PyTorch is timed on these")
    ap.add_argument(
        "--torch-device", default="cpu", help="PyTorch eager on these, comma-separated: cpu,cuda"
    )
    ap.add_argument("--quality-runs", type=Path, help="measure quality with these runs instead")
    ap.add_argument("--quality-data", type=Path, default=Path("data"))
    ap.add_argument("--quality-model", default=None, help="amasr, masr, ... (export's default)")
    ap.add_argument("--quality-cases", type=int, default=2000)
    ap.add_argument("--quality-name", default="score_quality", help="bench-out/NAME.json")
    args, _ = ap.parse_known_args()
    sys.path.insert(0, str(ROOT / "src"))
    OUT.mkdir(exist_ok=True)
    if args.quality_runs is not None:
        return quality(args)
    if hasattr(os, "sched_setaffinity") and args.cores:
        available = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, available[: args.cores])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    OUT.mkdir(exist_ok=True)

    import onnx

    from masr.export import ExportConfig, build_graph, mass_weights, mdr_weights
    from masr.score import Engine

    sizes = dict(AOTM_SIZES)
    result: dict = {
        "machine": machine_facts(cores),
        "model": {**sizes, "dim": DIM, "alpha": 0.5, "weights": "random"},
    }
    workloads: dict[str, dict] = {}
    if args.data.exists():
        log(f"AOTM sample: all playlists of random users of {args.data}, ~{args.playlists}")
        workloads["aotm_sample"] = playlists_from_aotm(args.data, args.playlists, sizes)
    else:
        log(f"{args.data} not found: synthetic playlists of AOTM's shape instead")
        workloads["aotm_shape"] = synthetic_playlists(args.playlists, sizes)
    # the issue's own setting: 12 members per playlist, AOTM's playlists per user
    workloads["members_12"] = synthetic_playlists(args.playlists, sizes, members=12)
    result["workloads"] = {name: describe(plays) for name, plays in workloads.items()}

    model = build_models(sizes)
    chunk = args.chunk or ExportConfig().chunk
    start = time.perf_counter()
    graph = build_graph(mdr_weights(model.mdr), mass_weights(model.mass), 0.5, chunk=chunk, **sizes)
    for key, value in {"chunk": chunk, "sizes": sizes}.items():  # as export writes them
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    result["onnxruntime"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "masr.onnx"
        onnx.save_model(graph, path)
        result["export"] = {
            "graph_build_s": round(time.perf_counter() - start, 2),
            "onnx_mb": round(path.stat().st_size / 1e6, 1),
            "chunk": chunk,
        }
        del graph
        start = time.perf_counter()
        engine = Engine(path, args.device, batch_size=args.batch_size)
        result["engine"] = {
            "session_s": round(time.perf_counter() - start, 2),
            "provider": engine.provider,
            "workers": engine.workers,
            "batch_size": engine.batch_size,
            "max_cells": engine.max_cells,
        }
        log(
            f"ONNX Runtime on {engine.provider}: {engine.workers} worker(s), batches of "
            f"{engine.batch_size}, chunk {chunk}, {cores} core(s)"
        )
        outputs = {}
        for name, plays in workloads.items():
            known, songs, scores = time_engine(engine, plays, args.k, args.repeat)
            outputs[name] = (songs, scores)
            unknown = {**plays, "users": np.full_like(plays["users"], -1)}
            unknown["playlists"] = unknown["users"]
            new, _, _ = time_engine(engine, unknown, args.k, 1)
            result["onnxruntime"][name] = {"known_ids": known, "new_ids": new}
            log(
                f"  ORT {name:12s} known ids {known['playlists_per_s']:7.1f}/s "
                f"({known['playlists_per_cpu_s']:.1f} per CPU-s), new ids "
                f"{new['playlists_per_s']:7.1f}/s"
            )
        first = next(iter(workloads))
        if engine.provider == "cpu" and cores > 1:
            single = Engine(path, "cpu", workers=1, batch_size=engine.batch_size)
            intra, _, _ = time_engine(single, workloads[first], args.k, 1)
            single.close()
            result["onnxruntime"][first]["one_call_intra_op_threads"] = intra
            log(f"  ORT {first}, 1 call x {cores} threads: {intra['playlists_per_s']:.1f}/s")
        ort_cpu = None
        if engine.provider == "cuda" and not args.skip_torch:
            cpu_engine = Engine(path, "cpu")
            ort_cpu = time_engine(
                cpu_engine, subset(workloads[first], args.torch_playlists), args.k
            )
            cpu_engine.close()
        if args.skip_torch:
            engine.close()

    if not args.skip_torch:
        part = subset(workloads[first], args.torch_playlists)
        ort_run, ort_songs, ort_scores = time_engine(engine, part, args.k, args.repeat)
        engine.close()
        result["same_batches"] = {"workload": first, "onnxruntime": ort_run}
        compare = {}
        if ort_cpu is not None:  # the CPU provider on the same playlists: parity across EPs
            compare["onnxruntime_cpu"] = ort_cpu
        for device in args.torch_device.split(","):
            run, songs, scores = time_torch(
                model, part, args.k, engine.batch_size, cores, device=device
            )
            compare[f"pytorch_eager_{device}"] = (run, songs, scores)
        for name, (run, songs, scores) in compare.items():
            same = float((songs == ort_songs).all(axis=1).mean())
            diff = float(np.abs(scores - ort_scores).max())
            ratio = ort_run["playlists_per_s"] / run["playlists_per_s"]
            result["same_batches"][name] = {
                **run,
                "ort_over_it": round(ratio, 2),
                "same_top_k_fraction": same,
                "max_abs_score_diff": diff,
            }
            log(
                f"  same {len(songs)} playlists: ORT ({engine.provider}) "
                f"{ort_run['playlists_per_s']:.1f}/s, {name} {run['playlists_per_s']:.1f}/s "
                f"({ratio:.2f}x); same top-{args.k}: {same:.3f}, max |Δscore| {diff:.2e}"
            )
        if "pytorch_eager_cpu" in result["same_batches"]:  # the name earlier reports used
            cpu = result["same_batches"]["pytorch_eager_cpu"]
            result["same_batches"]["pytorch_eager"] = cpu
            result["same_batches"]["ort_over_pytorch"] = cpu["ort_over_it"]
            result["same_batches"]["same_top_k_fraction"] = cpu["same_top_k_fraction"]
            result["same_batches"]["max_abs_score_diff"] = cpu["max_abs_score_diff"]
    result["targets"] = {"ort_playlists_per_s": 200, "ort_over_pytorch": 1.0}
    result["machine"]["load_avg_at_end"] = os.getloadavg()
    (OUT / "score.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {OUT / 'score.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
