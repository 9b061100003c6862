"""onebuild's quantizer beside Intel NNCF's and onnxruntime's on the four real trained models.
Prints JSON, one entry per model.

Every quantizer gets the same float ONNX file (`real_models.fixed_export`), the same calibration
samples and is measured on the same evaluation samples: the SQNR (dB) of all outputs together
against the float model run by onnxruntime (`sqnr_db`), of each output alone, of each sample
alone and their mean (`sqnr_db_sample_mean`), and the quantize time, file in -> quantized model
out. onebuild's variants run as in `quantize_vs_ort.py` (`onebuild_plain` like for like: uint8,
int8 per-channel weights, MinMax; `onebuild` its defaults; `BEST_8BIT` the best 8-bit variant
per model). The peers' QDQ models are run by onnxruntime. The exports are opset 11-13 with
weights in Constant nodes: below opset 13 both peers quantize weights per tensor (NNCF warns,
onnxruntime does not), and onnxruntime quantizes Constant weights as activations (uint8, per
tensor, at run time). So the peers also get the same model `prepared` (opset 13, weights and
biases as initializers), which gives both their int8 per-channel weights:

- `onnxruntime`: quantize_static on the file as it is (as `quantize_vs_ort.py` runs it; QDQ,
  uint8 activations, `per_channel`, MinMax); `onnxruntime_prepared` on the prepared file;
- `nncf_as_is`, `nncf`: NNCF's defaults on the file as it is and on the prepared file (preset
  PERFORMANCE: symmetric activations, uint8 where the calibrated range is non-negative, else
  int8; int8 per-channel weights; the mean over samples of each sample's min/max;
  FastBiasCorrection; graph outputs in float; the first convolution's weights in half the
  range, `OverflowFix.FIRST_LAYER`); every other NNCF row on the prepared file;
- `nncf_plain`: as like for like as NNCF allows: preset MIXED (asymmetric activations),
  min/max over all samples, no bias correction, graph outputs quantized, no overflow fix
  (`nncf_plain_float_out`: graph outputs in float; NNCF 3.4.0 cannot quantize the OCR
  detector's output, a Sigmoid's: `failed` records a failure);
- `nncf_bc`, `nncf_mixed_bc`, `nncf_tuned_bc`: full BiasCorrection (`fast_bias_correction=
  False`, NNCF's documented best PTQ setting for accuracy) with preset PERFORMANCE, MIXED
  (recommended for non-ReLU activations such as hard-swish), and MIXED with `nncf_plain`'s
  ranges and no overflow fix; `nncf_best` names the best NNCF row on the prepared file (full
  BiasCorrection fails on the OCR recognizer). `subset_size` is every calibration sample (at
  most 32 here; NNCF's default is 300).

Whatever the settings, NNCF quantizes where its CPU hardware model puts quantizers: the inputs
of convolutions and matrix products (a depthwise convolution's per channel) and of some
elementwise ops; BatchNormalization, hard-swish and other activations stay float between them.
`qdq` records what each QDQ model holds: activation quantizers by element type, zero point and
granularity, constants' quantizers, and the ops that compute on a float activation. With
`--jitter K` every row is also run K more times with every activation scale times 1 + 0.003 z
(`ort_variants`), as in `quantize_vs_ort.py`: `sqnr_db_jitter` (mean, sd, runs) is the
measurement's noise. NNCF's telemetry is off.

    OPENBLAS_NUM_THREADS=1 python bench/quantize_vs_nncf.py [--samples 32] [--models ...]
        [--variants onebuild_plain,nncf,...] [--jitter 2]
"""

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("NNCF_CI", "1")  # NNCF's usage telemetry off: a benchmark stays offline

import nncf
import numpy as np
import onnx
from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix
from nncf.quantization.range_estimator import RangeEstimatorParametersSet
from onnx import version_converter
from ort_variants import jitter_qdq
from quantize_vs_ort import (
    VARIANTS,
    _onebuild,
    _per_output,
    _per_sample,
    _run,
    _session,
    _session_run,
    _spread,
    _sqnr,
    ort_quantize,
)
from real_models import MODELS, fixed_export, samples

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # ops whose inputs 1.. are weights
ORT_KEYS = ("onnxruntime", "onnxruntime_prepared")
BEST_8BIT = {  # the best 8-bit onebuild variant per model (README, "Accuracy on real models")
    "layout_cdla": "onebuild_ebc_pcact",
    "ocr_cls": "onebuild_mse",
    "ocr_det": "onebuild_ebc_pcact",
    "ocr_rec": "onebuild_pcact",
}
LIKE_FOR_LIKE = AdvancedQuantizationParameters(
    overflow_fix=OverflowFix.DISABLE,
    quantize_outputs=True,
    disable_bias_correction=True,
    activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
)
NNCF_VARIANTS = {  # keyword arguments of nncf.quantize per result key
    "nncf_as_is": {},  # on the file as it is (opset below 13: per-tensor weights)
    "nncf": {},
    "nncf_plain": {"preset": nncf.QuantizationPreset.MIXED, "advanced_parameters": LIKE_FOR_LIKE},
    "nncf_plain_float_out": {  # the same with graph outputs in float (NNCF's default)
        "preset": nncf.QuantizationPreset.MIXED,
        "advanced_parameters": replace(LIKE_FOR_LIKE, quantize_outputs=False),
    },
    "nncf_bc": {"fast_bias_correction": False},
    "nncf_mixed_bc": {"preset": nncf.QuantizationPreset.MIXED, "fast_bias_correction": False},
    "nncf_tuned_bc": {  # MIXED, min/max over all samples, no overflow fix, full BiasCorrection
        "preset": nncf.QuantizationPreset.MIXED,
        "fast_bias_correction": False,
        "advanced_parameters": AdvancedQuantizationParameters(
            overflow_fix=OverflowFix.DISABLE,
            activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
        ),
    },
}


def nncf_quantize(path: Path, output: Path, x: str, calib: np.ndarray, **settings) -> None:
    """nncf.quantize on the ONNX file with every calibration sample, QDQ model saved to
    `output`; NNCF's log and progress bars go to stderr (stdout is the JSON)."""
    for handler in logging.getLogger("nncf").handlers:
        handler.setStream(sys.stderr)
    dataset = nncf.Dataset(list(calib), lambda sample: {x: sample})
    with contextlib.redirect_stdout(sys.stderr):
        quantized = nncf.quantize(onnx.load(path), dataset, subset_size=len(calib), **settings)
    onnx.save(quantized, output)


def prepared(path: Path) -> Path:
    """The same model in the form both peers need for per-channel int8 weights (saved beside
    it): opset 13 at least (DequantizeLinear's `axis`; below it NNCF warns and quantizes
    weights per tensor, onnxruntime silently) and weights as initializers (Paddle writes them
    as Constant nodes, which onnxruntime quantizes as activations: uint8, per tensor). Only
    weights and biases move: NNCF 3.4.0 fails on a Cast of an initializer."""
    proto = onnx.load(path)
    if next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) < 13:
        proto = version_converter.convert_version(proto, 13)
    weights = {i for n in proto.graph.node if n.op_type in WEIGHTED for i in n.input[1:]}
    kept = []
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.output[0] in weights:
            proto.graph.initializer.append(n.attribute[0].t)
            proto.graph.initializer[-1].name = n.output[0]
        else:
            kept.append(onnx.NodeProto.FromString(n.SerializeToString()))
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    output = path.with_suffix(".prepared.onnx")
    onnx.save(proto, output)
    return output


def qdq_summary(proto: onnx.ModelProto) -> dict:
    """What a QDQ model quantizes: activation quantizers by element type, zero point and
    granularity (NNCF quantizes depthwise convolutions' inputs per channel),
    constants' (weights, biases, operands such as hard-swish's 3 and 6) by element type and
    granularity; op types computing on a float activation (an input that is neither a constant
    nor a DequantizeLinear output: within a fused pattern, or left in float), with counts."""
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.attribute[0].name == "value":
            constants[n.output[0]] = onnx.numpy_helper.to_array(n.attribute[0].t)
    dequantized = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    activations, constants_q, float_ops = Counter(), Counter(), Counter()
    for n in proto.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale, stored = constants[n.input[1]], constants.get(n.input[0])
            zero = constants.get(n.input[2]) if len(n.input) > 2 else None
            # the element type: the zero point's, a stored quantized weight's, else uint8
            dequantize = n.op_type == "DequantizeLinear"
            typed = zero if zero is not None else stored if dequantize else None
            kind = "uint8" if typed is None else str(typed.dtype)
            if stored is not None:  # a constant: stored quantized, or quantized at run time
                granularity = "per channel" if scale.size > 1 else "per tensor"
                if n.op_type == "QuantizeLinear":
                    constants_q[f"{kind} {granularity}, quantized at run time"] += 1
                elif stored.dtype != np.float32:
                    constants_q[f"{kind} {granularity}"] += 1
            elif n.op_type == "QuantizeLinear":
                symmetric = "zero point 0" if zero is None or not zero.any() else "asymmetric"
                granularity = "per channel" if scale.size > 1 else "per tensor"
                activations[f"{kind} {symmetric} {granularity}"] += 1
        elif n.op_type != "Constant":
            live = [i for i in n.input if i and i not in constants]
            if any(i not in dequantized for i in live):
                float_ops[n.op_type] += 1
    return {
        "activation_quantizers": dict(activations),
        "constant_quantizers": dict(constants_q),
        "float_ops": dict(float_ops.most_common()),
    }


def measure(spec, count: int, work: Path, wanted: set[str], jitter: int) -> dict:
    """Every quantizer on one real model: SQNR (total, per output, per sample), seconds, the
    QDQ models' contents, and with `jitter` the spread over perturbed activation scales."""
    calib, evaluation = samples(spec, count)
    path = fixed_export(spec, work)
    float_session = _session(str(path))
    x = float_session.get_inputs()[0].name
    names = [o.name for o in float_session.get_outputs()]
    reference = _session_run(float_session, x, names, evaluation)
    upgraded = prepared(path)  # the same model; NNCF's and onnxruntime's per-channel weights
    keys = ["onebuild_plain", "onebuild", BEST_8BIT[spec.name], *ORT_KEYS, *NNCF_VARIANTS]
    keys = [k for k in dict.fromkeys(keys) if not wanted or k in wanted]
    outputs, seconds, qdq, protos, failed = {}, {}, {}, {}, {}
    for key in keys:
        start = time.perf_counter()
        if key in VARIANTS:
            _, quantized, spent = _onebuild(path, None, calib, work, **VARIANTS[key])
            outputs[key], seconds[key] = _run(quantized, x, names, evaluation), spent
            continue
        output = work / f"{spec.name}.{key}.onnx"
        source = path if key in ("onnxruntime", "nncf_as_is") else upgraded
        if key in ORT_KEYS:
            ort_quantize(source, output, x, calib)
        else:
            try:
                nncf_quantize(source, output, x, calib, **NNCF_VARIANTS[key])
            except Exception as error:  # NNCF's failure recorded; the other variants still run
                failed[key] = f"{type(error).__name__}: {error}"
                continue
        seconds[key] = time.perf_counter() - start
        protos[key] = onnx.load(output)
        qdq[key] = qdq_summary(protos[key])
        outputs[key] = _session_run(_session(str(output)), x, names, evaluation)
    per_sample = {k: _per_sample(reference, v) for k, v in outputs.items()}
    sqnr = {k: _sqnr(reference, v) for k, v in outputs.items()}
    tried = [k for k in NNCF_VARIANTS if k in sqnr and k != "nncf_as_is"]
    result = {
        "model": spec.name,
        "description": spec.description,
        "calibration_samples": len(calib),
        "evaluation_samples": len(evaluation),
        "best_8bit": BEST_8BIT[spec.name],
        "nncf_best": max(tried, key=lambda k: sqnr[k]) if tried else None,
        "sqnr_db": sqnr,
        "sqnr_db_sample_mean": {k: round(float(np.mean(v)), 2) for k, v in per_sample.items()},
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "sqnr_db_per_output": {k: _per_output(names, reference, v) for k, v in outputs.items()},
        "sqnr_db_per_sample": per_sample,
        "qdq": qdq,
        "failed": failed,
    }
    if jitter:
        runs = {k: [v] for k, v in sqnr.items()}
        sample_runs = {k: [result["sqnr_db_sample_mean"][k]] for k in runs}
        for seed in range(1, jitter + 1):
            for key in runs:
                if key in VARIANTS:
                    settings = VARIANTS[key]
                    _, quantized, _ = _onebuild(path, None, calib, work, jitter=seed, **settings)
                    out = _run(quantized, x, names, evaluation)
                else:
                    session = _session(jitter_qdq(protos[key], seed).SerializeToString())
                    out = _session_run(session, x, names, evaluation)
                runs[key].append(_sqnr(reference, out))
                sample_runs[key].append(round(float(np.mean(_per_sample(reference, out))), 2))
        result["sqnr_db_jitter"] = _spread(runs)
        result["sqnr_db_sample_mean_jitter"] = _spread(sample_runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32, help="samples per set (at most)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--variants", default="", help="result keys to run (default: all)")
    parser.add_argument("--jitter", type=int, default=0, help="perturbed runs (noise estimate)")
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    variants = {v for v in args.variants.split(",") if v}
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for spec in MODELS:
            if not wanted or spec.name in wanted:
                results.append(measure(spec, args.samples, Path(folder), variants, args.jitter))
    print(json.dumps({"nncf": nncf.__version__, "models": results}, indent=2))


if __name__ == "__main__":
    main()
