"""Control flow: `If` runs one of two subgraphs, chosen by a boolean computed at run time;
`Loop` runs its body while a run-time condition holds (and a trip count allows).

A node's subgraphs are IR `Graph`s held in its attributes (the registry lists which:
`OpDef.subgraphs`). A branch reads nothing of the outer graph by name: every outer value it
needs is an explicit input of the node after the condition, and each branch has one graph input
per such value, in the same order. Outer-scope reads are so ordinary uses (sorting and
dead-code elimination see them) and a branch is a self-contained graph.
"""

from collections.abc import Sequence

import numpy as np

from ...errors import InputValueError
from .registry import Attrs, TensorType, register

BRANCHES = ("then_branch", "else_branch")
MAX_ITERATIONS = 1 << 20  # a Loop still going after this many is an error, not a hang


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


def infer_loop(attrs: Attrs, types: Sequence[TensorType | None]) -> list[TensorType]:
    """Inputs: trip count (int64), condition (bool), `carried` loop-carried values, then the
    outer values the body reads. The body takes (iteration int64[], condition bool[], carried
    ..., outer ...) and gives (condition, carried ...); the node gives the final carried."""
    trips, condition, *values = types
    for what, t, dtype in (("trip count", trips, np.int64), ("condition", condition, np.bool_)):
        if t is None or t.dtype != dtype or int(np.prod(t.shape)) != 1:
            raise ValueError(f"the {what} must be one {np.dtype(dtype)}, not {_text([t])}")
    carried = attrs["carried"]
    if not 0 <= carried <= len(values):
        raise ValueError(f"carries {carried} values but has {len(values)} inputs after two")
    body = attrs["body"]
    scalars = [TensorType(np.dtype(np.int64), ()), TensorType(np.dtype(np.bool_), ())]
    takes, given = _text([v.type for v in body.inputs]), _text([*scalars, *values])
    if takes != given:
        raise ValueError(f"its body takes ({takes}), the node gives ({given})")
    gives, wanted = _text([v.type for v in body.outputs]), _text([scalars[1], *values[:carried]])
    if gives != wanted:
        raise ValueError(f"its body gives ({gives}); it must give ({wanted})")
    return list(values[:carried])


@register("Loop", infer_loop, batch=None, subgraphs=("body",))
def loop(
    attrs: Attrs, trips: np.ndarray, condition: np.ndarray, *values: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Run the body while the condition holds, at most `trips` times, carrying values."""
    from ..interpreter import Interpreter  # the interpreter runs registered kernels

    body, count = attrs["body"], attrs["carried"]
    interpreter, names = Interpreter(body), [v.name for v in body.inputs]
    carried, outer = list(values[:count]), list(values[count:])
    limit, going = int(trips.reshape(-1)[0]), bool(condition.reshape(-1)[0])
    iteration = 0
    while going and iteration < limit:
        if iteration == MAX_ITERATIONS:
            raise InputValueError(f"the loop is still going after {MAX_ITERATIONS} iterations")
        feeds = [np.array(iteration, np.int64), np.array(going), *carried, *outer]
        results = interpreter.run(dict(zip(names, feeds)))
        going = bool(results[body.outputs[0].name].reshape(-1)[0])
        carried = [results[v.name] for v in body.outputs[1:]]
        iteration += 1
    return tuple(carried)
