"""Where `promote_outputs` loses on held-out images: clipping at the int16 outputs of uint8
layers, or at their uint8 inputs? Prints JSON for one real model (`real_models.py`).

Runs the search (`--promote-outputs`, 30 dB on the calibration images), then, with the chosen
set fixed: each int16 output of a uint8 layer's largest held-out value over its (headroom-
widened) range; the float model with only the clipping of the uint8 layers' per-tensor uint8
inputs (nothing rounded), SQNR on both sets, and on the calibration images with each sample's
bounds the other samples' range (those inputs together, and each alone: what the search could
see); and the quantized model rebuilt with those two groups' ranges widened by `--widen`, in
that type only (the int16 outputs' uint8 copies and the uint8 inputs' int16 homes keep theirs).

    OPENBLAS_NUM_THREADS=1 python bench/promoted_clipping.py [--model layout_cdla]
        [--widen 1.25,1.5,2]

Not the OCR detector yet: its set names the layers `quantize` splits out of pixel shuffles
(`split_pixel_shuffles`), which this rebuild does not do.
"""

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from mixed_precision import _calibrated, _worst_db
from real_models import MODELS, fixed_export, samples

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, equalize, optimize, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.quant.config import LayerOverride
from onebuild.graph_ir.quant.quantize_graph import _Quantizer, quantize_graph
from onebuild.graph_ir.serde import load_onnx

MATMULS = ("QConv", "QGemm", "QMatMul")


def _chosen(config, record):
    """`config` with the search's choice as explicit overrides (edges unfolded, as it does)."""
    layers = [LayerOverride(tuple(record["promoted"]), "int16")]
    for key, dtype in (("promoted_outputs", "int16"), ("demoted_outputs", "uint8")):
        if record.get(key):
            layers.append(LayerOverride(tuple(record[key]), output_dtype=dtype))
    return replace(config, fold_scales=False, layers=tuple(layers))


def _trace(graph, batch) -> dict[str, np.ndarray]:
    values = {}
    Interpreter(graph, observer=lambda v, a: values.__setitem__(v.name, a)).run_batch(batch)
    return values


def _code_range(params, dtype_range) -> tuple[float, float]:
    (scale,), (zero_point,) = params.scale, params.zero_point
    return (dtype_range[0] - zero_point) * scale, (dtype_range[1] - zero_point) * scale


def _clipped_run(graph, bounds, batch) -> dict[str, np.ndarray]:
    """The float graph's outputs with each reader's first input clipped to `bounds[reader]`."""

    def clipping(node):
        kernel, (lo, hi) = OPS[node.op].kernel, bounds[node.name]
        return lambda attrs, x, *rest: kernel(attrs, np.clip(x, lo, hi).astype(x.dtype), *rest)

    kernels = {n.name: clipping(n) for n in graph.nodes if n.name in bounds}
    return Interpreter(graph, kernels=kernels).run_batch(batch)


def _clipping_only_db(graph, bounds, batch) -> float:
    """Worst output SQNR of the float graph with each reader's input 0 clipped to `bounds`."""
    want = Interpreter(graph).run_batch(batch)
    got = _clipped_run(graph, bounds, batch)
    ratios = []
    for name, reference in want.items():
        reference = reference.astype(np.float64)
        noise = np.sum((reference - got[name]) ** 2)
        ratios.append(np.sum(reference**2) / max(noise, 1e-300))
    return round(float(10 * np.log10(min(ratios))), 2)


def _leave_one_out_db(graph, inputs: dict[str, str], batch) -> float:
    """`_clipping_only_db` with each sample's bounds the range the other samples reach (what
    calibration without it would have allowed), for the readers of `inputs` (reader -> input)."""
    x = next(iter(batch))
    count = len(batch[x])
    one = [{name: array[i : i + 1] for name, array in batch.items()} for i in range(count)]
    traces = [_trace(graph, sample) for sample in one]
    lows = {v: np.array([min(t[v].min(), 0.0) for t in traces]) for v in inputs.values()}
    highs = {v: np.array([max(t[v].max(), 0.0) for t in traces]) for v in inputs.values()}
    want, noise = Interpreter(graph).run_batch(batch), {}
    for i in range(count):
        others = np.arange(count) != i
        bounds = {r: (lows[v][others].min(), highs[v][others].max()) for r, v in inputs.items()}
        got = _clipped_run(graph, bounds, one[i])
        for name, reference in want.items():
            error = np.sum((reference[i : i + 1].astype(np.float64) - got[name]) ** 2)
            noise[name] = noise.get(name, 0.0) + error
    ratios = [np.sum(want[o].astype(np.float64) ** 2) / max(n, 1e-300) for o, n in noise.items()]
    return round(float(10 * np.log10(min(ratios))), 2)


def measure(spec, widen: list[float], work: Path) -> dict:
    options = {"activation_granularity": "channel"} if spec.name == "layout_cdla" else {}
    path = fixed_export(spec, work)
    calib, held = samples(spec, 16)
    graph = equalize(optimize(load_onnx(path)).main, QuantizeOptions(**options))
    x = graph.inputs[0].name
    sets = {"calibration": {x: calib}, "held_out": {x: held}}
    stats = _calibrated(path, sets["calibration"], options)
    mixed = MixedPrecisionOptions(target_sqnr_db=30, promote_outputs=True)
    settings = QuantizeOptions(mixed_precision=mixed, **options)
    model = quantize(optimize(load_onnx(path)), settings, stats, [sets["calibration"]])
    record = json.loads(model.metadata["mixed_precision"])
    config = _chosen(QuantizeOptions(**options).quant_config(), record)
    ranges = stats.ranges_for("uint8")

    def build(widened: dict[str, float], dtype: str | None = None):
        """The chosen set with the `widened` values' ranges scaled, in `dtype` only if given."""
        original = _Quantizer.params

        def params(quantizer, value, kind):
            factor = widened.get(value.name, 1.0) if dtype in (None, kind) else 1.0
            if factor == 1.0 or value.is_const or (id(value), kind) in quantizer.param_cache:
                return original(quantizer, value, kind)
            saved = quantizer.ranges
            lo, hi = saved[value.name]
            quantizer.ranges = {**saved, value.name: (lo * factor, hi * factor)}
            try:
                return original(quantizer, value, kind)
            finally:
                quantizer.ranges = saved

        _Quantizer.params = params  # the bench's own process: restored below
        try:
            return quantize_graph(
                graph, ranges, config, stats.channel_means(), channel_ranges=stats.channel_ranges
            )
        finally:
            _Quantizer.params = original

    quantized = build({})
    nodes = {n.name: n for n in graph.nodes}
    held_values = _trace(graph, sets["held_out"])
    peaks = {}  # int16 outputs of uint8 layers, per tensor: held-out peak / code range
    for node in quantized.nodes:
        if node.name in record.get("promoted_outputs", []) and node.outputs[0].quant.axis is None:
            lo, hi = _code_range(node.outputs[0].quant, (-32767, 32767))
            values = held_values[nodes[node.name].outputs[0].name]
            peaks[node.name] = round(float(max(values.max() / hi, values.min() / lo)), 2)
    readers = [n for n in quantized.nodes if n.op in MATMULS and str(n.inputs[0].dtype) == "uint8"]
    bounds = {
        n.name: _code_range(n.inputs[0].quant, (0, 255))
        for n in readers
        if n.inputs[0].quant.axis is None and n.inputs[0].producer is not None
    }
    outputs = [nodes[n].outputs[0].name for n in record.get("promoted_outputs", [])]
    reads = {n: nodes[n].inputs[0].name for n in bounds}
    inputs = list(reads.values())
    rebuilt = {}
    groups = (
        ("int16 outputs of uint8 layers", outputs, "int16"),
        ("uint8 inputs", inputs, "uint8"),
    )
    for label, names, dtype in groups:
        for factor in widen:
            q = build(dict.fromkeys(names, factor), dtype)
            rebuilt[f"{label} x{factor}"] = [_worst_db(graph, q, b) for b in sets.values()]
    return {
        "model": spec.name,
        "high_precision_mac_fraction": round(record["high_precision_mac_fraction"], 4),
        "sqnr_db": [_worst_db(graph, quantized, b) for b in sets.values()],
        "int16_output_peak_over_range_held_out": peaks,
        "clipping_only_uint8_inputs_db": {
            label: _clipping_only_db(graph, bounds, b) for label, b in sets.items()
        },
        "leave_one_out_clipping_db_calibration": {
            "all": _leave_one_out_db(graph, reads, sets["calibration"]),
            **{r: _leave_one_out_db(graph, {r: v}, sets["calibration"]) for r, v in reads.items()},
        },
        "widened_sqnr_db_calibration_held_out": rebuilt,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="layout_cdla")
    parser.add_argument("--widen", default="1.25,1.5,2", help="range factors, comma-separated")
    args = parser.parse_args()
    spec = next(m for m in MODELS if m.name == args.model)
    with tempfile.TemporaryDirectory() as folder:
        entry = measure(spec, [float(f) for f in args.widen.split(",")], Path(folder))
    print(json.dumps(entry, indent=2))


if __name__ == "__main__":
    main()
