"""Where an export's inputs come from: the runs' checkpoints, the prepared data they were
trained on, and its id maps (index -> original id)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from masr.atomic import check_output_dir
from masr.errors import MasrError
from masr.onnx_format import ID_MAP_SIZES, sha256_file

if TYPE_CHECKING:
    from masr.models.base import Recommender

#: --model choices: the fusions first, then single parts.
#: What each kind is made of: (MDR-like run, MASS-like run, fusion run).
_KIND_RUNS: dict[str, tuple[str | None, str | None, str | None]] = {
    "amasr": ("amdr", "amass", "amasr"),
    "masr": ("mdr", "mass", "masr"),
    "mdr": ("mdr", None, None),
    "mass": (None, "mass", None),
    "amdr": ("amdr", None, None),
    "amass": (None, "amass", None),
}

#: the export kinds that fuse two parts (a fusion run of their own): amasr, masr
FUSION_KINDS = tuple(kind for kind, (_, _, fused) in _KIND_RUNS.items() if fused)


@dataclass
class Source:
    """One checkpoint the export reads."""

    role: str  # "mdr", "mass" or "fusion"
    run: str
    path: Path

    def describe(self, ckpt: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": self.role,
            "run": self.run,
            "path": str(self.path),
            "sha256": sha256_file(self.path),
            "model": ckpt.get("model"),
            "config": ckpt.get("config"),
            "epoch": ckpt.get("epoch"),
            "valid": ckpt.get("valid"),
            "masr_version": ckpt.get("masr_version"),
        }


def resolve_sources(runs_dir: str | Path, kind: str | None) -> tuple[str, list[Source]]:
    """(kind, checkpoints) to export: the parts' best checkpoints, else the fusion run's.

    Without ``kind``: AMASR when its parts (or its fusion run) exist, else MASR."""
    runs_dir = Path(runs_dir)
    check_output_dir(runs_dir, "--runs", creatable=False)  # a file, or below one: one line
    if not runs_dir.is_dir():
        raise MasrError(f"--runs {runs_dir}: no such directory; train first (masr train)")
    looked: list[str] = []
    for candidate in [kind] if kind else FUSION_KINDS:
        mdr_run, mass_run, fusion_run = _KIND_RUNS[candidate]
        parts = [(role, run) for role, run in (("mdr", mdr_run), ("mass", mass_run)) if run]
        paths = [(role, run, runs_dir / run / "best.pt") for role, run in parts]
        looked += [str(p) for _, _, p in paths]
        if all(p.is_file() for _, _, p in paths):
            return candidate, [Source(role, run, p) for role, run, p in paths]
        if fusion_run is not None:
            fused = runs_dir / fusion_run / "best.pt"
            looked.append(str(fused))
            if fused.is_file():
                return candidate, [Source("fusion", fusion_run, fused)]
    what = kind or "AMASR or MASR"
    have = sorted(p.parent.name for p in map(Path, dict.fromkeys(looked)) if p.is_file())
    found = f"; it has {', '.join(have)} only" if have else ""
    fusion = kind is None or kind in FUSION_KINDS  # a fusion: two parts, or its fusion run
    needs = "an MDR and a MASS part, or the fusion run" if fusion else f"the {kind} run"
    # a fusion missing a part: the part there can be exported alone (QA: not said)
    alone = [h for h in have if h in _KIND_RUNS and h not in FUSION_KINDS]
    other = f", or export {alone[0]} alone: masr export --model {alone[0]}" if alone else ""
    raise MasrError(
        f"--runs {runs_dir}: no trained {what}: the export needs {needs} (looked for "
        f"{', '.join(dict.fromkeys(looked))}){found}; train it first: masr train --model "
        f"{kind or 'amasr'}{other}"
    )


def fusion_alpha(runs_dir: str | Path, kind: str) -> tuple[float | None, str | None]:
    """(α, note) of the fusion run of ``kind`` (amasr, masr) when it exists: the weight
    ``masr train --alpha`` gave it (or ``--alpha auto`` chose), which the export serves when it
    reads the parts' own checkpoints. None with a note when that run was made from parts
    trained again since (its α was meant for the former ones); None alone without a run."""
    from masr.runs.store import earlier_parts, parse_run_json

    fusion_run = _KIND_RUNS[kind][2]
    if fusion_run is None:
        return None, None
    run_dir = Path(runs_dir) / fusion_run
    if not (run_dir / "best.pt").is_file():
        return None, None
    info, why = parse_run_json(run_dir)
    if info is None:  # unreadable, or none beside best.pt: a fusion killed between the two
        # writes (evaluate serves that best.pt's α; QA: said "no amasr run to take α from")
        return None, (
            f"note: {run_dir / 'run.json'}: {why or 'missing'}, so its α cannot be read; "
            f"exporting the paper's α (`masr train --model {fusion_run}` fuses the parts "
            "again; or --alpha)"
        )
    if "alpha" not in info:
        return None, None
    if earlier_parts(run_dir, info):
        return None, (
            f"note: {run_dir} (α {info['alpha']:g}) was fused from parts trained again since; "
            f"exporting the paper's α (`masr train --model {fusion_run}` fuses them again)"
        )
    return float(info["alpha"]), None


def load_sources(
    sources: list[Source],
) -> tuple[Recommender | None, Recommender | None, float | None, list[dict[str, Any]], str]:
    """(MDR part, MASS part, the fusion run's α or None, source descriptions, data fingerprint)."""
    from masr.checkpoint import build_model, load_checkpoint

    mdr = mass = None
    alpha: float | None = None
    described, fingerprints = [], set()
    for source in sources:
        try:
            ckpt = load_checkpoint(source.path)
        except MasrError as exc:  # the way out, as evaluate says it (QA: none was said)
            raise MasrError(
                f"{exc}; train {source.run} again (`masr train --model {source.run}` with the "
                "options it was made with)"
            ) from None
        described.append(source.describe(ckpt))
        fingerprints.add(str(ckpt.get("data_fingerprint")))
        model = build_model(ckpt)
        expected = {"mdr": "mdr", "mass": "mass", "fusion": "masr"}[source.role]
        if model.name != expected:
            raise MasrError(f"{source.path}: holds a {model.name} model, expected {expected}")
        if source.role == "mdr":
            mdr = model
        elif source.role == "mass":
            mass = model
        else:
            mdr, mass = model.parts()
            alpha = float(model.config.alpha)
    if len(fingerprints) > 1:
        paths = ", ".join(str(s.path) for s in sources)
        raise MasrError(f"{paths}: trained on different prepared data (fingerprints differ)")
    if mdr is not None and mass is not None:
        if (mdr.n_users, mdr.n_songs) != (mass.n_users, mass.n_songs):
            raise MasrError("the MDR and MASS checkpoints have different user or song counts")
    return mdr, mass, alpha, described, fingerprints.pop()


def locate_data(
    runs_dir: Path, sources: list[Source], fingerprint: str, override: Path | None
) -> Path:
    """The prepared-data directory the checkpoints were trained on (for the id maps).

    ``override`` (``--data``) when given; else the path each run recorded in run.json (as
    written, then relative to the runs directory's parent), then ``data/``. The manifest's
    fingerprint must equal the checkpoints'."""
    from masr.runs import read_run_json

    if override is not None:
        candidates = [Path(override)]
    else:
        candidates = []
        for source in sources:
            info = read_run_json(runs_dir / source.run) or {}
            recorded = (info.get("data") or {}).get("path")
            if recorded:
                candidates += [Path(recorded), runs_dir.resolve().parent / recorded]
        candidates.append(Path("data"))
    seen: list[str] = []
    for path in candidates:
        manifest = path / "manifest.json"
        if str(path) in seen or not manifest.is_file():
            seen.append(str(path))
            continue
        seen.append(str(path))
        try:
            loaded = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        found = loaded.get("fingerprint") if isinstance(loaded, dict) else None
        if found == fingerprint:
            return path
        if override is not None:
            what = found or "without a fingerprint (not a `masr prep` manifest)"
            raise MasrError(
                f"--data {path}: prepared data {what} is not the data the checkpoints were "
                f"trained on ({fingerprint})"
            )
    raise MasrError(
        f"no prepared data with fingerprint {fingerprint} (looked in "
        f"{', '.join(dict.fromkeys(seen))}); "
        "point to it with --data DIR"
    )


def read_id_maps(data_dir: Path, sizes: dict[str, int]) -> dict[str, pl.DataFrame]:
    """Index -> original id tables of the prepared data, restricted to the model's catalog;
    each must have as many rows as the model has songs, playlists and users (``sizes``)."""
    n_songs = sizes["n_songs"]
    try:
        songs = pl.read_parquet(data_dir / "songs.parquet")
        playlists = pl.read_parquet(data_dir / "playlists.parquet")
        users = pl.read_parquet(data_dir / "users.parquet")
    except Exception as exc:  # polars raises several types for missing or corrupt files
        raise MasrError(f"{data_dir}: cannot read the id tables ({exc})") from None
    songs = songs.filter(pl.col("song_idx") < n_songs).sort("song_idx")
    if songs.height != n_songs:
        raise MasrError(
            f"{data_dir}: songs.parquet has {songs.height} catalog songs, the model {n_songs}"
        )
    maps = {
        "songs": songs,
        "playlists": playlists.select("playlist_idx", "playlist_id", "user_idx").sort(
            "playlist_idx"
        ),
        "users": users.select("user_idx", "user_id").sort("user_idx"),
    }
    for name in ("playlists", "users"):
        expected = sizes[ID_MAP_SIZES[name]]
        if maps[name].height != expected:
            raise MasrError(
                f"{data_dir}: {name}.parquet has {maps[name].height} rows, the model {expected}"
            )
    return maps
