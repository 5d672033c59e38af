"""Full-ranking hit@10 by how popular the held-out song is: where a model wins or loses.

    python benchmarks/by_popularity.py --data DIR --run RUNS_DIR:NAME [--run ...] \\
        [--split valid] [--full-sample 2000] [--seed 0] [--json out.json]

Each ``--run`` is a trained run (``masr train``'s runs directory and the run's name, e.g.
``runs:amasr`` or ``runs_knn:itemknn``). The held-out songs of the full-ranking cases (the
same seeded draw as ``masr evaluate --full-sample`` and the per-epoch validation) are put in
bins by their number of training playlists, and each run's full-ranking hit@10 (rank of the
held-out song among every catalog song outside the playlist's training songs, ties against it,
below 10) is printed per bin, with the bin's share of the cases. A model that wins on the
popular songs and loses on the long tail has learned popularity; one that loses on the
rare songs lacks the capacity to remember their few co-occurrences. Validation split by
default: the test split is for final figures only.

``--prior W`` (repeatable) also ranks each run with a popularity prior added afterwards:
distance − W · log(training playlists of the song), i.e. W / τ · log popularity on the logits
of a model trained with ``--loss softmax --temperature τ``. It asks whether a model's misses
on popular songs are a calibration offset that one weight on the validation split would fix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from masr.dataset import load_prepared
from masr.evaluate import full_ranks, subsample_cases
from masr.runs.store import load_run
from masr.sampling import TrainingIndex

#: upper edges of the popularity bins (training playlists holding the held-out song)
EDGES = (2, 5, 10, 25, 100)


def bin_labels(edges: tuple[int, ...] = EDGES) -> list[str]:
    """["1-2", "3-5", ..., ">100"] for the upper edges ``edges``."""
    lows = (1, *(e + 1 for e in edges))
    return [f"{lo}-{hi}" for lo, hi in zip(lows, edges, strict=False)] + [f">{edges[-1]}"]


def popularity_bins(counts: np.ndarray, edges: tuple[int, ...] = EDGES) -> np.ndarray:
    """Bin index (0 .. len(edges)) of each count: the first edge it does not exceed."""
    return np.searchsorted(np.asarray(edges), counts, side="left")


def hits_by_bin(ranks: np.ndarray, bins: np.ndarray, n_bins: int, k: int = 10) -> list[float]:
    """hit@k (rank < k) of the cases in each bin; NaN for an empty bin."""
    hit = ranks < k
    return [float(hit[bins == b].mean()) if (bins == b).any() else float("nan")
            for b in range(n_bins)]


class WithPrior:
    """``model`` with distance − ``weight`` · ``log_pop`` (V,) in its full ranking: what
    ``full_ranks`` reads of a model (``uses_members``, ``full_distance``), nothing else."""

    def __init__(self, model: object, weight: float, log_pop: torch.Tensor) -> None:
        self.model, self.weight, self.log_pop = model, weight, log_pop
        self.uses_members = model.uses_members

    def full_distance(self, batch: object) -> torch.Tensor:
        return self.model.full_distance(batch) - self.weight * self.log_pop


def load_named_run(spec: str, data: object) -> tuple[str, object]:
    """(name, model in eval mode on the CPU) of ``--run RUNS_DIR:NAME``; ValueError when the
    spec has no runs directory."""
    runs_dir, _, name = spec.rpartition(":")
    if not runs_dir:
        raise ValueError(f"--run {spec}: give RUNS_DIR:NAME")
    model, _ = load_run(Path(runs_dir), name, data, "cpu")
    model.eval()
    return name, model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="prepared data directory (masr prep)")
    parser.add_argument("--run", action="append", required=True, metavar="RUNS_DIR:NAME")
    parser.add_argument("--split", default="valid", choices=["valid", "test"])
    parser.add_argument("--full-sample", type=int, default=2000, help="cases (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the case draw")
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("--prior", action="append", type=float, default=[], metavar="W",
                        help="also rank with distance - W * log(popularity); repeatable")
    args = parser.parse_args(argv)

    data = load_prepared(args.data)
    cases = subsample_cases(
        data.valid if args.split == "valid" else data.test, args.full_sample, args.seed
    )
    index = TrainingIndex.from_data(data, torch.device("cpu"))
    bins = popularity_bins(data.song_popularity[cases.song])
    log_pop = torch.log(torch.as_tensor(data.song_popularity, dtype=torch.float32).clamp(min=1))
    labels = bin_labels()
    share = [float((bins == b).mean()) for b in range(len(labels))]
    table: dict[str, dict[str, float]] = {"share of cases": dict(zip(labels, share, strict=True))}
    overall: dict[str, float] = {}
    for spec in args.run:
        try:
            name, model = load_named_run(spec, data)
        except ValueError as err:
            parser.error(str(err))
        runs_dir = spec.rpartition(":")[0]
        for weight in (0.0, *args.prior):
            ranks = full_ranks(WithPrior(model, weight, log_pop) if weight else model, cases, index)
            label = f"{name} ({runs_dir})" + (f" - {weight:g} log pop" if weight else "")
            table[label] = dict(zip(labels, hits_by_bin(ranks, bins, len(labels)), strict=True))
            overall[label] = float((ranks < 10).mean())
            print(f"{label}: full hit@10 {overall[label]:.4f}", file=sys.stderr)

    width = max(len(r) for r in table)
    print(f"{'full hit@10 by training playlists of the held-out song':<{width}} | "
          + " | ".join(f"{lab:>7}" for lab in labels) + " |     all")
    for row, values in table.items():
        cells = " | ".join(f"{values[lab]:7.4f}" for lab in labels)
        tail = f"{overall[row]:7.4f}" if row in overall else f"{1.0:7.4f}"
        print(f"{row:<{width}} | {cells} | {tail}")
    if args.json:
        by_bin = {row: {lab: None if np.isnan(v) else v for lab, v in values.items()}
                  for row, values in table.items()}  # an empty bin: null, not NaN
        out = {"split": args.split, "cases": len(cases), "seed": args.seed, "bins": labels,
               "hit@10_by_bin": by_bin, "hit@10": overall}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
