"""Benchmark the model forward/backward and full-catalog scoring of MDR, MASS (issue 3).

    python benchmarks/bench_models.py [--threads N] [--repeat 10] [--skip-full]

AOTM-2011 sizes (14,115 users, 81,798 playlists, 64,181 songs; d = 64), random indices:

* training step: ``distance`` + backward at batch 256 with C = 5 candidates (1 positive + 4
  negatives) and L = 20 member slots, embedding gradients row-sparse as the trainer uses them;
  MASS in each dropout mode ("element" = the reference code's per-element mask, "shared" = one
  mask per candidate and dimension, GEMM form; dropout 0 for the eval-form cost). The optimiser
  step is not included. ``epoch_s_est`` = ms/step x ceil(850,000 / 256) steps.
* full ranking: ``full_distance`` for 64 playlists with L = 12 members each, all of different
  users and 8 users x 8 playlists (MASS shares the per-user queries), in playlists/s.

Targets (issue 3): CPU MDR <= 4 s/epoch, MASS <= 30 s/epoch; full-catalog MDR+MASS top-10
>= 200 playlists/s on 2 cores. Figures go to bench-out/models.json and a summary to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from masr.models.base import Batch
from masr.models.mass import MASS, MASSConfig
from masr.models.mdr import MDR, MDRConfig

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"
USERS, PLAYLISTS, SONGS, DIM = 14_115, 81_798, 64_181, 64
TRAIN_ROWS = 850_000


def random_batch(
    gen: torch.Generator, rows: int, slots: int, users: torch.Tensor | None = None
) -> Batch:
    """Rows with 1..slots real members (left-aligned), padding masked."""
    if users is None:
        users = torch.randint(0, USERS, (rows,), generator=gen)
    lengths = torch.randint(1, slots + 1, (rows, 1), generator=gen)
    return Batch(
        users,
        torch.randint(0, PLAYLISTS, (rows,), generator=gen),
        torch.randint(0, SONGS, (rows, slots), generator=gen),
        torch.arange(slots).unsqueeze(0) < lengths,
    )


def time_train_step(model: torch.nn.Module, repeat: int) -> float:
    """Median ms of zero_grad + distance + backward (row-sparse embedding gradients)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.sparse = True
    model.train()
    gen = torch.Generator().manual_seed(0)
    times = []
    for i in range(repeat + 2):
        batch = random_batch(gen, 256, 20)
        songs = torch.randint(0, SONGS, (256, 5), generator=gen)
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model.distance(batch, songs).sum().backward()
        if i >= 2:  # first two are warm-up
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def time_full(model: torch.nn.Module, batch: Batch, repeat: int) -> float:
    """Best-of-``repeat`` playlists/s of ``full_distance`` plus a top-10."""
    model.eval()
    best = math.inf
    with torch.no_grad():
        for _ in range(repeat):
            start = time.perf_counter()
            torch.topk(model.full_distance(batch), 10, largest=False)
            best = min(best, time.perf_counter() - start)
    return batch.users.shape[0] / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--repeat", type=int, default=10, help="timed repetitions per figure")
    parser.add_argument("--skip-full", action="store_true", help="skip the full-ranking figures")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    steps = math.ceil(TRAIN_ROWS / 256)
    result: dict = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "sizes": {"users": USERS, "playlists": PLAYLISTS, "songs": SONGS, "dim": DIM},
        "train_step": {},
        "full": {},
    }
    variants = {
        "mdr": lambda: MDR(MDRConfig(dim=DIM), USERS, PLAYLISTS, SONGS),
        "mass_element": lambda: MASS(MASSConfig(dim=DIM), USERS, PLAYLISTS, SONGS),
        "mass_shared": lambda: MASS(
            MASSConfig(dim=DIM, dropout_mode="shared"), USERS, PLAYLISTS, SONGS
        ),
        "mass_nodropout": lambda: MASS(MASSConfig(dim=DIM, dropout=0.0), USERS, PLAYLISTS, SONGS),
    }
    for name, build in variants.items():
        ms = time_train_step(build(), args.repeat)
        result["train_step"][name] = {
            "ms_per_step": round(ms, 2),
            "epoch_s_est": round(ms * steps / 1000, 1),
        }
        print(
            f"train step {name:15s} {ms:8.1f} ms/step  ~{ms * steps / 1000:7.1f} s/epoch",
            file=sys.stderr,
            flush=True,
        )
    if not args.skip_full:
        gen = torch.Generator().manual_seed(1)
        batches = {
            "64_users": random_batch(gen, 64, 12),
            "8_users_x_8": random_batch(
                gen, 64, 12, torch.randint(0, USERS, (8,), generator=gen).repeat_interleave(8)
            ),
        }
        batches = {
            k: Batch(b.users, b.playlists, b.members, torch.ones_like(b.member_mask))
            for k, b in batches.items()
        }
        models = {"mdr": variants["mdr"](), "mass": variants["mass_nodropout"]()}
        for bname, batch in batches.items():
            rates = {
                m: time_full(model, batch, max(2, args.repeat // 3)) for m, model in models.items()
            }
            both = 1.0 / (1.0 / rates["mdr"] + 1.0 / rates["mass"])
            result["full"][bname] = {
                "mdr_playlists_s": round(rates["mdr"], 1),
                "mass_playlists_s": round(rates["mass"], 1),
                "mdr_plus_mass_playlists_s": round(both, 1),
            }
            print(
                f"full ranking {bname:12s} MDR {rates['mdr']:8.1f}  MASS {rates['mass']:7.1f}  "
                f"MDR+MASS {both:7.1f} playlists/s",
                file=sys.stderr,
                flush=True,
            )
    OUT.mkdir(exist_ok=True)
    (OUT / "models.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
