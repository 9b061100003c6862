"""The mixed-precision search's shortcuts give exactly what the full evaluation gives: probes
that rerun only what changed and stop once the target is out of reach (quant/probes.py) and
sensitivity runs that recompute only the nodes the measured layer reaches
(quant/sensitivity.py), on the trained digits CNN and real digit images."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_mixed_precision import decoy_digits, outlier_digits

from onebuild.compile import (
    MixedPrecisionOptions,
    QuantizeOptions,
    calibrate,
    optimize,
    options_from,
    quantize,
)
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir.quant import mixed_precision, probes, sensitivity
from onebuild.graph_ir.quant.config import LayerOverride, QuantConfig
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde import load_onnx
from onebuild.recipe import QuantizeMixedPrecision

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}


class FullEvaluation:
    """The slow path: every probe compared with `compare_graphs`, nothing reused."""

    def __init__(self, float_graph, batches):
        self.float_graph = float_graph
        self.batches = [(f"sample batch {i}", b) for i, b in enumerate(batches)]

    def compare(self, candidate, give_up_below=None, computed=None):  # never gives up
        assert computed is None  # no empirical correction here
        return compare_graphs(self.float_graph, candidate, self.batches)


def _search(path: Path) -> dict:
    model = optimize(load_onnx(path, SHAPES))
    specs = [(v.name, v.shape) for v in model.main.inputs]
    stats = calibrate(model.main, iter_batches(DIGITS / "data/calib.npz", specs))
    samples = first_samples(DIGITS / "data/calib.npz", specs, 16)
    options = QuantizeOptions(mixed_precision=MixedPrecisionOptions(target_sqnr_db=30))
    return json.loads(quantize(model, options, stats, samples).metadata["mixed_precision"])


@pytest.mark.parametrize("variant", [outlier_digits, decoy_digits])
def test_the_search_with_shared_probes_equals_the_full_evaluation(variant, tmp_path, monkeypatch):
    path = variant(tmp_path / "m.onnx")
    made = []

    class Counting(probes.Probes):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(mixed_precision, "Probes", Counting)
    fast = _search(path)
    assert made and made[0].reused > 0  # the probes did share work
    monkeypatch.setattr(mixed_precision, "Probes", FullEvaluation)
    full = _search(path)
    assert len(fast["steps"]) >= 3 and fast["promoted"]  # a search happened
    stopped = [i for i, step in enumerate(fast["steps"]) if "sqnr_db" not in step]
    assert stopped  # a probe gave up (the all-base one, at least: it misses by far)
    for i in stopped:  # it could not have met the target: the full run misses it too
        step, whole = fast["steps"][i], full["steps"][i]
        assert whole["sqnr_db"] <= step.pop("sqnr_db_at_most") < fast["target_sqnr_db"]
        assert step.pop("samples") < 16
        step["sqnr_db"] = whole["sqnr_db"]
    assert fast == full  # promoted set, SQNR of every other probe, sensitivities: bit for bit


def test_a_probe_reruns_only_what_changed_and_measures_as_compare_graphs(tmp_path):
    path = outlier_digits(tmp_path / "m.onnx")
    float_graph = optimize(load_onnx(path, SHAPES)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    ranges, means = stats.ranges_for("uint8"), stats.channel_means()
    test = first_samples(DIGITS / "data/test.npz", specs, 40)  # two chunks of samples
    base = quantize_graph(float_graph, ranges, QuantConfig(), means)
    late = QuantConfig(layers=(LayerOverride(("fc",), "int16"),))
    promoted_fc = quantize_graph(float_graph, ranges, late, means)
    shared = probes.Probes(float_graph, test)
    for candidate in (base, promoted_fc):
        computed = shared.computed
        got = shared.compare(candidate)
        want = compare_graphs(float_graph, candidate, [(str(i), b) for i, b in enumerate(test)])
        assert got.outputs == want.outputs and got.samples == want.samples == 40
    # the second candidate differs from the first only from fc's input conversion on: the
    # convolutions and pools are reused, per piece of samples (fewer than half the node runs)
    assert shared.computed - computed < computed / 2
    assert shared.reused >= 2 * 6


def test_a_store_smaller_than_a_candidate_keeps_the_earliest_results(tmp_path):
    """Past its size, the store drops the results of the latest nodes in the graph first: a
    second candidate that changes only fc still reuses the convolutions and pools, where a
    least-recently-used store of that size would have dropped the first pieces' before it
    asked for them. Every SQNR is still compare_graphs'."""
    path = outlier_digits(tmp_path / "m.onnx")
    float_graph = optimize(load_onnx(path, SHAPES)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    ranges, means = stats.ranges_for("uint8"), stats.channel_means()
    test = first_samples(DIGITS / "data/test.npz", specs, 40)
    base = quantize_graph(float_graph, ranges, QuantConfig(), means)
    late = QuantConfig(layers=(LayerOverride(("fc",), "int16"),))
    promoted_fc = quantize_graph(float_graph, ranges, late, means)
    whole = probes.Probes(float_graph, test)
    whole.compare(base)
    small = probes.Probes(float_graph, test, cache_bytes=whole.bytes * 3 // 4)
    small.compare(base)
    assert 0 < small.bytes <= whole.bytes * 3 // 4 and len(small.stored) < len(whole.stored)
    pieces = {key[:3] for key in whole.stored}  # (part, step, first sample)
    for candidate in (promoted_fc, base):
        reused = small.reused
        got = small.compare(candidate)
        want = compare_graphs(float_graph, candidate, [(str(i), b) for i, b in enumerate(test)])
        assert got.outputs == want.outputs
        # the input conversion, conv1 and pool1 of every piece at least (LRU: none)
        assert small.reused - reused >= 3 * len(pieces)


def _branching_digits(path: Path) -> Path:
    """The digits CNN with a side branch off pool1 (a copy of conv2, averaged) as a second
    output: conv2 and the side convolution do not reach each other."""
    model = onnx.load(DIGITS / "digits.onnx")
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    model.graph.initializer.append(numpy_helper.from_array(weights["w2"][::-1].copy(), "ws"))
    model.graph.node.extend(
        [
            helper.make_node("Conv", ["p1", "ws", "b2"], ["s"], name="side", pads=[1, 1, 1, 1]),
            helper.make_node("GlobalAveragePool", ["s"], ["sg"], name="side_pool"),
            helper.make_node("Flatten", ["sg"], ["features"], name="side_flat"),
        ]
    )
    features = helper.make_tensor_value_info("features", onnx.TensorProto.FLOAT, ["N", 16])
    model.graph.output.append(features)
    onnx.save(model, path)
    return path


def test_sensitivity_reusing_unreached_nodes_equals_recomputing_them(tmp_path, monkeypatch):
    path = _branching_digits(tmp_path / "branch.onnx")
    float_graph = optimize(load_onnx(path, SHAPES)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    quantized = quantize_graph(float_graph, stats.ranges_for("uint8"), QuantConfig())
    batch = first_samples(DIGITS / "data/test.npz", specs, 8)[0]
    layers = ["conv1", "conv2", "side", "fc"]
    position = {n.name: i for i, n in enumerate(float_graph.nodes)}
    reached = sensitivity.downstream(float_graph, position["conv2"])
    assert position["side"] not in reached and position["fc"] in reached
    signal, noise = sensitivity.isolated_output_noise(float_graph, quantized, batch, layers)
    assert noise["side"]["logits"] == 0 < noise["side"]["features"]  # the branches apart
    assert noise["conv2"]["features"] == 0 < noise["conv2"]["logits"]
    everything_after = lambda graph, index: set(range(index + 1, len(graph.nodes)))  # noqa: E731
    monkeypatch.setattr(sensitivity, "downstream", everything_after)
    assert sensitivity.isolated_output_noise(float_graph, quantized, batch, layers) == (
        signal,
        noise,
    )
    assert np.isfinite(signal["logits"]) and signal["features"] > 0


@pytest.mark.parametrize("step", [0, 1])  # at the bound, and one past it (float64)
def test_integer_conv_on_float32_is_exact_up_to_its_bound(step):
    """QConv runs on float32 when |x - zp| * sum|w| of every output stays below 2^24: codes
    and weights at the extremes (255 and 127 over 518 taps: 16 775 430) give the exact
    integer result; one more tap goes past the bound, which the float64 path takes."""
    from onebuild.graph_ir.ops import quantized

    taps = 518 + step
    x = np.full((1, taps, 1, 1), 255, np.uint8)
    x[0, ::7] = 0  # codes at both ends of the range: x - zp is 255 or 0
    w = np.full((2, taps, 1, 1), 127, np.int8)
    w[1, ::3] = -127
    b = np.array([3, -5], np.int32)
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4, "group": 1}
    attrs |= {"x_zero_point": 0, "dtype": "int16", "y_zero_point": 0, "qmin": -32768}
    attrs |= {"qmax": 32767, "multiplier": [1 << 14] * 2, "shift": [24] * 2}  # y = acc / 1024
    exact = (x.astype(np.int64)[:, None] * w.astype(np.int64)[None]).sum(axis=2)[..., 0, 0]
    exact = exact + b
    centered = x.astype(np.int64)
    assert quantized._float32_exact(centered, w) == (step == 0)
    got = quantized.q_conv(attrs, x, w, b)[..., 0, 0]
    want = quantized.requantize(exact, 1 << 14, 24)
    assert np.array_equal(got, np.clip(want, -32768, 32767))
    assert abs(int(exact[0, 0])) > 1 << 23  # large enough that float32 rounding would show


def test_quantized_models_run_the_same_on_float32_and_float64(tmp_path, monkeypatch):
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.ops import quantized

    path = outlier_digits(tmp_path / "m.onnx")
    float_graph = optimize(load_onnx(path, SHAPES)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    test = first_samples(DIGITS / "data/test.npz", specs, 64)[0]
    ranges, means = stats.ranges_for("uint8"), stats.channel_means()
    graph = quantize_graph(float_graph, ranges, QuantConfig(), means)
    fast = Interpreter(graph).run_batch(test)
    taken = []
    monkeypatch.setattr(quantized, "FLOAT32_EXACT", 0)  # float64 everywhere
    slow = Interpreter(graph).run_batch(test)
    monkeypatch.undo()
    check = quantized._float32_exact
    monkeypatch.setattr(
        quantized, "_float32_exact", lambda *a: taken.append(check(*a)) or taken[-1]
    )
    Interpreter(graph).run_batch(test)
    assert any(taken)  # the float32 path did run
    assert all(np.array_equal(fast[k], slow[k]) for k in fast)


def test_demotion_keeps_each_largest_unit_that_still_meets_the_target():
    """From a set that holds, the largest units go back to the base type one at a time; a
    demotion that breaks the target is undone, and only as many as asked are tried."""
    names = "abcdefghij"
    units = {name: [name, f"{name}/pool"] for name in names}
    noisy = dict(zip(names, [5.0, 1.0, 1.0, 0.5, 0.5, 0.05, 0.2, 0.01, 0.0, 0.0]))
    probed = []

    def tried(chosen):
        probed.append(list(chosen))
        kept = {name for name in units if name not in chosen}
        return None, list(chosen), sum(noisy[name] for name in kept)

    start = [n for name in names for n in units[name]]
    best = (None, start, 0.0)
    met = lambda noise: noise <= 1.6  # noqa: E731
    _, chosen, noise = mixed_precision._demote(best, list(names), units, tried, met, 8)
    # a, c, e, g would exceed; b, d, f, h fit (1.56); i and j are past the 8 asked for
    assert [name for name in names if name not in chosen] == ["b", "d", "f", "h"]
    assert noise == 1.0 + 0.5 + 0.05 + 0.01
    assert len(probed) == 8
    assert "b/pool" not in chosen and "a/pool" in chosen and "i" in chosen  # units go whole


@pytest.mark.parametrize("start", [0.5, 1.5])
def test_close_to_the_target_demotion_ends_at_the_first_failure(start):
    """By default (a `margin`) a demotion that fails while the set holds by less than
    DEMOTE_MARGIN_DB ends the pass; with more margin the next units are still tried. Close
    to the target the largest unit may still go back (the PP-OCR recognizer's case)."""
    units = {name: [name] for name in "abcd"}
    noisy = dict(zip("abcd", [0.04, 1.2, 0.01, 0.01]))  # a fits even close to the target

    def tried(chosen):
        probed.append(list(chosen))
        return None, list(chosen), start + sum(noisy[n] for n in units if n not in chosen)

    def margin(noise):  # dB above the target of a noise power against the allowed 1.6
        return 10 * np.log10(1.6 / noise)

    met = lambda noise: noise <= 1.6  # noqa: E731
    probed = []
    best = (None, list(units), start)
    _, chosen, _ = mixed_precision._demote(best, list(units), units, tried, met, 4, margin)
    kept = [n for n in units if n not in chosen]
    if start == 1.5:  # 0.16 dB to spare: a goes back, b fails, c and d are not tried
        assert kept == ["a"] and len(probed) == 2
    else:  # 4.7 dB: b fails, c and d still go back (as without a margin)
        assert kept == ["a", "c", "d"] and len(probed) == 4


def test_a_probe_gives_up_only_when_the_target_is_out_of_reach(tmp_path):
    path = outlier_digits(tmp_path / "m.onnx")
    float_graph = optimize(load_onnx(path, SHAPES)).main
    specs = [(v.name, v.shape) for v in float_graph.inputs]
    stats = calibrate(float_graph, iter_batches(DIGITS / "data/calib.npz", specs))
    test = first_samples(DIGITS / "data/test.npz", specs, 40)
    candidate = quantize_graph(float_graph, stats.ranges_for("uint8"), QuantConfig())
    exact = compare_graphs(float_graph, candidate, [(str(i), b) for i, b in enumerate(test)])
    reached = exact.outputs["logits"]["sqnr_db"]
    shared = probes.Probes(float_graph, test)
    held = shared.compare(candidate, give_up_below=reached)  # met exactly: runs to the end
    assert held.complete and held.outputs == exact.outputs and held.samples == 40
    for target in (reached + 0.01, reached + 20):
        missed = shared.compare(candidate, give_up_below=target)
        assert not missed.complete and reached <= missed.outputs["logits"]["sqnr_db"] < target
    assert missed.samples < 40  # far out of reach: it stopped early


@pytest.mark.parametrize("trim_probes", [None, 0, 3])
def test_trim_probes_sets_how_many_units_are_tried_back(trim_probes, tmp_path, monkeypatch):
    """`trim_probes` (recipe `[quantize.mixed_precision]`) reaches the search: that many
    units tried back whatever the margin; by default REFINE_PROBES, until one fails with
    less than a 1 dB margin."""
    path = outlier_digits(tmp_path / "m.onnx")
    calls = []
    demote = mixed_precision._demote
    monkeypatch.setattr(mixed_precision, "_demote", lambda *a: calls.append(a[5:]) or demote(*a))
    model = optimize(load_onnx(path, SHAPES))
    specs = [(v.name, v.shape) for v in model.main.inputs]
    stats = calibrate(model.main, iter_batches(DIGITS / "data/calib.npz", specs))
    samples = first_samples(DIGITS / "data/calib.npz", specs, 16)
    mixed = MixedPrecisionOptions(target_sqnr_db=30, trim_probes=trim_probes)
    record = json.loads(
        quantize(model, QuantizeOptions(mixed_precision=mixed), stats, samples).metadata[
            "mixed_precision"
        ]
    )
    assert record["target_met"]
    if trim_probes is None:  # the default trim, which a failure close to the target ends
        ((count, margin),) = calls
        assert count == mixed_precision.REFINE_PROBES
        assert margin(_Worst(30.25)) == pytest.approx(0.25)
    else:  # that many, whatever the margin
        assert calls == ([(trim_probes, None)] if trim_probes else [])


class _Worst:
    """A comparison whose one output reaches `db`."""

    def __init__(self, db: float):
        self.outputs = {"y": {"sqnr_db": db}}


def test_trim_probes_is_a_recipe_key():
    section = QuantizeMixedPrecision(target_sqnr_db=30, trim_probes=8)
    assert options_from(MixedPrecisionOptions, section.model_dump()).trim_probes == 8
    with pytest.raises(ValueError):
        QuantizeMixedPrecision(target_sqnr_db=30, trim_probes=-1)
