"""Automatic mixed precision on the real trained models of `real_models.py`. Prints JSON, one
entry per model.

Per model: uint8 (onebuild defaults) and int16 SQNR on the calibration and the held-out images;
the mixed-precision search (`target_sqnr_db`, int16 promotion) run on the calibration images, as
a build without `[quantize.accuracy]` does: promoted MAC fraction, SQNR reached on them and on
the held-out images, the probes; the time from ONNX file to quantized model (import, O1,
calibration, search) next to onnxruntime's quantize_static on the same file and samples, wall
and CPU (on a shared machine the CPU time is the steadier figure). With `--layers`: the output
SQNR with each layer alone quantized (`quant.sensitivity`, its leave-one-out clipping included)
on both image sets, and the held-out clipping table (share of each tensor's values outside its
calibrated range, and the largest overshoot as a share of that range). SQNR is the worst
output's.

    python bench/mixed_precision.py [--samples 16] [--models ocr_cls,...] [--target 30] [--layers]
        [--options '{"activation_granularity": "channel"}'] [--method mse] [--trim-probes 8]
        [--runs 3] [--promote-outputs]

`--options` are QuantizeOptions (`bias_correction = "empirical"` fits on the calibration
images, in every probe of the search too); `--method` the calibration method.

With `--runs N` both tools are timed N times, alternating, and the ratios of each pair are
reported as median and range (on a loaded machine a single ratio moves by 30 % or more).

On a machine shared with other jobs, run it with OPENBLAS_NUM_THREADS=1: multi-threaded BLAS
spins there (up to 10x slower on small products) and its summation order moves the float
reference by an ulp, which can change the promoted set.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from quantize_vs_ort import ort_quantize
from real_models import MODELS, fixed_export, samples

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, equalize, optimize, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.macs import graph_macs, macs
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.evaluate import compare_graphs
from onebuild.graph_ir.quant.mixed_precision import layer_units
from onebuild.graph_ir.quant.sensitivity import isolated_output_noise
from onebuild.graph_ir.serde import load_onnx

TOP = 12


def _worst_db(float_graph, quantized, batch) -> float:
    comparison = compare_graphs(float_graph, quantized, [("samples", batch)])
    return round(min(o["sqnr_db"] for o in comparison.outputs.values()), 2)


def _probe_db(step: dict) -> float | str:
    if "sqnr_db" in step:
        return round(step["sqnr_db"], 2)
    return f"< {step['sqnr_db_at_most']:.2f} ({step['samples']} samples)"


def _mixed(path: Path, batch, target: float, options: dict, method: str, trims=None, outputs=False):
    """File in -> mixed-precision model out, as the build's steps do: (model, (wall, CPU
    seconds))."""
    start, cpu = time.perf_counter(), time.process_time()
    model = optimize(load_onnx(path))
    stats = _calibrated(path, batch, options, method)
    mixed = MixedPrecisionOptions(target_sqnr_db=target, trim_probes=trims, promote_outputs=outputs)
    model = quantize(model, QuantizeOptions(mixed_precision=mixed, **options), stats, [batch])
    return model, (time.perf_counter() - start, time.process_time() - cpu)


def _calibrated(path: Path, batch, options: dict, method: str = "minmax"):
    """Calibration statistics as the build's calibrate step gathers them: on the graph
    equalized when `options` ask for it."""
    graph = equalize(optimize(load_onnx(path)).main, QuantizeOptions(**options))
    return calibrate(graph, [("calibration", batch)], method)


def _ort_seconds(path: Path, x: str, calib: np.ndarray, work: Path) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    ort_quantize(path, work / f"{path.stem}.qdq.onnx", x, calib)
    return time.perf_counter() - start, time.process_time() - cpu


def _layers(float_graph, uint8, calib_batch, held_out, stats) -> dict:
    """Each layer's output SQNR alone on both sets (worst first on held-out) and clipping."""
    units = layer_units(float_graph, uint8)
    total = max(graph_macs(float_graph), 1)
    nodes = {n.name: n for n in float_graph.nodes}
    alone = {}
    for label, batch in (("calibration", calib_batch), ("held_out", held_out)):
        signal, noise = isolated_output_noise(float_graph, uint8, batch, list(units))
        alone[label] = {
            layer: min(10 * np.log10(signal[o] / max(noise[layer][o], 1e-300)) for o in signal)
            for layer in units
        }
    worst = sorted(units, key=lambda n: alone["held_out"][n])[:TOP]
    ranges = stats.ranges_for("uint8")
    clipped = {}

    def observe(value, array) -> None:
        if value.name in ranges:
            lo, hi = min(ranges[value.name][0], 0.0), max(ranges[value.name][1], 0.0)
            outside = float(((array < lo) | (array > hi)).mean())
            over = max(float(array.max()) - hi, lo - float(array.min()), 0.0)
            if outside:
                clipped[value.name] = (outside, over / (hi - lo) if hi > lo else 0.0)

    Interpreter(float_graph, observer=observe).run_batch(held_out)
    return {
        "sqnr_db_alone": [
            {
                "layer": n,
                "op": nodes[n].op,
                "mac_fraction": round(macs(nodes[n]) / total, 4),
                "calibration": round(alone["calibration"][n], 1),
                "held_out": round(alone["held_out"][n], 1),
            }
            for n in worst
        ],
        "predicted_uint8_db": {  # the isolated noises summed
            label: round(-10 * np.log10(sum(10 ** (-db / 10) for db in values.values())), 2)
            for label, values in alone.items()
        },
        "tensors_clipped_held_out": f"{len(clipped)} of {len(ranges)}",
        "clipping": [
            {"tensor": k, "outside": round(v[0], 4), "overshoot": round(v[1], 3)}
            for k, v in sorted(clipped.items(), key=lambda kv: -kv[1][0])[:TOP]
        ],
    }


def _timed_runs(path, x, calib, target, options, work, runs, method, trims=None, outputs=False):
    """The mixed-precision model and `runs` timings of onebuild and onnxruntime, alternating
    (each pair under the same load): {"onebuild": [(wall, CPU), ...], "onnxruntime": [...]}."""
    times: dict[str, list] = {"onebuild": [], "onnxruntime": []}
    for _ in range(runs):
        model, seconds = _mixed(path, {x: calib}, target, options, method, trims, outputs)
        times["onebuild"].append(seconds)
        times["onnxruntime"].append(_ort_seconds(path, x, calib, work))
    return model, times


def _ratios(times: dict, index: int) -> dict:
    """Median and range over the runs of onebuild's time / onnxruntime's in the same pair."""
    pairs = zip(times["onebuild"], times["onnxruntime"])
    ratios = sorted(ours[index] / theirs[index] for ours, theirs in pairs)
    spread = [round(ratios[0], 2), round(ratios[-1], 2)]
    return {"median": round(float(np.median(ratios)), 2), "range": spread}


def measure(
    spec,
    count: int,
    target: float,
    layers: bool,
    work: Path,
    options: dict,
    runs: int = 1,
    method: str = "minmax",
    trims: int | None = None,
    outputs: bool = False,
) -> dict:
    path = fixed_export(spec, work)
    calib, held_out = samples(spec, count)
    float_graph = optimize(load_onnx(path)).main
    x = float_graph.inputs[0].name
    calib_batch, held_batch = {x: calib}, {x: held_out}
    stats = _calibrated(path, calib_batch, options, method)
    entry = {
        "model": spec.name,
        "calibration_samples": len(calib),
        "held_out_samples": len(held_out),
    }
    plain = {}
    for dtype in ("uint8", "int16"):
        settings = QuantizeOptions(dtype=dtype, **options)
        quantized = quantize(optimize(load_onnx(path)), settings, stats, [calib_batch]).main
        plain[dtype] = quantized
        entry[f"{dtype}_sqnr_db"] = {
            "calibration": _worst_db(float_graph, quantized, calib_batch),
            "held_out": _worst_db(float_graph, quantized, held_batch),
        }
    model, times = _timed_runs(path, x, calib, target, options, work, runs, method, trims, outputs)
    record = json.loads(model.metadata["mixed_precision"])
    seconds, ort_seconds = times["onebuild"][-1], times["onnxruntime"][-1]
    entry["mixed_precision"] = {
        "target_sqnr_db": target,
        "high_precision_mac_fraction": round(record["high_precision_mac_fraction"], 4),
        "promoted_layers": len(record["promoted"]),
        "promoted_outputs": len(record.get("promoted_outputs", [])),
        "sqnr_db_calibration": round(record["sqnr_db"], 2),
        "sqnr_db_held_out": _worst_db(float_graph, model.main, held_batch),
        "probes": [  # a probe stopped once it could not reach the target: "< its bound"
            [s["promoted"], round(s["high_precision_mac_fraction"], 3), _probe_db(s)]
            for s in record["steps"]
        ],
        "kept_low": [  # the base-type units with the most noise alone, and their MACs
            [k["node"], round(k["sqnr_db_alone"], 1), round(k["mac_fraction"], 4)]
            for k in record.get("kept_low", [])
        ],
        "seconds": round(seconds[0], 1),
        "onnxruntime_seconds": round(ort_seconds[0], 1),
        "time_ratio": round(seconds[0] / ort_seconds[0], 1),
        "cpu_seconds": round(seconds[1], 1),  # all threads (onnxruntime uses several)
        "onnxruntime_cpu_seconds": round(ort_seconds[1], 1),
        "cpu_time_ratio": round(seconds[1] / ort_seconds[1], 1),
        "runs": runs,  # the figures above are the last run's; the ratios over all runs:
        "time_ratios": _ratios(times, 0),
        "cpu_time_ratios": _ratios(times, 1),
        "seconds_all": [[round(t, 1) for t in pair] for pair in times["onebuild"]],
        "onnxruntime_seconds_all": [[round(t, 1) for t in pair] for pair in times["onnxruntime"]],
    }
    if layers:
        entry["layers"] = _layers(float_graph, plain["uint8"], calib_batch, held_batch, stats)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16, help="samples per set (at most)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--target", type=float, default=30.0, help="target_sqnr_db")
    parser.add_argument("--layers", action="store_true", help="per-layer and clipping tables")
    parser.add_argument("--method", default="minmax", help="calibration method")
    parser.add_argument("--trim-probes", type=int, default=None, help="mixed precision's")
    parser.add_argument("--runs", type=int, default=1, help="timed runs of both tools, alternating")
    parser.add_argument(
        "--promote-outputs", action="store_true", help="activation-only promotion allowed"
    )
    parser.add_argument("--options", default="{}", help='QuantizeOptions as JSON, e.g. '
                        '\'{"activation_granularity": "channel"}\'')  # fmt: skip
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for spec in MODELS:
            if not wanted or spec.name in wanted:
                options = json.loads(args.options)
                folder_path = Path(folder)
                entry = measure(
                    spec,
                    args.samples,
                    args.target,
                    args.layers,
                    folder_path,
                    options,
                    args.runs,
                    args.method,
                    args.trim_probes,
                    args.promote_outputs,
                )
                results.append(entry)
                print(json.dumps(entry), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
