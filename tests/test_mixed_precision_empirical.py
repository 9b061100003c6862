"""Mixed precision with empirical bias correction (`bias_correction = "empirical"`): every
candidate of the search is corrected before it is measured, so the SQNR the search reports is
the one of the model the build writes, and the correction's shared pass (`BiasCorrector`)
gives every candidate the biases a fresh correction gives it."""

import json

import numpy as np
import pytest
from test_empirical_bias import _quantized
from test_equalize import _digits, _load, spread_model
from test_trix_sim import assert_bit_exact

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, quantize
from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.quant import empirical_bias, mixed_precision
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.empirical_bias import BiasCorrector, correct_biases
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.model_io import with_quantized_io
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.targets.trix_sim.hardware import load_hardware


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    return spread_model(tmp_path_factory.mktemp("spread"))


def _biases(graph) -> dict[str, np.ndarray]:
    return {n.name: n.inputs[2].numpy() for n in graph.nodes if n.op in ("QConv", "QGemm")}


def test_a_shared_corrector_gives_each_candidate_a_fresh_correction(spread):
    calib, _ = _digits()
    graph = _load(spread)
    stats = calibrate(graph, {"x": calib})
    ranges, means = stats.ranges_for("uint8"), stats.channel_means()
    convs = [n.name for n in graph.nodes if n.op == "Conv"]
    assert len(convs) == 3
    promoted = [(), (convs[2],), (convs[0],), (convs[1], convs[2]), ()]
    shared = BiasCorrector(graph, [{"x": calib}], empirical_bias.CACHE_BYTES)
    runs = []
    for names in promoted:
        layers = (LayerOverride(names, "int16"),) if names else ()
        config = QuantConfig(layers=layers)
        fresh = quantize_graph(graph, ranges, config, means)
        again = quantize_graph(graph, ranges, config, means)
        assert correct_biases(graph, fresh, [{"x": calib}]) == 3
        before = shared.computed
        assert shared(again) == 3
        runs.append((shared.computed - before, len(again.nodes)))
        want, got = _biases(fresh), _biases(again)
        assert want.keys() == got.keys()
        assert all(np.array_equal(want[k], got[k]) and want[k].dtype == got[k].dtype for k in want)
    # the shared pass reruns only what changed: all of the first, none of the repeated empty
    # set, not what is upstream of the last layer when only that one is promoted
    assert runs[0][0] == runs[0][1] and runs[-1][0] == 0
    assert 0 < runs[1][0] < runs[1][1]
    single = BiasCorrector(graph, [{"x": calib}])  # one correction: no cache by default
    single(quantize_graph(graph, ranges, QuantConfig(), means))
    single(quantize_graph(graph, ranges, QuantConfig(), means))
    assert not single.stored and single.reused == 0


def _searched(spread, bias_correction, count=None):
    calib, _ = _digits()
    calib = calib[:count]
    graph = _load(spread)
    stats = calibrate(graph, {"x": calib})
    mixed = MixedPrecisionOptions(target_sqnr_db=15)  # on this model: uint8 14.7 dB corrected
    options = QuantizeOptions(bias_correction=bias_correction, mixed_precision=mixed)
    model = quantize(Model([_load(spread)]), options, stats, [{"x": calib}])
    return graph, model, stats


@pytest.fixture(scope="module")
def searched(spread):
    return _searched(spread, "empirical")


def test_the_search_reports_the_sqnr_of_the_corrected_model_it_writes(spread, searched):
    graph, model, stats = searched
    calib, _ = _digits()
    record = json.loads(model.metadata["mixed_precision"])
    assert record["target_met"]
    measured = compare_graphs(graph, model.main, [("calibration", {"x": calib})])
    worst = min(o["sqnr_db"] for o in measured.outputs.values())
    assert worst == record["sqnr_db"]  # the model written is the model measured, bit for bit
    # its biases are the corrected ones: a plain quantization of the same choice differs
    layers = (LayerOverride(tuple(record["promoted"]), "int16"),)
    plain = quantize_graph(graph, stats.ranges_for("uint8"), QuantConfig(layers=layers))
    assert _biases(plain).keys() == _biases(model.main).keys()
    assert any(not np.array_equal(a, _biases(model.main)[k]) for k, a in _biases(plain).items())


def test_probes_that_see_the_correction_promote_less(spread, searched):
    """Measured: corrected probes keep conv1 in uint8 (65.4 % of the MACs promoted, 15.2 dB);
    uncorrected ones (plain bias correction) must promote all three layers to reach 15 dB."""
    corrected = json.loads(searched[1].metadata["mixed_precision"])
    plain = json.loads(_searched(spread, True)[1].metadata["mixed_precision"])
    assert plain["target_met"] and plain["high_precision_mac_fraction"] == 1.0
    assert corrected["high_precision_mac_fraction"] < 0.7


def test_the_corrected_mixed_model_runs_bit_exactly_on_the_npu(searched, rng):
    _, model, _ = searched
    assert_bit_exact(with_quantized_io(model.main), load_hardware("trix-m"), "performance", rng)


def test_uint8_alone_misses_the_target_on_this_model(spread):
    """The search above had something to do: corrected uint8 is far below 30 dB here."""
    calib, _ = _digits()
    graph, empirical = _quantized(spread, calib, "empirical")
    measured = compare_graphs(graph, empirical, [("calibration", {"x": calib})])
    assert min(o["sqnr_db"] for o in measured.outputs.values()) < 20


def test_probes_reading_the_correction_pass_outputs_choose_and_measure_the_same(
    spread, monkeypatch
):
    """When the correction fits on the probes' own samples, the probes read its pass's outputs
    instead of running each candidate again: the same record, probe for probe, as running it."""
    read = []
    compare = mixed_precision.Probes.compare

    def spy(self, candidate, give_up_below=None, computed=None):
        read.append(computed is not None)
        return compare(self, candidate, give_up_below, computed)

    monkeypatch.setattr(mixed_precision.Probes, "compare", spy)
    count = empirical_bias.SAMPLES  # the correction's samples are the probes' own
    shared = json.loads(_searched(spread, "empirical", count)[1].metadata["mixed_precision"])
    assert read and all(read)
    read.clear()
    monkeypatch.setattr(mixed_precision, "_equal_batches", lambda a, b: False)
    ran = json.loads(_searched(spread, "empirical", count)[1].metadata["mixed_precision"])
    assert read and not any(read)
    assert shared == ran and len(ran["steps"]) > 2
