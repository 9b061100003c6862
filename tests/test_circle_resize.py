"""Nearest Resize in circle: onert 0.1.0 has no RESIZE_NEAREST_NEIGHBOR kernel, so circle spells
upsampling by whole factors (torch's nn.Upsample(scale_factor=2)) as RESHAPE and CONCATENATION
of copies, which onert runs and the reader folds back; other factors keep the operator (LiteRT
runs it, onert does not: listed in docs/circle-tflite.md)."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import operator_list, run_litert, run_onert

from onebuild import compile as C
from onebuild.errors import UnsupportedOpsError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle
from onebuild.npz import read_npz

ROOT = Path(__file__).resolve().parent.parent


def digits(count: int) -> np.ndarray:
    images = read_npz(ROOT / "examples" / "digits" / "data" / "test.npz")["input"][:count]
    return images.astype(np.float32).reshape(count, 1, 1, 8, 8)


def upsample(tmp_path, sizes: list[int], channels: int = 1):
    """Resize nearest (asymmetric, floor: how torch exports nn.Upsample) of [1, C, 8, 8]."""
    node = helper.make_node(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
        name="up",
    )
    shape = [1, channels, 8, 8]
    sizes_init = ("sizes", np.asarray([1, channels, *sizes], np.int64))
    path = tmp_path / "up.onnx"
    path.write_bytes(make_model([node], [("x", shape)], ["y"], [sizes_init]).SerializeToString())
    return load_onnx(path)


def test_onert_has_no_nearest_resize_kernel(tmp_path, capfd):
    """One operator: RESIZE_NEAREST_NEIGHBOR 8x8 -> 12x12 (no whole factor): onert fails at
    prepare, LiteRT runs it to the interpreter's output."""
    model = upsample(tmp_path, [12, 12])
    data = write_circle(model)
    assert "RESIZE_NEAREST_NEIGHBOR" in operator_list(data)
    x = digits(1)[0]
    with pytest.raises(Exception, match="NNFW_STATUS_ERROR"):
        run_onert(data, tmp_path, [[x]])
    assert "KernelGenerator: NYI for operation 'ResizeNearestNeighbor'" in capfd.readouterr().err
    want = Interpreter(model.main).run({"x": x})["y"]
    got = run_litert(write_circle(model, "tflite"), [[x]])[0][0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sizes", [[16, 16], [16, 24], [8, 32]])
def test_whole_factor_upsampling_runs_in_onert_and_reads_back(tmp_path, sizes):
    model = upsample(tmp_path, sizes, channels=3)
    data, reason = exact_circle(model)
    assert reason is None
    assert "RESIZE_NEAREST_NEIGHBOR" not in operator_list(data)
    assert [n.op for n in read_circle(data).main.nodes] == ["Resize"]
    x = digits(3).reshape(1, 3, 8, 8)  # three digits as channels
    got = run_onert(data, tmp_path, [[x]])[0][0]
    np.testing.assert_array_equal(got, Interpreter(model.main).run({"x": x})["y"])


def test_quantized_upsampling_runs_in_onert_on_the_codes(tmp_path):
    model = upsample(tmp_path, [16, 16])
    x = digits(16)
    stats = C.calibrate(model.main, [("digits", {"x": x})])
    options = C.QuantizeOptions(input_type="uint8", output_type="uint8")
    quantized = C.quantize(model, options, stats)
    graph = quantized.main
    assert graph.nodes[0].op == "Resize" and graph.inputs[0].dtype == np.uint8
    data, reason = exact_circle(quantized)
    assert reason is None
    params = graph.inputs[0].quant
    codes = np.clip(np.rint(x / params.scale[0]) + params.zero_point[0], 0, 255).astype(np.uint8)
    got = np.concatenate([r[0] for r in run_onert(data, tmp_path, [[c] for c in codes])])
    want = Interpreter(graph).run_batch({"x": codes})["y"]
    np.testing.assert_array_equal(got, want.reshape(got.shape))


@pytest.mark.parametrize(
    "shape, scales, written",
    [
        ((1, 1, 4, 6), [1, 1, 2, 1.5], True),  # the size ratios
        ((1, 1, 9, 6), [1, 1, 1 / 3, 0.5], True),  # float32(1/3): the ratio 3 / 9 in float32
        ((1, 1, 5, 7), [1, 1, 0.6, 0.5], False),  # 3 / 5, 3 / 7 from sizes: another sampling
    ],
)
def test_linear_resize_by_scales_written_only_where_tflite_resizes_by_them(
    tmp_path, shape, scales, written
):
    """RESIZE_BILINEAR takes a size and resizes by out / in; scales that are not those ratios
    have no TFLite form (the node is named; a package keeps it in `.obir`). What is written,
    onert and LiteRT run to onnxruntime's numbers on the source model."""
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="up")
    scales_init = ("scales", np.asarray(scales, np.float32))
    source = make_model([node], [("x", list(shape))], ["y"], [scales_init], opset=19)
    path = tmp_path / "up.onnx"
    path.write_bytes(source.SerializeToString())
    model = load_onnx(path)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    try:
        files = write_circle(model, "tflite"), write_circle(model)
    except UnsupportedOpsError as error:
        assert not written and "node 'up'" in str(error)
        assert exact_circle(model)[0] is None
        return
    lite = run_litert(files[0], [[x]])[0][0]
    np.testing.assert_allclose(lite, want[0], rtol=1e-5, atol=1e-5)
    onert = run_onert(files[1], tmp_path, [[x]])[0][0]
    np.testing.assert_allclose(onert, want[0], rtol=1e-5, atol=1e-5)
    assert written
