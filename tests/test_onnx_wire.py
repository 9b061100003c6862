"""Embedded ONNX weights are memory-mapped from the model file, not parsed and copied."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onebuild.errors import ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.graph_ir.serde.onnx_wire import map_embedded_weights


def _matmul_model(weight: onnx.TensorProto) -> onnx.ModelProto:
    """y = x @ w for x [1, 200]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 200])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 200])],
        [weight],
    )
    return helper.make_model(graph)


def test_embedded_weights_are_mapped_and_give_the_same_results(tmp_path, rng):
    proto = light_model("squeezenet", seed=3)
    onnx.save(proto, tmp_path / "m.onnx")
    mapped = load_onnx(tmp_path / "m.onnx").main
    large = [v for v in mapped.constants.values() if v.const.nbytes >= 1 << 16]
    assert large and not any(v.const.is_loaded for v in large)
    # weights at offsets unaligned for float32 are read as aligned copies
    stripped = onnx.load_model_from_string(
        map_embedded_weights((tmp_path / "m.onnx").read_bytes(), "m.onnx")
    )
    offsets = {
        t.name: int(next(e.value for e in t.external_data if e.key == "offset"))
        for t in stripped.graph.initializer
        if t.external_data
    }
    unaligned = [v for v in large if offsets[v.name] % 4]
    assert unaligned and all(v.numpy().flags.aligned for v in large)
    reference = import_onnx(proto).main
    for value in large:
        np.testing.assert_array_equal(value.numpy(), reference.constants[value.name].numpy())
    feeds = {v.name: rng.random(v.shape, dtype=np.float32) for v in mapped.inputs}
    got, want = Interpreter(mapped).run(feeds), Interpreter(reference).run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_rewritten_model_refers_to_the_bytes_in_the_file(tmp_path):
    weight = np.arange(40000, dtype=np.float32).reshape(200, 200)
    data = _matmul_model(numpy_helper.from_array(weight, "w")).SerializeToString()
    stripped = onnx.load_model_from_string(map_embedded_weights(data, "model.onnx"))
    (tensor,) = stripped.graph.initializer
    info = {entry.key: entry.value for entry in tensor.external_data}
    assert tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data
    assert info["location"] == "model.onnx" and int(info["length"]) == weight.nbytes
    start = int(info["offset"])
    assert data[start : start + weight.nbytes] == weight.tobytes()
    assert map_embedded_weights(data, "model.onnx", min_bytes=weight.nbytes + 1) is None
    assert map_embedded_weights(data[:-7], "model.onnx") is None  # malformed: parsed as usual


def test_raw_data_of_the_wrong_size_is_a_one_line_error(tmp_path):
    tensor = numpy_helper.from_array(np.zeros((100, 200), np.float32), "w")
    tensor.dims[:] = [200, 200]  # the bytes hold half of that
    onnx.save(_matmul_model(tensor), tmp_path / "bad.onnx")
    with pytest.raises(ModelError, match="tensor 'w'") as error:
        load_onnx(tmp_path / "bad.onnx")
    assert "\n" not in str(error.value)
