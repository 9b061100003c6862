"""The TRIX schedule's layer fusion: epilogues (`fusion.py`: residual Adds and Concat parts
folded into the convolution that produces their operand) stay bit-exact on every tiling, skip
the DRAM round trip of the intermediate and are checked by the .tvn decoder; cascades
(`cascade.py`: a layer and the next in row stripes) keep the intermediate out of DRAM."""

import dataclasses
import hashlib

import numpy as np
import pytest
from test_trix_sim import PRESETS, assert_bit_exact, integer_graph

from onebuild.errors import FormatError
from onebuild.graph_ir.ir import Graph
from onebuild.targets.trix_sim import cascade, codegen
from onebuild.targets.trix_sim.codegen import EXEC, STORE, generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.simulator import Simulator
from onebuild.targets.trix_sim.tvn import DIGEST, decode, encode


def _block_graph(rng):
    """stem conv -> residual block (3x3 conv, 1x1 conv + the stem) -> fire module (1x1 and 3x3
    expand convs concatenated with a max-pooled branch) -> 1x1 conv."""
    graph = Graph("block")
    x = graph.add_input("x", np.float32, (1, 5, 11, 13))

    def conv(value, m, k):
        weight = rng.normal(0, 0.4, (m, value.shape[1], k, k)).astype(np.float32)
        bias = rng.normal(0, 0.1, m).astype(np.float32)
        attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [k // 2] * 4, "group": 1}
        inputs = [value, graph.add_constant(weight), graph.add_constant(bias)]
        return graph.make_node("Conv", inputs, attrs).output

    stem = conv(x, 12, 3)
    residual = graph.make_node("Add", [conv(conv(stem, 12, 3), 12, 1), stem]).output
    pool = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1] * 4}
    pooled = graph.make_node("MaxPool", [residual], pool).output
    parts = [conv(residual, 7, 1), conv(residual, 9, 3), pooled]
    joined = graph.make_node("Concat", parts, {"axis": 1}).output
    graph.outputs = [conv(joined, 6, 1)]
    return graph, {"x": rng.normal(0, 1, (3, 1, 5, 11, 13)).astype(np.float32)}


@pytest.fixture(scope="module")
def quantized():
    graph, data = _block_graph(np.random.default_rng(7))
    return integer_graph(graph, data)


def test_residual_add_and_concat_parts_fuse_into_their_convolutions(quantized):
    hw = load_hardware("trix-s")
    module = generate(lower(quantized, hw), hw)
    fused = {
        layer.name: module.layers[layer.attrs["epilogue"]].kind
        for layer in module.layers
        if "epilogue" in layer.attrs
    }
    # the Add goes to the later of its producers (the 1x1 conv; the stem is its other
    # operand); both expand convs of the concat fuse, its max-pooled part stays a copy
    assert sorted(fused.values()) == ["add", "concat", "concat"]
    add = next(i for i, layer in enumerate(module.layers) if layer.kind == "add")
    concat = next(i for i, layer in enumerate(module.layers) if layer.kind == "concat")
    execs = module.code[module.code[:, 0] == EXEC]
    assert add not in execs[:, 1]  # no instructions of its own
    copied = execs[execs[:, 1] == concat]
    # only part 2 (the pool) is copied, into channels 16 on (after 7 + 9 fused ones)
    assert len(copied) and (copied[:, 7] == 2).all() and (copied[:, 4] >= 16).all()
    assert [layer.name for layer in module.layers] == [
        layer.name for layer in lower(quantized, hw).layers
    ]


@pytest.mark.parametrize("preset", PRESETS)
def test_fused_programs_are_bit_exact_on_every_tiling(quantized, preset, rng):
    """Roomy SRAM (resident tensors, whole-height tiles), both preferences, and SRAMs so small
    that the convolutions run as row tiles with the Add's operand staged beside them."""
    hw = load_hardware(preset)
    for pref in ("performance", "memory"):
        assert_bit_exact(quantized, hw, pref, rng)
    for sram in (3072, 4096, 8192):
        small = dataclasses.replace(hw, sram_bytes=sram)
        assert_bit_exact(quantized, small, "performance", rng)


def test_fusion_removes_the_intermediate_round_trips(quantized, rng, monkeypatch):
    """With every tensor in DRAM (`memory`), each fused intermediate saves exactly its store
    and its reload, and the Add's separate pass (cascades off: they change the tiling)."""
    hw = load_hardware("trix-m")
    program = lower(quantized, hw)
    monkeypatch.setattr(cascade, "find_cascades", lambda *args: {})
    fused = generate(program, hw, "memory")
    middles = [layer.output for layer in fused.layers if "epilogue" in layer.attrs]
    monkeypatch.setattr(codegen, "fuse_epilogues", lambda p: p)
    plain = generate(program, hw, "memory")
    x = quantized.inputs[0]
    feeds = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
    (got, fused_report), (want, plain_report) = (
        Simulator(m, hw).run(feeds) for m in (fused, plain)
    )
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    saved = 2 * sum(program.tensors[n].nbytes for n in middles)
    assert plain_report.dram_bytes - fused_report.dram_bytes == saved
    assert fused_report.cycles < plain_report.cycles


def assert_same_outputs(module, reference, hw, graph: Graph, rng) -> None:
    """Both programs give the same codes on one random uint8 input of `graph`."""
    x = graph.inputs[0]
    feeds = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
    got, _ = Simulator(module, hw).run(feeds)
    want, _ = Simulator(reference, hw).run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def _tampered(module, index: int, value) -> bytes:
    layers = list(module.layers)
    attrs = {**layers[index].attrs, "epilogue": value}
    layers[index] = dataclasses.replace(layers[index], attrs=attrs)
    return encode(dataclasses.replace(module, layers=layers))


def test_decoder_rejects_epilogues_that_do_not_fit(quantized):
    hw = load_hardware("trix-s")
    module = generate(lower(quantized, hw), hw)
    assert decode(encode(module)).layers[1].attrs.keys() == module.layers[1].attrs.keys()
    conv = next(i for i, layer in enumerate(module.layers) if "epilogue" in layer.attrs)
    pool = next(i for i, layer in enumerate(module.layers) if layer.kind == "maxpool")
    stem = 0  # a convolution whose only reader is a convolution
    for index, value in [(conv, conv), (conv, 0), (conv, pool), (conv, 10**6), (stem, conv)]:
        with pytest.raises(FormatError, match="epilogue"):
            decode(_tampered(module, index, value), "m.tvn")
    with pytest.raises(FormatError, match="epilogue"):
        decode(_tampered(module, pool, len(module.layers) - 1), "m.tvn")


def test_version_2_files_without_epilogues_still_load(quantized, rng, monkeypatch):
    hw = load_hardware("trix-m")
    monkeypatch.setattr(codegen, "fuse_epilogues", lambda p: p)
    module = generate(lower(quantized, hw), hw)
    content = bytearray(encode(module)[:-DIGEST])
    content[4:6] = (2).to_bytes(2, "little")
    old = decode(bytes(content) + hashlib.sha256(content).digest())
    assert_same_outputs(old, module, hw, quantized, rng)


def _stem_graph(rng):
    """A squeezenet-like stem: 3-channel 3x3/2 convolution (DMA-bound: its output dwarfs its
    input) -> 3x3/2 max pool -> 1x1 convolution."""
    graph = Graph("stem")
    x = graph.add_input("x", np.float32, (1, 3, 95, 93))
    weight = graph.add_constant(rng.normal(0, 0.4, (24, 3, 3, 3)).astype(np.float32))
    bias = graph.add_constant(rng.normal(0, 0.1, 24).astype(np.float32))
    attrs = {"strides": [2, 2], "dilations": [1, 1], "pads": [1] * 4, "group": 1}
    stem = graph.make_node("Conv", [x, weight, bias], attrs).output
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [1, 1], "pads": [0] * 4}
    pooled = graph.make_node("MaxPool", [stem], {**pool, "ceil_mode": 0}).output
    weight = graph.add_constant(rng.normal(0, 0.4, (8, 24, 1, 1)).astype(np.float32))
    bias = graph.add_constant(rng.normal(0, 0.1, 8).astype(np.float32))
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4, "group": 1}
    graph.outputs = [graph.make_node("Conv", [pooled, weight, bias], attrs).output]
    return graph, {"x": rng.normal(0, 1, (3, 1, 3, 95, 93)).astype(np.float32)}


@pytest.fixture(scope="module")
def stem():
    graph, data = _stem_graph(np.random.default_rng(11))
    return integer_graph(graph, data)


@pytest.mark.parametrize("preset", PRESETS)
def test_a_dma_bound_convolution_cascades_with_its_pool(stem, preset, rng, monkeypatch):
    """The stem convolution, the max pool and the 1x1 convolution run as one cascade in row
    stripes: the first two outputs are never stored, the pool runs in the stem's output stage
    (the stem's EXECs name the pool's row stripes, the pool has none), and the program is
    faster than layer by layer and than with the pool apart, and bit-exact (the stem computed
    whole on later runs, its stripes proven to read its input, the last layer computed whole
    from the stem's pooled output, its stripes proven to read copies of it), also on SRAMs that
    force thin stripes and with the `memory` preference (whose arena must keep the stem's
    input alive while the last layer's stripes are stored). 64 KiB of SRAM: the stem's output
    (54 KiB) cannot stay resident."""
    hw = dataclasses.replace(load_hardware(preset), sram_bytes=65536)
    program = lower(stem, hw)
    module = generate(program, hw)
    code = module.code
    stores = code[code[:, 0] == STORE][:, 1].tolist()
    assert set(stores) == {2}  # only the last layer's stripes are stored
    order = code[code[:, 0] == EXEC][:, 1].tolist()
    assert order == [0, 2] * len(stores)  # the stem (with the pool) and the last layer
    assert module.layers[0].attrs["epilogue"] == 1
    stripes = code[(code[:, 0] == EXEC) & (code[:, 1] == 0)][:, 2:4]
    assert len(stripes) >= 4 and stripes[0, 0] == 0
    assert (stripes[1:, 0] == stripes[:-1].sum(axis=1)).all()  # the pool's rows, each once
    assert stripes[-1].sum() == program.tensors[program.layers[1].output].shape[1]
    x = stem.inputs[0]
    feeds = {x.name: rng.integers(0, 256, x.shape).astype(np.uint8)}
    simulator = Simulator(module, hw)
    got, cascaded = simulator.run(feeds)
    assert 0 in simulator._lean  # the stem is computed whole: every stripe is proven its slice
    copies = {index for _, index, target, _, args in simulator._plan if args and target is not None}
    assert 0 in copies  # of the whole stem's pooled output, on later runs
    # the last layer's stripes read copies of that output (never in DRAM): it is computed
    # whole from it, every stripe proven
    assert simulator._sources == {2: 0} and 2 in simulator._lean
    again, _ = simulator.run(feeds)
    monkeypatch.setattr(cascade, "fuse_pools", lambda *args: None)
    apart = generate(program, hw)
    assert apart.code[(apart.code[:, 0] == EXEC)][1:2, 1].tolist() == [1]  # the pool's own
    want, unfused = Simulator(apart, hw).run(feeds)
    monkeypatch.setattr(cascade, "find_cascades", lambda *args: {})
    _, plain = Simulator(generate(program, hw), hw).run(feeds)
    monkeypatch.undo()
    assert cascaded.cycles < unfused.cycles < plain.cycles
    assert cascaded.dram_bytes < plain.dram_bytes
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(again[name], want[name])
    for pref in ("performance", "memory"):
        assert_bit_exact(stem, hw, pref, rng)
    for sram in (8192, 16384):
        assert_bit_exact(stem, dataclasses.replace(hw, sram_bytes=sram), "performance", rng)


def test_pool_epilogues_round_trip_and_are_checked(stem, rng):
    """A `.tvn` with a max pool epilogue decodes to the same program, which runs to the same
    codes; an epilogue naming a layer other than the pool reading the convolution, or a tile
    beyond the pool's rows, is a FormatError."""
    hw = dataclasses.replace(load_hardware("trix-m"), sram_bytes=65536)
    module = generate(lower(stem, hw), hw)
    assert module.layers[0].attrs["epilogue"] == 1
    decoded = decode(encode(module))
    assert [layer.attrs for layer in decoded.layers] == [layer.attrs for layer in module.layers]
    assert_same_outputs(decoded, module, hw, stem, rng)
    with pytest.raises(FormatError, match="epilogue"):
        decode(_tampered(module, 0, 2), "m.tvn")  # the 1x1 convolution
    code = module.code.copy()
    first = np.flatnonzero((code[:, 0] == EXEC) & (code[:, 1] == 0))[-1]
    code[first, 3] += 1  # one row past the pool's output
    with pytest.raises(FormatError, match="EXEC tile leaves"):
        decode(encode(dataclasses.replace(module, code=code)), "m.tvn")


@pytest.mark.parametrize("make", [_block_graph, _stem_graph])
def test_int16_epilogues_and_cascades_are_bit_exact(make, rng):
    graph, data = make(np.random.default_rng(5))
    quantized = integer_graph(graph, data, "int16")
    hw = load_hardware("trix-m")
    module = generate(lower(quantized, hw), hw)
    assert any("epilogue" in layer.attrs for layer in module.layers) or make is _stem_graph
    for sram in (8192, 65536, hw.sram_bytes):
        assert_bit_exact(quantized, dataclasses.replace(hw, sram_bytes=sram), "performance", rng)


def test_the_estimate_charges_fused_layers_as_the_code_generator_runs_them(quantized, monkeypatch):
    """perf.estimate (what partition's cost strategy reads) gives the fused Add no layer of
    its own and moves no fused intermediate: it is below the same estimate without fusion by
    at least the intermediates' DMA, and the Concat moves only its pooled part."""
    from onebuild.targets.trix_sim import perf
    from onebuild.targets.trix_sim.fusion import fuse_epilogues
    from onebuild.targets.trix_sim.perf import dma_cycles, estimate

    hw = load_hardware("trix-m")
    program = lower(quantized, hw)
    fused = estimate(program, hw)
    add = next(layer.name for layer in program.layers if layer.kind == "add")
    concat = next(layer for layer in program.layers if layer.kind == "concat")
    assert add not in fused["layers"]
    pooled = program.tensors[concat.inputs[2]].nbytes
    assert fused["layers"][concat.name]["dram_bytes"] == 2 * pooled
    monkeypatch.setattr(perf, "fuse_epilogues", lambda p: p)
    plain = estimate(program, hw)
    middles = [
        layer.output for layer in fuse_epilogues(program).layers if "epilogue" in layer.attrs
    ]
    assert plain["cycles"] - fused["cycles"] >= dma_cycles(
        hw, sum(program.tensors[n].nbytes for n in middles)
    )
