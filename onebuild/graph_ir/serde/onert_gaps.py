"""What onert 0.1.0 (the ONE runtime's Python wheel, a test extra) cannot run in a circle or
tflite file, by operator and element type: one place, each gap found with a one-operator
reproduction (`tests/test_onert_gaps.py`). onert loads such a file and fails at `prepare` or
only at `run` ("Transpose: unsupported data type"), or refuses to load it
("OperationValidator failed"). The operators it lacks in every type, which the circle writer
spells around, are in docs/circle-tflite.md."""

from collections import Counter

import numpy as np

from .flatbuf import Buffer
from .tflite_schema import BUILTIN_NAMES, TENSOR_TYPES

# (operator, type of its first input) -> onert 0.1.0's complaint
GAPS = {
    ("TRANSPOSE", "int8"): "Transpose: unsupported data type",
    ("FULLY_CONNECTED", "int8"): "FullyConnected: unsupported data type",
}
# no int16 tensor at all: the API refuses int16 inputs and outputs ("Model has type that runtime
# API does not support"), MAX_POOL_2D, FULLY_CONNECTED, TRANSPOSE and copies have no int16 kernel,
# and a model with int16 convolutions fails to load ("OperationValidator failed")
UNSUPPORTED_TYPES = ("int16",)
SHOWN = 4


def onert_gaps(data: bytes) -> str | None:
    """One phrase saying what onert 0.1.0 cannot run in the flatbuffer `data`, or None."""
    root = Buffer(bytes(data), "model").root(None)
    codes = [max(c.scalar(0, "b"), c.scalar(3, "i")) for c in root.tables(1, "operator codes")]
    found: Counter = Counter()
    types: set[str] = set()
    for graph in root.tables(2, "subgraphs"):
        tensors = [
            TENSOR_TYPES.get(t.scalar(1, "b"), np.dtype("V1")) for t in graph.tables(0, "tensors")
        ]
        types.update(t.name for t in tensors)
        for op in graph.tables(3, "operators"):
            name = BUILTIN_NAMES.get(codes[op.scalar(0, "I")], "CUSTOM")
            inputs = op.array(1, "int32", "operator inputs")
            dtype = tensors[inputs[0]].name if len(inputs) and inputs[0] >= 0 else ""
            if (name, dtype) in GAPS:
                found[f"{name} {dtype}"] += 1
    parts = [f"{' and '.join(t for t in UNSUPPORTED_TYPES if t in types)} tensors"]
    parts = parts if types & set(UNSUPPORTED_TYPES) else []
    listed = [f"{op} x{n}" for op, n in sorted(found.items())]
    parts += listed[:SHOWN] + ([f"{len(listed) - SHOWN} more"] if len(listed) > SHOWN else [])
    if not parts:
        return None
    return f"onert 0.1.0 cannot run it ({', '.join(parts)}: no such kernels)"
