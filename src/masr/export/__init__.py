"""Export MDR, MASS or their fusion MASR / AMASR (eq. 20) to one ONNX file (plus its weights
beside it past protobuf's 2 GB: ``external``).

The graph scores the whole catalog for a batch of playlists and returns the K best songs:

    inputs   users (B,) int64, playlists (B,) int64   -1 = unknown (fold-in, below)
             members (B, L) int64                    the playlist's songs, -1 = padding
             k () int64                              how many songs to return (<= catalog size)
    outputs  songs (B, K) int64                      catalog song indices, best first
             scores (B, K) float32                   -(fused distance): higher is better;
                                                     -inf only when fewer than K songs remain

    o = α o_MDR + (1 - α) o_MASS                      (eq. 20; α = 1 for MDR, 0 for MASS)

Member songs are never returned (their distance is set to +inf before the top-K). Users and
playlists the model never saw are folded in: an unknown playlist (and by default an unknown user)
folds in from its members' MDR song vectors (by default through the maps ``masr.foldin`` fits on
the training playlists, else their mean), an unknown MASS user takes the mean of each memory's
user table, and a new playlist with no usable member ranks by user taste, then by popularity
(a known one keeps its trained MDR vector).

Everything that does not depend on the playlist is precomputed as constants (GEMM form). Where
each part lives:

    sources.py       which checkpoints (runs) and prepared data (id maps) an export reads
    weights.py       the models' tensors as NumPy, from their public ``export_weights()``
    onnx_builder.py  the small ONNX builder both graph modules write with
    graph.py         the graph: inputs, MDR's eq. 11 with fold-in, eq. 20, exclusion, top-K
    mass_graph.py    MASS's eqs. 12-19, walked over the catalog in chunks by an ONNX Loop
    two_stage.py     --candidates N: MASS on the N songs MDR proposes per playlist
    external.py      the weights in a file beside the model past protobuf's 2 GB
    this file        the options, the metadata and the files written next to the model

The file format both this package and scoring read is ``masr.onnx_format``. This package needs
torch (it reads checkpoints); scoring (``masr.score``) does not.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from masr import __version__
from masr.atomic import atomic_group, check_not_inside, check_parents
from masr.config import ALPHA, FOLD_IN_MODES, UNKNOWN_USER_MODES, ExportConfig, ScoreConfig
from masr.config import EXPORT_KINDS as KINDS
from masr.errors import MasrError, check_instance
from masr.export import external
from masr.export.graph import build_graph, graph_and_arrays
from masr.export.sources import (
    FUSION_KINDS,
    Source,
    fusion_alpha,
    load_sources,
    locate_data,
    read_id_maps,
    resolve_sources,
)
from masr.export.weights import MASSWeights, MDRWeights, mass_weights, mdr_weights
from masr.foldin import FoldInMaps, fit_playlist_maps
from masr.onnx_format import (
    CANDIDATES,
    FORMAT,
    FORMAT_VERSION,
    ID_MAPS,
    INPUTS,
    IR_VERSION,
    MODEL_SHA256,
    OPSET,
    OUTPUTS,
    UNKNOWN,
    WEIGHTS,
    sha256_file,
    sidecar,
)


@dataclass
class ExportResult:
    """What ``export_model`` wrote."""

    path: Path
    metadata: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def check_replaceable_model(out: str | Path) -> None:
    """Refuse an ``out`` that is an existing file other than a masr export (a text file, a
    checkpoint, another program's model): the export replaces ``out`` whole (QA: ``--out
    notes.txt`` became an ONNX model without a word). An earlier export is replaced."""
    out = Path(out)
    from masr.onnx_format import FORMAT, read_json_object, read_metadata, sidecars

    if not out.is_file():
        # no model there: the files the export writes beside it (NAME.json, its id maps and
        # weights) are replaced too, so they must be an earlier masr export's (its JSON)
        beside = sidecars(out)  # the JSON first
        found = [p for p in beside if p.exists()]
        if found and (read_json_object(beside[0]) or {}).get("format") != FORMAT:
            raise MasrError(
                f"--out {out}: {found[0]} exists and is not a masr export's, and the export "
                "writes it; choose another name, or remove it first"
            )
        return
    try:
        format_tag = read_metadata(out).get("format")
    except (OSError, ValueError):
        format_tag = None
    if format_tag != FORMAT:
        raise MasrError(
            f"--out {out}: an existing file that is not a masr export, which the export would "
            "replace; choose another name, or remove it first"
        )


def check_outside_runs(out: str | Path, runs_dir: str | Path) -> None:
    """Refuse an ``out`` inside a run folder of ``runs_dir`` (a folder with run.json or
    best.pt), whose files ``masr train`` writes: the exported checkpoints are among them
    (``--out runs/mdr/best.pt`` would replace the checkpoint it reads; ``resolve_sources``
    takes them from there). The CLI calls it before it locks ``out`` or clears a killed
    export's temporary files beside it (a training run's own temporary checkpoint, there)."""
    out, runs_dir = Path(out), Path(runs_dir)
    target = out.resolve()
    folders: set[Path] = set()
    for marker in ("run.json", "best.pt"):
        folders |= {p.parent.resolve() for p in runs_dir.glob(f"*/{marker}")}
    for folder in sorted(folders):
        if folder in target.parents:
            raise MasrError(
                f"--out {out}: inside the run folder {folder}, whose files `masr train` "
                "writes (and the export reads); export elsewhere, e.g. exported/masr.onnx"
            )


def _check_one_part(kind: str, config: ExportConfig) -> None:
    """One line for the options that need both parts, given for a one-part export."""
    if config.alpha is not None:
        raise MasrError(f"--alpha: {kind} is one part; α weights the parts of amasr/masr only")
    if config.candidates is not None:
        raise MasrError(
            f"--candidates: {kind} is one part; the two-stage graph proposes with MDR and "
            "re-ranks with the MDR + MASS fusion (export amasr or masr)"
        )


def export_model(
    runs_dir: str | Path = "runs",
    out: str | Path = "exported/masr.onnx",
    config: ExportConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> ExportResult:
    """Export the runs' MDR/MASS parts to ``out`` plus its metadata JSON and id maps.

    Every file is written aside and renamed; parent folders are created."""
    config = ExportConfig() if config is None else config
    check_instance(config, ExportConfig, "export_model(config=...)")  # a dict: one line
    config.validate()
    say = log or (lambda _msg: None)
    runs_dir, out = Path(runs_dir), Path(out)
    if out.exists() and out.is_dir():
        raise MasrError(f"--out {out}: is a directory; give a file name (e.g. {out}/masr.onnx)")
    check_parents(out, "--out")
    kind, sources = resolve_sources(runs_dir, config.model)
    check_outside_runs(out, runs_dir)
    if kind not in FUSION_KINDS:  # one part: refused alone, before the progress line (QA)
        _check_one_part(kind, config)
    mdr, mass, fused_alpha, described, fingerprint = load_sources(sources)
    # the data the checkpoints were trained on, before any line: other data is one error line
    data_dir = locate_data(runs_dir, sources, fingerprint, config.data)
    check_not_inside(out, data_dir, "--out")  # masr prep replaces that folder whole
    say(f"exporting {kind} from {', '.join(str(s.path) for s in sources)}")
    from masr.runs.store import run_warnings

    for source in sources:  # an interrupted run's best.pt is only its best epoch so far
        for note in run_warnings(source.path.parent):
            say(note)
    alpha_note = None
    if mdr is not None and mass is not None and fused_alpha is None and config.alpha is None:
        fused_alpha, alpha_note = fusion_alpha(runs_dir, kind)  # the parts read, the fusion's α
        if alpha_note:
            say(alpha_note)
    if mdr is not None and mass is not None:
        alpha = next(a for a in (config.alpha, fused_alpha, ALPHA) if a is not None)
        if config.alpha is None and fused_alpha is None and alpha_note is None:
            fusion_run = "amasr" if kind == "amasr" else "masr"
            say(
                f"note: no {fusion_run} run to take α from: exporting the paper's α {ALPHA:g} "
                f"(`masr train --model {fusion_run}` chooses it on validation; or --alpha)"
            )
    else:  # one part (its --alpha and --candidates were refused above)
        alpha = 1.0 if mass is None else 0.0
    if mdr is not None and mass is not None and alpha in (0.0, 1.0) and not config.candidates:
        # eq. 20 gives one part no weight (a weight chosen on validation, or --alpha): the other
        # part's graph alone ranks the same, without ranking the catalog by the unused one
        unused = "mass" if alpha == 1.0 else "mdr"
        say(f"α {alpha:g}: eq. 20 gives the {unused} part no weight; exporting the other alone")
        if unused == "mdr":
            say(
                "note: without MDR, `masr score` ranks a playlist with no known song by MASS's "
                "song biases alone (no user taste); --alpha 0.25 keeps MDR in the export"
            )
        mdr, mass = (mdr, None) if alpha == 1.0 else (None, mass)
    elif mdr is not None and mass is not None and alpha == 1.0:
        # a two-stage graph keeps its contract (masr score --candidates), but its re-rank
        # by eq. 20 at α 1 is MDR's own order of MDR's proposals
        say(
            "note: α 1 gives the mass part no weight: the two-stage re-rank keeps MDR's order "
            "of its proposals (an export without --candidates ranks the same, without MASS)"
        )
    default_k = ScoreConfig().k
    if config.candidates is not None and config.candidates < default_k:
        say(
            f"note: --candidates {config.candidates} is below masr score's default --k "
            f"{default_k}: score this export with --k {config.candidates} or less"
        )
    # the parts' tensors first: an ablation (Tables 3-4) refuses here, before any file is read
    mdr_w = mdr_weights(mdr) if mdr is not None else None
    mass_w = mass_weights(mass) if mass is not None else None
    part = mdr if mdr is not None else mass
    sizes = part.sizes()
    dims = {name: int(m.config.dim) for name, m in (("mdr", mdr), ("mass", mass)) if m}
    del mdr, mass, part  # the arrays above are all that is used of them from here
    check_replaceable_model(out)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    maps = read_id_maps(data_dir, sizes)
    fold_in, fold_info = _fold_in(mdr_w, data_dir, config.fold_in, say)

    graph, arrays = graph_and_arrays(
        mdr_w,
        mass_w,
        alpha,
        chunk=config.chunk,
        unknown_user=config.unknown_user,
        candidates=config.candidates,
        fold_in=fold_in,
        **sizes,
    )
    del mdr_w, mass_w  # the tables live on in ``arrays`` until written, once
    files: list[Path] = []
    written: dict[str, dict[str, Any]] = {}
    # the id maps, the model and its metadata belong together (score checks that they do):
    # written aside and renamed together at the end, so an interrupted or failed export leaves
    # the former export whole (external weights too: written with the model under their final
    # names in a private folder beside them, checked there, then staged like the rest)
    with atomic_group() as stage, contextlib.ExitStack() as private:
        for name in ID_MAPS:
            path = sidecar(out, name)
            tmp = stage(path)
            maps[name].write_parquet(tmp)
            written[name] = {"file": path.name, "rows": maps[name].height}
            written[name]["sha256"] = sha256_file(tmp)
            files.append(path)

        data = {
            "fingerprint": fingerprint,
            "checksum": manifest.get("checksum"),
            "path": str(data_dir),
            "input": manifest.get("input"),
            # the prepared input's id columns: masr score reads files with the same names
            "columns": manifest.get("columns"),
        }
        weights, folder = None, None
        if config.external_data or external.too_large(graph, arrays):
            # ONNX reads external weights by their name beside the model (and refuses links)
            folder = Path(private.enter_context(tempfile.TemporaryDirectory(
                prefix=f".{out.name}.check.", suffix=".tmp", dir=out.parent)))
            weights = _write_weights(graph, arrays, out, folder / sidecar(out, WEIGHTS).name)
            files.append(sidecar(out, WEIGHTS))
        else:
            external.embed(graph, arrays)
        metadata = _metadata(
            kind, alpha, dims, sizes, config, described, data, written, weights, fold_info
        )
        for key, value in metadata.items():  # every value JSON-encoded (strings quoted)
            entry = graph.metadata_props.add()
            entry.key, entry.value = key, json.dumps(value)
        if weights is None:
            onnx.checker.check_model(graph, full_check=True)

        if folder is None:
            tmp = stage(out)
            onnx.save_model(graph, tmp)
        else:  # by path: the checker reads the weights file beside the model
            onnx.save_model(graph, folder / out.name)
            onnx.checker.check_model(str(folder / out.name), full_check=True)
            # staged (so renamed) weights first, then the model that names them
            os.replace(folder / sidecar(out, WEIGHTS).name, stage(sidecar(out, WEIGHTS)))
            tmp = stage(out)
            os.replace(folder / out.name, tmp)
        files.insert(0, out)
        meta_path = sidecar(out, "json")
        # the JSON also holds the model file's SHA-256 (the model cannot hold its own): `masr
        # score` checks it, so a damaged model file is refused rather than scored
        with open(stage(meta_path), "w") as fh:
            json.dump({**metadata, MODEL_SHA256: sha256_file(tmp)}, fh, indent=2)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        files.insert(1, meta_path)
    stale = sidecar(out, WEIGHTS)
    if weights is None and stale.is_file():  # a former external export's weights
        stale.unlink()
    size_mb = os.path.getsize(out) / 1e6
    beside = "" if weights is None else f", {weights['file']} ({weights['bytes'] / 1e6:.1f} MB)"
    say(f"wrote {out} ({size_mb:.1f} MB){beside}, {meta_path.name} and the id maps")
    return ExportResult(path=out, metadata=metadata, files=files)


def _fold_in(
    mdr: MDRWeights | None, data_dir: Path, mode: str, say: Callable[[str], None]
) -> tuple[FoldInMaps | None, dict[str, Any] | None]:
    """The maps that fold a new playlist into MDR (``masr.foldin``) under ``--fold-in map``,
    fitted on the prepared data's training playlists, and what the metadata says of them; no
    maps under ``mean``, without an MDR part, or with too few playlists to fit (said)."""
    if mdr is None:
        if mode != "map":  # the default; another mode given explicitly has nothing to act on
            say(f"note: --fold-in {mode} not used: the export has no MDR part to fold into")
        return None, None
    if mode == "mean":
        return None, {"mode": "mean"}
    from masr.dataset import load_prepared

    data = load_prepared(data_dir, cases=False)  # the checkpoints' data (``locate_data``)
    maps = fit_playlist_maps(
        mdr.song, mdr.user, mdr.playlist, data.playlist_user, data.indptr, data.train_song
    )
    if maps is None:
        say("too few training playlists to fit the fold-in maps: new playlists are folded in "
            "as the mean of their songs")
        return None, {"mode": "mean", "why": "too few training playlists for the maps"}
    return maps, {"mode": "map", "playlists": maps.playlists, "r2": round(maps.r2, 4)}


def _write_weights(
    graph: onnx.ModelProto, arrays: dict[str, np.ndarray], out: Path, tmp: Path
) -> dict[str, Any]:
    """Write the graph's large tensors to ``tmp`` (a private path: it becomes
    ``NAME.onnx.weights`` with the rest of the export) and describe that file for the metadata
    (``masr.export.external``)."""
    name = sidecar(out, WEIGHTS).name
    size = external.write_arrays(graph, arrays, tmp, name)
    return {"file": name, "bytes": size, "sha256": sha256_file(tmp)}


def _metadata(
    kind: str,
    alpha: float,
    dims: dict[str, int],
    sizes: dict[str, int],
    config: ExportConfig,
    sources: list[dict[str, Any]],
    data: dict[str, Any],
    id_maps: dict[str, dict[str, Any]],
    weights: dict[str, Any] | None = None,
    fold_in: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the export records about itself (in the graph and in the JSON next to it). Its
    ``export_id`` hashes what decides the scores, so a reader can tell sidecars of another export
    (``masr.score``)."""
    metadata: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": kind,
        "alpha": alpha,
        "dims": dims,
        "sizes": sizes,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "chunk": config.chunk,
        "unknown_user": config.unknown_user,
        "fold_in": fold_in,
        "unknown_index": UNKNOWN,
        "candidates": config.candidates,
        "inputs": {**INPUTS, **(CANDIDATES if config.candidates else {})},
        "outputs": dict(OUTPUTS),
        "sources": sources,
        "data": data,
        "id_maps": id_maps,
        "weights": weights,
        "masr_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    decides = [sources, alpha, config.chunk, config.unknown_user, id_maps]
    if config.candidates:  # only then, so that exact exports keep their ids
        decides.append({"candidates": config.candidates})
    if fold_in is not None and fold_in["mode"] == "map":
        decides.append({"fold_in": fold_in})
    identity = json.dumps(decides, sort_keys=True)
    metadata["export_id"] = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return metadata


def metadata_of(model: onnx.ModelProto) -> dict[str, Any]:
    """The masr metadata stored in an ONNX model's ``metadata_props`` (values JSON-decoded)."""
    return {entry.key: json.loads(entry.value) for entry in model.metadata_props}


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ID_MAPS",
    "IR_VERSION",
    "KINDS",
    "OPSET",
    "UNKNOWN",
    "UNKNOWN_USER_MODES",
    "ExportConfig",
    "ExportResult",
    "FOLD_IN_MODES",
    "MASSWeights",
    "MDRWeights",
    "Source",
    "build_graph",
    "check_outside_runs",
    "check_replaceable_model",
    "graph_and_arrays",
    "export_model",
    "load_sources",
    "locate_data",
    "mass_weights",
    "mdr_weights",
    "metadata_of",
    "resolve_sources",
    "sidecar",
]
