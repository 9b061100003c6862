"""A MatMul over the rows of a sequence ([1, T, K] @ [K, N], quantized as Reshape -> QGemm ->
Reshape) runs on the TRIX NPU: bit-exact against the integer reference on both presets and at
the smallest SRAM the constraint admits; rows tiled where they do not fit, the weights then
streamed once per row tile; a layer too big for the SRAM stays on the CPU, saying why.

The layer is a real trained one: the input projection of the bidirectional LSTM digit
classifier (examples/recurrent, 8x8 digits read as 8 rows of 8 pixels), W [2, 96, 8] of both
directions as one [8, 192] MatMul, fed held-out digit sequences."""

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_builders import make_model
from test_trix_channels import _with_version
from test_trix_sim import integer_graph

from onebuild import compile as api
from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz
from onebuild.targets.trix_sim.codegen import EXEC, LOAD, generate
from onebuild.targets.trix_sim.constraints import tile_fits_sram
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.perf import estimate
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.tvn import HEADER, decode, encode

RECURRENT = Path(__file__).parent.parent / "examples" / "recurrent"


def _digit_rows() -> tuple[np.ndarray, np.ndarray]:
    """Calibration and held-out digits as sequences [N, 1, 8 rows, 8 pixels]."""
    calib = read_npz(RECURRENT / "data" / "calib.npz")["x"]  # [N, T, 1, K]
    test = read_npz(RECURRENT / "data" / "test.npz")["x"]
    return calib.transpose(0, 2, 1, 3), test.transpose(0, 2, 1, 3)


def _float_projection(relu: bool = False, bias: bool = False):
    """The LSTM's trained input weights as a sequence Linear [1, 8, 8] @ [8, 192] (+ its
    trained input bias, an Add over the last axis)."""
    lstm = onnx.load(RECURRENT / "lstm_bidirectional.onnx")
    trained = {i.name: numpy_helper.to_array(i) for i in lstm.graph.initializer}
    w, b = trained["W"], trained["B"]  # [2, 4H, K], [2, 8H] (input, recurrent biases)
    weights = w.reshape(-1, w.shape[-1]).T.copy()  # [K, 2 x 4H]
    constants = [("w", weights), ("b", b[:, : w.shape[1]].reshape(-1).copy())]
    names = ["x", *(["t"] if bias else []), *(["r"] if relu else []), "y"]
    nodes = [helper.make_node("MatMul", ["x", "w"], [names[1]])]
    if bias:
        nodes.append(helper.make_node("Add", [names[1], "b"], [names[2]]))
    if relu:
        nodes.append(helper.make_node("Relu", [names[-2]], ["y"]))
    return import_onnx(make_model(nodes, [("x", [1, 8, 8])], ["y"], constants)).main


def _projection(relu: bool = False, dtype: str = "uint8", bias: bool = False):
    """`_float_projection` quantized with quantized I/O, and held-out sequences."""
    calib, test = _digit_rows()
    graph = integer_graph(_float_projection(relu, bias), {"x": calib}, dtype)
    ops = [n.op for n in graph.nodes]
    assert ops[:3] == ["Reshape", "QGemm", "Reshape"], ops
    return graph, test


def _codes(graph, test: np.ndarray, count: int) -> list[dict]:
    x = graph.inputs[0]
    q = x.quant
    codes = np.rint(test[:count] / q.scale[0]) + q.zero_point[0]
    info = np.iinfo(x.dtype)
    return [{x.name: np.clip(c, info.min, info.max).astype(x.dtype)} for c in codes]


def _bit_exact(graph, hw, feeds: list[dict], pref: str = "performance"):
    module = generate(lower(graph, hw), hw, pref)
    assert module.sram_peak <= hw.sram_bytes
    simulator, reference = Simulator(module, hw), Interpreter(graph)
    for sample in feeds:
        got, report = simulator.run(sample)
        want = reference.run(sample)
        for value in graph.outputs:
            np.testing.assert_array_equal(got[value.name], want[value.name])
    return module, report


@pytest.mark.parametrize("hw_name", ["trix-s", "trix-m"])
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_sequence_rows_are_bit_exact_on_both_presets(hw_name, dtype):
    graph, test = _projection(relu=dtype == "uint8", dtype=dtype)
    hw = load_hardware(hw_name)
    assert api.partition(graph, "m", codegen=api.CodegenOptions(hw=hw_name)).backends == ["trix"]
    module, report = _bit_exact(graph, hw, _codes(graph, test, 6))
    gemm = next(layer for layer in module.layers if layer.kind == "gemm")
    assert report.layers[gemm.name]["macs"] == 8 * 8 * 192  # every row, every channel
    weights = gemm.arrays["weights"].nbytes
    assert report.layers[gemm.name]["dram_bytes"] == weights + graph.inputs[0].size * (
        1 if dtype == "uint8" else 2
    ) + graph.outputs[0].size * (1 if dtype == "uint8" else 2)  # weights once: rows fit


def _rows_tiles(module) -> set[int]:
    return {int(row[2]) for row in module.code if row[0] == EXEC}


def test_rows_that_do_not_fit_are_tiled_and_the_weights_stream_once_per_row_tile():
    graph, test = _projection()
    hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=1024)
    module, report = _bit_exact(graph, hw, _codes(graph, test, 4))
    starts = _rows_tiles(module)
    assert len(starts) > 1, starts  # row tiles
    index = next(i for i, layer in enumerate(module.layers) if layer.kind == "gemm")
    weights = module.layers[index].arrays["weights"].nbytes
    blob = module.arrays[(index, "weights")]
    loaded = sum(
        int(row[4]) * int(row[5])
        for row in module.code
        if row[0] == LOAD and row[1] == index and blob <= row[2] < blob + weights
    )
    assert loaded == len(starts) * weights
    estimated = estimate(lower(graph, hw), hw)["layers"][module.layers[index].name]
    assert estimated["dram_bytes"] == report.layers[module.layers[index].name]["dram_bytes"]


def test_the_smallest_sram_the_constraint_admits_compiles_and_less_is_refused():
    graph, test = _projection()
    gemm = next(n for n in graph.nodes if n.op == "QGemm")
    low, high = 1, 1 << 16  # in units of 16 bytes: refused / admitted
    while high - low > 1:
        middle = (low + high) // 2
        hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=middle * 16)
        low, high = (low, middle) if tile_fits_sram(gemm, hw) else (middle, high)
    hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=high * 16)
    module, _ = _bit_exact(graph, hw, _codes(graph, test, 2))
    assert _rows_tiles(module) == set(range(8))  # one row per tile
    below = dataclasses.replace(hw, sram_bytes=low * 16)
    with pytest.raises(UserError, match=f"layer '{gemm.name}' .* one tile"):
        generate(lower(graph, hw), below, "performance")
    placed = api.partition(graph, "m", codegen=api.CodegenOptions(hw="trix-s"))
    assert placed.backends == ["trix"]


def test_a_sequence_layer_too_big_for_the_sram_stays_on_the_cpu_with_its_reason(rng):
    """Rows of 70000 int16 codes (140 KB) and two rows of weights fit trix-m's 1 MiB, not
    trix-s's 256 KiB."""
    k = 70000
    weights = (rng.standard_normal((k, 4)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = import_onnx(make_model(nodes, [("x", [1, 3, k])], ["y"], [("w", weights)]))
    calib = {"x": rng.standard_normal((4, 1, 3, k)).astype(np.float32)}
    graph = integer_graph(model.main, calib, "int16")
    small = api.partition(graph, "m", codegen=api.CodegenOptions(hw="trix-s"))
    placed = {n.op: b for g, b in zip(small.graphs, small.backends) for n in g.nodes}
    assert placed["QGemm"] == "cpu"
    assert "smallest tile must fit the SRAM" in str(small.report)
    large = api.partition(graph, "m", codegen=api.CodegenOptions(hw="trix-m"))
    assert large.backends == ["trix"]


def test_tvn_version_6_holds_gemms_over_rows_and_older_headers_are_refused():
    graph, test = _projection()
    hw = load_hardware("trix-m")
    data = encode(generate(lower(graph, hw), hw))
    assert HEADER.unpack_from(data)[1] == 6
    module = decode(data)
    simulator = Simulator(module, hw)
    sample = _codes(graph, test, 1)[0]
    got, _ = simulator.run(sample)
    want = Interpreter(graph).run(sample)
    np.testing.assert_array_equal(got[graph.outputs[0].name], want[graph.outputs[0].name])
    with pytest.raises(FormatError, match="sequence parameters before version 6"):
        decode(_with_version(data, 5))


def test_a_gemm_wider_than_max_channels_runs_as_channel_parts():
    """trix-s takes 2048 channels a layer: the 192 outputs on a preset cut to 80 channels run
    as three gemm layers writing their columns, bit-exact; the estimate adds them up under
    the node's name (the partition's cost model looks nodes up by name)."""
    graph, test = _projection()
    hw = dataclasses.replace(load_hardware("trix-s"), max_channels=80)
    module, report = _bit_exact(graph, hw, _codes(graph, test, 3))
    parts = [layer for layer in module.layers if layer.kind == "gemm"]
    gemm = next(n for n in graph.nodes if n.op == "QGemm")
    assert [p.name for p in parts] == [f"{gemm.name}:{i}" for i in range(3)]
    assert [p.attrs["ch_offset"] for p in parts] == [0, 80, 160]
    assert sum(report.layers[p.name]["macs"] for p in parts) == 8 * 8 * 192
    estimated = estimate(lower(graph, hw), hw)["layers"]
    assert gemm.name in estimated and not any(":" in name for name in estimated)
    decode(encode(module))  # offsets and widths pass the reader's checks


@pytest.mark.parametrize("hw_name", ["trix-s", "trix-m"])
def test_a_sequence_linear_with_its_bias_is_one_npu_part_and_bit_exact(hw_name):
    """The bias Add over the last axis of [1, T, N] (a QAdd after the rows QGemm) runs on the
    NPU with one code per row of its (T, N, 1) layout: the Linear is one NPU part."""
    graph, test = _projection(relu=True, bias=True)
    assert "QAdd" in [n.op for n in graph.nodes]
    assert api.partition(graph, "m", codegen=api.CodegenOptions(hw=hw_name)).backends == ["trix"]
    module, _ = _bit_exact(graph, load_hardware(hw_name), _codes(graph, test, 4))
    add = next(layer for layer in module.layers if layer.kind == "add")
    assert add.attrs["const_axis"] == 1 and add.arrays["operand"].shape == (192,)
    decode(encode(module))  # the reader checks one code per row
