"""The TRIX simulator's compiled kernels (numba, extra `fast`; in the test extra) and the numpy
code they replace give identical outputs and cycles, both bit-exact with the integer reference
interpreter: each test runs both paths."""

import sys

import numpy as np
import pytest
from test_trix_sim import CONVS, _conv_graph, integer_graph

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.targets.trix_sim import kernels
from onebuild.targets.trix_sim.codegen import generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.simulator import Simulator


def _counted(monkeypatch) -> dict:
    """Turns the kernels on and counts their calls."""
    monkeypatch.setattr(kernels, "use", True)
    kernels.load()
    fused = kernels.compiled()
    assert fused is not None, "numba is in the test extra: the compiled path must be tested"
    calls = {}
    for name, kernel in vars(fused).items():

        def counting(*args, _kernel=kernel, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _kernel(*args)

        monkeypatch.setattr(fused, name, counting)
    return calls


def _both_paths(monkeypatch, quantized, presets, rng, samples=2) -> dict:
    """Runs `samples` random inputs through a simulator per path and preset; asserts equal
    outputs and reports, bit-exact with the interpreter; the compiled kernels' call counts."""
    feeds = [
        {
            v.name: rng.integers(np.iinfo(v.dtype).min, np.iinfo(v.dtype).max + 1, v.shape).astype(
                v.dtype
            )
            for v in quantized.inputs
        }
        for _ in range(samples)
    ]
    reference = Interpreter(quantized)
    calls = {}
    for preset in presets:
        hw = load_hardware(preset)
        module = generate(lower(quantized, hw), hw, "performance")
        runs = []
        for compiled in (True, False):
            if compiled:
                calls = _counted(monkeypatch)
            else:
                monkeypatch.setattr(kernels, "use", False)
            simulator = Simulator(module, hw)
            runs.append([simulator.run(f) for f in feeds])
        for f, (fast, (slow, slow_report)) in zip(feeds, zip(*runs)):
            want = reference.run(f)
            for value in quantized.outputs:
                np.testing.assert_array_equal(fast[0][value.name], want[value.name])
                np.testing.assert_array_equal(slow[value.name], want[value.name])
            assert fast[1].cycles == slow_report.cycles and fast[1].layers == slow_report.layers
    return calls


def test_squeezenet_is_identical_on_both_paths(rng, monkeypatch):
    model = import_onnx(light_model("squeezenet", seed=1, expose_logits=True))
    run_preset(model)
    x = model.main.inputs[0]
    quantized = integer_graph(model.main, {x.name: rng.random((2, *x.shape), dtype=np.float32)})
    calls = _both_paths(monkeypatch, quantized, ["trix-s", "trix-m"], rng)
    assert calls["requantize"] >= 26  # every convolution's outputs at least once
    assert calls["row_sums"] >= 1  # its global average pool
    assert calls["center"] >= 17  # every 1x1 convolution's operand at least once


@pytest.mark.parametrize("shape", [CONVS[0], CONVS[2], CONVS[3]])  # plain, depthwise, grouped
@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_convolutions_are_identical_on_both_paths(rng, monkeypatch, shape, dtype):
    graph, data = _conv_graph(rng, *shape)
    calls = _both_paths(monkeypatch, integer_graph(graph, data, dtype), ["trix-s"], rng)
    # int16 outputs need shifts beyond the float64 proof: int64 on both paths
    assert (calls.get("requantize", 0) > 0) == (dtype == "uint8")


def test_without_numba_the_numpy_path_runs(rng, monkeypatch):
    """A process where numba cannot be imported loads no kernels and simulates with numpy."""
    monkeypatch.setattr(kernels, "use", True)
    monkeypatch.setattr(kernels, "_loaded", [])
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    kernels.load()
    assert kernels.compiled() is None
    graph, data = _conv_graph(rng, *CONVS[0])
    quantized = integer_graph(graph, data)
    hw = load_hardware("trix-s")
    simulator = Simulator(generate(lower(quantized, hw), hw, "performance"), hw)
    feeds = {"x": rng.integers(0, 256, quantized.inputs[0].shape).astype(np.uint8)}
    want = Interpreter(quantized).run(feeds)
    for _ in range(2):  # the second run loads the kernels: none
        got, _ = simulator.run(feeds)
        for value in quantized.outputs:
            np.testing.assert_array_equal(got[value.name], want[value.name])
    assert kernels.compiled() is None
