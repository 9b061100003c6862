"""The keys of a partition `opcode` map: IR op names (any case; a quantized op answers to the
float op it replaced, a lookup table to the function it holds) and circle operator names
as ONE's `.part` files write them (`CONV_2D`, `DEPTHWISE_CONV_2D`, `FULLY_CONNECTED`, ...),
which name the nodes the circle writer writes as that operator. A name both spell (PAD and
Pad, SPLIT and Split) is a circle operator in upper case, else the IR op. An unknown key is an
error that lists the close names.
"""

import difflib

from ...errors import UserError
from ..ir import Node
from ..ops import OPS
from ..ops.quantized import stands_for
from ..serde.circle_names import CIRCLE_NAMES, NARROW, names_circle_op

LOOKUPS = ("QLookup", "QLookupInterp")
WILDCARD = "_"  # every node no entry names


def float_ops(node: Node) -> set[str]:
    """The op names `node` answers to: its own, the float op a quantized op replaced (`float_op`
    as the quantizer records it, else as its attributes tell: `ops.quantized.stands_for`), and
    the function a lookup table holds (its `function` attribute: HardSwish, Sigmoid, ...)."""
    names = {node.op}
    if node.op in OPS and OPS[node.op].quantizes:
        shape = tuple(node.inputs[0].shape) if node.inputs and node.inputs[0] else ()
        names.update(stands_for(node.op, node.attrs, shape))
    function = node.attrs.get("function") if node.op in LOOKUPS else None
    if isinstance(function, str):
        names.add(function)
    return names


def _circle_key(key: str) -> bool:
    """A circle operator name: spelled as ONE's tools spell it, or in another case that no
    IR op name has."""
    return key in CIRCLE_NAMES or (key.upper() in CIRCLE_NAMES and key.lower() not in IR_NAMES)


IR_NAMES = {op.lower() for op in OPS}


def matches(key: str, node: Node, ops: set[str]) -> bool:
    """Whether opcode key `key` names `node` (`ops`: its `float_ops`)."""
    if _circle_key(key):
        return names_circle_op(key.upper(), node, ops)
    return key.lower() in {op.lower() for op in ops}


def specificity(key: str) -> int:
    """1 for a circle operator that names part of its IR ops' nodes (DEPTHWISE_CONV_2D,
    FULLY_CONNECTED, SUB, MEAN, PAD, ...; `circle_names.NARROW`), 0 for other keys."""
    return int(_circle_key(key) and key.upper() in NARROW)


def check_keys(keys, where: str) -> None:
    """Refuse keys that name neither an IR op nor a circle operator, naming `where` they are
    (`partition.opcode`, a .part file's [OPCODE]) and the close names."""
    known = {name.lower(): name for name in [*sorted(CIRCLE_NAMES), *OPS]}  # IR spelling first
    for key in keys:
        if key == WILDCARD or key.lower() in known:
            continue
        close = difflib.get_close_matches(key.lower(), list(known), n=4, cutoff=0.6)
        hint = f"; close: {', '.join(known[c] for c in close)}" if close else ""
        raise UserError(
            f"{where}: unknown op '{key}' (an IR op such as Conv or Softmax, or a circle "
            f"operator such as CONV_2D or SOFTMAX{hint})"
        )
