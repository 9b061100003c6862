"""ONNX converters of the selection and index operators: TopK, CumSum, Trilu, GatherElements,
GatherND, ScatterElements (and the older Scatter), ScatterND, Einsum (kernels in
`graph_ir/ops/indexing.py`). Constant operands (k, axis) become attributes."""

from ..ops import normalize_axis
from .onnx_ops import converter

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scalar(ctx, index: int, what: str) -> int:
    values = ctx.const(index, what).reshape(-1)
    if values.size != 1:
        raise ctx.fail(f"{what} must hold one value, got {values.size}")
    return int(values[0])


@converter("TopK")
def top_k(ctx):
    x = ctx.inputs[0]
    axis = normalize_axis(ctx.attr("axis", -1), len(x.shape))
    k = int(ctx.attr("k")) if ctx.opset < 10 else _scalar(ctx, 1, "k")
    if not 0 <= k <= x.shape[axis]:
        raise ctx.fail(f"k = {k} is outside [0, {x.shape[axis]}] (axis {axis})")
    attrs = {"axis": axis, "k": k, "largest": int(ctx.attr("largest", 1))}
    return ctx.emit("TopK", [x], attrs)


@converter("CumSum")
def cum_sum(ctx):
    x = ctx.inputs[0]
    axis = normalize_axis(_scalar(ctx, 1, "axis"), len(x.shape))
    attrs = {"axis": axis, "exclusive": int(ctx.attr("exclusive", 0))}
    return ctx.emit("CumSum", [x], {**attrs, "reverse": int(ctx.attr("reverse", 0))})


@converter("Trilu")
def trilu(ctx):
    x = ctx.inputs[0]
    if len(x.shape) < 2:
        raise ctx.fail(f"needs a rank >= 2 input, got {list(x.shape)}")
    k = _scalar(ctx, 1, "k") if ctx.input(1) is not None else 0
    return ctx.emit("Trilu", [x], {"upper": int(ctx.attr("upper", 1)), "k": k})


@converter("GatherElements")
def gather_elements(ctx):
    data, indices = ctx.inputs[:2]
    if len(indices.shape) != len(data.shape):
        raise ctx.fail(f"indices {list(indices.shape)} and data {list(data.shape)} ranks differ")
    axis = normalize_axis(ctx.attr("axis", 0), len(data.shape))
    return ctx.emit("GatherElements", [data, indices], {"axis": axis})


@converter("GatherND")
def gather_nd(ctx):
    data, indices = ctx.inputs[:2]
    batch_dims = int(ctx.attr("batch_dims", 0))
    if not indices.shape or not 1 <= indices.shape[-1] <= len(data.shape) - batch_dims:
        raise ctx.fail(f"indices {list(indices.shape)} do not fit data {list(data.shape)}")
    if data.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise ctx.fail(f"the first {batch_dims} dims of data and indices differ")
    return ctx.emit("GatherND", [data, indices], {"batch_dims": batch_dims})


def _reduction(ctx) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in REDUCTIONS:
        raise ctx.fail(f"unknown reduction '{reduction}' ({', '.join(REDUCTIONS)})")
    return reduction


@converter("ScatterElements", "Scatter")
def scatter_elements(ctx):
    data, indices, updates = ctx.inputs[:3]
    if indices.shape != updates.shape or len(indices.shape) != len(data.shape):
        raise ctx.fail(f"indices {list(indices.shape)} and updates {list(updates.shape)} differ")
    axis = normalize_axis(ctx.attr("axis", 0), len(data.shape))
    attrs = {"axis": axis, "reduction": _reduction(ctx)}
    return ctx.emit("ScatterElements", [data, indices, updates], attrs)


@converter("ScatterND")
def scatter_nd(ctx):
    data, indices, updates = ctx.inputs[:3]
    depth = indices.shape[-1] if indices.shape else 0
    if not 1 <= depth <= len(data.shape):
        raise ctx.fail(f"indices {list(indices.shape)} do not fit data {list(data.shape)}")
    if updates.shape != indices.shape[:-1] + data.shape[depth:]:
        raise ctx.fail(f"updates {list(updates.shape)} do not fit the indexed slices")
    return ctx.emit("ScatterND", [data, indices, updates], {"reduction": _reduction(ctx)})


@converter("Einsum")
def einsum(ctx):
    return ctx.emit("Einsum", ctx.inputs, {"equation": ctx.attr("equation")})
