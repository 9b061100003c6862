"""An IR model as circle, only when the circle reads back to the same model: what packages ship.

A package's CPU part must run bit for bit as the IR part it came from (its neighbours, compiled
`.tvn` parts, expect the same tensors), so a circle is kept only when (1) the writer expresses
every node, (2) read back, its inputs and outputs have the IR's names, dtypes, shapes and
quantization parameters (scales pass through float32 in the file), and (3) read back, it gives
the IR's outputs bit for bit on a seeded probe batch (quantized inputs over their whole integer
range, other integer inputs zero, float inputs standard normal). Otherwise the reason says which
check failed; an unexpected fault of the writer, reader or interpreter is such a reason too, so
packing never fails for it.
"""

import numpy as np

from ...errors import FormatError, ModelError
from ..interpreter import Interpreter
from ..ir import Model, Value
from .circle_arith import onert_arithmetic

PROBE_SAMPLES = 4


def exact_circle(model: Model) -> tuple[bytes | None, str | None]:
    """(circle bytes, None) when the circle is exact; (None, the reason) when it is not."""
    try:
        return _checked(model)
    except (ModelError, FormatError) as error:
        return None, str(error)
    except Exception as error:  # a writer or reader fault must not fail a package that works
        return None, f"the circle round trip failed ({type(error).__name__}: {error})"


def _checked(model: Model) -> tuple[bytes | None, str | None]:
    from . import read_circle, write_circle  # the format modules load when first used

    data = write_circle(model)
    back = read_circle(data, "circle").main
    graph = model.main
    pairs = [*zip(graph.inputs, back.inputs), *zip(graph.outputs, back.outputs)]
    if len(back.inputs) != len(graph.inputs) or len(back.outputs) != len(graph.outputs):
        return None, "the circle has another number of inputs or outputs"
    for mine, theirs in pairs:
        if _spec(mine) != _spec(theirs):
            return None, (
                f"tensor '{mine.name}' reads back from circle as {_spec(theirs)}, not {_spec(mine)}"
            )
    rng = np.random.default_rng(0)
    feeds = {v.name: _probe(v, rng) for v in graph.inputs}
    with onert_arithmetic(graph):  # what the circle asks of onert (`circle_arith`)
        want = Interpreter(graph).run_batch(feeds)
    got = Interpreter(back).run_batch(feeds)
    for value in graph.outputs:
        a, b = want[value.name], got[value.name]
        if not np.array_equal(a, b):
            moved = float(np.mean(a != b))
            return None, (
                f"output '{value.name}' differs after a circle round trip ({moved:.1%} of a "
                "probe batch's elements)"
            )
    return data, None


def _spec(value: Value) -> tuple:
    quant = value.quant
    params = None
    if quant is not None:
        params = (tuple(np.ravel(quant.scale)), tuple(np.ravel(quant.zero_point)), quant.axis)
    return value.name, value.dtype.name, tuple(value.shape), params


def _probe(value: Value, rng: np.random.Generator) -> np.ndarray:
    shape = (PROBE_SAMPLES, *value.shape)
    dtype = value.dtype
    if np.issubdtype(dtype, np.integer):
        if value.quant is None:  # indices, sizes: zeros are valid
            return np.zeros(shape, dtype)
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    return rng.standard_normal(shape).astype(dtype)
