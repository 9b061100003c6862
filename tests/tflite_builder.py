"""Small .tflite files written operator by operator, as the TensorFlow Lite converter spells
them (an int8 SOFTMAX, a quantized PRELU, a STRIDED_SLICE): forms onebuild's own writer never
makes, built with its flatbuffer `Writer` so the tests need no converter."""

from dataclasses import dataclass, field

import numpy as np

from onebuild.graph_ir.ir import Graph, Value
from onebuild.graph_ir.serde.circle_write import Writer
from onebuild.graph_ir.tensor import QuantParams


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    quant: tuple[float, int] | None = None  # (scale, zero point), per tensor
    data: np.ndarray | None = None
    scales: tuple | None = None  # per channel: (scales, zero points, axis)


@dataclass
class Op:
    code: str
    inputs: list[str]
    outputs: list[str]
    options: dict = field(default_factory=dict)


def build(tensors: list[Tensor], ops: list[Op], inputs: list[str], outputs: list[str]) -> bytes:
    """A tflite of `ops` over `tensors` (constants carry `data`), with these graph I/O."""
    graph = Graph("main")
    writer = Writer(graph, "tflite")
    index, values = {}, {}
    for t in tensors:
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
