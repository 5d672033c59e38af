"""A small builder over ``onnx.helper``, below both graph modules (``graph``, ``mass_graph``).

Node and constant names come from one counter per graph, so the same calls in the same order give
the same file byte for byte: keep the order of calls when moving graph code around.

Constants are kept as NumPy arrays until the model is complete (``arrays``); their initializers
are shells (name, type, shape) that ``masr.export.external`` fills in place or points at a
weights file. A protobuf copy of a graph is then cheap, and an export at Million Playlist size
never holds its tables twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper


class Graph:
    """Unique names, shared int64 constants, one call per node."""

    def __init__(self, prefix: str = "", shared: Graph | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []  # shells; the data is in ``arrays``
        self.arrays: dict[str, np.ndarray] = {}
        self._prefix = prefix
        self._count = 0
        self._ints: dict[tuple, str] = {}
        self._outer = shared  # a Loop body puts its constants in the outer graph

    def ints(self, *values: int) -> str:
        """A shared int64 constant: ``ints(1)`` is [1] (axes, shapes), ``ints()`` is scalar 0."""
        if self._outer is not None:
            return self._outer.ints(*values)
        key = values
        if key not in self._ints:
            value = np.array(values, dtype=np.int64) if values else np.array(0, dtype=np.int64)
            self._ints[key] = self.const("i" + "_".join(str(v) for v in values), value)
        return self._ints[key]

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self._prefix}{hint}_{self._count}"

    def const(self, hint: str, value: Any, dtype: Any = None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.name(hint)
        if not array.flags.c_contiguous:
            # copy(order="C"), not ascontiguousarray: that would turn a scalar into shape (1,)
            array = array.copy(order="C")
        self.initializers.append(shell(name, array))
        self.arrays[name] = array
        return name

    def op(self, op_type: str, *inputs: str, n_out: int = 1, hint: str | None = None, **attrs: Any):
        outputs = [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def used_initializers(self) -> list[onnx.TensorProto]:
        """Initializers some node (or Loop body) reads."""
        used: set[str] = set()

        def visit(nodes: list[onnx.NodeProto]) -> None:
            for node in nodes:
                used.update(node.input)
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.GRAPH:
                        visit(list(attr.g.node))

        visit(self.nodes)
        return [t for t in self.initializers if t.name in used]


def shell(name: str, array: np.ndarray) -> onnx.TensorProto:
    """An initializer without its data: name, element type and shape of ``array``."""
    tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
    tensor.dims.extend(array.shape)
    return tensor


def f32(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy or view: the dtype of every float constant in the graph."""
    return np.ascontiguousarray(a, dtype=np.float32)
