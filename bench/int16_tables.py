"""How far the interpolated int16 per-channel tables (QLookupInterp: 513 knots per channel, a
bend per segment, exact segments where those interpolate more than 1 LSB off) are from the float
function on the real models' ranges. Prints JSON, one entry per model.

Each model is calibrated on the bench's calibration images and quantized to int16 with
`activation_granularity = "channel"`; for every QLookupInterp and every channel, each input code
within that channel's calibrated range is run through the table and compared with the float
function rounded at that code (`kernel_attrs.function_codes`, the 65536-entry table's value), in
output codes (LSBs): the largest difference, the RMS, the 99.9th percentile, the mean and the
share of codes that agree exactly; with the largest difference as a share of int16's half range
(32767 codes: the calibrated output range is a half to a third of it, the headroom). The
same for the knots and bends without exact segments (`no_exact`) and for the knots alone
(`knots_only`, the table before bends and exact segments, TFLite's form), per function (the
table's op and the scalar ops it absorbs) and over all, and the exact segments' count and
bytes. With `--qdq`: every per-channel layer (QConv with per-channel input or output,
QLookupInterp) exported alone as QDQ ONNX and run in onnxruntime on the integer reference's own
inputs (the first calibration image; onnxruntime's graph optimizations off): per op, the
layers, the largest code difference and how many layers are within 1 code.

    python bench/int16_tables.py [--samples 4] [--models layout_cdla,...] [--qdq]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from qdq_layers import ort_code_differences
from real_models import MODELS, fixed_export, samples

from onebuild.compile import QuantizeOptions, optimize, quantize
from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.channel_activations import depthwise_edges
from onebuild.graph_ir.quant.interpolated_table import EXACT_SEGMENTS
from onebuild.graph_ir.quant.kernel_attrs import function_codes
from onebuild.graph_ir.quant.params import channel_of, dequantize
from onebuild.graph_ir.serde import load_onnx

CODES = np.arange(-32768, 32768).astype(np.int16)


def qdq_differences(quantized: Graph, feeds: dict) -> dict:
    """Per-channel layers alone in onnxruntime against the integer reference, in codes."""

    def kind(node) -> str | None:
        values = [v for v in (*node.inputs, *node.outputs) if v is not None and not v.is_const]
        per_channel = any(v.quant is not None and v.quant.axis is not None for v in values)
        return f"qdq_{node.op}" if node.op in ("QConv", "QLookupInterp") and per_channel else None

    # onnxruntime's graph optimizations put int16 DQ -> Conv -> Q on a kernel that differs by
    # thousands of codes (per tensor too: the OCR detector's first conv): measured without
    return ort_code_differences(quantized, feeds, kind, optimized=False)


def _summary(differences: list[np.ndarray]) -> dict:
    every = np.concatenate(differences)
    return {
        "codes_compared": int(every.size),
        "max_lsb": int(every.max()),
        "rms_lsb": round(float(np.sqrt(np.mean(np.square(every, dtype=np.float64)))), 4),
        "p99_9_lsb": float(np.percentile(every, 99.9)),
        "mean_lsb": round(float(every.mean()), 4),
        "exact_share": round(float(np.mean(every == 0)), 4),
        "within_1_lsb_share": round(float(np.mean(every <= 1)), 5),
        "max_share_of_int16_range": round(float(every.max() / np.iinfo(np.int16).max), 5),
    }


def measure(spec, count: int, work: Path, qdq: bool = False) -> dict:
    path = fixed_export(spec, work)
    calib, _ = samples(spec, count)
    float_graph = optimize(load_onnx(path)).main
    stats = calibrate(float_graph, [("calibration", {float_graph.inputs[0].name: calib})])
    options = QuantizeOptions(dtype="int16", activation_granularity="channel")
    quantized = quantize(optimize(load_onnx(path)), options, stats).main
    tables = {n.name: n for n in quantized.nodes if n.op == "QLookupInterp"}
    found: dict[str, dict[str, list]] = {}  # function -> table form -> differences
    segments, exact_bytes = [], 0
    for edge in depthwise_edges(float_graph):
        node = tables.get(edge.table.name) if edge.table else None
        if node is None:
            continue
        function = "+".join([edge.table.op, *(n.op for n in edge.affine)])
        channels = node.inputs[1].shape[0]
        every = np.repeat(CODES[None, None, :, None], channels, axis=1)
        constants = [v.numpy() for v in node.inputs[1:]]
        forms = {"table": constants, "no_exact": constants[:2], "knots_only": constants[:1]}
        got = {k: OPS["QLookupInterp"].kernel({}, every, *v)[0] for k, v in forms.items()}
        if len(constants) > 2:
            segments.append((constants[2] >= 0).sum(axis=1))
            exact_bytes += constants[2].nbytes + constants[3].nbytes
        lo, hi = stats.channel_ranges[edge.values[0].name]
        for c in range(channels):
            x, y = channel_of(node.inputs[0].quant, c), channel_of(node.output.quant, c)
            real = dequantize(CODES, x)
            exact = function_codes(edge.table, real, y, "int16", edge.affine)
            inside = (real >= min(lo[c], 0)) & (real <= max(hi[c], 0))
            for form, codes in got.items():
                diff = np.abs(codes[0, c, :, 0].astype(np.int64) - exact)[inside]
                found.setdefault(function, {}).setdefault(form, []).append(diff)
    listed = np.concatenate(segments) if segments else np.zeros(1, np.int64)
    channels = sum(len(v["table"]) for v in found.values())
    extra = qdq_differences(quantized, {float_graph.inputs[0].name: calib[:1]}) if qdq else {}
    forms = ("table", "no_exact", "knots_only")
    return {
        **extra,
        "model": spec.name,
        "tables": len(tables),
        "channels": channels,
        **{form: _summary([d for v in found.values() for d in v[form]]) for form in forms},
        "per_function": {
            f: {form: _summary(v[form]) for form in forms} for f, v in sorted(found.items())
        },
        "exact_segments_per_channel": {
            "mean": round(float(listed.mean()), 2),
            "max": int(listed.max()),
            "channels_capped": int((listed >= EXACT_SEGMENTS).sum()),
        },
        "exact_segment_bytes_per_channel": round(exact_bytes / max(channels, 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="calibration samples")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument("--qdq", action="store_true", help="per-channel layers in onnxruntime")
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    with tempfile.TemporaryDirectory() as folder:
        for spec in MODELS:
            if not wanted or spec.name in wanted:
                entry = measure(spec, args.samples, Path(folder), args.qdq)
                print(json.dumps(entry), flush=True)


if __name__ == "__main__":
    main()
