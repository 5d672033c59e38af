"""The exported model's file format, shared by the writer (``masr.export``) and the reader
(``masr.score``).

One home for what both sides must agree on: the graph's inputs and outputs, the index that means
"not in the model", the metadata's format tag, and the names of the files written next to the
``.onnx``; and ``read_metadata_props`` / ``read_metadata``, which read a model's metadata
entries. Standard library only: scoring must not import torch, and nothing here needs onnx.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path
from typing import Any, BinaryIO

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


def sidecars(model_path: str | Path) -> list[Path]:
    """Every file an export writes beside the model: its JSON, weights and id maps."""
    return [sidecar(model_path, what) for what in ("json", WEIGHTS, *ID_MAPS)]


def read_json_object(path: str | Path) -> dict[str, Any] | None:
    """A JSON file's object (an export's metadata file), else None: no file, not JSON, not an
    object."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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


#: ModelProto.metadata_props' field number, and a StringStringEntryProto's key and value
#: (onnx.proto), which ``read_metadata_props`` reads
_METADATA_PROPS_FIELD = 14
_ENTRY_KEY, _ENTRY_VALUE = 1, 2


def _varint(fh: BinaryIO) -> int:
    """One base-128 varint of the protobuf wire format; ValueError at the end of the file."""
    value = shift = 0
    while True:
        byte = fh.read(1)
        if not byte:
            raise ValueError("the file ends inside a field")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 64 bits")


def _length_delimited(fh: BinaryIO, size: int) -> bytes:
    """The bytes of one length-delimited value (a string, bytes or a message) of a message of
    ``size`` bytes; ValueError when they do not fit in it."""
    length = _varint(fh)
    if fh.tell() + length > size:
        raise ValueError("a field longer than the file")
    return fh.read(length)


def _skip(fh: BinaryIO, wire: int, size: int) -> None:
    """Past one field's value of wire type ``wire`` in a message of ``size`` bytes, without
    reading it (a graph of gigabytes is sought past); ValueError when it does not fit."""
    if wire == 0:  # varint
        _varint(fh)
        return
    widths = {1: 8, 5: 4}  # fixed64, fixed32
    if wire == 2:
        length = _varint(fh)
    elif wire in widths:
        length = widths[wire]
    else:
        raise ValueError(f"wire type {wire}")
    if fh.tell() + length > size:
        raise ValueError("a field longer than the file")
    fh.seek(length, 1)


def _string_entry(blob: bytes) -> tuple[str, str]:
    """A StringStringEntryProto's (key, value); fields of other numbers are skipped, as every
    protobuf reader does."""
    fh, found = io.BytesIO(blob), {_ENTRY_KEY: "", _ENTRY_VALUE: ""}
    while fh.tell() < len(blob):
        tag = _varint(fh)
        if tag >> 3 not in found:
            _skip(fh, tag & 7, len(blob))
        elif tag & 7 != 2:
            raise ValueError("a metadata entry whose key or value is not a string")
        else:
            found[tag >> 3] = _length_delimited(fh, len(blob)).decode("utf-8")
    return found[_ENTRY_KEY], found[_ENTRY_VALUE]


def read_metadata_props(path: str | Path) -> dict[str, str]:
    """The metadata entries (``metadata_props``) of the ONNX model file at ``path``, read from
    the protobuf wire format alone: every other top-level field (the graph and its tensors
    above all) is skipped by its length, never parsed or loaded, so neither onnx nor
    onnxruntime is needed and a large model costs a few reads. ValueError for a file that is
    not a protobuf message (an ONNX model is one)."""
    props: dict[str, str] = {}
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        while fh.tell() < size:
            tag = _varint(fh)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                raise ValueError("field number 0")
            if field == _METADATA_PROPS_FIELD and wire == 2:
                key, value = _string_entry(_length_delimited(fh, size))
                props[key] = value
            else:  # the graph and every other field, by its length or width
                _skip(fh, wire, size)
    return props


def read_metadata(path: str | Path) -> dict[str, Any]:
    """``read_metadata_props`` with each value read as the JSON a masr export writes (an entry
    that is not JSON is left out): the metadata a reader checks ``format`` in. ValueError for
    a file that is not a protobuf message."""
    meta: dict[str, Any] = {}
    for key, value in read_metadata_props(path).items():
        with contextlib.suppress(ValueError):
            meta[key] = json.loads(value)
    return meta
