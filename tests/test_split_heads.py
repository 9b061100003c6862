"""O1 takes attention's q/k/v Slices before the Transpose that moves the batch axis (PP-OCR's
recognizer: [1, T, 3, H, D] -> [3, 1, H, T, D] -> three one-index Slices), so the graph runs
batches; every value is the same as before (checked element by element on distinct values)."""

import numpy as np
from onnx import helper
from onnx_builders import make_model

from onebuild.graph_ir.batching import batch_plan
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde.onnx_import import import_onnx

SHAPE = [1, 5, 3, 2, 4]  # T, 3, heads, head dim


def _qkv_split():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1, 4])]
    for name in "qkv":
        starts, ends, axes = [f"{name}_s", f"{name}_e", "axis"]
        nodes += [
            helper.make_node("Slice", ["t", starts, ends, axes], [f"{name}5"]),
            helper.make_node("Squeeze", [f"{name}5", "axis"], [name]),
        ]
    constants = [("axis", np.array([0]))]
    for i, name in enumerate("qkv"):
        constants += [(f"{name}_s", np.array([i])), (f"{name}_e", np.array([i + 1]))]
    return import_onnx(make_model(nodes, [("x", SHAPE)], list("qkv"), constants))


def test_qkv_slices_move_before_the_transpose_and_values_stay_the_same():
    unchanged, model = _qkv_split(), _qkv_split()
    assert batch_plan(model.main) is None  # the Transpose moves axis 0
    run_preset(model)
    ops = [n.op for n in model.main.nodes]
    assert all(n.attrs["perm"][0] == 0 for n in model.main.nodes if n.op == "Transpose"), ops
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)  # every value distinct
    want = Interpreter(unchanged.main).run({"x": x})
    got = Interpreter(model.main).run({"x": x})
    for name in "qkv":
        np.testing.assert_array_equal(got[name], want[name])
    interpreter = Interpreter(model.main)
    assert interpreter.batchable
    batch = np.stack([x, -x, 2 * x])
    batched = interpreter.run_batch({"x": batch})
    for index, sample in enumerate(batch):
        single = Interpreter(unchanged.main).run({"x": sample})
        for name in "qkv":
            np.testing.assert_array_equal(batched[name][index], single[name])
