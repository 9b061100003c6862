"""The QDQ export of lookup tables (`onnx_export`): exact integer ONNX ops, so onnxruntime
computes every code as onebuild's kernels do."""

import numpy as np
import onnx
from onnx import helper

from ..ir import Node
from ..ops.quantized import KNOTS, SEGMENT, segment_slots


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
    keeps the dividend positive, so it floors); with exact segments, each segment's slot
    (`segment_slots`, a constant) gathered at c·512 + k, and where it is not -1 the exact code
    at (c·E + slot)·128 + t instead (Where)."""
    x, table = node.inputs[:2]
    rows, width = table.shape
    name = node.name

    def op(kind: str, a: str, b, label: str) -> str:
        if not isinstance(b, str):
            b = ex.constant(np.asarray(b, np.int32), f"{name}_{label}_operand")
        out = ex.fresh(f"{name}_{label}")
        ex.emit(kind, [a, b], [out], f"{name}/{label}")
        return out

    def per_row(stride: int) -> np.ndarray:
        starts = np.arange(rows, dtype=np.int32) * np.int32(stride)
        return starts.reshape((1, -1) + (1,) * (len(x.shape) - 2))

    codes = ex.fresh(f"{name}_codes")
    ex.emit("Cast", [x.name], [codes], f"{name}/cast", to=onnx.TensorProto.INT32)
    u = op("Sub", codes, np.iinfo(np.int16).min, "unsigned")
    k = op("Div", u, SEGMENT, "segment")
    t = op("Sub", u, op("Mul", k, SEGMENT, "start"), "offset")
    at = op("Add", k, per_row(width), "knot")
    flat = ex.constant(table.numpy().astype(np.int32).ravel(), f"{name}_knots")
    a = op("Gather", flat, at, "base")
    b = op("Gather", flat, op("Add", at, 1, "next_knot"), "end")
    product = op("Mul", op("Sub", b, a, "slope"), t, "product")
    floor = op("Div", op("Add", product, SEGMENT // 2 + (1 << 23), "biased"), SEGMENT, "floor")
    y = op("Add", a, op("Sub", floor, 1 << 16, "fraction"), "sum")
    if len(node.inputs) > 2 and node.inputs[2].size:
        segments, exact = (v.numpy() for v in node.inputs[2:])
        slots = ex.constant(segment_slots(segments).ravel(), f"{name}_slots")
        slot = op("Gather", slots, op("Add", k, per_row(KNOTS - 1), "segment_row"), "slot")
        first = op(
            "Mul",
            op("Add", op("Max", slot, 0, "slot_or_0"), per_row(segments.shape[1]), "exact_row"),
            SEGMENT,
            "exact_start",
        )
        codes_flat = ex.constant(exact.astype(np.int32).ravel(), f"{name}_exact_codes")
        exact_code = op("Gather", codes_flat, op("Add", first, t, "exact_at"), "exact")
        interpolated = op("Less", slot, 0, "interpolated")
        chosen = ex.fresh(f"{name}_chosen")
        ex.emit("Where", [interpolated, y, exact_code], [chosen], f"{name}/chosen")
        y = chosen
    to = helper.np_dtype_to_tensor_dtype(node.output.dtype)
    ex.emit("Cast", [y], [node.output.name], name, to=to)
