"""How far the interpolated int16 per-channel tables (QLookupInterp, 513 knots per channel) are
from the float function on the real models' ranges. Prints JSON, one entry per model.

Each model is calibrated on the bench's calibration images and quantized to int16 with
`activation_granularity = "channel"`; for every QLookupInterp and every channel, each input code
within that channel's calibrated range is run through the table and compared with the float
function rounded at that code (`kernel_attrs.function_codes`, the 65536-entry table's value), in
output codes (LSBs): the largest difference, the 99.9th percentile, the mean and the share of
codes that agree exactly; with the largest difference as a share of the channel's calibrated
output range.

    python bench/int16_tables.py [--samples 4] [--models layout_cdla,...]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from mixed_precision import _fixed
from real_models import MODELS, samples

from onebuild.compile import QuantizeOptions, optimize, quantize
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.channel_activations import depthwise_edges
from onebuild.graph_ir.quant.kernel_attrs import function_codes
from onebuild.graph_ir.quant.params import channel_of, dequantize
from onebuild.graph_ir.serde import load_onnx

CODES = np.arange(-32768, 32768).astype(np.int16)


def measure(spec, count: int, work: Path) -> dict:
    path = _fixed(spec, work)
    calib, _ = samples(spec, count)
    float_graph = optimize(load_onnx(path)).main
    stats = calibrate(float_graph, [("calibration", {float_graph.inputs[0].name: calib})])
    options = QuantizeOptions(dtype="int16", activation_granularity="channel")
    quantized = quantize(optimize(load_onnx(path)), options, stats).main
    tables = {n.name: n for n in quantized.nodes if n.op == "QLookupInterp"}
    differences, relative = [], []
    for edge in depthwise_edges(float_graph):
        node = tables.get(edge.table.name) if edge.table else None
        if node is None:
            continue
        channels = node.inputs[1].shape[0]
        every = np.repeat(CODES[None, None, :, None], channels, axis=1)
        (got,) = OPS["QLookupInterp"].kernel({}, every, node.inputs[1].numpy())
        lo, hi = stats.channel_ranges[edge.values[0].name]
        out_lo, out_hi = stats.channel_ranges[edge.values[-1].name]
        for c in range(channels):
            x, y = channel_of(node.inputs[0].quant, c), channel_of(node.output.quant, c)
            real = dequantize(CODES, x)
            exact = function_codes(edge.table, real, y, "int16", edge.affine)
            inside = (real >= min(lo[c], 0)) & (real <= max(hi[c], 0))
            diff = np.abs(got[0, c, :, 0].astype(np.int64) - exact)[inside]
            differences.append(diff)
            span = (max(out_hi[c], 0) - min(out_lo[c], 0)) / y.scale[0]
            relative.append(diff.max() / span if span > 0 else 0.0)
    every = np.concatenate(differences)
    return {
        "model": spec.name,
        "tables": len(tables),
        "channels": len(relative),
        "codes_compared": int(every.size),
        "max_lsb": int(every.max()),
        "p99_9_lsb": float(np.percentile(every, 99.9)),
        "mean_lsb": round(float(every.mean()), 4),
        "exact_share": round(float(np.mean(every == 0)), 4),
        "within_1_lsb_share": round(float(np.mean(every <= 1)), 5),
        "max_share_of_output_range": round(float(max(relative)), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="calibration samples")
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    wanted = {m for m in args.models.split(",") if m}
    with tempfile.TemporaryDirectory() as folder:
        for spec in MODELS:
            if not wanted or spec.name in wanted:
                print(json.dumps(measure(spec, args.samples, Path(folder))), flush=True)


if __name__ == "__main__":
    main()
