"""The TRIX simulator is bit-exact with the integer reference interpreter, op by op (odd sizes,
strides, padding, groups, tiles straddling rows and channel chunks, both presets, both
preferences) and on whole quantized models."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from onebuild.errors import ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.passes.cleanup import eliminate_dead_code
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.params import requantize
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_model
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz
from onebuild.targets.trix_sim import exact as exact_mod
from onebuild.targets.trix_sim import kernels
from onebuild.targets.trix_sim.codegen import LOAD, generate
from onebuild.targets.trix_sim.exact import (
    FLOAT32_EXACT,
    all_codes,
    exact_dot,
    float_scaling,
    lookup,
    product_bound,
    reduction_chunks,
    requantize_float,
    row_l1,
    same_values,
    scale_in_place,
)
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.perf import roofline
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.timeline import exactly_tiled

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
PRESETS = ["trix-s", "trix-m"]


def integer_graph(graph: Graph, calibration: dict, dtype: str = "uint8") -> Graph:
    """Quantized with quantized I/O; only the last output kept (drops float heads)."""
    config = QuantConfig(dtype, input_type=dtype, output_type=dtype)
    quantized = quantize_graph(graph, calibrate(graph, calibration).ranges, config)
    quantized.outputs = quantized.outputs[-1:]
    eliminate_dead_code(quantized)
    return quantized


def assert_bit_exact(quantized: Graph, hw, pref: str, rng, samples: int = 2) -> dict:
    module = generate(lower(quantized, hw), hw, pref)
    assert module.sram_peak <= hw.sram_bytes
    reference = Interpreter(quantized)
    simulator = Simulator(module, hw)  # samples after the first are later runs (reused timing)
    for _ in range(samples):
        feeds = {}
        for v in quantized.inputs:
            info = np.iinfo(v.dtype)
            feeds[v.name] = rng.integers(info.min, info.max + 1, v.shape).astype(v.dtype)
        want = reference.run(feeds)
        got, report = simulator.run(feeds)
        for value in quantized.outputs:
            np.testing.assert_array_equal(got[value.name], want[value.name])
    return report.summary(hw, module)


def _conv_graph(rng, c, h, w, m, k, stride, pad, group, dilation=1):
    graph = Graph("conv")
    x = graph.add_input("x", np.float32, (1, c, h, w))
    weight = graph.add_constant(rng.normal(0, 0.3, (m, c // group, k, k)).astype(np.float32))
    bias = graph.add_constant(rng.normal(0, 0.1, m).astype(np.float32))
    attrs = {
        "strides": [stride, stride],
        "dilations": [dilation, dilation],
        "pads": [pad, pad, pad, pad],
        "group": group,
        "clip": [0.0, float("inf")],
    }
    graph.outputs = [graph.make_node("Conv", [x, weight, bias], attrs).output]
    return graph, {"x": rng.normal(0, 1, (3, 1, c, h, w)).astype(np.float32)}


CONVS = [  # c, h, w, m, k, stride, pad, group, dilation
    (3, 13, 11, 8, 3, 1, 1, 1, 1),
    (5, 9, 7, 6, 3, 2, 1, 1, 1),
    (8, 10, 10, 8, 3, 1, 1, 8, 1),  # depthwise
    (6, 11, 9, 9, 5, 2, 2, 3, 1),  # grouped
    (4, 12, 12, 5, 3, 1, 2, 1, 2),  # dilated
    (16, 7, 7, 33, 1, 1, 0, 1, 1),
]


@pytest.mark.parametrize("shape", CONVS)
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_conv_is_bit_exact(rng, shape, dtype):
    graph, data = _conv_graph(rng, *shape)
    quantized = integer_graph(graph, data, dtype)
    for preset in PRESETS:
        hw = load_hardware(preset)
        assert_bit_exact(quantized, hw, "performance", rng)
    tiny = dataclasses.replace(load_hardware("trix-s"), sram_bytes=2048)  # many row/channel tiles
    assert_bit_exact(quantized, tiny, "memory", rng)


def _elementwise_graph(rng, op: str):
    graph = Graph(op)
    a = graph.add_input("a", np.float32, (1, 5, 9, 7))
    b = graph.add_input("b", np.float32, (1, 5, 9, 7))
    if op in ("Add", "Sub", "Mul"):
        y = graph.make_node(op, [a, b]).output
    elif op == "Concat":
        y = graph.make_node("Concat", [a, b], {"axis": 1}).output
    elif op == "Sigmoid":
        y = graph.make_node("Add", [graph.make_node("Sigmoid", [a]).output, b]).output
    else:
        pool = {
            "kernel_shape": [3, 2],
            "strides": [2, 1],
            "dilations": [1, 1],
            "pads": [1, 0, 1, 1],
            "ceil_mode": 0,
            "count_include_pad": int(op == "AvgPoolIncludePad"),
        }
        kind = "MaxPool" if op == "MaxPool" else "AveragePool"
        pooled = graph.make_node(kind, [graph.make_node("Add", [a, b]).output], pool).output
        y = graph.make_node("GlobalAveragePool", [pooled]).output if op == "Global" else pooled
    graph.outputs = [y]
    data = {n: rng.normal(0, 1, (3, 1, 5, 9, 7)).astype(np.float32) for n in ("a", "b")}
    return graph, data


@pytest.mark.parametrize(
    "op",
    ["Add", "Sub", "Mul", "Concat", "Sigmoid", "MaxPool", "AvgPool", "AvgPoolIncludePad", "Global"],
)
def test_vector_ops_are_bit_exact(rng, op):
    graph, data = _elementwise_graph(rng, op)
    quantized = integer_graph(graph, data)
    for preset in PRESETS:
        assert_bit_exact(quantized, load_hardware(preset), "performance", rng)
    tiny = dataclasses.replace(load_hardware("trix-s"), sram_bytes=1024)
    assert_bit_exact(quantized, tiny, "memory", rng)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("shape", [(1, 6, 1, 1), (6, 1, 1), (1,)])
def test_constant_operands_are_bit_exact(rng, op, shape):
    graph = Graph(op)
    x = graph.add_input("x", np.float32, (1, 6, 5, 7))
    const = graph.add_constant(rng.normal(0.5, 1, shape).astype(np.float32), "c")
    graph.outputs = [graph.make_node(op, [const, x]).output]
    quantized = integer_graph(graph, {"x": rng.normal(0, 1, (3, 1, 6, 5, 7)).astype(np.float32)})
    for preset in PRESETS:
        assert_bit_exact(quantized, load_hardware(preset), "performance", rng)


def test_digits_is_bit_exact_on_both_presets(rng):
    model = load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    calib = read_npz(DIGITS / "data" / "calib.npz")
    for dtype in ("uint8", "int16"):
        quantized = integer_graph(model.main, calib, dtype)
        for preset in PRESETS:
            for pref in ("performance", "memory"):
                assert_bit_exact(quantized, load_hardware(preset), pref, rng, samples=5)


@pytest.mark.parametrize(
    "name, presets",
    [("squeezenet", PRESETS), ("resnet50", ["trix-m"]), ("inception_v2", ["trix-s"])],
)
def test_light_models_are_bit_exact(rng, name, presets):
    model = import_onnx(light_model(name, seed=1, expose_logits=True))
    run_preset(model)
    x = model.main.inputs[0]
    quantized = integer_graph(model.main, {x.name: rng.random((2, *x.shape), dtype=np.float32)})
    for preset in presets:
        summary = assert_bit_exact(quantized, load_hardware(preset), "performance", rng, 1)
        assert summary["cycles"] >= summary["roofline_cycles"] > 0
        assert 0 < summary["mac_utilization"] <= 1
        layers = summary["layers"].values()
        # each layer's share of the time adds up to the total; engines overlap within a layer
        assert sum(layer["cycles"] for layer in layers) == summary["cycles"]
        assert sum(layer["compute_cycles"] + layer["dma_cycles"] for layer in layers) > sum(
            layer["cycles"] for layer in layers
        )


def test_preferences_trade_arena_size_for_cycles(rng):
    """memory: smaller peak arena; performance: fewer cycles (double buffering); both exact."""
    model = import_onnx(light_model("resnet50", seed=1, expose_logits=True))
    run_preset(model)
    x = model.main.inputs[0]
    quantized = integer_graph(model.main, {x.name: rng.random((1, *x.shape), dtype=np.float32)})
    hw = load_hardware("trix-m")
    memory = assert_bit_exact(quantized, hw, "memory", rng, samples=1)
    performance = assert_bit_exact(quantized, hw, "performance", rng, samples=1)
    assert memory["arena_bytes"] < performance["arena_bytes"]
    assert performance["cycles"] < memory["cycles"]


def test_unsupported_graphs_name_every_reason():
    graph = Graph("float")
    x = graph.add_input("x", np.float32, (1, 4))
    graph.outputs = [graph.make_node("Softmax", [x], {"axis": 1}).output]
    with pytest.raises(ModelError, match="Softmax computes in float") as error:
        lower(graph, load_hardware("trix-m"))
    assert "must be quantized" in str(error.value) and "\n" not in str(error.value)


def _chain_graph(rng):
    """conv -> maxpool -> (1x1 conv + residual add) ++ 1x1 conv -> global pool -> gemm."""
    graph = Graph("chain")
    x = graph.add_input("x", np.float32, (1, 8, 12, 12))

    def conv(value, m, k):
        c = value.shape[1]
        weight = graph.add_constant(rng.normal(0, 0.3, (m, c, k, k)).astype(np.float32))
        bias = graph.add_constant(rng.normal(0, 0.1, m).astype(np.float32))
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [k // 2] * 4, "group": 1}
        return graph.make_node("Conv", [value, weight, bias], attrs).output

    pool = {"kernel_shape": [2, 2], "strides": [2, 2], "dilations": [1, 1], "pads": [0] * 4}
    pooled = graph.make_node("MaxPool", [conv(x, 24, 3)], {**pool, "ceil_mode": 0}).output
    residual = graph.make_node("Add", [conv(pooled, 24, 1), pooled]).output
    joined = graph.make_node("Concat", [residual, conv(pooled, 8, 1)], {"axis": 1}).output
    pooled_all = graph.make_node("GlobalAveragePool", [joined]).output
    flat = graph.make_node("Reshape", [pooled_all], {"shape": [1, 32]})
    weight = graph.add_constant(rng.normal(0, 0.3, (10, 32)).astype(np.float32))
    bias = graph.add_constant(rng.normal(0, 0.1, 10).astype(np.float32))
    gemm = graph.make_node("Gemm", [flat.output, weight, bias], {"transB": 1})
    graph.outputs = [gemm.output]
    return graph, {"x": rng.normal(0, 1, (3, 1, 8, 12, 12)).astype(np.float32)}


def test_sram_resident_intermediates_never_touch_dram(rng):
    """With room in SRAM, `performance` keeps every intermediate tensor there: the DRAM traffic
    is exactly the compulsory one (weights and model I/O once), and results stay bit-exact;
    a small SRAM keeps some of them (whole-height channel tiles) and is bit-exact too."""
    graph, data = _chain_graph(rng)
    quantized = integer_graph(graph, data)
    hw = load_hardware("trix-s")
    performance = assert_bit_exact(quantized, hw, "performance", rng)
    memory = assert_bit_exact(quantized, hw, "memory", rng)
    compulsory = roofline(lower(quantized, hw), hw)["memory"] * hw.dram_bytes_per_cycle
    assert performance["dram_bytes"] == compulsory
    assert memory["dram_bytes"] > 2 * performance["dram_bytes"]
    for sram in (4096, 6144, 12288):
        small = dataclasses.replace(hw, sram_bytes=sram)
        summary = assert_bit_exact(quantized, small, "performance", rng)
        assert performance["dram_bytes"] < summary["dram_bytes"] < memory["dram_bytes"]


def test_exact_dot_is_exact_where_float32_sums_would_round(rng):
    """Extreme codes force reduction chunks (one float32 GEMM would round past 2^24); typical
    codes take one GEMM. Both equal the int64 product."""
    k = 4608  # a 3x3 convolution over 512 channels
    for low, high, one_gemm in ((-255, 256, False), (-20, 21, True)):
        a = rng.integers(-128, 128, (24, k)).astype(np.int8)
        a[0] = -128
        b = rng.integers(low, high, (k, 30)).astype(np.float32)
        b[:, 0] = -255 if low == -255 else b[:, 0]
        bound = product_bound(np.dtype(np.uint8), np.dtype(np.int8))
        edges = reduction_chunks(a.astype(np.float32), b, FLOAT32_EXACT // bound)
        assert (len(edges) == 2) == one_gemm
        expected = a.astype(np.int64) @ b.astype(np.int64)
        np.testing.assert_array_equal(exact_dot(a, b, bound), expected)


def test_exact_dot_takes_one_gemm_where_the_l1_reach_proves_it(rng, monkeypatch):
    """Weights whose row sums of |w| times the largest |x - zp| stay below 2^24 take one GEMM
    without looking at the data (reduction_chunks is not called), exactly, on the codes that
    make every partial sum largest; a reach at 2^24 falls back to the chunk search."""
    k = 1152  # a 3x3 convolution over 128 channels: K * bound > 2^24
    a = rng.integers(-50, 51, (16, k)).astype(np.int8)
    a[0] = np.where(np.arange(k) % 2, 56, -56)
    b = np.where(a[0][:, None] > 0, 255.0, -255.0).astype(np.float32) * np.ones((1, 9), np.float32)
    bound = product_bound(np.dtype(np.uint8), np.dtype(np.int8))
    assert k * bound >= FLOAT32_EXACT
    reach = row_l1(a.astype(np.float32)) * 255
    assert reach == 56 * k * 255 < FLOAT32_EXACT
    expected = a.astype(np.int64) @ b.astype(np.int64)
    assert expected[0, 0] == reach
    searched = []
    real = exact_mod.reduction_chunks
    monkeypatch.setattr(exact_mod, "reduction_chunks", lambda *a: searched.append(1) or real(*a))
    np.testing.assert_array_equal(exact_dot(a, b, bound, reach=reach).astype(np.int64), expected)
    assert not searched
    np.testing.assert_array_equal(exact_dot(a, b, bound, reach=FLOAT32_EXACT), expected)
    assert searched


def _requantization_cases(rng, qmin, qmax, zp, shift):
    """Accumulators whose results straddle the clip bounds and the rounding ties: per channel
    a random 31-bit multiplier or exactly 2^30 (ties at every other step)."""
    m = rng.integers(1 << 30, 1 << 31, (6, 1, 1))
    m[0] = 1 << 30
    r = np.full((6, 1, 1), shift) - rng.integers(0, 3, (6, 1, 1))
    bias = rng.integers(-300_000, 300_000, (6, 1, 1))
    targets = np.concatenate(
        [rng.uniform(qmin - 3, qmax + 3, 400), [qmin - 1, qmin, qmax, qmax + 1]]
    )
    exact = (targets - zp)[None, None, :] * np.ldexp(1.0, r) / m - bias  # w near the targets
    acc = np.floor(exact).astype(np.int64) + rng.integers(-2, 3, exact.shape)
    want = np.clip(requantize(acc + bias, m, r) + zp, qmin, qmax)
    return acc, bias, m, r, want


@pytest.fixture(params=["compiled", "numpy"])
def requantize_path(request, monkeypatch):
    """The float requantization by the compiled kernel (numba, in the test extra) or numpy."""
    monkeypatch.setattr(kernels, "use", request.param == "compiled")
    kernels.load()
    assert (kernels.compiled() is not None) == (request.param == "compiled")


@pytest.mark.parametrize("dtype, qmin, qmax, zp", [
    ("uint8", 0, 255, 131), ("int8", -127, 127, 0), ("int16", -32767, 32767, 0),
    ("uint8", 0, 255, 0),
])  # fmt: skip
def test_requantization_shortcuts_equal_the_reference(rng, requantize_path, dtype, qmin, qmax, zp):
    """The float64 (also from float32 accumulators, whose bias is added in float32) and
    in-place int64 requantizations equal params.requantize plus saturation on results at the
    clip bounds and at rounding ties, for every shift they accept, and decline the shifts
    their proofs do not cover; on both paths of the float one."""
    accepted = {"float": [], "int64": [], "float32": []}
    for shift in range(8, 63, 3):
        acc, bias, m, r, want = _requantization_cases(rng, qmin, qmax, zp, shift)
        got = requantize_float(acc.astype(np.float64), bias, m, r, zp, qmin, qmax, dtype)
        if got is not None:
            accepted["float"].append(shift)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want)
            scaling = float_scaling(bias, m, r, zp, qmin, qmax)
            small = np.abs(acc) < 1 << 24  # what a float32 accumulator holds exactly
            if scaling[2] is not None and small.any():  # the bias added in float32
                accepted["float32"].append(shift)
                tight = np.where(small, acc, 0).astype(np.float32)
                got = requantize_float(tight, bias, m, r, zp, qmin, qmax, dtype, scaling)
                np.testing.assert_array_equal(got[small], want[small])
        bound = int(np.abs(acc).max())
        got = scale_in_place(acc.copy(), bias, m, r, zp, bound)
        if got is not None:
            accepted["int64"].append(shift)
            np.testing.assert_array_equal(np.clip(got, qmin, qmax), want)
    # uint8/int8 results: shifts up to 41 in float64 (typical convolutions), int16 up to 35
    assert max(accepted["float"]) >= (41 if qmax < 256 else 35)
    assert max(accepted["float"]) < 50 and max(accepted["int64"]) < 62
    assert min(accepted["float"]) == min(accepted["int64"]) == 8
    assert min(accepted["float32"]) == 8 and max(accepted["float32"]) >= 20


# (A, m, r, j): A m = j 2^r + 2^(r-1) - 1, one step below a rounding tie, so requantize(A, m,
# r) = j; found by a search over divisors. At r = 49 a float64 product (A m ~ 2^56) rounds onto
# the tie and gives j + 1, so the float path must decline it; r = 44 is its largest uint8 shift.
NEAR_TIES = [(1059271, 1868380169, 44, 112), (1080351, 1176502305, 43, 144),
             (33559303, 1316820297, 49, 78), (33764623, 1308812817, 49, 78)]  # fmt: skip


def test_requantization_shortcuts_one_step_below_a_tie(requantize_path):
    for a, m, r, j in NEAR_TIES:
        assert requantize(np.int64(a), m, r) == j
        for bias in (0, -123_456):
            acc = np.array([[[a - bias, a - bias + 1]]], np.int64)
            args = (np.array([[[bias]]]), np.array([[[m]]]), np.array([[[r]]]))
            got = requantize_float(acc.astype(np.float64), *args, 0, 0, 255, "uint8")
            assert (got is None) == (r > 44)
            if got is not None:
                assert got[0, 0, 0] == j
            assert scale_in_place(acc, *args, 0, a + 1)[0, 0, 0] == j


@pytest.mark.parametrize("x_dtype, b_dtype", [("int8", "uint8"), ("uint8", "int8")])
def test_code_tables_index_by_the_bits_of_codes(rng, x_dtype, b_dtype):
    """Tables over every code (and every pair of 8-bit codes) give f of the codes themselves,
    negative ones included, with either operand broadcast."""

    def f(x, b):
        return (x.astype(np.int64) * 3 - b.astype(np.int64) * 7) % 251

    table = f(*np.ix_(all_codes(x_dtype), all_codes(b_dtype))).ravel()
    x = rng.integers(-128 if x_dtype == "int8" else 0, 128, (4, 5, 6)).astype(x_dtype)
    b = rng.integers(-128 if b_dtype == "int8" else 0, 128, (4, 5, 6)).astype(b_dtype)
    for xs, bs in ((x, b), (x, b[:, :1, :1]), (x[:, :1, :1], b)):
        np.testing.assert_array_equal(lookup(table, xs, bs), f(xs, bs))
    for dtype in ("int8", "uint8", "int16"):
        codes = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, 500).astype(dtype)
        single = all_codes(dtype).astype(np.int64) * 5 % 256
        np.testing.assert_array_equal(lookup(single, codes), codes.astype(np.int64) * 5 % 256)


def test_same_values_equals_array_equal(rng):
    """8-byte words, the tail bytes, strided views and other dtypes all compare correctly."""
    for shape in ((5, 7, 9), (64, 40, 41)):  # compared by np.array_equal, by words
        a = rng.integers(0, 256, shape).astype(np.uint8)
        assert same_values(a, a.copy()) and same_values(a[:, 1:], a.copy()[:, 1:])
        for index in ((0, 3, 0), (4, -1, -1), (2, 4, 1)):  # first word, a row's tail, middle
            b = a.copy()
            b[index] ^= 1
            assert not same_values(a, b) and not same_values(a[:, 3:], b[:, 3:])
        assert same_values(a, a.astype(np.int16)) and not same_values(a.view(np.int8), a)
        assert not same_values(a, a[:, :-1])


def test_whole_layer_execution_equals_tile_by_tile(rng):
    """Layers run whole (convolutions, pools) give the same outputs and report as tile by
    tile, also for a stream whose tile reads other data than the whole layer was computed
    from (that tile is not proven to read the same bytes, compares them and computes alone);
    a later run of a simulator (on other data before) equals a new simulator's run."""
    x, hw, module = _squeezenet(rng, "trix-s")
    feeds = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
    before = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
    tiled = exactly_tiled(module)
    conv = next(i for i in tiled if len(_loads(module, i)) > 2 and module.layers[i].kind == "conv")
    loads = _loads(module, conv)
    tampered = module.code.copy()
    tampered[loads[len(loads) // 2], 2] += 7  # one input tile from the wrong DRAM address
    results = []
    for code in (module.code, tampered):
        for whole, samples in ((True, [feeds]), (False, [feeds]), (True, [before, feeds])):
            simulator = Simulator(dataclasses.replace(module, code=code), hw)
            if not whole:
                simulator._tiled = []
            elif code is module.code:
                assert len(simulator._tiled) > len(module.layers) // 2
            for sample in samples:
                outputs, report = simulator.run(sample)
            results.append((outputs, report.cycles, report.layers))
            proven = {key[0] for key in simulator._proven}
            assert (conv in proven) == whole and (conv in simulator._lean) == (
                whole and code is module.code
            )
            pools = {i for i in tiled if module.layers[i].kind.endswith("pool")}  # own EXECs
            assert len(pools) == 3 and (pools <= simulator._lean) == whole  # 2 max, 1 average
    for first, *others in (results[:3], results[3:]):
        for other in others:
            assert first[1:] == other[1:]
            for name in first[0]:
                np.testing.assert_array_equal(first[0][name], other[0][name])
    assert any(not np.array_equal(results[0][0][n], results[3][0][n]) for n in results[0][0])


def test_pools_of_tensors_kept_in_sram_run_whole(rng):
    """On trix-m squeezenet's pools read channel tiles of tensors kept in SRAM: they are
    computed whole from there, every tile proven to read it, with the outputs and report of
    tile-by-tile execution, also on a later run."""
    x, hw, module = _squeezenet(rng, "trix-m")
    feeds, before = ({x.name: rng.integers(0, 256, x.shape).astype(np.uint8)} for _ in range(2))
    whole, tiled = Simulator(module, hw), Simulator(module, hw)
    tiled._tiled = []
    whole.run(before)
    got, report = whole.run(feeds)
    want, expected = tiled.run(feeds)
    pools = {i for i in exactly_tiled(module) if module.layers[i].kind.endswith("pool")}
    assert len(pools) == 3 and pools <= whole._lean
    maxpools = [i for i in pools if module.layers[i].kind == "maxpool"]
    assert len(maxpools) == 2 and all(whole._places[i][1] for i in maxpools)  # in SRAM
    assert (report.cycles, report.layers) == (expected.cycles, expected.layers)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def _loads(module, index: int) -> np.ndarray:
    return np.flatnonzero((module.code[:, 0] == LOAD) & (module.code[:, 1] == index))


def _squeezenet(rng, preset: str):
    """squeezenet quantized on random images and compiled for `preset`: (its input, the
    hardware, the module)."""
    model = import_onnx(light_model("squeezenet", seed=1, expose_logits=True))
    run_preset(model)
    x = model.main.inputs[0]
    quantized = integer_graph(model.main, {x.name: rng.random((2, *x.shape), dtype=np.float32)})
    hw = load_hardware(preset)
    return x, hw, generate(lower(quantized, hw), hw, "performance")
