"""`verify(graph)`: check the IR invariants and name the offending node."""

from collections import Counter

from ..errors import IRError
from .ir import Graph, Node
from .ops import OPS


def _fail(node: Node, message: str) -> IRError:
    return IRError(f"node '{node.name}' ({node.op}): {message}")


# Integer kernels read zero points from their attributes; the values carry them in `quant`.
# Both must agree: attribute -> (side, input/output index) whose parameters it copies.
_ZERO_POINTS = {
    "x_zero_point": ("inputs", 0),
    "a_zero_point": ("inputs", 0),
    "b_zero_point": ("inputs", 1),
    "y_zero_point": ("outputs", 0),
}


def _check_quant_params(node: Node) -> None:
    """Quantization parameters stored in a node's attributes equal its values' own."""
    checks = [
        (attr, getattr(node, side)[i])
        for attr, (side, i) in _ZERO_POINTS.items()
        if attr in node.attrs and i < len(getattr(node, side))
    ]
    if "x_zero_points" in node.attrs:
        checks += [(f"x_zero_points[{i}]", v) for i, v in enumerate(node.inputs)]
    for attr, value in checks:
        name, _, index = attr.partition("[")
        stored = node.attrs.get(name)
        if index and stored is not None:
            stored = stored[int(index[:-1])]
        if stored is None or value is None or value.quant is None:
            continue
        own = list(value.quant.zero_point)  # a list attribute: per-channel, one per channel
        found = [int(z) for z in stored] if isinstance(stored, list) else int(stored)
        expected = own if isinstance(stored, list) else own[0]
        if found != expected:
            raise _fail(
                node, f"attribute {attr} = {stored}, but '{value.name}' has zero point {expected}"
            )
    value = {"QuantizeLinear": node.outputs, "DequantizeLinear": node.inputs}.get(node.op, [None])[
        0
    ]
    if value is not None and value.quant is not None and "scale" in node.attrs:
        stored = (tuple(node.attrs["scale"]), tuple(node.attrs["zero_point"]))
        if stored != (tuple(value.quant.scale), tuple(value.quant.zero_point)):
            raise _fail(
                node,
                f"scale/zero_point attributes {stored} differ from '{value.name}''s parameters",
            )


def verify(graph: Graph) -> None:
    """Ownership, unique names, define-before-use (hence no cycles), consistent use lists,
    output types that match the op's type inference, and quantization parameters that agree
    between attributes and values; in the subgraphs of control-flow nodes too."""
    defined: set[int] = set()
    names: Counter = Counter()
    for value in graph.inputs + list(graph.constants.values()):
        if value.graph is not graph:
            raise IRError(f"value '{value.name}' is listed in graph '{graph.name}' but not owned")
        defined.add(id(value))
        names[value.name] += 1
    expected_uses: dict[int, list] = {}
    for node in graph.nodes:
        if node.graph is not graph:
            raise _fail(node, f"is listed in graph '{graph.name}' but not owned by it")
        if node.op not in OPS:
            raise _fail(node, "unknown op")
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if id(value) not in defined:
                where = (
                    "is used before it is defined" if value.graph is graph else "is not in graph"
                )
                raise _fail(node, f"input {index} '{value.name}' {where}")
            expected_uses.setdefault(id(value), []).append((id(node), index))
        try:
            types = OPS[node.op].infer(node.attrs, node.input_types())
        except Exception as error:
            raise _fail(node, f"type inference failed: {error}") from error
        if len(types) != len(node.outputs):
            raise _fail(node, f"has {len(node.outputs)} outputs, the op defines {len(types)}")
        _check_quant_params(node)
        for subgraph in node.subgraphs:
            try:
                verify(subgraph)
            except IRError as error:
                raise _fail(node, f"subgraph '{subgraph.name}': {error}") from error
        for value, inferred in zip(node.outputs, types):
            if value.producer is not node or value.graph is not graph:
                raise _fail(node, f"output '{value.name}' has a broken producer/owner link")
            if (value.dtype, value.shape) != (inferred.dtype, inferred.shape):
                raise _fail(
                    node,
                    f"output '{value.name}' is declared {value.dtype}{list(value.shape)} but "
                    f"the op infers {inferred.dtype}{list(inferred.shape)}",
                )
            defined.add(id(value))
            names[value.name] += 1
    duplicates = [name for name, count in names.items() if count > 1]
    if duplicates:
        raise IRError(f"graph '{graph.name}' has duplicate value names: {', '.join(duplicates)}")
    for value in (
        graph.inputs + list(graph.constants.values()) + [v for n in graph.nodes for v in n.outputs]
    ):
        actual = sorted((id(n), i) for n, i in value.uses)
        if actual != sorted(expected_uses.get(id(value), [])):
            raise IRError(f"value '{value.name}' has a use list that does not match its readers")
    for value in graph.outputs:
        if id(value) not in defined:
            raise IRError(f"graph output '{value.name}' is not defined in graph '{graph.name}'")
