"""The exported model's file format, shared by the writer (``masr.export``) and the reader
(``masr.score``).

One home for what both sides must agree on: the graph's inputs and outputs, the index that means
"not in the model", the metadata's format tag, and the names of the files written next to the
``.onnx``. Standard library only: scoring must not import torch, and nothing here needs onnx.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: ONNX opset of the graph (ReduceSum/ReduceSumSquare take axes as inputs from opset 18).
OPSET = 18
#: IR version 8 keeps the file loadable by ONNX Runtime >= 1.14 (newer onnx writes IR 10+).
IR_VERSION = 8
#: Index meaning "not in the model" for users and playlists, and padding for members.
UNKNOWN = -1
#: ``format`` and ``format_version`` in the metadata: what a reader checks before trusting it.
FORMAT = "masr-onnx"
FORMAT_VERSION = 1
#: The graph's inputs and outputs (names, in order) with what they hold; the metadata repeats
#: these descriptions so that an export documents itself.
INPUTS = {
    "users": "int64 (B,) user index, -1 = unknown",
    "playlists": "int64 (B,) playlist index, -1 = unknown (fold-in)",
    "members": "int64 (B, L) member song indices, -1 = padding",
    "k": "int64 scalar, songs per playlist",
}
#: The optional input of a two-stage export (``masr export --candidates N``): its default is N.
CANDIDATES = {
    "candidates": "int64 scalar, songs MDR proposes per playlist for the fusion to re-rank "
    "(two-stage exports only; optional, default the export's --candidates)",
}
OUTPUTS = {
    "songs": "int64 (B, K) song indices, best first",
    "scores": "float32 (B, K) negated fused distance, higher is better",
}
#: The id maps written next to the model, and the ``sizes`` entry each one's rows must equal.
ID_MAP_SIZES = {"songs": "n_songs", "playlists": "n_playlists", "users": "n_users"}
ID_MAPS = tuple(ID_MAP_SIZES)


#: The weights file of an export too large for one protobuf (``masr.export.external``).
WEIGHTS = "weights"
#: the key of the model file's SHA-256 in the metadata JSON beside it (not in the model's own
#: metadata: a file cannot hold its own hash)
MODEL_SHA256 = "model_sha256"


def sidecar(model_path: str | Path, what: str) -> Path:
    """The file next to the model: ``json``, ``weights`` (external data) or an id map
    (``songs``, ``playlists``, ``users``)."""
    model_path = Path(model_path)
    if what in ("json", WEIGHTS):
        return model_path.with_name(f"{model_path.name}.{what}")
    suffix = f".{what}.parquet"
    return model_path.with_name(model_path.name + suffix)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB blocks (checkpoints and id maps can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
