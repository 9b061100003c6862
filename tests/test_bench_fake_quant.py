"""bench/fake_quant.py: fake quantization on onebuild's own grids tracks the integer model it
estimates (all uint8, all int16, one layer promoted), and activation-only promotion lets a
uint8 layer write int16 for a promoted reader."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
from test_mixed_precision import DIGITS, outlier_digits

from onebuild.compile import QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.serde import load_onnx

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fake_quant", ROOT / "bench" / "fake_quant.py")
fake_quant = importlib.util.module_from_spec(_spec)
sys.modules["fake_quant"] = fake_quant  # dataclasses resolve their module
_spec.loader.exec_module(fake_quant)


def _worst_db(want: dict, got: dict) -> float:
    return min(
        sqnr_db(float(np.vdot(w, w)), float(np.square(w - got[o].astype(np.float64)).sum()))
        for o, w in want.items()
    )


def test_fake_quantization_tracks_the_integer_model_and_values_can_be_promoted(tmp_path):
    path = outlier_digits(tmp_path / "outlier.onnx")
    float_graph = optimize(load_onnx(path)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    batch = first_samples(DIGITS / "data/test.npz", specs, 64)[0]

    def integer(**options):
        return quantize(optimize(load_onnx(path)), QuantizeOptions(**options), stats).main

    low, high = integer(), integer(dtype="int16")
    conv2 = integer(layers=({"names": ["conv2"], "dtype": "int16"},))
    fake = fake_quant.FakeQuant(float_graph, fake_quant.grids(float_graph, low, high))
    want = {k: v.astype(np.float64) for k, v in Interpreter(float_graph).run_batch(batch).items()}

    def fake_db(way: str, promoted: set[str]) -> float:
        return _worst_db(
            want, fake.outputs(batch, fake_quant.way_rounding(float_graph, way, promoted))
        )

    def integer_db(graph) -> float:
        outputs = compare_graphs(float_graph, graph, [("test", batch)]).outputs
        return min(o["sqnr_db"] for o in outputs.values())

    everything = {n.name for n in float_graph.nodes}
    assert abs(fake_db("layer", set()) - integer_db(low)) < 0.1
    assert abs(fake_db("layer", everything) - integer_db(high)) < 0.1
    # conv2 in int16 reads conv1's uint8 output, whose small channels lost every code
    assert abs(fake_db("layer", {"conv2"}) - integer_db(conv2)) < 0.1
    assert integer_db(conv2) < 10
    # allowed to write int16 for its promoted reader, conv1 keeps them: the MACs are the same
    assert fake_db("value", {"conv2"}) > fake_db("layer", {"conv2"}) + 20
