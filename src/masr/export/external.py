"""ONNX external data: the weights in one file beside the ``.onnx`` when one protobuf cannot hold
them.

A protobuf message is limited to 2 GiB (its lengths are signed 32-bit), and an AMASR export at
Million Playlist size holds three song tables of ~0.6 GB each before the user and playlist
tables. Past ``PROTO_LIMIT`` (or when asked: ``masr export --external-data``) every initializer
of at least ``MIN_EXTERNAL_BYTES`` moves into ``NAME.onnx.weights``; the graph keeps each one's
offset and length and the file name relative to the model, which is how ONNX Runtime finds it,
so ``masr score --model NAME.onnx`` stays one path. The file's SHA-256 goes into the metadata
(as the id maps' do): a weights file of another export is refused with one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

#: The largest protobuf message, in bytes. Module-level so that a test can lower it and force
#: the external layout on a tiny model.
PROTO_LIMIT = 2**31 - 1
#: Room kept for the graph itself (nodes, names, metadata) next to the tensors' bytes.
HEADROOM = 1 << 24
#: Smaller initializers (shapes, axes, scalars) stay inside the ``.onnx``.
MIN_EXTERNAL_BYTES = 1024
#: Each tensor starts on a page boundary in the weights file, so a reader may map it.
ALIGN = 4096


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the initializers' data (what decides the protobuf's size)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def too_large(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> bool:
    """Whether the model, once the builder's ``arrays`` are in it, would not fit in one
    protobuf (``PROTO_LIMIT``, read at call time)."""
    size = tensor_bytes(model) + sum(a.nbytes for a in arrays.values())
    return size + HEADROOM > PROTO_LIMIT


def embed(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
    """Fill the model's initializer shells with their ``arrays`` (consumed: each array is let go
    as soon as it is in the protobuf)."""
    for tensor in model.graph.initializer:
        if tensor.name in arrays:
            tensor.CopyFrom(numpy_helper.from_array(arrays.pop(tensor.name), tensor.name))


def write_arrays(
    model: onnx.ModelProto, arrays: dict[str, np.ndarray], path: str | Path, location: str
) -> int:
    """Write the large ``arrays`` to ``path`` (each page-aligned) and point their initializer
    shells at ``location`` (the name the file will have next to the model: ``path`` may be a
    temporary name); embed the small ones. ``arrays`` is consumed. Returns the file's size."""
    offset = 0
    with open(path, "wb") as fh:
        for tensor in model.graph.initializer:
            array = arrays.get(tensor.name)
            if array is None or array.nbytes < MIN_EXTERNAL_BYTES:
                continue
            del arrays[tensor.name]
            gap = -offset % ALIGN
            fh.write(b"\0" * gap)
            offset += gap
            # ONNX stores little-endian bytes (a view on little-endian machines)
            little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
            fh.write(memoryview(little).cast("B"))
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", offset),
                               ("length", array.nbytes)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            offset += array.nbytes
    embed(model, arrays)  # the small ones
    return offset
