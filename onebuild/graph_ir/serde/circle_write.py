"""IR -> circle / tflite flatbuffers (`write_circle`, `write_tflite`), float and quantized.

Layout: the IR is channels-first (NCHW); TFLite's spatial operators are channels-last. Each IR
value is written in one layout, a permutation `perm` (stored = ir.transpose(perm)), chosen by its
producer: spatial ops write NHWC, layout-neutral ops (elementwise, concat, pads, reductions) keep
their input's layout, shape-sensitive ops (reshape, softmax off the last axis, matrix products)
ask for the IR layout. A TRANSPOSE is emitted only where a consumer needs another layout than its
producer wrote, which for CNNs means at graph inputs and outputs (both keep the IR's layout) and
before a flatten. Weights and other constants are permuted when written.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import ModelError, UnsupportedOpsError
from ..ir import Graph, Model, Node, Value
from ..quant.channel_activations import per_channel_value
from ..tensor import QuantParams
from . import circle_ops as ops
from . import circle_ops_nn as nn
from . import circle_ops_norm as norm
from . import circle_ops_shape as shape
from . import circle_table as lut
from .flatbuf import numbers, offsets, raw_bytes, table
from .naming import fresh_name
from .tflite_schema import (
    BUILTIN,
    EXACT_SCALES,
    IDENTIFIER,
    METADATA_BUFFER,
    METADATA_NAME,
    MODEL_METADATA,
    OPTIONS,
    PLACEHOLDER_FOR_GREATER_OP_CODES,
    SCHEMA_VERSION,
    TYPE_CODES,
)

Perm = tuple[int, ...] | None


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


@dataclass(slots=True)
class _Tensor:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    buffer: int  # index into the model's buffers; 0: no data
    quant: QuantParams | None


class Writer:
    """Collects tensors, buffers, operator codes and operators of one subgraph."""

    def __init__(self, graph: Graph, fmt: str = "circle"):
        self.graph, self.fmt = graph, fmt
        self.tensors: list[_Tensor] = []
        self.buffers: list[bytes] = [b""]
        self.opcodes: dict[str, int] = {}
        self.operators: list[tuple[int, list[int], list[int], str, dict]] = []
        self.home: dict[int, Perm] = {}  # id(value) -> the layout its producer wrote
        self.index: dict[tuple[int, Perm], int] = {}  # (id(value), layout) -> tensor index
        self.names: set[str] = set()
        # id(value) -> the IR column of each stored column, for a 2-D value written as the
        # flattened channels-last data (read only by dense layers, whose weights follow it)
        self.flat_order: dict[int, np.ndarray] = {}

    # -- tensors -------------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        return fresh_name(self.names, base)

    def new_tensor(self, name, dtype, shape, data=None, quant=None) -> int:
        if np.dtype(dtype) not in TYPE_CODES:
            raise ops.Unsupported  # bfloat16, float8, sub-byte integers, ...
        buffer = 0
        if data is not None:
            array = np.ascontiguousarray(data, dtype=np.dtype(dtype).newbyteorder("<"))
            self.buffers.append(array.tobytes())
            buffer = len(self.buffers) - 1
        self.tensors.append(_Tensor(self.fresh(name), np.dtype(dtype), tuple(shape), buffer, quant))
        return len(self.tensors) - 1

    def constant(self, array, name: str, quant: QuantParams | None = None) -> int:
        array = np.asarray(array)
        return self.new_tensor(name, array.dtype, array.shape, array, quant)

    def define(self, value: Value, perm: Perm, quant=None) -> int:
        """A tensor for `value` written by its producer in layout `perm`."""
        shape = value.shape if perm is None else tuple(value.shape[p] for p in perm)
        index = self.new_tensor(value.name, value.dtype, shape, None, quant or value.quant)
        self.home[id(value)] = perm
        self.index[(id(value), perm)] = index
        return index

    def alias(self, value: Value, source: Value) -> None:
        """`value` is `source` (Identity): the same tensor in the same layout."""
        perm = self.home[id(source)]
        self.home[id(value)] = perm
        self.index[(id(value), perm)] = self.index[(id(source), perm)]

    def get(self, value: Value, perm: Perm) -> int:
        """The tensor of `value` in layout `perm`, transposing (or permuting a constant)."""
        key = (id(value), perm)
        if key in self.index:
            return self.index[key]
        if value.is_const:
            data = value.numpy()
            if perm is not None:
                data = data.transpose(perm)
            quant = _permuted(value.quant, perm)
            index = self.constant(data, value.name, quant)
        else:
            home = self.home[id(value)]
            inner = tuple(range(len(value.shape))) if home is None else _inverse(home)
            wanted = tuple(range(len(value.shape))) if perm is None else perm
            q = [inner[p] for p in wanted]
            source = self.index[(id(value), home)]
            shape = value.shape if perm is None else tuple(value.shape[p] for p in perm)
            quant = _permuted(value.quant, perm)
            index = self.new_tensor(f"{value.name}_t", value.dtype, shape, None, quant)
            order = self.constant(np.asarray(q, np.int32), f"{value.name}_perm")
            self.op("TRANSPOSE", [source, order], [index])
        self.index[key] = index
        return index

    def home_of(self, value: Value) -> Perm:
        return None if value.is_const else self.home[id(value)]

    # -- operators -----------------------------------------------------------------------------
    def op(self, code: str, inputs: list[int], outputs: list[int], **options) -> None:
        opcode = self.opcodes.setdefault(code, len(self.opcodes))
        self.operators.append((opcode, inputs, outputs, code, options))

    def requantize(self, source: int, target: int) -> None:
        """QUANTIZE between two parameter sets; in circle through float (DEQUANTIZE, QUANTIZE:
        onert's QUANTIZE takes float input only)."""
        if self.fmt != "circle":
            self.op("QUANTIZE", [source], [target])
            return
        t = self.tensors[target]
        real = self.new_tensor(f"{t.name}_real", np.float32, t.shape)
        self.op("DEQUANTIZE", [source], [real])
        self.op("QUANTIZE", [real], [target])

    def run(self) -> None:
        for value in [*self.graph.inputs, *self.graph.outputs]:
            if value.dtype not in TYPE_CODES:
                raise ModelError(
                    f"circle/tflite export: {value.name!r} is {value.dtype}, which circle and "
                    f"tflite cannot hold (types: {', '.join(sorted(map(str, TYPE_CODES)))})"
                )
        for value in self.graph.inputs:
            self.define(value, None)
        _refuse(
            [n.name for n in self.graph.nodes if _per_channel_activations(n)],
            "take or give activations quantized per channel, which TFLite kernels cannot",
            'quantize with activation_granularity = "tensor" for circle',
        )
        _refuse(
            [n.name for n in self.graph.nodes if _writes_wider(n)],
            "compute in 8 bits and write int16, which onert and LiteRT refuse (CONV_2D output "
            "type must be the input's)",
            "quantize without mixed_precision.promote_outputs for circle",
        )
        unsupported = []
        for node in self.graph.nodes:
            mapping = WRITERS.get(node.op)
            try:
                if mapping is None:
                    raise ops.Unsupported
                mapping(self, node)
            except ops.Unsupported:
                unsupported.append((node.op, node.name))
                for value in node.outputs:  # placeholders, so later nodes can still be checked
                    if id(value) not in self.home:
                        self.home[id(value)] = None
                        self.index[(id(value), None)] = -1
        if unsupported:
            raise UnsupportedOpsError("circle/tflite export", unsupported)

    # -- serialization -------------------------------------------------------------------------
    def serialize(self) -> bytes:
        import flatbuffers

        b = flatbuffers.Builder(1024 + sum(len(d) for d in self.buffers))
        outputs = [self.get(v, None) for v in self.graph.outputs]
        if self.fmt == "circle":
            outputs = self._copied_outputs(outputs)
        inputs = [self.index[(id(v), None)] for v in self.graph.inputs]
        self._name_outputs(outputs)
        scales = [s for t in self.tensors if t.quant is not None for s in t.quant.scale]
        if scales:
            self.buffers.append(np.asarray(scales, "<f8").tobytes())
        buffers = [
            table(b, [(0, "offset", raw_bytes(b, data))] if data else []) for data in self.buffers
        ]
        tensors = [self._tensor(b, t) for t in self.tensors]
        operators = [self._operator(b, *op) for op in self.operators]
        subgraph = table(
            b,
            [
                (0, "offset", offsets(b, tensors)),
                (1, "offset", numbers(b, inputs, "int32")),
                (2, "offset", numbers(b, outputs, "int32")),
                (3, "offset", offsets(b, operators)),
                (4, "offset", b.CreateString(self.graph.name)),
            ],
        )
        codes = []
        for code in self.opcodes:
            number = BUILTIN[code]
            codes.append(
                table(
                    b,
                    [
                        (0, "byte", min(number, PLACEHOLDER_FOR_GREATER_OP_CODES)),
                        (2, "int", 1),
                        (3, "int", number),
                    ],
                )
            )
        if scales:  # the scales as float64, after the data buffers (see EXACT_SCALES)
            name = b.CreateString(EXACT_SCALES)
            entry = [
                (METADATA_NAME, "offset", name),
                (METADATA_BUFFER, "uint", len(self.buffers) - 1),
            ]
            metadata = table(b, entry)
        model = table(
            b,
            [
                (0, "uint", SCHEMA_VERSION[self.fmt]),
                (1, "offset", offsets(b, codes)),
                (2, "offset", offsets(b, [subgraph])),
                (3, "offset", b.CreateString("onebuild")),
                (4, "offset", offsets(b, buffers)),
                *([(MODEL_METADATA, "offset", offsets(b, [metadata]))] if scales else []),
            ],
        )
        b.Finish(model, file_identifier=IDENTIFIER[self.fmt])
        return bytes(b.Output())

    def _copied_outputs(self, outputs: list[int]) -> list[int]:
        """A graph output that an operator also reads, or that shares its tensor with another
        output of another name (a quantized output listed twice: one tensor cannot hold two
        names), is written by a copy (RESHAPE to its own shape) of that tensor, one copy per
        IR value. onert 0.1.0 with internally allocated outputs (as its Python API runs) plans
        an output that is read like an inner tensor: freed after its last reader, its memory
        is given to a later tensor, whose data the output returns. The reader folds the copies
        back (no node, or an Identity for a second name)."""
        read = {i for _, inputs, *_ in self.operators for i in inputs}
        held: dict[int, set[int]] = {}  # tensor -> the IR outputs it holds
        for value, index in zip(self.graph.outputs, outputs):
            held.setdefault(index, set()).add(id(value))
        copies: dict[tuple[int, int], int] = {}
        written = []
        for value, index in zip(self.graph.outputs, outputs):
            if index in read or len(held[index]) > 1:
                key = (index, id(value))
                if key not in copies:
                    t = self.tensors[index]
                    copy = self.new_tensor(f"{t.name}_out", t.dtype, t.shape, None, t.quant)
                    shape = self.constant(np.asarray(t.shape, np.int32), f"{t.name}_shape")
                    self.op("RESHAPE", [index, shape], [copy])
                    copies[key] = copy
                index = copies[key]
            written.append(index)
        return written

    def _name_outputs(self, outputs: list[int]) -> None:
        """Graph outputs keep their IR names (a transposed or aliased output's tensor takes the
        name from the tensor it was made from, which is renamed)."""
        by_name = {t.name: i for i, t in enumerate(self.tensors)}
        for value, index in zip(self.graph.outputs, outputs):
            tensor = self.tensors[index]
            if tensor.name == value.name:
                continue
            holder = by_name.get(value.name)
            if holder is not None:
                if holder in outputs:
                    continue  # another output already has it (an output listed twice)
                self.tensors[holder].name = self.fresh(f"{value.name}_inner")
                by_name[self.tensors[holder].name] = holder
            by_name.pop(tensor.name, None)
            tensor.name = value.name
            by_name[value.name] = index

    def _tensor(self, b, t: _Tensor) -> int:
        fields = [
            (0, "offset", numbers(b, t.shape, "int32")),
            (1, "byte", TYPE_CODES[t.dtype]),
            (2, "uint", t.buffer),
            (3, "offset", b.CreateString(t.name)),
        ]
        if t.quant is not None:
            q = t.quant
            quant = [
                (2, "offset", numbers(b, q.scale, "float32")),
                (3, "offset", numbers(b, q.zero_point, "int64")),
                (6, "int", q.axis or 0),
            ]
            fields.append((4, "offset", table(b, quant)))
        return table(b, fields)

    def _operator(self, b, opcode, inputs, outputs, code, options) -> int:
        fields = [
            (0, "uint", opcode),
            (1, "offset", numbers(b, inputs, "int32")),
            (2, "offset", numbers(b, outputs, "int32")),
        ]
        if code in OPTIONS:
            union, spec = OPTIONS[code]
            values = [(slot, kind, options.get(name, 0)) for slot, (name, kind) in enumerate(spec)]
            fields += [(3, "ubyte", union), (4, "offset", table(b, values))]
        return table(b, fields)


# The IR ops written, each by one mapping function (which raises `Unsupported` for nodes
# without an exact TFLite form).
WRITERS: dict[str, Callable] = {
    "Conv": nn.conv,
    "QConv": nn.conv,
    "Gemm": nn.gemm,
    "QGemm": nn.gemm,
    "MatMul": nn.matmul,
    **{op: ops.binary for op in ("Add", "Sub", "Mul", "Div", "QAdd", "QMul")},
    **{op: ops.unary for op in ops.UNARY},
    "Clip": ops.clip,
    "PRelu": ops.prelu,
    "Gelu": ops.unary,
    "ConvTranspose": nn.conv_transpose,
    "DepthToSpace": nn.depth_to_space,
    "Swish": ops.unary,
    "QLookup": lut.lookup,
    "Softmax": ops.softmax,
    "QSoftmax": ops.softmax,
    **{op: nn.pool for op in ("MaxPool", "AveragePool", "QAveragePool")},
    "ReduceMean": ops.reduce,
    "ReduceMax": ops.reduce,
    "Concat": ops.concat,
    "QConcat": ops.concat,
    "GlobalAveragePool": nn.global_pool,
    "GlobalMaxPool": nn.global_pool,
    "Reshape": ops.reshape,
    "Split": ops.split,
    "Transpose": ops.transpose,
    "Pad": ops.pad,
    "Slice": shape.slice_,
    "Resize": norm.resize,
    "BatchNormalization": norm.batch_norm,
    "LRN": norm.lrn,
    "LayerNormalization": norm.layer_norm,
    "Identity": ops.identity,
    "Dropout": ops.identity,
    "QuantizeLinear": ops.quantize_op,
    "DequantizeLinear": ops.quantize_op,
    "Requantize": ops.quantize_op,
}


def _refuse(nodes: list[str], what: str, fix: str) -> None:
    """One line for every node the export cannot write, for one reason."""
    if nodes:
        listed = ", ".join(repr(n) for n in nodes[:5]) + ", ..." * (len(nodes) > 5)
        raise ModelError(
            f"circle/tflite export: {len(nodes)} node(s) {what} (nodes {listed}); {fix}"
        )


def _per_channel_activations(node: Node) -> bool:
    """A computed value quantized per channel (`quantize.activation_granularity`): TFLite
    kernels take per-tensor activations only."""
    return any(map(per_channel_value, [*node.inputs, *node.outputs]))


def _writes_wider(node: Node) -> bool:
    """A QConv/QGemm whose output type is not its input's (a uint8 layer writing int16:
    `quantize.mixed_precision.promote_outputs`); onert 0.1.0 refuses it when loading
    (OperationValidator), LiteRT when preparing (conv.cc: output->type != input_type)."""
    x = node.inputs[0] if node.inputs else None
    return node.op in ("QConv", "QGemm") and x is not None and x.dtype != node.outputs[0].dtype


def _permuted(quant: QuantParams | None, perm: Perm) -> QuantParams | None:
    if quant is None or quant.axis is None or perm is None:
        return quant
    return QuantParams(quant.scale, quant.zero_point, perm.index(quant.axis))


def write_flatbuffer(model: Model, fmt: str) -> bytes:
    """The main graph of `model` as a circle (`fmt="circle"`) or tflite flatbuffer."""
    writer = Writer(model.main, fmt)
    writer.run()
    return writer.serialize()


def write_circle(model: Model) -> bytes:
    return write_flatbuffer(model, "circle")


def write_tflite(model: Model) -> bytes:
    return write_flatbuffer(model, "tflite")


__all__ = ["Writer", "write_circle", "write_tflite"]
