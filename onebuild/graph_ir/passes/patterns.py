"""Pattern fusion: the decomposed activations and normalizations exporters emit, as one op each.

Recognised (torch.onnx, paddle2onnx and tf2onnx spellings; operands in either order, a division
by a constant read as a multiplication by its reciprocal):

- HardSwish: x * relu6(x + 3) / 6, relu6 as Clip(0, 6), a fused Add clip or Min(Relu(.), 6);
  x * HardSigmoid(x; 1/6, 1/2)
- HardSigmoid: relu6(x + b) / 6, and Clip(x * a + b, 0, 1)
- Swish (SiLU): x * Sigmoid(x), x * Sigmoid(x * beta)
- Mish: x * Tanh(Softplus(x))
- Gelu: x * (1 + Erf(x / sqrt 2)) / 2, and the tanh form
  x * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2
- LayerNormalization: (x - mean) / Sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta] over
  trailing axes
- what remains of a division by a constant: a multiplication by its reciprocal

A pattern fuses only when every intermediate value is read inside the pattern alone (and is not
a graph output): otherwise the intermediate must be computed anyway.
"""

import math

import numpy as np

from ..ir import Graph, Node, Value
from .rewrite import made_by, replace_with, scalar, single

RTOL = 1e-4  # how closely an exporter's constant must match the pattern's (float32 spellings)


def _near(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=RTOL, abs_tol=1e-7)


def _with_constant(node: Node) -> tuple[Value, float] | None:
    """(the other operand, the number) of a binary node with one scalar-constant operand."""
    a, b = node.inputs[:2]
    if scalar(b) is not None and scalar(a) is None:
        return a, scalar(b)
    if scalar(a) is not None and scalar(b) is None:
        return b, scalar(a)
    return None


class _Match:
    """The nodes a candidate pattern consumes, and the test that they are private to it."""

    def __init__(self, anchor: Node):
        self.anchor = anchor
        self.nodes: list[Node] = [anchor]

    def take(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def private(self) -> bool:
        inside = {id(n) for n in self.nodes}
        for node in self.nodes:
            if node is self.anchor:
                continue
            for value in node.outputs:
                graph = value.graph
                if graph is not None and value in graph.outputs:
                    return False
                if any(id(user) not in inside for user in value.users):
                    return False
        return True


def _product(match: _Match, value: Value, top: bool = False) -> tuple[list[Value], float]:
    """`value` as (non-constant factors, constant factor): Mul nodes and divisions by a constant
    are opened while their result is read once (the anchor itself always)."""
    number = scalar(value)
    if number is not None:
        return [], number
    node = made_by(value, ("Mul", "Div"))
    if node is None or not (top or single(value)):
        return [value], 1.0
    a, b = node.inputs[:2]
    if node.op == "Div":
        divisor = scalar(b)
        if not divisor:
            return [value], 1.0
        if not top:
            match.take(node)
        factors, scale = _product(match, a)
        return factors, scale / divisor
    if not top:
        match.take(node)
    fa, sa = _product(match, a)
    fb, sb = _product(match, b)
    return fa + fb, sa * sb


def _scaled(match: _Match, value: Value) -> tuple[Value, float]:
    """`value` as (x, k) with value = k * x (k = 1 when it is no such product)."""
    if not single(value):
        return value, 1.0
    factors, scale = _product(match, value)
    if len(factors) == 1 and factors[0] is not value:
        return factors[0], scale
    return value, 1.0


def _shifted(match: _Match, value: Value) -> tuple[Value, float]:
    """`value` as (x, b) with value = x + b (b = 0 when it is no such sum)."""
    node = made_by(value, "Add")
    pair = _with_constant(node) if node is not None and single(value) else None
    if pair is None:
        return value, 0.0
    match.take(node)
    return pair


def _relu6_of(match: _Match, value: Value) -> tuple[Value, float] | None:
    """(x, b) with value = min(max(x + b, 0), 6), in the Clip, fused-clip and Min/Relu forms."""
    node = value.producer
    if node is None or not single(value):
        return None
    if node.op == "Add" and list(node.attrs.get("clip", ())) == [0.0, 6.0]:
        pair = _with_constant(node)
        if pair is None:
            return None
        match.take(node)
        return pair
    clipped = None
    if node.op == "Clip" and _near(_scalar_input(node, 1), 0.0):
        if _near(_scalar_input(node, 2), 6.0):
            clipped = node.inputs[0]
    elif node.op == "Min" and len(node.inputs) == 2 and "clip" not in node.attrs:
        pair = _with_constant(node)
        relu = made_by(pair[0], "Relu") if pair and _near(pair[1], 6.0) else None
        if relu is not None and single(pair[0]):
            match.take(relu)
            clipped = relu.inputs[0]
    if clipped is None:
        return None
    match.take(node)
    return _shifted(match, clipped)


def _scalar_input(node: Node, index: int) -> float | None:
    return scalar(node.inputs[index]) if index < len(node.inputs) else None


def _unary_of(match: _Match, value: Value, op: str) -> Value | None:
    """The input of the single-reader `op` node producing `value`."""
    node = made_by(value, op)
    if node is None or not single(value):
        return None
    match.take(node)
    return node.inputs[0]


def _plus_one(match: _Match, value: Value, op: str) -> Value | None:
    """The input of `op` when value = op(.) + 1."""
    inner, shift = _shifted(match, value)
    return _unary_of(match, inner, op) if _near(shift, 1.0) and inner is not value else None


def _is_cube(match: _Match, factors: list[Value], x: Value) -> bool:
    """Whether the product of `factors` is x^3 (x * x * x, or Pow(x, 3))."""
    if len(factors) == 3:
        return all(f is x for f in factors)
    node = made_by(factors[0], "Pow") if len(factors) == 1 else None
    if node is None or not single(factors[0]) or node.inputs[0] is not x:
        return False
    match.take(node)
    return _near(scalar(node.inputs[1]), 3.0)


def _gelu_tanh_input(match: _Match, value: Value, x: Value) -> bool:
    """Whether value = sqrt(2/pi) * (x + 0.044715 x^3)."""
    inner, k = _scaled(match, value)
    node = made_by(inner, "Add")
    if node is None or not _near(k, math.sqrt(2 / math.pi)) or not single(inner):
        return False
    match.take(node)
    a, b = node.inputs[:2]
    cubic = b if a is x else a if b is x else None
    if cubic is None or not single(cubic):
        return False
    factors, c = _product(match, cubic)
    return _near(c, 0.044715) and _is_cube(match, factors, x)


def _unary_product(graph: Graph, match: _Match) -> tuple[str, Value, dict] | None:
    """A product anchored at a Mul or a division by a constant, as (op, x, attrs)."""
    factors, scale = _product(match, match.anchor.output, top=True)
    if len(factors) == 1:
        relu6 = _relu6_of(match, factors[0])
        if relu6 is not None and _near(scale, 1 / 6):
            return "HardSigmoid", relu6[0], {"alpha": 1 / 6, "beta": relu6[1] / 6}
        return None
    if len(factors) != 2:
        return None
    for x, other in (factors, factors[::-1]):
        found = _activation_times_x(match, x, other, scale)
        if found is not None:
            return found
    return None


def _hard_sigmoid_6(node: Node) -> bool:
    """Whether a HardSigmoid is relu6(x + 3) / 6."""
    return _near(node.attrs.get("alpha", 0.2), 1 / 6) and _near(node.attrs.get("beta", 0.5), 0.5)


def _activation_times_x(match: _Match, x: Value, other: Value, scale: float):
    """x * other * scale as one activation of x (or None)."""
    size = len(match.nodes)
    if _near(scale, 1 / 6):
        relu6 = _relu6_of(match, other)
        if relu6 is not None and relu6[0] is x and _near(relu6[1], 3.0):
            return "HardSwish", x, {}
    elif _near(scale, 1.0):
        node = made_by(other, "HardSigmoid")
        if node is not None and node.inputs[0] is x and single(other) and _hard_sigmoid_6(node):
            match.take(node)
            return "HardSwish", x, {}
        inner = _unary_of(match, other, "Sigmoid")
        if inner is not None:
            y, beta = _scaled(match, inner)
            if y is x:
                return "Swish", x, {"alpha": beta}
        del match.nodes[size:]
        inner = _unary_of(match, other, "Tanh")
        if inner is not None and _unary_of(match, inner, "Softplus") is x:
            return "Mish", x, {}
    elif _near(scale, 0.5):
        inner = _plus_one(match, other, "Erf")
        if inner is not None:
            y, k = _scaled(match, inner)
            if y is x and _near(k, 1 / math.sqrt(2)):
                return "Gelu", x, {"approximate": "none"}
        del match.nodes[size:]
        inner = _plus_one(match, other, "Tanh")
        if inner is not None and _gelu_tanh_input(match, inner, x):
            return "Gelu", x, {"approximate": "tanh"}
    del match.nodes[size:]
    return None


def _hard_sigmoid_clip(graph: Graph, match: _Match):
    """Clip(x * a + b, 0, 1) as HardSigmoid(x; a, b)."""
    node = match.anchor
    if not (_near(_scalar_input(node, 1), 0.0) and _near(_scalar_input(node, 2), 1.0)):
        return None
    shifted, beta = _shifted(match, node.inputs[0])
    x, alpha = _scaled(match, shifted)
    if shifted is node.inputs[0] or x is shifted:
        return None
    return "HardSigmoid", x, {"alpha": alpha, "beta": beta}


def _reduce_mean(match: _Match, value: Value) -> tuple[Value, tuple[int, ...]] | None:
    node = made_by(value, "ReduceMean")
    if node is None or not node.attrs.get("keepdims", 1) or not node.attrs.get("axes"):
        return None
    match.take(node)
    return node.inputs[0], tuple(node.attrs["axes"])


def _layer_norm(graph: Graph, match: _Match):
    """(x - mean) / Sqrt(var + eps) over trailing axes, with a following * gamma and + beta."""
    centered, root = match.anchor.inputs[:2]
    sub = made_by(centered, "Sub")
    sqrt = made_by(root, "Sqrt")
    if sub is None or sqrt is None:
        return None
    match.take(sub)
    match.take(sqrt)
    x = sub.inputs[0]
    mean = _reduce_mean(match, sub.inputs[1])
    variance, eps = _shifted(match, sqrt.inputs[0])
    var = _reduce_mean(match, variance)
    if mean is None or var is None or mean[0] is not x or mean[1] != var[1] or eps <= 0:
        return None
    square = made_by(var[0], ("Pow", "Mul"))
    if square is None or square.inputs[0] is not centered:
        return None
    match.take(square)
    other = square.inputs[1]
    if not (other is centered if square.op == "Mul" else _near(scalar(other), 2.0)):
        return None
    rank = len(x.shape)
    axis = rank - len(mean[1])
    if tuple(a % rank for a in mean[1]) != tuple(range(axis, rank)):
        return None
    return "LayerNormalization", x, {"axis": axis, "epsilon": eps}


def _affine_after(value: Value, op: str, shape: tuple[int, ...]) -> Node | None:
    """The single reader of `value` when it is `op` with a constant that broadcasts to `shape`
    (the normalized axes) and no further."""
    if not single(value):
        return None
    user = value.users[0]
    if user.op != op or "clip" in user.attrs:
        return None
    other = user.inputs[1] if user.inputs[0] is value else user.inputs[0]
    if other is value or not other.is_const or len(other.shape) > len(shape):
        return None
    try:
        if np.broadcast_shapes(other.shape, shape) != shape:
            return None
    except ValueError:
        return None
    return user


def _replace_layer_norm(graph: Graph, match: _Match, x: Value, attrs: dict) -> None:
    """The LayerNormalization node, taking a following * gamma and + beta in."""
    shape = x.shape[attrs["axis"] :]
    last = match.anchor
    scale = np.ones(shape, x.dtype)
    bias = None
    for op in ("Mul", "Add"):
        user = _affine_after(last.output, op, shape)
        if user is None:
            continue
        constant = next(v for v in user.inputs if v.is_const).numpy()
        array = np.broadcast_to(constant, shape).astype(x.dtype)
        if op == "Mul":
            scale = array
        else:
            bias = array
        match.take(user)
        last = user
    inputs = [x, graph.add_constant(scale, f"{last.output.name}_scale")]
    if bias is not None:
        inputs.append(graph.add_constant(bias, f"{last.output.name}_bias"))
    replace_with(graph, match.nodes, last, "LayerNormalization", inputs, attrs)


def _division_as_product(graph: Graph, node: Node) -> bool:
    """Div(a, constant) -> Mul(a, 1 / constant) for floating-point values, when every
    reciprocal is a normal number (1 / a subnormal overflows to inf, 0 * inf is NaN)."""
    divisor = node.inputs[1]
    if not divisor.is_const or not np.issubdtype(node.output.dtype, np.floating):
        return False
    values = divisor.numpy()
    if not np.all(np.isfinite(values)) or np.any(values == 0):
        return False
    with np.errstate(over="ignore"):
        inverse = (1.0 / values).astype(values.dtype)
    tiny = np.finfo(values.dtype).tiny
    if not np.all(np.isfinite(inverse) & (np.abs(inverse) >= tiny)):
        return False
    reciprocal = graph.add_constant(inverse, f"{divisor.name}_inv")
    replace_with(graph, [node], node, "Mul", [node.inputs[0], reciprocal], {})
    return True


def activation_ending_at(node: Node) -> tuple[str, Value, dict] | None:
    """(op, x, attrs) when the Mul or Div `node` ends one of the activation spellings above
    (HardSwish, HardSigmoid, Swish, Mish, Gelu); the graph is left as it is, and whether the
    intermediate values are read elsewhere is not asked (a reader keeps the nodes it bypasses)."""
    if node.op not in ("Mul", "Div") or "clip" in node.attrs or len(node.outputs) != 1:
        return None
    return _unary_product(node.graph, _Match(node))


def layer_norm_ending_at(node: Node) -> tuple[str, Value, dict] | None:
    """("LayerNormalization", x, attrs) when the Div `node` ends its spelling above (without
    gamma and beta); the graph is left as it is, as by `activation_ending_at`."""
    if node.op != "Div" or "clip" in node.attrs or len(node.outputs) != 1:
        return None
    return _layer_norm(node.graph, _Match(node))


MATCHERS = {
    "Mul": _unary_product,
    "Div": _unary_product,
    "Clip": _hard_sigmoid_clip,
}


def fuse_patterns(graph: Graph) -> bool:
    """Rewrite the decomposed forms listed in this module's docstring into one op each."""
    modified = False
    for node in graph:
        if node.graph is None or len(node.outputs) != 1 or "clip" in node.attrs:
            continue
        if not np.issubdtype(node.output.dtype, np.floating):
            continue
        found = None
        match = _Match(node)
        if node.op in MATCHERS:
            found = MATCHERS[node.op](graph, match)
        if node.op == "Div" and found is None:
            match = _Match(node)
            found = _layer_norm(graph, match)
        if found is not None and match.private():
            op, x, attrs = found
            if op == "LayerNormalization":
                _replace_layer_norm(graph, match, x, attrs)
            else:
                replace_with(graph, match.nodes, node, op, [x], attrs)
            modified = True
        elif node.op == "Div":
            modified |= _division_as_product(graph, node)
    return modified
