"""Small .tflite files written operator by operator, as the TensorFlow Lite converter spells
them (an int8 SOFTMAX, a quantized PRELU, a STRIDED_SLICE): forms onebuild's own writer never
makes, built with its flatbuffer `Writer` so the tests need no converter."""

from dataclasses import dataclass, field

import numpy as np

from onebuild.graph_ir.ir import Graph, Value
from onebuild.graph_ir.serde.circle_write import Writer
from onebuild.graph_ir.serde.flatbuf import numbers, offsets, table
from onebuild.graph_ir.serde.tflite_schema import TYPE_CODES
from onebuild.graph_ir.tensor import QuantParams


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    quant: tuple[float, int] | None = None  # (scale, zero point), per tensor
    data: np.ndarray | None = None
    scales: tuple | None = None  # per channel: (scales, zero points, axis)
    sparse: int | None = None  # stored sparse: CSR over the last axis, in blocks of this size


@dataclass
class Op:
    code: str
    inputs: list[str]
    outputs: list[str]
    options: dict = field(default_factory=dict)


def build(tensors: list[Tensor], ops: list[Op], inputs: list[str], outputs: list[str]) -> bytes:
    """A tflite of `ops` over `tensors` (constants carry `data`), with these graph I/O."""
    graph = Graph("main")
    writer = _SparseWriter(graph, "tflite")
    index, values = {}, {}
    for t in tensors:
        if t.sparse is not None:
            stored, levels = _compressed(np.asarray(t.data, t.dtype), t.sparse)
            index[t.name] = writer.new_tensor(t.name, t.dtype, t.shape, stored)
            writer.sparsity[index[t.name]] = (len(t.shape), t.sparse, levels)
            continue
        quant = None
        if t.quant is not None:
            quant = QuantParams((_f32(t.quant[0]),), (int(t.quant[1]),))
        if t.scales is not None:
            scales, zero_points, axis = t.scales
            quant = QuantParams(tuple(map(_f32, scales)), tuple(map(int, zero_points)), axis)
        if t.data is not None:
            index[t.name] = writer.constant(np.asarray(t.data, t.dtype), t.name, quant)
            continue
        value = Value(t.name, np.dtype(t.dtype), t.shape, quant=quant)
        values[t.name] = value
        index[t.name] = writer.define(value, None)
    graph.inputs.extend(values[name] for name in inputs)
    graph.outputs.extend(values[name] for name in outputs)
    for op in ops:
        writer.op(op.code, [index[n] for n in op.inputs], [index[n] for n in op.outputs],
                  **op.options)  # fmt: skip
    return writer.serialize()


def _compressed(dense: np.ndarray, block: int) -> tuple[np.ndarray, list]:
    """TFLite sparsity of `dense`: every axis dense but the last, stored CSR by blocks of
    `block` columns (1: single elements); the stored values and the levels' (format, dense
    size, segments, indices)."""
    rows = dense.reshape(-1, dense.shape[-1] // block, block)
    kept = np.abs(rows).max(axis=2) > 0
    segments = np.concatenate([[0], np.cumsum(kept.sum(axis=1))])
    indices = np.nonzero(kept)[1]
    levels = [(0, size, None, None) for size in dense.shape[:-1]]
    levels.append((1, 0, segments, indices))
    if block > 1:
        levels.append((0, block, None, None))
    return rows[kept].reshape(-1), levels


class _SparseWriter(Writer):
    """onebuild's writer, with `sparsity` parameters on some tensors."""

    def __init__(self, graph, fmt):
        super().__init__(graph, fmt)
        self.sparsity: dict[int, tuple] = {}

    def _tensor(self, b, t) -> int:
        index = next(i for i, known in enumerate(self.tensors) if known is t)
        if index not in self.sparsity:
            return super()._tensor(b, t)
        rank, block, levels = self.sparsity[index]
        built = []
        for fmt, size, segments, indices in levels:
            fields = [(0, "byte", fmt), (1, "int", size)]
            if segments is not None:
                segment_table = table(b, [(0, "offset", numbers(b, segments, "uint16"))])
                index_table = table(b, [(0, "offset", numbers(b, indices, "uint8"))])
                fields += [(2, "ubyte", 2), (3, "offset", segment_table)]
                fields += [(4, "ubyte", 3), (5, "offset", index_table)]
            built.append(table(b, fields))
        order = list(range(rank + (block > 1)))
        sparsity = [(0, "offset", numbers(b, order, "int32"))]
        if block > 1:
            sparsity.append((1, "offset", numbers(b, [rank - 1], "int32")))
        sparsity.append((2, "offset", offsets(b, built)))
        parameters = table(b, sparsity)
        fields = [
            (0, "offset", numbers(b, t.shape, "int32")),
            (1, "byte", TYPE_CODES[t.dtype]),
            (2, "uint", t.buffer),
            (3, "offset", b.CreateString(t.name)),
            (6, "offset", parameters),
        ]
        return table(b, fields)


def _f32(scale: float) -> float:
    """A scale as the file holds it (float32), so the float64 copy onebuild's writer adds
    (metadata EXACT_SCALES) says the same: the file is read as a converter's would be."""
    return float(np.float32(scale))


def run_litert(data: bytes, feeds: list[np.ndarray], builtin: bool = False) -> list[np.ndarray]:
    """LiteRT's outputs, one feed at a time (its default kernels, XNNPACK where it takes the
    operator; `builtin`: its own reference-like kernels only)."""
    from ai_edge_litert import interpreter as litert

    resolver = litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin else None
    kwargs = {"experimental_op_resolver_type": resolver} if builtin else {}
    interpreter = litert.Interpreter(model_content=data, **kwargs)
    interpreter.allocate_tensors()
    source = interpreter.get_input_details()[0]["index"]
    target = interpreter.get_output_details()[0]["index"]
    results = []
    for x in feeds:
        interpreter.set_tensor(source, x)
        interpreter.invoke()
        results.append(interpreter.get_tensor(target).copy())
    return results
