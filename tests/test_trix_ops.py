"""The TRIX operators beyond convolutions (issue 19): broadcast elementwise with computed
per-channel operands, channel splits and slices, transposes, resizes, pads, depth-to-space,
softmax and requantization between uint8 and int16. Each runs bit-exactly with the integer
reference on both presets and on a tiny SRAM that forces many tiles; the SRAM is never
exceeded (the simulator checks every access, `assert_bit_exact` the planned peak)."""

import dataclasses

import numpy as np
import pytest
from test_trix_sim import PRESETS, assert_bit_exact, integer_graph

from onebuild.errors import ModelError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import LOOKUP, quantize_graph
from onebuild.targets.trix_sim.codegen import EXEC, generate
from onebuild.targets.trix_sim.hardware import Hardware, load_hardware
from onebuild.targets.trix_sim.lower import lower, unsupported
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.tvn import decode, encode


def _all_on_npu(quantized: Graph) -> None:
    hw = load_hardware("trix-m")
    reasons = {n.name: unsupported(n, hw) for n in quantized.nodes}
    assert not any(reasons.values()), reasons


def _through_tvn(quantized: Graph, rng) -> None:
    """The .tvn encoding is deterministic and its decoded program is bit-exact too."""
    hw = load_hardware("trix-m")
    data = encode(generate(lower(quantized, hw), hw))
    assert encode(generate(lower(quantized, hw), hw)) == data
    module = decode(data)
    feeds = {}
    for v in quantized.inputs:
        info = np.iinfo(v.dtype)
        feeds[v.name] = rng.integers(info.min, info.max + 1, v.shape).astype(v.dtype)
    got, _ = Simulator(module, hw).run(feeds)
    want = Interpreter(quantized).run(feeds)
    for value in quantized.outputs:
        np.testing.assert_array_equal(got[value.name], want[value.name])


def _smallest_sram(quantized: Graph, pref: str) -> Hardware:
    """trix-s with the smallest SRAM (a multiple of 16 bytes) the program compiles for."""

    def fits(size: int) -> bool:
        hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=size)
        try:
            generate(lower(quantized, hw), hw, pref)
        except (ModelError, UserError):
            return False
        return True

    low, high = 0, 1 << 20  # SRAM sizes that do not / do fit, in units of 16 bytes
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle * 16) else (middle, high)
    return dataclasses.replace(load_hardware("trix-s"), sram_bytes=high * 16)


def check(quantized: Graph, rng, tiled: bool = True) -> None:
    """Bit-exact on both presets and on the smallest SRAM each preference compiles for (which
    splits layers into tiles unless not `tiled`), also through the .tvn encoding."""
    _all_on_npu(quantized)
    _through_tvn(quantized, rng)
    for preset in PRESETS:
        assert_bit_exact(quantized, load_hardware(preset), "performance", rng)
    for pref in ("performance", "memory"):
        tiny = _smallest_sram(quantized, pref)
        assert_bit_exact(quantized, tiny, pref, rng)
    module = generate(lower(quantized, tiny), tiny, "memory")  # the smallest SRAM of all
    execs = np.bincount(module.code[module.code[:, 0] == EXEC, 1], minlength=len(module.layers))
    assert execs.max() > 1 or not tiled  # several tiles in some layer


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("vector_first", [False, True])
@pytest.mark.parametrize("channels", [7, 1])
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_runtime_per_channel_operands(rng, op, vector_first, channels, dtype):
    """[N, C, H, W] (op) [N, C, 1, 1] computed at run time, as in squeeze-excitation, and a
    computed scalar [N, 1, 1, 1]."""
    graph = Graph(op)
    x = graph.add_input("x", np.float32, (1, 7, 9, 5))
    v = graph.add_input("v", np.float32, (1, channels, 1, 1))
    pair = [v, x] if vector_first else [x, v]
    graph.outputs = [graph.make_node(op, pair).output]
    data = {
        "x": rng.normal(0, 1, (3, 1, 7, 9, 5)).astype(np.float32),
        "v": rng.normal(0.5, 0.5, (3, 1, channels, 1, 1)).astype(np.float32),
    }
    check(integer_graph(graph, data, dtype), rng)


def test_squeeze_excitation_block_is_one_npu_program(rng):
    """GlobalAveragePool -> 1x1 convs -> HardSigmoid -> Mul with the block input, as one NPU
    program."""
    graph = Graph("se")
    x = graph.add_input("x", np.float32, (1, 8, 11, 9))
    pooled = graph.make_node("GlobalAveragePool", [x]).output
    w1 = graph.add_constant(rng.normal(0, 0.4, (4, 8, 1, 1)).astype(np.float32))
    b1 = graph.add_constant(rng.normal(0, 0.1, 4).astype(np.float32))
    w2 = graph.add_constant(rng.normal(0, 0.4, (8, 4, 1, 1)).astype(np.float32))
    b2 = graph.add_constant(rng.normal(0, 0.1, 8).astype(np.float32))
    conv = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1}
    hidden = graph.make_node("Conv", [pooled, w1, b1], {**conv, "clip": [0.0, np.inf]}).output
    gate = graph.make_node("Conv", [hidden, w2, b2], conv).output
    gate = graph.make_node("HardSigmoid", [gate], {"alpha": 1 / 6, "beta": 0.5}).output
    graph.outputs = [graph.make_node("Mul", [x, gate]).output]
    data = {"x": rng.normal(0, 1, (3, 1, 8, 11, 9)).astype(np.float32)}
    check(integer_graph(graph, data), rng)


def _moved(rng, op: str, attrs: dict, shape=(1, 6, 9, 7), extra=()):
    """The op alone, quantized with uint8 I/O (every output kept)."""
    graph = Graph(op)
    x = graph.add_input("x", np.float32, shape)
    moved = graph.make_node(op, [x, *extra], attrs)
    graph.outputs = list(moved.outputs)
    data = {"x": rng.normal(0, 1, (3, *shape)).astype(np.float32)}
    config = QuantConfig("uint8", input_type="uint8", output_type="uint8")
    return quantize_graph(graph, calibrate(graph, data).ranges, config)


SLICES = [  # starts, ends, steps over (N, C, H, W)
    ([0, 1, 2, 0], [1, 5, 9, 7], [1, 1, 1, 1]),
    ([0, 0, 1, 1], [1, 6, 8, 6], [1, 2, 3, 2]),
    ([0, 3, 0, 3], [1, 6, None, 4], [1, 1, 2, 1]),
]


@pytest.mark.parametrize("starts, ends, steps", SLICES)
def test_slice(rng, starts, ends, steps):
    check(_moved(rng, "Slice", {"starts": starts, "ends": ends, "steps": steps}), rng)


@pytest.mark.parametrize("axis, split", [(1, [2, 4]), (2, [4, 5]), (3, [3, 4])])
def test_split(rng, axis, split):
    check(_moved(rng, "Split", {"axis": axis, "split": split}), rng)


@pytest.mark.parametrize(
    "perm, shape",
    [
        ([0, 1, 3, 2], (1, 6, 9, 7)),
        ([0, 2, 3, 1], (1, 6, 9, 7)),
        ([0, 3, 1, 2], (1, 6, 9, 7)),
        ([0, 2, 1], (1, 11, 21)),  # a detector head: [1, C, H*W] -> [1, H*W, C]
    ],
)
def test_transpose(rng, perm, shape):
    check(_moved(rng, "Transpose", {"perm": perm}, shape), rng)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad(rng, mode):
    attrs = {"pads": [0, 0, 1, 2, 0, 0, 3, 1], "mode": mode, "value": 0.0}
    check(_moved(rng, "Pad", attrs), rng)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(rng, mode):
    # a DCR tile reads every input channel: the smallest SRAM the constraint admits holds
    # the whole layer (under the performance preference it still runs as several tiles)
    quantized = _moved(rng, "DepthToSpace", {"blocksize": 2, "mode": mode}, (1, 8, 5, 3))
    check(quantized, rng, tiled=mode == "CRD")


def _resize_attrs(mode: str, coordinates: str, scale: float, shape) -> dict:
    sizes = [shape[0], shape[1], int(shape[2] * scale), int(shape[3] * scale)]
    return {
        "mode": mode,
        "coordinate_transformation_mode": coordinates,
        "nearest_mode": "floor" if coordinates == "asymmetric" else "round_prefer_floor",
        "scales": [1.0, 1.0, scale, scale],
        "sizes": sizes,
        "roi": None,
    }


@pytest.mark.parametrize(
    "mode, coordinates, scale",
    [
        ("nearest", "asymmetric", 2.0),  # PicoDet's FPN upsampling
        ("nearest", "half_pixel", 4.0),
        ("nearest", "asymmetric", 0.5),
        ("linear", "half_pixel", 2.0),
        ("linear", "asymmetric", 4.0),
        ("linear", "pytorch_half_pixel", 2.0),
    ],
)
def test_resize(rng, mode, coordinates, scale):
    shape = (1, 5, 6, 4)
    check(_moved(rng, "Resize", _resize_attrs(mode, coordinates, scale, shape), shape), rng)


def test_resize_off_the_grid_stays_on_the_cpu(rng):
    shape = (1, 3, 6, 6)
    attrs = _resize_attrs("linear", "align_corners", 7 / 6, shape)  # taps in sixths
    quantized = _moved(rng, "Resize", attrs, shape)
    resize = next(n for n in quantized.nodes if n.op == "Resize")
    assert unsupported(resize, load_hardware("trix-m")) == [
        "Resize must be nearest or linear with every tap a multiple of 1/256 (power-of-two scales)"
    ]


@pytest.mark.parametrize("shape", [(1, 100), (1, 7, 5, 3), (1, 13, 4)])
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_softmax(rng, shape, dtype):
    """Softmax over the channels: a classifier's [1, K] logits, per-pixel class maps."""
    graph = Graph("softmax")
    x = graph.add_input("x", np.float32, shape)
    graph.outputs = [graph.make_node("Softmax", [x], {"axis": 1}).output]
    data = {"x": rng.normal(0, 3, (4, *shape)).astype(np.float32)}
    quantized = integer_graph(graph, data, dtype)
    assert quantized.nodes[0].op == "QSoftmax"
    check(quantized, rng)


def test_softmax_over_another_axis_stays_on_the_cpu(rng):
    graph = Graph("softmax")
    x = graph.add_input("x", np.float32, (1, 3, 4, 5))
    graph.outputs = [graph.make_node("Softmax", [x], {"axis": -1}).output]
    quantized = integer_graph(graph, {"x": rng.normal(0, 3, (2, 1, 3, 4, 5)).astype(np.float32)})
    node = next(n for n in quantized.nodes if n.op == "QSoftmax")
    reasons = unsupported(node, load_hardware("trix-m"))
    assert reasons == ["Softmax must run over axis 1 (the channels of each position)"]


@pytest.mark.parametrize("source, target", [("uint8", "int16"), ("int16", "uint8")])
def test_requantize_between_uint8_and_int16_layers(rng, source, target):
    """A uint8 layer feeding an int16 one and back (mixed precision): Requantize nodes run on
    the NPU between them."""
    from onebuild.graph_ir.quant.config import LayerOverride

    graph = Graph("mixed")
    x = graph.add_input("x", np.float32, (1, 5, 9, 7))
    first = graph.make_node("Add", [x, x], name="first").output
    second = graph.make_node("Add", [first, first], name="second").output
    graph.outputs = [graph.make_node("Add", [second, x], name="third").output]
    data = {"x": rng.normal(0, 2, (3, 1, 5, 9, 7)).astype(np.float32)}
    config = QuantConfig(
        source, input_type=source, output_type=source,
        layers=(LayerOverride(names=("second",), dtype=target),),
    )  # fmt: skip
    quantized = quantize_graph(graph, calibrate(graph, data).ranges, config)
    assert [n.op for n in quantized.nodes].count("Requantize") == 2  # first -> second -> third
    check(quantized, rng)


def test_decoder_rejects_moves_and_vectors_that_do_not_fit_their_tensors(rng):
    """A re-sealed .tvn whose move attributes or vector operand disagree with its tensors is
    a one-line FormatError, not an out-of-range read in the simulator."""
    from onebuild.errors import FormatError
    from onebuild.targets.trix_sim.tvn_layers import Reader, check_layer

    hw = load_hardware("trix-m")
    cases = [
        (_moved(rng, "Slice", {"starts": [0, 1, 0, 0], "ends": [1, 4, 9, 7], "steps": [1] * 4}),
         "slice", "starts", [1, 0, 7]),
        (_moved(rng, "Transpose", {"perm": [0, 2, 1, 3]}), "transpose", "perm", [1, 1, 2]),
        (_moved(rng, "Pad", {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "edge", "value": 0.0}),
         "pad", "mode", 7),
    ]  # fmt: skip
    for quantized, kind, key, bad in cases:
        module = decode(encode(generate(lower(quantized, hw), hw)))
        layer = next(layer for layer in module.layers if layer.kind == kind)
        check_layer(Reader(b"", "x.tvn"), layer, module.tensors)  # as compiled: fine
        layer.attrs[key] = bad
        with pytest.raises(FormatError, match="attributes do not match its tensors"):
            check_layer(Reader(b"", "x.tvn"), layer, module.tensors)
    graph = Graph("mul")
    x = graph.add_input("x", np.float32, (1, 4, 3, 3))
    v = graph.add_input("v", np.float32, (1, 4, 1, 1))
    graph.outputs = [graph.make_node("Mul", [x, v]).output]
    data = {n: rng.normal(0, 1, (2, *g.shape)).astype(np.float32) for n, g in (("x", x), ("v", v))}
    module = decode(encode(generate(lower(integer_graph(graph, data), hw), hw)))
    mul = next(layer for layer in module.layers if layer.kind == "mul")
    mul.inputs = mul.inputs[::-1]  # the full tensor where the vector belongs
    with pytest.raises(FormatError, match="vector operand does not match its output"):
        check_layer(Reader(b"", "x.tvn"), mul, module.tensors)


def test_reduce_mean_over_height_and_width(rng):
    """ReduceMean over H, W (keepdims) quantizes as a global average pool; gating its input by
    it is a squeeze-excitation without convolutions."""
    graph = Graph("mean")
    x = graph.add_input("x", np.float32, (1, 6, 9, 5))
    mean = graph.make_node("ReduceMean", [x], {"axes": [2, 3], "keepdims": 1}).output
    graph.outputs = [graph.make_node("Mul", [x, mean]).output]
    quantized = integer_graph(graph, {"x": rng.normal(0, 1, (3, 1, 6, 9, 5)).astype(np.float32)})
    assert [n.op for n in quantized.nodes][:2] == ["QAveragePool", "QMul"]
    check(quantized, rng)


LOOKUP_ATTRS = {
    "LeakyRelu": {"alpha": 0.1}, "HardSigmoid": {"alpha": 1 / 6, "beta": 0.5},
    "Elu": {"alpha": 1.0}, "Celu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 0.5},
    "Shrink": {"lambd": 0.5, "bias": 0.0}, "Gelu": {"approximate": "none"},
    "Selu": {"alpha": 1.67, "gamma": 1.05},
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(LOOKUP - {"Clip"}))
def test_every_lookup_activation(rng, op):
    """Every unary function the quantizer makes a table runs on the NPU as a lookup."""
    graph = Graph(op)
    x = graph.add_input("x", np.float32, (1, 3, 5, 7))
    graph.outputs = [graph.make_node(op, [x], LOOKUP_ATTRS.get(op, {})).output]
    quantized = integer_graph(graph, {"x": rng.normal(0, 2, (3, 1, 3, 5, 7)).astype(np.float32)})
    assert quantized.nodes[0].op == "QLookup"
    check(quantized, rng)


def test_int16_lookup_on_both_presets(rng):
    """An int16 table has 65536 entries (128 KiB): it fits either preset's SRAM with tiles."""
    graph = Graph("hardswish")
    x = graph.add_input("x", np.float32, (1, 3, 5, 7))
    graph.outputs = [graph.make_node("HardSwish", [x]).output]
    quantized = integer_graph(
        graph, {"x": rng.normal(0, 2, (3, 1, 3, 5, 7)).astype(np.float32)}, "int16"
    )
    for preset in PRESETS:
        assert_bit_exact(quantized, load_hardware(preset), "performance", rng)
        assert_bit_exact(quantized, load_hardware(preset), "memory", rng)


def test_simulator_refuses_a_program_planned_beyond_the_sram(rng):
    from onebuild.errors import FormatError

    quantized = _moved(rng, "Transpose", {"perm": [0, 1, 3, 2]})
    hw = load_hardware("trix-s")
    module = decode(encode(generate(lower(quantized, hw), hw)))
    assert 0 < module.sram_peak <= hw.sram_bytes
    module.sram_peak = hw.sram_bytes + 1
    with pytest.raises(FormatError, match="plans 262145 bytes of SRAM, trix-s has 262144"):
        Simulator(module, hw)


@pytest.mark.parametrize(
    "key, bad", [("starts", 3), ("perm", 1), ("blocksize", [2]), ("steps", [[1], 1, 1])]
)
def test_decoder_rejects_move_attributes_of_the_wrong_type(rng, key, bad):
    from onebuild.errors import FormatError
    from onebuild.targets.trix_sim.tvn_layers import Reader, check_layer

    kinds = {
        "starts": "slice",
        "steps": "slice",
        "perm": "transpose",
        "blocksize": "depth_to_space",
    }
    quantized = {
        "slice": lambda: _moved(
            rng, "Slice", {"starts": [0] * 4, "ends": [1, 3, 9, 7], "steps": [1] * 4}
        ),
        "transpose": lambda: _moved(rng, "Transpose", {"perm": [0, 1, 3, 2]}),
        "depth_to_space": lambda: _moved(
            rng, "DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (1, 8, 5, 3)
        ),
    }[kinds[key]]()
    hw = load_hardware("trix-m")
    module = decode(encode(generate(lower(quantized, hw), hw)))
    layer = next(layer for layer in module.layers if layer.kind == kinds[key])
    layer.attrs[key] = bad
    with pytest.raises(FormatError, match="attributes do not match its tensors"):
        check_layer(Reader(b"", "x.tvn"), layer, module.tensors)


@pytest.mark.parametrize("kernel, stride, pads", [(3, 2, [0, 0, 0, 0]), (2, 2, [1, 0, 0, 1])])
def test_max_pool_with_ceil_mode(rng, kernel, stride, pads):
    """ceil_mode runs as extra bottom/right padding."""
    attrs = {
        "kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": pads,
        "dilations": [1, 1], "ceil_mode": 1,
    }  # fmt: skip
    quantized = _moved(rng, "MaxPool", attrs, (1, 4, 10, 7))
    assert quantized.outputs[0].shape[2:] == (
        -(-(10 + pads[0] + pads[2] - kernel) // stride) + 1,
        -(-(7 + pads[1] + pads[3] - kernel) // stride) + 1,
    )
    check(quantized, rng)
