"""Control flow: `If` runs one of two subgraphs, chosen by a boolean computed at run time.

A node's subgraphs are IR `Graph`s held in its attributes (the registry lists which:
`OpDef.subgraphs`). A branch reads nothing of the outer graph by name: every outer value it
needs is an explicit input of the node after the condition, and each branch has one graph input
per such value, in the same order. Outer-scope reads are so ordinary uses (sorting and
dead-code elimination see them) and a branch is a self-contained graph.
"""

from collections.abc import Sequence

import numpy as np

from .registry import Attrs, TensorType, register

BRANCHES = ("then_branch", "else_branch")


def infer_if(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Both branches take the node's inputs after the condition and give the same types."""
    condition, *captured = types
    if condition is None or condition.dtype != np.bool_ or int(np.prod(condition.shape)) != 1:
        raise ValueError(f"the condition must be one bool, not {_text([condition])}")
    given, outputs = _text(captured), {}
    for key in BRANCHES:
        branch = attrs[key]
        takes = _text([v.type for v in branch.inputs])
        if takes != given:
            raise ValueError(f"{key} takes ({takes}), the node gives ({given})")
        outputs[key] = [v.type for v in branch.outputs]
    if _text(outputs["then_branch"]) != _text(outputs["else_branch"]):
        raise ValueError(
            f"then_branch gives ({_text(outputs['then_branch'])}), else_branch gives "
            f"({_text(outputs['else_branch'])}); both branches must give the same types"
        )
    return outputs["then_branch"]


def _text(types: Sequence[TensorType | None]) -> str:
    return ", ".join("none" if t is None else f"{t.dtype}{list(t.shape)}" for t in types)


@register("If", infer_if, batch=None, subgraphs=BRANCHES)
def if_(attrs: Attrs, condition: np.ndarray, *captured: np.ndarray) -> tuple[np.ndarray, ...]:
    """Run then_branch if the condition is true, else_branch otherwise, on the inputs after it."""
    from ..interpreter import Interpreter  # the interpreter runs registered kernels

    branch = attrs[BRANCHES[0] if bool(np.asarray(condition).reshape(-1)[0]) else BRANCHES[1]]
    results = Interpreter(branch).run({v.name: a for v, a in zip(branch.inputs, captured)})
    return tuple(results[v.name] for v in branch.outputs)
