"""New playlists: how well runs continue playlists they never saw (what `masr score` gets).

The paper's protocol holds out one song of playlists the models trained on, so MDR ranks with
each playlist's learned vector. `masr score` mostly meets playlists made after training, which
MDR folds in from their songs (masr.foldin). This measures that case:

    python benchmarks/new_playlists.py holdout --data aotm --out aotm-new [--playlists 4000]
        a copy of the prepared data without N playlists (drawn with --seed among those with a
        validation case): their training rows and their cases are left out; holdout.json lists
        them
    masr train --model amasr --data aotm-new --runs runs-new ...   (and itemknn, pop)
    python benchmarks/new_playlists.py evaluate --data aotm --holdout aotm-new --runs runs-new
        [--mdr amdr] [--mass amass] [--baseline itemknn] [--split valid] [--new-users]
        [--json F]
        the held-out playlists' cases of --split, each ranked against the whole catalog (their
        training songs as members and excluded, as in the full protocol), by the MDR run under
        each fold-in (the plain mean; the fitted maps), the MASS run, their eq. 20 fusion at
        each α of the grid and every baseline, under both protocols (the case's 100 stored
        negatives; the whole catalog); one JSON line (and --json)

    python benchmarks/new_playlists.py score --data aotm --holdout aotm-new
        --model exported/a.onnx [--model exported/b.onnx ...] [--split valid] [--new-users]
        [--json F]
        the same cases through the user's path: the held-out playlists' training songs
        written as a `masr score` input (original ids, each playlist under a new id, so that
        it is folded in), `masr score` run on each exported model, hit@10 of the held-out song

Choose with --split valid; read test once, for what was chosen.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def holdout(args: argparse.Namespace) -> int:
    import numpy as np
    import polars as pl

    from masr.dataset import MANIFEST, TABLES, fingerprint_of

    src, out = Path(args.data), Path(args.out)
    if out.exists():
        sys.exit(f"{out}: exists; give a new folder")
    valid = pl.read_parquet(src / "valid.parquet", columns=["playlist_idx"])
    pool = np.unique(valid["playlist_idx"].to_numpy())
    rng = np.random.default_rng(args.seed)
    held = np.sort(rng.choice(pool, size=min(args.playlists, len(pool)), replace=False))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kept = {}
    for name in TABLES:
        table = pl.read_parquet(src / f"{name}.parquet")
        if name in ("train", "valid", "test"):
            table = table.filter(~pl.col("playlist_idx").is_in(held))
            kept[name] = table.height
        table.write_parquet(tmp / f"{name}.parquet")
    manifest = json.loads((src / MANIFEST).read_text())
    manifest["holdout"] = {"source": str(src), "playlists": len(held), "seed": args.seed,
                           "kept": kept}
    manifest["fingerprint"] = fingerprint_of(manifest)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (tmp / "holdout.json").write_text(json.dumps({"playlists": held.tolist()}) + "\n")
    tmp.rename(out)
    print(json.dumps({"out": str(out), "held_out": len(held), **kept}))
    return 0


def held_cases(full, holdout: str, split: str):  # noqa: ANN001, ANN201
    """(held-out playlist ids, ``full``'s cases of ``split``, the indices of the held-out
    playlists' cases among them), as `holdout` recorded them."""
    import numpy as np

    held = np.asarray(json.loads((Path(holdout) / "holdout.json").read_text())["playlists"])
    cases = full.valid if split == "valid" else full.test
    return held, cases, np.flatnonzero(np.isin(cases.playlist, held))


def evaluate(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from masr.checkpoint import load_model
    from masr.dataset import load_prepared
    from masr.foldin import fit_playlist_maps, fold_playlists, fold_users
    from masr.models.base import Batch
    from masr.sampling import TrainingIndex

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    full = load_prepared(args.data)
    sub = load_prepared(args.holdout)
    held, cases, pick = held_cases(full, args.holdout, args.split)
    if args.cases and args.cases < len(pick):
        pick = np.sort(np.random.default_rng(0).choice(pick, size=args.cases, replace=False))
    index = TrainingIndex.from_data(full)  # the held-out playlists' songs: their members
    runs = Path(args.runs)

    def load(run: str):
        model, _ = load_model(runs / run / "best.pt")
        return model.eval()

    mdr = load(args.mdr) if args.mdr else None
    mass = load(args.mass) if args.mass else None
    baselines = {name: load(name) for name in args.baseline}
    maps, w = None, mdr.export_weights() if mdr is not None else {}
    if mdr is not None:
        maps = fit_playlist_maps(
            w["song"].numpy(), w["user"].numpy(), w["playlist"].numpy(),
            sub.playlist_user, sub.indptr, sub.train_song,
        )
    hits: dict[str, dict[str, int]] = {"sampled": {}, "full": {}}
    started = time.perf_counter()

    def count(name: str, dist: torch.Tensor, songs: torch.Tensor, closed: torch.Tensor,
              negatives: torch.Tensor) -> None:
        """Both protocols' hits at 10 of ``dist`` (B, V), ties counted against the held-out
        song as masr evaluate does: the case's stored negatives (-1 padding), and the whole
        catalog less the members."""
        own = dist.gather(1, songs[:, None])  # (B, 1)
        stored = negatives >= 0
        beaten = (dist.gather(1, negatives.clamp_min(0)) <= own) & stored
        full = dist.masked_fill(closed, float("inf")) <= own  # the held-out song counts itself
        for protocol, rank in (("sampled", beaten.sum(1)), ("full", full.sum(1) - 1)):
            hits[protocol][name] = hits[protocol].get(name, 0) + int((rank < 10).sum())

    with torch.no_grad():
        for lo in range(0, len(pick), args.batch):
            rows = pick[lo : lo + args.batch]
            p = torch.as_tensor(cases.playlist[rows])
            u = torch.as_tensor(cases.user[rows])
            y = torch.as_tensor(cases.song[rows])
            negs = torch.as_tensor(cases.negatives[rows])
            first, stop = index.indptr[p], index.indptr[p + 1]
            slots = torch.arange(int((stop - first).max()))
            mask = slots[None] < (stop - first)[:, None]  # (B, L)
            at = (first[:, None] + slots[None]).clamp(max=index.song.numel() - 1)
            members = torch.where(mask, index.song[at], 0)
            closed = torch.zeros(len(rows), full.n_songs, dtype=torch.bool)
            closed[torch.arange(len(rows))[:, None].expand_as(members)[mask], members[mask]] = True
            batch = Batch(u, p, members, mask, index)
            if mass is None:
                o_mass = None
            elif args.new_users:  # as the export folds an unknown user into MASS: mean rows
                o_mass = mass.full_distance_from_vectors(
                    mass.user_emb.weight.mean(0).expand(len(rows), -1),
                    mass.att_user_emb.weight.mean(0).expand(len(rows), -1),
                    members,
                    mask,
                )
            else:
                o_mass = mass.full_distance(batch)
            if o_mass is not None:
                count("mass", o_mass, y, closed, negs)
            if mdr is not None:
                mean = (w["song"][members] * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                # a new user (as the export, unknown_user "members"): from the same songs, their
                # mean or the user map
                u_vec = mean if args.new_users else w["user"][u]
                folds = {"mean": (u_vec, mean)}
                if maps is not None:
                    known = np.full(len(rows), not args.new_users)
                    p_map = fold_playlists(maps, mean.numpy(), u_vec.numpy(), known)
                    u_map = fold_users(maps, mean.numpy()) if args.new_users else u_vec
                    folds["map"] = (torch.as_tensor(u_map), torch.as_tensor(p_map))
                for fold, (u_vec, p_vec) in folds.items():
                    o_mdr = mdr.full_distance_from_vectors(u_vec, p_vec)
                    count(f"mdr fold-in {fold}", o_mdr, y, closed, negs)
                    for a in ALPHAS if o_mass is not None else ():
                        count(f"fusion fold-in {fold} alpha {a:g}",
                              a * o_mdr + (1 - a) * o_mass, y, closed, negs)
            for name, model in baselines.items():
                count(name, model.full_distance(batch), y, closed, negs)
    n = len(pick)
    out = {
        "split": args.split, "cases": n, "held_out_playlists": len(held),
        "users": "new (folded in)" if args.new_users else "known",
        "mdr": args.mdr, "mass": args.mass,
        "fold_in_map": None if maps is None else {"playlists": maps.playlists,
                                                  "r2": round(maps.r2, 4)},
        "sampled hit@10": {name: round(h / n, 4) for name, h in hits["sampled"].items()},
        "full hit@10": {name: round(h / n, 4) for name, h in hits["full"].items()},
        "standard_error_at_0.05": round((0.05 * 0.95 / max(n, 1)) ** 0.5, 4),
        "seconds": round(time.perf_counter() - started, 1),
    }
    line = json.dumps(out)
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def score(args: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    import numpy as np
    import polars as pl

    from masr.dataset import load_prepared

    full = load_prepared(args.data)
    _, cases, pick = held_cases(full, args.holdout, args.split)
    cols = full.manifest["columns"]
    src = Path(args.data)
    users = pl.read_parquet(src / "users.parquet")
    songs = pl.read_parquet(src / "songs.parquet")
    target = pl.DataFrame({
        "playlist_idx": cases.playlist[pick].astype(np.int32),
        "user_idx": cases.user[pick].astype(np.int32),
        "want_idx": cases.song[pick].astype(np.int32),
    })
    rows = pl.DataFrame({
        "playlist_idx": full.train_playlist.astype(np.int32),
        "song_idx": full.train_song.astype(np.int32),
    }).join(target.select("playlist_idx", "user_idx"), on="playlist_idx")
    new_id = (pl.lit("new-") + pl.col("playlist_idx").cast(pl.Utf8)).alias(cols["playlist"])
    user_id = pl.col("user_id")
    if args.new_users:  # ids the model never saw: the users are folded in too
        user_id = pl.lit("new-") + user_id
    given = (
        rows.join(users, on="user_idx").join(songs, on="song_idx")
        .sort("playlist_idx")
        .select(user_id.alias(cols["user"]), new_id, pl.col("track_id").alias(cols["track"]))
    )
    truth = target.join(songs, left_on="want_idx", right_on="song_idx").select(
        (pl.lit("new-") + pl.col("playlist_idx").cast(pl.Utf8)).alias("playlist_id"),
        pl.col("track_id").alias("want"),
    )
    out: dict[str, object] = {
        "split": args.split, "cases": len(pick), "users": "new" if args.new_users else "known",
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        given_csv = Path(tmp) / "given.csv"
        given.write_csv(given_csv)
        for model in args.model:
            recs_csv = Path(tmp) / "recs.csv"
            started = time.perf_counter()
            proc = subprocess.run(
                ["masr", "score", str(given_csv), "--model", model, "--k", "10",
                 "--out", str(recs_csv)], capture_output=True, text=True,
            )
            if proc.returncode:
                sys.exit(f"masr score --model {model}: {proc.stderr.strip()}")
            recs = pl.read_csv(recs_csv, schema_overrides={"playlist_id": pl.Utf8,
                                                           "track_id": pl.Utf8})
            hit = truth.join(recs, left_on=["playlist_id", "want"],
                             right_on=["playlist_id", "track_id"], how="semi").height
            out["models"][model] = {  # type: ignore[index]
                "hit@10": round(hit / max(len(pick), 1), 4),
                "seconds": round(time.perf_counter() - started, 1),
                "summary": proc.stderr.strip().splitlines()[-1],
            }
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    h = sub.add_parser("holdout", help="a prepared copy without N playlists")
    h.add_argument("--data", required=True)
    h.add_argument("--out", required=True)
    h.add_argument("--playlists", type=int, default=4000)
    h.add_argument("--seed", type=int, default=123)
    e = sub.add_parser("evaluate", help="rank the held-out playlists' cases")
    e.add_argument("--data", required=True, help="the full prepared data (the members)")
    e.add_argument("--holdout", required=True, help="the copy the runs were trained on")
    e.add_argument("--runs", required=True)
    e.add_argument("--mdr", default="amdr", help="an MDR-class run ('' for none)")
    e.add_argument("--mass", default="amass", help="a MASS-class run ('' for none)")
    e.add_argument("--baseline", action="append", default=[], help="a baseline run (repeat)")
    e.add_argument("--split", default="valid", choices=("valid", "test"))
    e.add_argument("--cases", type=int, default=0, help="at most this many (seeded); 0 = all")
    e.add_argument("--new-users", action="store_true",
                   help="score the held-out playlists as if their users were new too")
    e.add_argument("--batch", type=int, default=250)
    e.add_argument("--threads", type=int, default=1, help="0 = torch's default")
    e.add_argument("--json", default="")
    c = sub.add_parser("score", help="the same cases through masr score")
    c.add_argument("--data", required=True, help="the full prepared data")
    c.add_argument("--holdout", required=True, help="the copy the runs were trained on")
    c.add_argument("--model", action="append", required=True, help="an exported ONNX (repeat)")
    c.add_argument("--split", default="valid", choices=("valid", "test"))
    c.add_argument("--new-users", action="store_true", help="the users under new ids too")
    c.add_argument("--json", default="")
    args = parser.parse_args(argv)
    return {"holdout": holdout, "evaluate": evaluate, "score": score}[args.command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
