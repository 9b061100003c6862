"""Single operators in the interpreter (imported, optionally after O1) against onnxruntime, on
the inputs a review found wrong: extreme integers, infinities, crops, shorter index tensors."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onebuild.errors import ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde.onnx_import import import_onnx


def op_model(nodes, inputs: dict, outputs: list[str], inits: dict, opset: int = 19):
    """A graph of `nodes` reading the arrays `inputs` (graph inputs) and `inits` (initializers)."""
    graph = helper.make_graph(
        nodes,
        "op",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_value_info(name, onnx.TypeProto()) for name in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def both(model, feeds: dict, optimize: bool = False) -> tuple[list, list]:
    """(onebuild's outputs, onnxruntime's outputs)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    imported = import_onnx(model, "op", {k: v.shape for k, v in feeds.items()})
    if optimize:
        run_preset(imported)
    graph = imported.main
    results = Interpreter(graph).run(feeds)
    return [results[v.name] for v in graph.outputs], session.run(None, feeds)


def assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_top_k_largest_of_extreme_integers(dtype):
    """The type's minimum sorts last (-INT_MIN overflowed to INT_MIN and came first)."""
    info = np.iinfo(dtype)
    x = np.array([[info.min, 5, info.max, 0, info.min]], dtype)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    model = op_model([node], {"x": x}, ["v", "i"], {"k": np.int64([3])})
    assert_same(*both(model, {"x": x}))


def test_gather_elements_with_indices_shorter_on_another_axis():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    node = helper.make_node("GatherElements", ["d", "i"], ["y"], axis=0)
    model = op_model([node], {"d": data}, ["y"], {"i": np.int64([[2, -1]])})
    assert_same(*both(model, {"d": data}))


def test_reduce_log_sum_exp_of_infinite_rows():
    """An all -inf row (a masked row) gives -inf, a +inf row +inf (they were NaN)."""
    x = np.float32([[-np.inf, -np.inf], [0, -np.inf], [np.inf, 1], [3, 4]])
    node = helper.make_node("ReduceLogSumExp", ["x", "a"], ["y"], keepdims=0)
    model = op_model([node], {"x": x}, ["y"], {"a": np.int64([1])}, opset=18)
    got, want = both(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("mode", ["wrap", "edge", "reflect", "constant"])
@pytest.mark.parametrize("pads", [[0, -2, 0, 3], [0, 1, 0, -2], [0, -1, 0, 1], [0, 2, 0, -1]])
def test_pad_crops_before_it_pads(mode, pads):
    """wrap repeats the cropped tensor (it wrapped the uncropped one: [2 3 4 0 1 2])."""
    if mode == "reflect" and pads == [0, -2, 0, 3]:
        pads = [0, -2, 0, 2]  # onnxruntime refuses 3 (see the next test)
    x = np.arange(5, dtype=np.float32).reshape(1, 5)
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    model = op_model([node], {"x": x}, ["y"], {"p": np.int64(pads)})
    assert_same(*both(model, {"x": x}))


@pytest.mark.parametrize("pads", [[0, 5, 0, 0], [0, -1, 0, 4]])
def test_pad_reflect_beyond_one_reflection_is_refused(pads):
    """onnxruntime refuses a reflect pad of the axis length or more (after cropping)."""
    x = np.arange(5, dtype=np.float32).reshape(1, 5)
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect", name="pad")
    model = op_model([node], {"x": x}, ["y"], {"p": np.int64(pads)})
    with pytest.raises(Exception, match="reflect"):  # the reference refuses too
        ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    with pytest.raises(ModelError, match="node 'pad' .*reflect pads .* use mode 'edge'"):
        import_onnx(model, "op", {"x": x.shape})


def test_division_by_a_subnormal_constant_stays_a_division_under_o1():
    """1 / 1e-39 overflows float32: as a product, 0 / 1e-39 became 0 * inf = NaN."""
    x = np.float32([0.0, 1e-30, -2e-31])
    node = helper.make_node("Div", ["x", "c"], ["y"])
    model = op_model([node], {"x": x}, ["y"], {"c": np.float32(1e-39)})
    got, want = both(model, {"x": x}, optimize=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_float_mod_without_fmod_is_refused():
    """ONNX defines fmod=0 (floor modulo) for integers only; it was computed as floor modulo."""
    a = np.float32([5.5, -5.5])
    node = helper.make_node("Mod", ["a", "b"], ["y"], name="mod")
    model = op_model([node], {"a": a}, ["y"], {"b": np.float32([2, 2])})
    with pytest.raises(Exception, match="Mod"):
        ort.InferenceSession(model.SerializeToString()).run(None, {"a": a})
    with pytest.raises(ModelError, match="node 'mod' .*needs fmod=1"):
        import_onnx(model, "op", {"a": a.shape})


def test_float16_sigmoid_keeps_its_tail():
    """Computed in float32 and rounded once (step by step in float16, Sigmoid(-10) was 0)."""
    x = np.float16([-10, -8, -6, -4, -1, 0, 3, 8])
    model = op_model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": x}, ["y"], {})
    got, want = both(model, {"x": x})
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "HardSigmoid"])
def test_float16_kernels_round_once(op):
    """Within one float16 ulp of onnxruntime, which computes in float32 (LogSoftmax was 16
    ulps off, Softmax 4, HardSigmoid 2)."""
    x = (np.random.default_rng(0).standard_normal((2, 3, 4, 5)) * 3).astype(np.float16)
    model = op_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"], {}, opset=21)
    got, want = both(model, {"x": x})
    ulp = np.maximum(np.abs(want[0].astype(np.float64)) * 2**-10, 2**-24)
    assert got[0].dtype == np.float16
    assert (np.abs(got[0].astype(np.float64) - want[0]) <= ulp).all()


def test_float32_sigmoid_tail_against_the_exact_value():
    """Below -17 the tanh form cancelled to 0. onnxruntime's approximation loses this tail too
    (5.96e-8 for Sigmoid(-16), exact 1.13e-7): the reference here is the exact value."""
    x = np.float32([-16, -20, -30, -80])
    model = op_model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": x}, ["y"], {})
    graph = import_onnx(model, "op", {"x": x.shape}).main
    got = Interpreter(graph).run({"x": x})[graph.outputs[0].name]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


def test_float16_layer_normalization_stashes_in_float32():
    """Mean and InvStdDev are float32 with stash_type 1 (they were float16)."""
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float16)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"])
    inits = {"s": np.linspace(0.5, 2, 8).astype(np.float16), "b": np.full(8, 0.25, np.float16)}
    got, want = both(op_model([node], {"x": x}, ["y", "mean", "inv"], inits, opset=17), {"x": x})
    assert [g.dtype for g in got] == [w.dtype for w in want] == [np.float16, np.float32, np.float32]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3)


def test_dequantize_linear_takes_the_scale_type():
    q = np.arange(-128, 128, 7, dtype=np.int8).reshape(1, -1)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])
    inits = {"s": np.float16(0.0123), "z": np.int8(3)}
    assert_same(*both(op_model([node], {"q": q}, ["y"], inits), {"q": q}))


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize(("kernel", "stride"), [(1, 2), (1, 3), (2, 3), (2, 4)])
def test_conv_transpose_same_with_a_stride_beyond_the_kernel(auto_pad, kernel, stride):
    """onnxruntime returns (in - 1) * stride + kernel samples when SAME would need negative
    padding (onnx.reference pads to in * stride); onebuild follows onnxruntime."""
    rng = np.random.default_rng(kernel * 10 + stride)
    x = rng.standard_normal((1, 1, 4)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[stride], auto_pad=auto_pad)
    model = op_model(
        [node], {"x": x}, ["y"], {"w": rng.standard_normal((1, 1, kernel)).astype(np.float32)}
    )
    got, want = both(model, {"x": x})
    assert got[0].shape == want[0].shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_of_opset_7(mode):
    """Opset 7's scales are an attribute (it raised AttributeError)."""
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=[1.0, 1.0, 2.0, 1.5])
    got, want = both(op_model([node], {"x": x}, ["y"], {}, opset=7), {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("c_shape", [(3, 5), (3, 1), (5,)])
def test_batchnorm_folds_into_a_gemm_with_a_full_c(c_shape):
    """C of [M, N] stays [M, N] in the fold (the O1 fold raised)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], alpha=0.5, beta=2.0),
        helper.make_node("BatchNormalization", ["g", "s", "b", "mu", "v"], ["y"]),
    ]
    inits = {
        "w": rng.standard_normal((4, 5)).astype(np.float32),
        "c": rng.standard_normal(c_shape).astype(np.float32),
        "s": rng.uniform(0.5, 2, 5).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
        "mu": rng.standard_normal(5).astype(np.float32),
        "v": rng.uniform(0.5, 2, 5).astype(np.float32),
    }
    model = op_model(nodes, {"x": x}, ["y"], inits)
    got, want = both(model, {"x": x}, optimize=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_space_to_depth_writes_back_without_a_mode():
    """ONNX's SpaceToDepth has no mode: the exported model passes the checker and runs."""
    from onebuild.graph_ir.serde.onnx_export import export_onnx

    x = np.arange(48, dtype=np.float32).reshape(1, 2, 4, 6)
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    model = op_model([node], {"x": x}, ["y"], {})
    exported = export_onnx(import_onnx(model, "op", {"x": x.shape}))
    onnx.checker.check_model(exported, full_check=True)
    assert_same(*both(exported, {"x": x}))
