"""Operators as the TensorFlow Lite converter writes them in int8 models (an int8 SOFTMAX ending
a classifier, standalone RELU6 / RELU_N1_TO_1 / RELU, quantized PRELU, MEAN and REDUCE_MAX over
non-spatial axes, STRIDED_SLICE float and int8), each in a one-operator file
(`tflite_builder`), read by onebuild and run against LiteRT on its default kernels and on its
builtin ones, and against onert where it runs them. All of them were refused before
("quantized SOFTMAX is not supported", ...)."""

import numpy as np
import pytest
from tflite_builder import Op, Tensor, build, run_litert

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde.circle_read import read_tflite

CODES = np.arange(-128, 128, dtype=np.int8)


def photo_codes(scale: float) -> np.ndarray:
    """scikit-learn's photograph, 32x32 (every 8th pixel), in [-3, 3] as int8 codes."""
    from sklearn.datasets import load_sample_image

    image = load_sample_image("china.jpg")[100:356:8, 200:456:8].astype(np.float32)
    return np.clip(np.rint((image / 127.5 - 1) * 3 / scale), -128, 127).astype(np.int8)[None]


def steps_off(data: bytes, feeds: list[np.ndarray]) -> tuple[list[str], list[tuple]]:
    """The IR ops read, and (largest difference in steps, fraction of elements differing)
    from LiteRT's default kernels, then from its builtin kernels."""
    graph = read_tflite(data).main
    got = Interpreter(graph).run_batch({graph.inputs[0].name: np.stack(feeds)})
    got = got[graph.outputs[0].name].astype(np.float64)
    found = []
    for builtin in (False, True):
        want = np.stack(run_litert(data, feeds, builtin)).reshape(got.shape)
        off = np.abs(got - want)
        found.append((float(off.max()), float((off > 0).mean())))
    return [n.op for n in graph.nodes], found


def one_op(code, x: Tensor, y: Tensor, constants=(), **options) -> bytes:
    names = [x.name, *(c.name for c in constants)]
    return build([x, *constants, y], [Op(code, names, [y.name], options)], [x.name], [y.name])


def classifier_logits() -> np.ndarray:
    """Logits of a logistic regression trained on scikit-learn's digits, for 200 test images."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    x = digits.data / 16.0
    model = LogisticRegression(max_iter=500).fit(x[:1000], digits.target[:1000])
    return model.decision_function(x[1000:1200]).astype(np.float32)


@pytest.mark.parametrize("zero_point", [0, 9])
def test_int8_softmax_of_a_classifier_is_litert_bit_for_bit(zero_point):
    """The converter's int8 SOFTMAX (output scale 1/256, zero point -128): the IR's QSoftmax."""
    logits = classifier_logits()
    scale = float(np.abs(logits).max() / 120)
    codes = np.clip(np.rint(logits / scale) + zero_point, -128, 127).astype(np.int8)
    data = one_op(
        "SOFTMAX",
        Tensor("x", "int8", (1, 10), (scale, zero_point)),
        Tensor("y", "int8", (1, 10), (1 / 256, -128)),
        beta=1.0,
    )
    ops, found = steps_off(data, [c[None] for c in codes])
    assert ops == ["QSoftmax"] and found == [(0, 0.0), (0, 0.0)]


@pytest.mark.parametrize("scale,beta", [(0.1, 1.0), (0.25, 1.0), (0.05, 0.5)])
def test_int8_softmax_of_every_code_pair_is_litert_bit_for_bit(scale, beta):
    pairs = np.stack(np.broadcast_arrays(CODES[:, None], CODES[None, :]), -1)  # [256, 256, 2]
    data = one_op(
        "SOFTMAX",
        Tensor("x", "int8", (256, 2), (scale, -3)),
        Tensor("y", "int8", (256, 2), (1 / 256, -128)),
        beta=beta,
    )
    assert steps_off(data, list(pairs)) == (["QSoftmax"], [(0, 0.0), (0, 0.0)])


@pytest.mark.parametrize(
    "code,output",
    [("RELU6", (6 / 255, -128)), ("RELU6", (0.05, 3)), ("RELU_N1_TO_1", (2 / 255, 0)),
     ("RELU", (0.03, -128))],
)  # fmt: skip
def test_quantized_relus_of_every_code_are_litert_bit_for_bit(code, output):
    """RELU6 and RELU_N1_TO_1 (refused before) as TFLite's ReluX: each code requantized (two
    roundings) and clamped to the bounds' codes (a table of the float function is 1 step off
    LiteRT on code 90 for RELU6 here). A quantized RELU keeps the function's table (onebuild's
    writer spells a Relu QLookup so), which LiteRT matches on every code here."""
    data = one_op(
        code, Tensor("x", "int8", (1, 256), (0.04, 5)), Tensor("y", "int8", (1, 256), output)
    )
    assert steps_off(data, [CODES[None]]) == (["QLookup"], [(0, 0.0), (0, 0.0)])


def test_quantized_prelu_of_a_photo_is_within_a_step_of_litert():
    """In float between DequantizeLinear and QuantizeLinear (the IR has no integer PRelu yet):
    1 step off LiteRT on 0.16 % of the elements."""
    alpha = np.array([0.25, -0.5, 0.1], np.float32)
    a_scale = 0.5 / 127
    alpha_codes = np.rint(alpha / a_scale).astype(np.int8).reshape(1, 1, 3)
    data = one_op(
        "PRELU",
        Tensor("x", "int8", (1, 32, 32, 3), (3 / 127, 0)),
        Tensor("y", "int8", (1, 32, 32, 3), (3.5 / 255, -50)),
        [Tensor("alpha", "int8", (1, 1, 3), (a_scale, 0), data=alpha_codes)],
    )
    ops, found = steps_off(data, [photo_codes(3 / 127)])
    assert ops == ["DequantizeLinear", "PRelu", "QuantizeLinear"]
    assert all(steps <= 1 and share < 0.005 for steps, share in found), found


def test_quantized_mean_and_max_over_channels_and_rows():
    """REDUCE_MAX keeps its codes (exact); MEAN over the channels is within a step of LiteRT
    (TFLite rounds its integer mean otherwise: 1 step on 14-17 % of the elements)."""
    x = Tensor("x", "int8", (1, 32, 32, 3), (3 / 127, 0))
    axis = [Tensor("axes", "int32", (1,), data=np.array([3], np.int32))]
    mean = one_op("MEAN", x, Tensor("y", "int8", (1, 32, 32), (2 / 127, -3)), axis)
    ops, found = steps_off(mean, [photo_codes(3 / 127)])
    assert ops == ["DequantizeLinear", "ReduceMean", "QuantizeLinear"]
    assert all(steps <= 1 and share < 0.25 for steps, share in found), found
    rows = [Tensor("axes", "int32", (1,), data=np.array([1], np.int32))]
    largest = one_op("REDUCE_MAX", x, Tensor("y", "int8", (1, 1, 32, 3), (3 / 127, 0)), rows,
                     keep_dims=True)  # fmt: skip
    assert steps_off(largest, [photo_codes(3 / 127)])[1] == [(0, 0.0), (0, 0.0)]


def _vector(name, values):
    return Tensor(name, "int32", (len(values),), data=np.array(values, np.int32))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize(
    "begin,end,strides,masks,shape",
    [
        ([0, 2, -1, 1], [1, 30, 0, 3], [1, 3, -2, 1], {"end_mask": 4}, (1, 10, 16, 2)),
        ([0, 5, 0, 2], [1, 6, 32, 3], [1, 1, 4, 1], {"shrink_axis_mask": 10, "begin_mask": 4},
         (1, 8)),
        ([0, 1, 2, 0], [1, 4, 3, 3], [1, 1, 1, 1], {"offset": True, "begin_mask": 9,
                                                     "end_mask": 9}, (1, 4, 3, 3)),
    ],
)  # fmt: skip
def test_strided_slice_is_litert_bit_for_bit(dtype, begin, end, strides, masks, shape):
    """Negative strides, begin/end masks, shrunk axes and `offset`, on a photo."""
    quant = (3 / 127, 0) if dtype == "int8" else None
    x = Tensor("x", dtype, (1, 32, 32, 3), quant)
    feed = photo_codes(3 / 127)
    if dtype == "float32":
        feed = feed.astype(np.float32) * np.float32(3 / 127)
    operands = [_vector("begin", begin), _vector("end", end), _vector("strides", strides)]
    data = one_op("STRIDED_SLICE", x, Tensor("y", dtype, shape, quant), operands, **masks)
    assert steps_off(data, [feed])[1] == [(0, 0.0), (0, 0.0)]


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantized_softmax_and_strided_slice_are_onert_bit_for_bit(tmp_path, dtype):
    """onert reads the same files: its 8-bit SOFTMAX gives the QSoftmax's codes, its float
    STRIDED_SLICE the Slice's values (its int8 RELU6, PRELU, MEAN, REDUCE_MAX and
    STRIDED_SLICE refuse int8: "unsupported data type")."""
    from test_circle import run_onert

    logits = classifier_logits()
    scale, low = float(np.abs(logits).max() / 120), np.iinfo(dtype).min
    codes = np.clip(np.rint(logits / scale), -128, 127).astype(np.int64) + 128 + low
    softmax = one_op(
        "SOFTMAX",
        Tensor("x", dtype, (1, 10), (scale, 128 + low)),
        Tensor("y", dtype, (1, 10), (1 / 256, low)),
        beta=1.0,
    )
    operands = [_vector("begin", [0, 2, -1, 1]), _vector("end", [1, 30, 0, 3]),
                _vector("strides", [1, 3, -2, 1])]  # fmt: skip
    sliced = one_op("STRIDED_SLICE", Tensor("x", "float32", (1, 32, 32, 3)),
                    Tensor("y", "float32", (1, 10, 16, 2)), operands, end_mask=4)  # fmt: skip
    image = photo_codes(3 / 127).astype(np.float32) * np.float32(3 / 127)
    for data, feeds in ((softmax, [c[None].astype(dtype) for c in codes]), (sliced, [image])):
        graph = read_tflite(data).main
        got = Interpreter(graph).run_batch({"x": np.stack(feeds)})["y"]
        ran = run_onert(data, tmp_path, [[x] for x in feeds], "model.tflite")
        np.testing.assert_array_equal(np.stack([r[0] for r in ran]).reshape(got.shape), got)


@pytest.mark.parametrize(
    "starts,ends,steps",
    [([0, 0, 2, 1], [1, 3, 30, 32], [1, 1, 1, 1]),
     ([0, 2, 31, 0], [1, None, 3, 32], [1, -1, -2, 3]),
     ([0, 0, -1, 0], [1, 3, None, 32], [1, 1, -1, 1])],
)  # fmt: skip
def test_a_slice_is_written_as_litert_and_onert_run_it(tmp_path, starts, ends, steps):
    """The IR's Slice (now also what STRIDED_SLICE reads as) writes as SLICE (steps 1) or
    STRIDED_SLICE and reads back as the same Slice: LiteRT (tflite) and onert (circle) give
    its values bit for bit on a photo."""
    from test_circle import run_onert

    from onebuild.graph_ir.ir import Graph, Model
    from onebuild.graph_ir.serde import write_circle

    graph = Graph("main")
    x = graph.add_input("x", np.float32, (1, 3, 32, 32))
    attrs = {"starts": starts, "ends": ends, "steps": steps}
    graph.outputs.append(graph.make_node("Slice", [x], attrs, "y", output_names=["y"]).output)
    image = photo_codes(3 / 127).astype(np.float32).transpose(0, 3, 1, 2) * np.float32(3 / 127)
    want = Interpreter(graph).run({"x": image})["y"]
    for fmt in ("tflite", "circle"):
        data = write_circle(Model([graph]), fmt)
        back = read_tflite(data).main if fmt == "tflite" else None
        if back is not None:
            assert [(n.op, n.attrs["steps"]) for n in back.nodes] == [("Slice", steps)]
            got = run_litert(data, [image])[0]
        else:
            got = run_onert(data, tmp_path, [[image]])[0][0]
        np.testing.assert_array_equal(got, want)
