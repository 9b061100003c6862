"""circle / tflite flatbuffers -> IR (`read_circle`, `read_tflite`), every offset verified.

TFLite tensors are channels-last; the IR is channels-first. Each TFLite tensor is known as one or
more IR values, each with the permutation `perm` relating them (tflite = value.transpose(perm)).
Spatial operators read their input as NCHW (perm NHWC) and define their output the same way;
layout-neutral operators keep their input's perm; shape-sensitive ones (reshape, transpose,
matrix products) read the TFLite layout itself (perm None). An IR Transpose is made only where a
reader needs a perm no IR value of the tensor has yet, so a CNN's layout changes stay at its
graph inputs and outputs, as in the source model's own semantics.
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import FormatError, IRError, ModelError, OneBuildError, UnsupportedOpsError
from ..ir import Graph, Model, Value
from ..passes.cleanup import eliminate_dead_code
from ..tensor import QuantParams
from . import circle_read_nn as nn
from . import circle_read_ops as ops
from . import circle_read_shape as shape
from . import circle_table as lut
from .circle_arith import use_onert_arithmetic
from .flatbuf import Buffer, Table
from .tflite_schema import (
    BUILTIN_NAMES,
    EXACT_SCALES,
    IDENTIFIER,
    METADATA_BUFFER,
    METADATA_NAME,
    MODEL_METADATA,
    OPERATOR_NAMES,
    TENSOR_TYPES,
)
from .tflite_sparse import densify

MAX_RANK = 64  # as IR files
MAX_TENSOR_BYTES = 1 << 34  # no tensor of a loadable model is this large (as IR files)
MAX_FILE = 1 << 31  # flatbuffers address 2 GiB; larger models keep buffers outside (unsupported)


def _inverse(perm):
    return tuple(int(i) for i in np.argsort(perm))


@dataclass(slots=True)
class TensorInfo:
    index: int
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    data: np.ndarray | None  # a constant's contents
    quant: QuantParams | None


class Reader:
    """One subgraph being converted: tensors, their IR values per layout, the graph."""

    def __init__(self, buf: Buffer, model: Table, subgraph: Table):
        self.buf = buf
        self.graph = Graph(subgraph.string(4, "subgraph name") or "main")
        buffers = model.tables(4, "buffers")
        self.tensors = [
            self._tensor(i, t, buffers) for i, t in enumerate(subgraph.tables(0, "tensors"))
        ]
        self._exact_scales(model, buffers)
        self.values: dict[int, dict] = {}  # tensor index -> {perm: Value}
        self.functions: dict[int, tuple] = {}  # id(QLookup output) -> (input, (op, attrs))
        self.readers: dict[int, set] = {}  # tensor index -> {(operator name, input position)}
        self.producers: dict[int, tuple] = {}  # tensor index -> (operator name, input indices)
        self.tables: dict[int, tuple] = {}  # tensor index -> (its QLookup read from GATHER, perm)
        # tensor index -> the IR column of each stored column (a flatten of channels-last data
        # whose IR value is the IR's flatten; see circle_read_shape.reshape)
        self.column_order: dict[int, np.ndarray] = {}
        self.graph.reserve(t.name for t in self.tensors)

    def fail(self, what: str) -> FormatError:
        return self.buf.fail(what)

    def _tensor(self, index: int, t: Table, buffers: list[Table]) -> TensorInfo:
        what = f"tensor {index}"
        code = t.scalar(1, "b")
        if code not in TENSOR_TYPES:
            raise ModelError(f"{self.buf.source}: {what} has unsupported element type {code}")
        dtype = TENSOR_TYPES[code]
        shape = tuple(int(d) for d in t.array(0, "int32", f"{what} shape"))
        if any(d < 0 for d in shape):
            raise ModelError(f"{self.buf.source}: {what} has a dynamic shape {list(shape)}")
        if len(shape) > MAX_RANK or math.prod(shape) * dtype.itemsize > MAX_TENSOR_BYTES:
            raise ModelError(f"{self.buf.source}: {what} shape {list(shape)} is too large")
        name = t.string(3, f"{what} name") or f"tensor_{index}"
        sparsity = t.table(6, f"{what} sparsity")
        buffer = t.scalar(2, "I")
        data = None
        if buffer:
            if buffer >= len(buffers):
                raise self.fail(f"{what} names buffer {buffer} of {len(buffers)}")
            raw = buffers[buffer].bytes(0, f"buffer {buffer}")
            if sparsity is not None:  # the nonzero values only (DENSIFY reads it)
                if len(raw) % dtype.itemsize:
                    raise self.fail(f"{what} '{name}' has {len(raw)} bytes of {dtype}")
                values = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)
                data = densify(sparsity, values, shape, f"{self.buf.source}: {what} '{name}'")
            elif len(raw):
                count = int(np.prod(shape, dtype=np.int64))
                if len(raw) != count * dtype.itemsize:
                    raise self.fail(
                        f"{what} '{name}' has {len(raw)} bytes for {count} elements of {dtype}"
                    )
                data = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        if sparsity is not None and data is None:
            raise ModelError(f"{self.buf.source}: {what} '{name}' is sparse but not constant")
        quant = self._quant(t, f"{what} '{name}'", shape, dtype)
        return TensorInfo(index, name, dtype, shape, data, quant)

    def _quant(self, t: Table, what: str, shape, dtype: np.dtype) -> QuantParams | None:
        q = t.table(4, f"{what} quantization")
        if q is None:
            return None
        scale = q.array(2, "float32", f"{what} scales")
        zero = q.array(3, "int64", f"{what} zero points")
        if not len(scale):
            return None
        if len(zero) != len(scale) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ModelError(f"{self.buf.source}: {what} has bad quantization parameters")
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            if zero.min() < info.min or zero.max() > info.max:
                raise ModelError(f"{self.buf.source}: {what} has zero points outside {dtype}")
        axis = q.scalar(6, "i")
        if len(scale) == 1:
            return QuantParams((float(scale[0]),), (int(zero[0]),), None)
        if not 0 <= axis < len(shape) or shape[axis] != len(scale):
            raise ModelError(
                f"{self.buf.source}: {what} of shape {list(shape)} has {len(scale)} scales for "
                f"axis {axis}, which is not an axis of that length (LiteRT refuses this file "
                "too; TFLite Micro reads it): quantize the float model with onebuild instead"
            )
        return QuantParams(tuple(float(s) for s in scale), tuple(int(z) for z in zero), axis)

    def _exact_scales(self, model: Table, buffers: list[Table]) -> None:
        """onebuild's float64 scales (metadata EXACT_SCALES) replace the float32 ones, when
        they are as many and each rounds to the file's float32 scale; else they are ignored."""
        entries = [
            m
            for m in model.tables(MODEL_METADATA, "metadata")
            if m.string(METADATA_NAME, "metadata name") == EXACT_SCALES
        ]
        quantized = [t for t in self.tensors if t.quant is not None]
        if len(entries) != 1 or not quantized:
            return
        index = entries[0].scalar(METADATA_BUFFER, "I")
        if index >= len(buffers):
            raise self.fail(f"metadata '{EXACT_SCALES}' names buffer {index} of {len(buffers)}")
        raw = buffers[index].bytes(0, f"buffer {index}")
        count = sum(len(t.quant.scale) for t in quantized)
        if len(raw) != 8 * count:
            return
        exact = np.frombuffer(raw, "<f8")
        stored = np.concatenate([np.asarray(t.quant.scale, np.float64) for t in quantized])
        if not np.all(np.isfinite(exact)) or not np.array_equal(exact.astype(np.float32), stored):
            return
        start = 0
        for t in quantized:
            n = len(t.quant.scale)
            scale = tuple(float(x) for x in exact[start : start + n])
            t.quant = QuantParams(scale, t.quant.zero_point, t.quant.axis)
            start += n

    # -- values ----------------------------------------------------------------------------------
    def info(self, index: int) -> TensorInfo:
        if not 0 <= index < len(self.tensors):
            raise self.fail(f"tensor index {index} of {len(self.tensors)}")
        return self.tensors[index]

    def const(self, index: int) -> np.ndarray | None:
        return self.info(index).data

    def perm_of(self, index: int):
        """A perm the tensor is already known in (the first one defined)."""
        known = self.values.get(index)
        return next(iter(known)) if known else None

    def value(self, index: int, perm=None) -> Value:
        """An IR value `v` with tflite tensor == v.transpose(perm)."""
        t = self.info(index)
        known = self.values.setdefault(index, {})
        if perm in known:
            return known[perm]
        if t.data is not None:
            data = t.data if perm is None else t.data.transpose(_inverse(perm))
            value = self.graph.add_constant(np.ascontiguousarray(data), t.name)
            value.quant = _permuted(t.quant, perm)
        elif known:
            have, source = next(iter(known.items()))
            rank = len(t.shape)
            have = tuple(range(rank)) if have is None else have
            order = [have[i] for i in (_inverse(perm) if perm else range(rank))]
            value = self.graph.make_node(
                "Transpose", [source], {"perm": order}, f"{t.name}/t"
            ).output
            value.quant = _permuted(t.quant, perm)
        else:
            raise self.fail(f"tensor {index} '{t.name}' is read before it is written")
        known[perm] = value
        return value

    def define(self, index: int, value: Value, perm=None) -> None:
        t = self.info(index)
        expected = t.shape if perm is None else tuple(t.shape[i] for i in _inverse(perm))
        if tuple(value.shape) != expected:
            raise ModelError(
                f"{self.buf.source}: tensor {index} '{t.name}' is {list(t.shape)} but its "
                f"operator gives {list(value.shape)}"
            )
        if t.quant is not None:
            value.quant = _permuted(t.quant, perm)
        self.graph.rename(value, t.name)
        self.values.setdefault(index, {})[perm] = value

    def output(self, index: int) -> Value:
        """The IR-layout value of graph output `index`, named as the tensor (an output that
        is a layout alias of another tensor's value takes the name from it)."""
        value = self.value(index)
        name = self.info(index).name
        if value.name != name:
            if value.producer is None or value in self.graph.outputs:
                quant = value.quant  # a second name of a quantized output keeps its parameters
                value = self.graph.make_node("Identity", [value], {}, f"{name}/identity").output
                value.quant = quant
            for other in self.values.get(index, {}).values():  # the tensor in another layout
                if other is not value and other.name == name and other.producer is not None:
                    self.graph.rename(other, f"{name}_inner")  # gives the output its name
            self.graph.rename(value, name)
        return value

    def alias(self, index: int, value: Value, perm) -> None:
        """Tensor `index` is `value` seen through `perm` (no node)."""
        t = self.info(index)
        expected = t.shape if perm is None else tuple(value.shape[p] for p in perm)
        if tuple(t.shape) != expected:
            raise ModelError(f"{self.buf.source}: tensor {index} '{t.name}' has the wrong shape")
        self.values.setdefault(index, {})[perm] = value


# Each builtin read, by one mapping function (which raises `Malformed` for an operator that
# does not make sense).
def _with(fn, **kw) -> Callable:
    return lambda r, i, o, opts: fn(r, i, o, opts, **kw)


READERS: dict[str, Callable] = {
    "CONV_2D": nn.conv,
    "DEPTHWISE_CONV_2D": _with(nn.conv, depthwise=True),
    "FULLY_CONNECTED": nn.fully_connected,
    "BATCH_MATMUL": nn.batch_matmul,
    "TRANSPOSE_CONV": nn.conv_transpose,
    "GELU": ops.gelu,
    "MAX_POOL_2D": _with(nn.pool, code="MAX_POOL_2D"),
    "AVERAGE_POOL_2D": _with(nn.pool, code="AVERAGE_POOL_2D"),
    **{c: _with(ops.binary, code=c) for c in ("ADD", "SUB", "MUL", "DIV", "POW")},
    **{c: _with(ops.unary, code=c) for c in ops.UNARY},
    "RELU6": _with(ops.clamp, code="RELU6"),
    "RELU_N1_TO_1": _with(ops.clamp, code="RELU_N1_TO_1"),
    "SOFTMAX": ops.softmax,
    "PRELU": ops.prelu,
    "DEPTH_TO_SPACE": shape.depth_to_space,
    "CONCATENATION": shape.concatenation,
    "RESHAPE": shape.reshape,
    "SPLIT": _with(shape.split, code="SPLIT"),
    "SPLIT_V": _with(shape.split, code="SPLIT_V"),
    "TRANSPOSE": shape.transpose,
    "MEAN": _with(ops.reduce, code="MEAN"),
    "REDUCE_MAX": _with(ops.reduce, code="REDUCE_MAX"),
    **{c: _with(shape.pad, code=c) for c in ("PAD", "PADV2", "MIRROR_PAD")},
    "SLICE": shape.slice_op,
    "STRIDED_SLICE": shape.strided_slice,
    "RESIZE_BILINEAR": _with(nn.resize, code="RESIZE_BILINEAR"),
    "RESIZE_NEAREST_NEIGHBOR": _with(nn.resize, code="RESIZE_NEAREST_NEIGHBOR"),
    "LOCAL_RESPONSE_NORMALIZATION": nn.lrn,
    "CAST": lut.read_cast,
    "GATHER": lut.read_gather,
    "QUANTIZE": lut.read_quantize,
    "DEQUANTIZE": _with(ops.quantize_op, code="DEQUANTIZE"),
    "DENSIFY": ops.densify,
}


_POOL = {"ceil_mode": 0, "dilations": [1, 1], "count_include_pad": 0}
DEFAULTS = {  # attributes of the IR ops the reader makes, where TFLite has no counterpart
    "MaxPool": {"ceil_mode": 0, "dilations": [1, 1]},
    "AveragePool": _POOL,
    "QAveragePool": _POOL,
    "Gemm": {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
    "Pad": {"mode": "constant", "value": 0.0},
}


def _permuted(quant, perm):
    """Parameters of a tensor's IR value in `perm` (the channel axis moves with it)."""
    if quant is None or quant.axis is None or perm is None:
        return quant
    return QuantParams(quant.scale, quant.zero_point, perm[quant.axis])


def _builtin(buf: Buffer, code: Table, index: int) -> int | str:
    custom = code.string(1, f"operator code {index} custom code")
    if custom:
        return f"CUSTOM:{custom}"
    deprecated = code.scalar(0, "b")
    builtin = code.scalar(3, "i")
    return max(deprecated, builtin)


def quantized_flatbuffer(path: str | os.PathLike) -> bool:
    """Whether the circle/tflite file at `path` gives quantization parameters to a subgraph
    input or an operator output (what `from_qdq.graph_is_quantized` asks of its import), read
    through mmap without loading buffers. False for a file that is no well-formed model (its
    import says what is wrong)."""
    import mmap

    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            buf = Buffer(m, str(path))
            try:
                return len(m) <= MAX_FILE and _states_quantization(buf.root())
            finally:
                buf.data.release()
    except (OSError, ValueError, IndexError, OneBuildError):
        return False


def _states_quantization(root: Table) -> bool:
    sub = root.tables(2, "subgraphs")[0]
    tensors = sub.tables(0, "tensors")
    produced = {int(i) for i in sub.array(1, "int32", "subgraph inputs")}
    for op in sub.tables(3, "operators"):
        produced.update(int(i) for i in op.array(2, "int32", "operator outputs"))
    for index in sorted(i for i in produced if 0 <= i < len(tensors)):
        q = tensors[index].table(4, "tensor quantization")
        if q is not None and len(q.array(2, "float32", "tensor scales")):
            return True
    return False


HINTS = {  # what to do about an operator onebuild does not read
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "TFLite's LSTM is not read yet: import the model's ONNX "
    "export (its LSTM operator is supported, float and quantized)",
    "SVDF": "SVDF is not read yet: import the model's ONNX export",
}


def _check_supported(buf: Buffer, codes: list, operators: list[Table], source: str) -> None:
    """Every operator must have a reader: else one error listing them all, with what to do
    about the ones `HINTS` knows."""
    unsupported = []
    for i, op in enumerate(operators):
        opcode = op.scalar(0, "I")
        if opcode >= len(codes):
            raise buf.fail(f"operator {i} names operator code {opcode} of {len(codes)}")
        code = codes[opcode]
        name = OPERATOR_NAMES.get(code, f"builtin {code}") if isinstance(code, int) else code
        if name not in READERS:
            unsupported.append((name, f"operator {i}"))
    if unsupported:
        hints = [HINTS[n] for n in sorted({n for n, _ in unsupported}) if n in HINTS]
        raise UnsupportedOpsError(source, unsupported, "; ".join(hints))


def read_flatbuffer(data: bytes | str | os.PathLike, fmt: str | None = None) -> Model:
    """A circle or tflite model (bytes or a path) as IR; `fmt` checks the file identifier."""
    source = "<bytes>"
    if not isinstance(data, bytes | bytearray | memoryview):
        source = str(data)
        path = Path(data)
        if not path.is_file():
            raise FormatError(f"{path}: no such file")
        if path.stat().st_size > MAX_FILE:
            raise FormatError(f"{path}: larger than 2 GiB (buffers outside the flatbuffer)")
        data = path.read_bytes()
    buf = Buffer(data, source)
    root = buf.root(IDENTIFIER[fmt] if fmt else None)
    if not fmt and bytes(buf.data[4:8]) not in IDENTIFIER.values():
        raise buf.fail(f"file identifier {bytes(buf.data[4:8])!r} is neither CIR0 nor TFL3")
    codes = [_builtin(buf, c, i) for i, c in enumerate(root.tables(1, "operator codes"))]
    subgraphs = root.tables(2, "subgraphs")
    if not subgraphs:
        raise ModelError(f"{source}: the model has no subgraph")
    sub = subgraphs[0]
    operators = sub.tables(3, "operators")
    _check_supported(buf, codes, operators, source)
    reader = Reader(buf, root, sub)
    for index in sub.array(1, "int32", "subgraph inputs"):
        t = reader.info(int(index))
        value = reader.graph.add_input(t.name, t.dtype, t.shape)
        reader.graph.rename(value, t.name)
        value.quant = t.quant
        reader.values[int(index)] = {None: value}
    for op in operators:  # who reads each tensor (a flatten before dense layers looks ahead)
        name = (
            BUILTIN_NAMES.get(codes[op.scalar(0, "I")]) if op.scalar(0, "I") < len(codes) else None
        )
        operands = [int(x) for x in op.array(1, "int32", "operator inputs")]
        for position, x in enumerate(operands):
            reader.readers.setdefault(x, set()).add((name, position))
        for x in op.array(2, "int32", "operator outputs"):
            reader.producers[int(x)] = (name, operands)
    for index in sub.array(2, "int32", "subgraph outputs"):
        reader.readers.setdefault(int(index), set()).add(("output", 0))
    for i, op in enumerate(operators):
        name = BUILTIN_NAMES[codes[op.scalar(0, "I")]]
        inputs = [int(x) for x in op.array(1, "int32", f"operator {i} inputs")]
        outputs = [int(x) for x in op.array(2, "int32", f"operator {i} outputs")]
        options = op.table(4, f"operator {i} options")
        try:
            READERS[name](reader, inputs, outputs, options)
        except ops.Malformed as error:
            raise ModelError(f"{source}: operator {i} ({name}): {error}") from None
        except (
            AttributeError,
            IndexError,
            KeyError,
            TypeError,
            ValueError,
            ZeroDivisionError,
            IRError,
        ) as error:
            # inconsistent shapes, options or operand counts of a damaged or foreign file
            raise ModelError(
                f"{source}: operator {i} ({name}) does not fit its tensors: "
                f"{type(error).__name__}: {error}"
            ) from None
    for index in sub.array(2, "int32", "subgraph outputs"):
        reader.graph.outputs.append(reader.output(int(index)))
    eliminate_dead_code(reader.graph)  # pads folded into convolutions and pools
    for node in reader.graph.nodes:  # the canonical attributes IR files spell out
        node.attrs = {**DEFAULTS.get(node.op, {}), **node.attrs}
    if bytes(buf.data[4:8]) == IDENTIFIER["circle"]:  # what the file asks of onert's kernels
        use_onert_arithmetic(reader.graph.nodes)  # (LiteRT's for tflite: onebuild's own)
    return Model([reader.graph], {"source_format": fmt or "circle/tflite"})


def read_circle(data: bytes | str | os.PathLike) -> Model:
    return read_flatbuffer(data, "circle")


def read_tflite(data: bytes | str | os.PathLike) -> Model:
    return read_flatbuffer(data, "tflite")
