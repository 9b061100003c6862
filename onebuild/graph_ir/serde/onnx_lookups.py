"""The QDQ export of lookup tables (`onnx_export`): exact integer ONNX ops, so onnxruntime
computes every code as onebuild's kernels do."""

import numpy as np
import onnx
from onnx import helper

from ...errors import ModelError
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
    """QLookupInterp exactly, in int64: u = q + 32768, k = u / 128, t = u - 128·k, knots a, b
    and the bend β gathered from the rows laid end to end,
    y = a + (128·(b - a)·t - β·t·(128 - t) + 2^13 + 2^40) / 2^14 - 2^26 (ONNX integer Div
    truncates: the 2^40 keeps the dividend positive, so it floors), saturated by Max / Min;
    with exact segments, each segment's slot (`segment_slots`, a constant) gathered at
    c·512 + k, and where it is not -1 the exact code at (c·E + slot)·128 + t instead (Where)."""
    x, table = node.inputs[:2]
    rows, width = table.shape
    name = node.name

    def op(kind: str, a: str, b, label: str) -> str:
        if not isinstance(b, str):
            b = ex.constant(np.asarray(b, np.int64), f"{name}_{label}_operand")
        out = ex.fresh(f"{name}_{label}")
        ex.emit(kind, [a, b], [out], f"{name}/{label}")
        return out

    def per_row(stride: int) -> np.ndarray:
        return (np.arange(rows, dtype=np.int64) * stride).reshape(
            (1, -1) + (1,) * (len(x.shape) - 2)
        )

    def rows_laid_end_to_end(value, label: str) -> str:
        return ex.constant(value.numpy().astype(np.int64).ravel(), f"{name}_{label}")

    codes = ex.fresh(f"{name}_codes")
    ex.emit("Cast", [x.name], [codes], f"{name}/cast", to=onnx.TensorProto.INT64)
    u = op("Sub", codes, np.iinfo(np.int16).min, "unsigned")
    k = op("Div", u, SEGMENT, "segment")
    t = op("Sub", u, op("Mul", k, SEGMENT, "start"), "offset")
    at = op("Add", k, per_row(width), "knot")
    flat = rows_laid_end_to_end(table, "knots")
    a = op("Gather", flat, at, "base")
    b = op("Gather", flat, op("Add", at, 1, "next_knot"), "end")
    fraction = op("Mul", op("Sub", b, a, "slope"), op("Mul", t, SEGMENT, "t_128"), "chord")
    segment = op("Add", k, per_row(KNOTS - 1), "segment_row")
    if len(node.inputs) > 2:
        bend = op("Gather", rows_laid_end_to_end(node.inputs[2], "bends"), segment, "bend")
        whole = ex.constant(np.asarray(SEGMENT, np.int64), f"{name}_segment_width")
        weight = op("Mul", t, op("Sub", whole, t, "t_rest"), "bend_weight")
        fraction = op("Sub", fraction, op("Mul", bend, weight, "bent"), "curve")
    biased = op("Add", fraction, (1 << 13) + (1 << 40), "biased")
    floor = op("Sub", op("Div", biased, 1 << 14, "floor"), 1 << 26, "fraction")
    y = op("Add", a, floor, "sum")
    y = op("Min", op("Max", y, -32768, "low"), 32767, "saturated")
    if len(node.inputs) > 3 and node.inputs[3].size:
        try:
            slots = segment_slots(node.inputs[3].numpy())
        except ValueError as error:
            raise ModelError(f"node '{name}' (QLookupInterp): {error}") from None
        slots = ex.constant(slots.astype(np.int64).ravel(), f"{name}_slots")
        slot = op("Gather", slots, segment, "slot")
        count = node.inputs[3].shape[1]
        exact_row = op("Add", op("Max", slot, 0, "slot_or_0"), per_row(count), "row")
        at_exact = op("Add", op("Mul", exact_row, SEGMENT, "exact_start"), t, "exact_at")
        exact = op("Gather", rows_laid_end_to_end(node.inputs[4], "exact"), at_exact, "exact")
        chosen = ex.fresh(f"{name}_chosen")
        ex.emit(
            "Where", [op("Less", slot, 0, "interpolated"), y, exact], [chosen], f"{name}/chosen"
        )
        y = chosen
    to = helper.np_dtype_to_tensor_dtype(node.output.dtype)
    ex.emit("Cast", [y], [node.output.name], name, to=to)
