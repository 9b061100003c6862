"""Resize in the interpreter against onnxruntime, the runtime users compare with: output lengths,
coordinate transforms on the integer output length, nearest ties, and integer saturation."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onebuild.errors import ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde.onnx_import import import_onnx

DTYPES = {np.float32: TensorProto.FLOAT, np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def resize_model(x: np.ndarray, inputs: dict, **attrs):
    """Resize of x with roi/scales/sizes given as initializers (absent ones left empty)."""
    names = [n if n in inputs else "" for n in ("roi", "scales", "sizes")]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Resize", ["x", *names], ["y"], name="resize", **attrs)
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", DTYPES[x.dtype.type], x.shape)],
        [helper.make_tensor_value_info("y", DTYPES[x.dtype.type], None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8
    return model


def both(model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(onebuild's output, onnxruntime's output)."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = import_onnx(model, "resize", {"x": x.shape}).main
    got = Interpreter(graph).run({"x": x})[graph.outputs[0].name]
    return got, want.run(None, {"x": x})[0]


def ramp(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32).reshape(1, 1, 1, n)


def test_tf_crop_and_resize_by_scales_samples_the_whole_roi():
    """Output length floor(in * scale) (not scaled by the roi), coordinates across the roi."""
    inputs = {"roi": np.float32([0, 0, 0, 0, 1, 1, 1, 0.5]), "scales": np.float32([1, 1, 1, 2])}
    crop = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}
    model = resize_model(ramp(5), inputs, **crop)
    got, want = both(model, ramp(5))
    assert got.shape == want.shape == (1, 1, 1, 10)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize(("mode", "scale"), [("align_corners", 1.5), ("pytorch_half_pixel", 0.3)])
def test_fractional_scales_use_the_integer_output_length(mode, scale):
    """align_corners x1.5 of 0..4 ends at 4 (onnx.reference: 3.69 on the fractional 7.5)."""
    scales = {"scales": np.float32([1, 1, 1, scale])}
    model = resize_model(ramp(5), scales, mode="linear", coordinate_transformation_mode=mode)
    got, want = both(model, ramp(5))
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_keep_aspect_ratio_rounds_half_up(policy):
    """14x21 to fit 7x10 (not_larger: 0.5 -> 7x10.5 -> 11) and 5x11 (not_smaller)."""
    x = np.arange(14 * 21, dtype=np.float32).reshape(1, 1, 14, 21)
    sizes = {"not_larger": [7, 11], "not_smaller": [5, 11]}[policy]
    model = resize_model(
        x, {"sizes": np.int64(sizes)}, axes=[2, 3], keep_aspect_ratio_policy=policy, mode="nearest"
    )
    got, want = both(model, x)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("n_in", "n_out", "coord", "rule"),
    [
        (7, 0.75, "half_pixel_symmetric", "ceil"),  # a scale, not a size
        (7, 18, "asymmetric", "round_prefer_ceil"),
        (7, 2, "asymmetric", "round_prefer_ceil"),  # 3.5 exactly, not float32's 3.4999998
        (10, 12, "asymmetric", "round_prefer_ceil"),
        (10, 12, "tf_crop_and_resize", "round_prefer_ceil"),
        (9, 6, "half_pixel", "round_prefer_floor"),
        (6, 9, "align_corners", "round_prefer_ceil"),
    ],
)
def test_nearest_ties_pick_the_pixel_onnxruntime_picks(n_in, n_out, coord, rule):
    inputs = {"sizes": np.int64([1, 1, 1, n_out])}
    if coord == "tf_crop_and_resize":
        inputs["roi"] = np.float32([0, 0, 0, 0, 1, 1, 1, 1])
    elif coord == "half_pixel_symmetric":
        inputs = {"scales": np.float32([1, 1, 1, n_out])}
    model = resize_model(
        ramp(n_in), inputs, mode="nearest", coordinate_transformation_mode=coord, nearest_mode=rule
    )
    got, want = both(model, ramp(n_in))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("values", [[0, 255, 0, 255, 0, 255], [0, 0, 255, 255, 0, 0]])
def test_uint8_cubic_overshoot_saturates(values):
    """Cubic rings past [0, 255]; the result saturates (it wrapped: 255 -> 27)."""
    x = np.uint8(values).reshape(1, 1, 1, 6)
    model = resize_model(x, {"scales": np.float32([1, 1, 1, 2.5])}, mode="cubic", antialias=1)
    got, want = both(model, x)
    np.testing.assert_array_equal(got, want)


def opset10_resize(x: np.ndarray, scales: list[float]):
    node = helper.make_node("Resize", ["x", "s"], ["y"], mode="nearest", name="resize")
    graph = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.float32(scales), "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("scale", [0.6, 0.75, 0.9, 2.5])
def test_opset_10_nearest_rounds_up_when_shrinking(scale):
    """Before nearest_mode, onnxruntime takes ceil on a shrinking axis (it was floor)."""
    x = ramp(10)
    got, want = both(opset10_resize(x, [1, 1, 1, scale]), x)
    np.testing.assert_array_equal(got, want)


def test_opset_10_nearest_shrinking_and_growing_is_refused():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    with pytest.raises(ModelError, match="node 'resize' .*shrinks some axes and grows others"):
        import_onnx(opset10_resize(x, [1, 1, 0.5, 2]), "resize", {"x": x.shape})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", ["asymmetric", "half_pixel", "tf_crop_and_resize"])
def test_an_unchanged_shape_returns_the_input(mode, coord):
    """x1.2125 of length 4 is 4 long: onnxruntime returns the input (the reference resamples)."""
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    inputs = {"scales": np.float32([1, 1, 1.2125, 1.2125])}
    if coord == "tf_crop_and_resize":
        inputs["roi"] = np.float32([0, 0, 0.1, 0.1, 1, 1, 0.9, 0.9])
    got, want = both(resize_model(x, inputs, mode=mode, coordinate_transformation_mode=coord), x)
    np.testing.assert_array_equal(got, want)
