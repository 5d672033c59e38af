"""Grid search of a closed-form baseline's settings on the VALIDATION split (issue 5).

    python benchmarks/tune_baselines.py --data DIR --model itemknn \\
        --grid alpha=0.5,0.75,1 --grid shrink=0,10,50 [--full [--select full]]

Fits ``--model`` (pop, itemknn, ease, als) once per point of the cartesian product of the
``--grid NAME=V1,V2,...`` lists (names are the model's config fields, as for
``masr train --set``), scores each on the validation split (sampled protocol; ``--full`` adds
full ranking on ``--full-sample`` seeded cases) and prints one JSON line per point on stdout,
then the best point (validation hit@10 of the ``--select`` protocol, ndcg@10 as the
tie-break) on stderr. The test split is never read. item-kNN counts
co-occurrences once for the whole grid. Gradient-trained baselines are tuned with
``masr train`` itself (every epoch is validated; see docs/reproduction.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

from masr.config import RECIPES
from masr.dataset import load_prepared
from masr.evaluate import better, evaluate_model
from masr.models import model_class, parse_settings
from masr.sampling import TrainingIndex
from masr.seed import set_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="prepared data directory (masr prep)")
    parser.add_argument("--model", required=True, choices=["pop", "itemknn", "ease", "als"])
    parser.add_argument(
        "--grid", action="append", default=[], metavar="NAME=V1,V2", help="values to try"
    )
    parser.add_argument("--full", action="store_true", help="also score full ranking")
    parser.add_argument("--seed", type=int, default=0, help="seeds ALS's initial factors")
    parser.add_argument(
        "--full-sample", type=int, default=RECIPES["fullrank"]["train"]["valid_sample"],
        help="with --full: rank this many validation cases (seed 0; 0 = all), as masr train's "
        "--valid-sample does under the default recipe",
    )
    parser.add_argument(
        "--select", choices=("sampled", "full"), default="sampled",
        help="the protocol whose validation hit@10 chooses the best point (full needs --full)",
    )
    args = parser.parse_args(argv)

    if args.select == "full" and not args.full:
        parser.error("--select full needs --full")
    data = load_prepared(args.data)
    names, values = [], []
    for item in args.grid:
        name, _, listed = item.partition("=")
        names.append(name)
        values.append(listed.split(","))
    cls = model_class(args.model)
    index = TrainingIndex.from_data(data, "cpu")
    protocols = ("sampled", "full") if args.full else ("sampled",)
    shared = None
    if args.model == "itemknn":
        from masr.models.itemknn import cooccurrence

        shared = cooccurrence(data, data.n_songs)
    best: tuple[dict, dict] | None = None
    for point in itertools.product(*values):
        items = [f"{n}={v}" for n, v in zip(names, point, strict=True)]
        settings = parse_settings([args.model], items)
        set_seed(args.seed)
        model = cls(cls.config_class(**settings), data.n_users, data.n_playlists, data.n_songs)
        started = time.perf_counter()
        if shared is not None:
            model.set_similarity(*shared, torch.device("cpu"))
        else:
            model.fit(data, torch.device("cpu"))
        fit_s = time.perf_counter() - started
        result = evaluate_model(model, data, "valid", protocols=protocols, index=index,
                                full_sample=args.full_sample)
        row = {"model": args.model, **settings, "fit_s": round(fit_s, 1)}
        for protocol, metrics in result.items():
            row[f"valid_{protocol}_hit@10"] = round(metrics["hit@10"], 4)
            row[f"valid_{protocol}_ndcg@10"] = round(metrics["ndcg@10"], 4)
        print(json.dumps(row), flush=True)
        if best is None or better(result[args.select], best[1]):
            best = (settings, result[args.select])
    if best is not None:
        sys.stderr.write(
            f"best on validation ({args.select}): {args.model} {best[0]} "
            f"hit@10 {best[1]['hit@10']:.4f} "
            f"ndcg@10 {best[1]['ndcg@10']:.4f}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
