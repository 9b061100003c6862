"""ONNX converters of the selection and index operators: TopK, CumSum, Trilu, GatherElements,
GatherND, ScatterElements (and the older Scatter), ScatterND, Einsum (kernels in
`graph_ir/ops/indexing.py`), and of the recurrent layers LSTM, GRU, RNN (`ops/recurrent.py`).
Constant operands (k, axis) become attributes; activations are canonicalized with their
parameters."""

from ..ops import normalize_axis
from ..ops.recurrent import ACTIVATIONS, GATE_FUNCTIONS, GATES
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
    if any(i > d for a, (i, d) in enumerate(zip(indices.shape, data.shape)) if a != axis):
        raise ctx.fail(
            f"indices {list(indices.shape)} are longer than data {list(data.shape)} "
            f"on an axis other than {axis}"
        )
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


# -- recurrent layers ----------------------------------------------------------------------------
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "RNN": ["Tanh"]}  # fmt: skip
# the IR's activation names -> ONNX's spelling (the importer lowercases)
ONNX_ACTIVATIONS = {name.lower(): name for name in (
    "Sigmoid", "Tanh", "Relu", "HardSigmoid", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
    "Affine", "Elu", "Softsign", "Softplus")}  # fmt: skip


@converter("LSTM", "GRU", "RNN")
def recurrent(ctx):

    op, x, w = ctx.op_type, ctx.inputs[0], ctx.inputs[1]
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.fail(f"unknown direction '{direction}'")
    dirs = 2 if direction == "bidirectional" else 1
    hidden = int(ctx.attr("hidden_size", w.shape[1] // GATES[op]))
    if w.shape[:2] != (dirs, GATES[op] * hidden) or len(x.shape) != 3:
        raise ctx.fail(f"W {list(w.shape)} does not fit {dirs} direction(s) of {hidden} units")
    per = GATE_FUNCTIONS[op]
    names = [n.lower() for n in ctx.attr("activations", DEFAULT_ACTIVATIONS[op] * dirs)]
    if len(names) != per * dirs or any(n not in ACTIVATIONS for n in names):
        raise ctx.fail(f"activations {names}: expected {per * dirs} of {', '.join(ACTIVATIONS)}")
    alphas, betas = ctx.attr("activation_alpha", []), ctx.attr("activation_beta", [])
    activations, used = [], {"alpha": 0, "beta": 0}
    for name in names:  # alpha/beta lists hold values only for the functions that take them
        takes = {"hardsigmoid": "ab", "leakyrelu": "a", "thresholdedrelu": "a",
                 "scaledtanh": "ab", "affine": "ab", "elu": "a"}.get(name, "")  # fmt: skip
        alpha = alphas[used["alpha"]] if "a" in takes and used["alpha"] < len(alphas) else None
        beta = betas[used["beta"]] if "b" in takes and used["beta"] < len(betas) else None
        used["alpha"] += alpha is not None
        used["beta"] += beta is not None
        if name in ("scaledtanh", "affine") and (alpha is None or beta is None):
            raise ctx.fail(f"activation {name} needs activation_alpha and activation_beta")
        activations.append([name, alpha, beta])
    attrs = {
        "direction": direction,
        "hidden_size": hidden,
        "layout": int(ctx.attr("layout", 0)),
        "cell_clip": None if ctx.attr("clip") is None else float(ctx.attr("clip")),
        "activations": activations,
        "input_forget": int(ctx.attr("input_forget", 0)),
        "linear_before_reset": int(ctx.attr("linear_before_reset", 0)),
    }
    return ctx.emit(op, ctx.inputs, attrs)
