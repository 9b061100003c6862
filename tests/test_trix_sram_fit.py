"""A layer whose smallest tile cannot fit the preset's SRAM stays on the CPU, with the reason in
the partition table (PP-OCR's recognizer on trix-s: a depthwise 5x5 over 480 channels of 6x80
went to the NPU and codegen failed naming neither part nor layer). The constraint agrees with
the code generator: at the smallest SRAM it admits, the layer compiles and runs bit-exactly;
with a sixteenth less, the code generator refuses it, naming the layer."""

import dataclasses

import pytest
from test_trix_sim import _conv_graph, assert_bit_exact, integer_graph

from onebuild import compile as api
from onebuild.errors import UserError
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.constraints import tile_fits_sram
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower

WIDE_DEPTHWISE = (480, 6, 80, 480, 5, 1, 2, 480)  # c, h, w, m, k, stride, pad, group


def _quantized(rng, shape):
    graph, data = _conv_graph(rng, *shape)
    return integer_graph(graph, data, "uint8")


def test_a_layer_too_big_for_the_sram_stays_on_the_cpu_with_its_reason(rng):
    quantized = _quantized(rng, WIDE_DEPTHWISE)
    small = api.partition(quantized, "m", codegen=api.CodegenOptions(hw="trix-s"))
    placed = {n.op: b for g, b in zip(small.graphs, small.backends) for n in g.nodes}
    assert placed["QConv"] == "cpu"
    reasons = str(small.report)
    assert "smallest tile must fit the SRAM" in reasons, reasons
    large = api.partition(quantized, "m", codegen=api.CodegenOptions(hw="trix-m"))
    placed = {n.op: b for g, b in zip(large.graphs, large.backends) for n in g.nodes}
    assert placed["QConv"] == "trix"


@pytest.mark.parametrize(
    "shape",
    [WIDE_DEPTHWISE, (64, 9, 40, 32, 3, 1, 1, 1), (24, 20, 30, 24, 3, 2, 1, 24)],
)
def test_the_smallest_sram_the_constraint_admits_compiles(rng, shape):
    quantized = _quantized(rng, shape)
    conv = next(n for n in quantized.nodes if n.op == "QConv")
    low, high = 1, 1 << 16  # in units of 16 bytes: refused / admitted
    while high - low > 1:
        middle = (low + high) // 2
        hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=middle * 16)
        low, high = (low, middle) if tile_fits_sram(conv, hw) else (middle, high)
    hw = dataclasses.replace(load_hardware("trix-s"), sram_bytes=high * 16)
    assert_bit_exact(quantized, hw, "performance", rng, samples=1)
    below = dataclasses.replace(hw, sram_bytes=high * 15)  # 1/16 less: not much too strict
    with pytest.raises(UserError, match=f"layer '{conv.name}' .* one tile"):
        generate(lower(quantized, hw), below, "performance")
