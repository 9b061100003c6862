"""The QDQ export of lookup tables (`onnx_export`): exact integer ONNX ops, so onnxruntime
computes every code as onebuild's kernels do."""

import numpy as np
import onnx
from onnx import helper

from ..ir import Node


def lookup(ex, node: Node) -> None:
    """QLookup exactly: a Gather from the table (one per channel: from its rows laid end to
    end, each channel offset by its row's start)."""
    x, table = node.inputs
    codes = ex.fresh(f"{node.name}_codes")
    ex.emit("Cast", [x.name], [codes], f"{node.name}/cast", to=onnx.TensorProto.INT32)
    index = ex.fresh(f"{node.name}_index")
    offset = np.int32(np.iinfo(x.dtype).min)
    source = table.name
    if len(table.shape) == 2:  # one table per channel: gather from the rows laid end to end
        rows, width = table.shape
        starts = np.arange(rows, dtype=np.int32) * np.int32(width) - offset
        offset = -starts.reshape((1, -1) + (1,) * (len(x.shape) - 2))
        source = ex.constant(table.numpy().ravel(), f"{node.name}_rows")
    offset = ex.constant(offset, f"{node.name}_offset")
    ex.emit("Sub", [codes, offset], [index], f"{node.name}/offset")
    ex.emit("Gather", [source, index], [node.output.name], node.name, axis=0)


def interpolated_lookup(ex, node: Node) -> None:
    """QLookupInterp exactly, in int32 (every intermediate below 2^24): u = q + 32768,
    k = u / 128, t = u - 128·k, a and b gathered from the rows laid end to end,
    y = a + ((b - a)·t + 64 + 2^23) / 128 - 2^16 (ONNX integer Div truncates: the 2^23
    keeps the dividend positive, so it floors)."""
    x, table = node.inputs
    rows, width = table.shape
    name = node.name

    def op(kind: str, a: str, b, label: str) -> str:
        if not isinstance(b, str):
            b = ex.constant(np.asarray(b, np.int32), f"{name}_{label}_operand")
        out = ex.fresh(f"{name}_{label}")
        ex.emit(kind, [a, b], [out], f"{name}/{label}")
        return out

    codes = ex.fresh(f"{name}_codes")
    ex.emit("Cast", [x.name], [codes], f"{name}/cast", to=onnx.TensorProto.INT32)
    u = op("Sub", codes, np.iinfo(np.int16).min, "unsigned")
    k = op("Div", u, 128, "segment")
    t = op("Sub", u, op("Mul", k, 128, "start"), "offset")
    starts = np.arange(rows, dtype=np.int32) * width
    starts = starts.reshape((1, -1) + (1,) * (len(x.shape) - 2))
    at = op("Add", k, starts, "knot")
    flat = ex.constant(table.numpy().astype(np.int32).ravel(), f"{name}_knots")
    a = op("Gather", flat, at, "base")
    b = op("Gather", flat, op("Add", at, 1, "next_knot"), "end")
    product = op("Mul", op("Sub", b, a, "slope"), t, "product")
    floor = op("Div", op("Add", product, 64 + (1 << 23), "biased"), 128, "floor")
    y = op("Add", a, op("Sub", floor, 1 << 16, "fraction"), "sum")
    to = helper.np_dtype_to_tensor_dtype(node.output.dtype)
    ex.emit("Cast", [y], [node.output.name], name, to=to)
