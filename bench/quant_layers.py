"""Tensor by tensor: onebuild's quantization beside onnxruntime's quantize_static on one model.

For every tensor both quantized models hold under the same name: each quantizer's scale and
zero point, and the SQNR (dB) of its dequantized value against the float model's, errors
propagated (each quantized model runs on its own activations, as deployed). onnxruntime's values
are the outputs of the DequantizeLinear nodes of its QDQ model (exposed as outputs);
onebuild's are the integer reference interpreter's codes, dequantized. Settings as the like for
like entry of `quantize_vs_ort.py` (uint8, per-channel int8 weights, MinMax, no bias
correction). Prints JSON rows in graph order, then the worst rows of each. `--sample I` measures
the I-th evaluation sample alone (a total over several can be dominated by one); `--per-sample`
adds each evaluation sample's SQNR to every row (`ort_db_each`, `ob_db_each`).

    python bench/quant_layers.py layout_cdla [--samples 4] [--sample I] [--per-sample]
        [--options '{"method": "mse"}']
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from quantize_vs_ort import DIGITS, _onebuild, ort_quantize
from real_models import MODELS, fixed_proto, samples

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.quant.params import dequantize
from onebuild.npz import read_npz

DQ_SUFFIX = "_DequantizeLinear_Output"


class Noise:
    """Signal and noise energy summed over samples, and each sample's SQNR."""

    def __init__(self):
        self.signal = self.noise = 0.0
        self.each: list[float | None] = []

    def add(self, ref: np.ndarray, test: np.ndarray) -> None:
        ref = np.asarray(ref, np.float64).ravel()
        diff = ref - np.asarray(test, np.float64).ravel()
        signal, noise = float(ref @ ref), float(diff @ diff)
        self.signal += signal
        self.noise += noise
        self.each.append(round(sqnr_db(signal, noise), 2) if signal else None)

    @property
    def db(self) -> float:
        return round(sqnr_db(self.signal, self.noise), 2)


def _session(proto: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])


def _outputs(session: ort.InferenceSession, feeds: dict) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _expose(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    known = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    return copy


def _ort_params(proto: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    """tensor -> (scale, zero point) of each per-tensor QuantizeLinear of an activation in the
    QDQ model (a graph output's is named after its DequantizeLinear's output)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    outputs = {o.name for o in proto.graph.output}
    params = {}
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outputs:
            params[node.output[0]] = _scalar(inits, node)
        quantize = node.op_type == "QuantizeLinear" and node.input[1] in inits
        if quantize and inits[node.input[1]].size == 1 and node.input[0] not in inits:
            params[node.input[0]] = _scalar(inits, node)
    return params


def _scalar(inits: dict, node: onnx.NodeProto) -> tuple[float, int]:
    zp = inits[node.input[2]] if len(node.input) > 2 else np.zeros(1)
    return float(inits[node.input[1]].ravel()[0]), int(zp.ravel()[0])


def _model(name: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """The float model with its input dims fixed, calibration and evaluation samples."""
    if name == "digits":
        calib = read_npz(DIGITS / "data" / "calib.npz")["input"]
        return (
            onnx.load(DIGITS / "digits.onnx"),
            calib,
            read_npz(DIGITS / "data" / "test.npz")["input"],
        )
    spec = next(m for m in MODELS if m.name == name)
    return fixed_proto(spec), *samples(spec, 16)


def both_quantized(name: str, work: Path, **options) -> tuple:
    """Model `name` quantized by both tools in `work`: (float proto, calibration, evaluation
    samples, onnxruntime's QDQ proto, onebuild's float graph, onebuild's quantized graph)."""
    proto, calib, evaluation = _model(name)
    path = work / f"{name}.onnx"
    onnx.save(proto, path)
    ort_quantize(path, work / "qdq.onnx", proto.graph.input[0].name, calib)
    graph, quantized, _ = _onebuild(path, None, calib, work, **options)
    return proto, calib, evaluation, onnx.load(work / "qdq.onnx"), graph, quantized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=[m.name for m in MODELS] + ["digits"])
    parser.add_argument("--samples", type=int, default=4, help="evaluation samples (at most)")
    parser.add_argument("--sample", type=int, help="only this evaluation sample (its index)")
    parser.add_argument("--options", default='{"bias_correction": false}', help="onebuild's")
    parser.add_argument("--worst", type=int, default=15)
    parser.add_argument("--per-sample", action="store_true", help="each sample's SQNR too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        options = json.loads(args.options)
        proto, _, evaluation, qdq_proto, graph, quantized = both_quantized(
            args.model, Path(folder), **options
        )
    evaluation = evaluation[: args.samples]
    if args.sample is not None:
        evaluation = evaluation[args.sample : args.sample + 1]
    x = proto.graph.input[0].name
    ort_params = _ort_params(qdq_proto)
    float_names = [o for n in proto.graph.node for o in n.output]
    ours = {v.name[:-2]: v for n in quantized.nodes for v in n.outputs if v.name.endswith("_q")}
    names = [n for n in float_names if n in ort_params or n in ours]
    float_run = _session(_expose(proto, names))
    graph_outputs = {o.name for o in qdq_proto.graph.output}
    dq = {n: n if n in graph_outputs else n + DQ_SUFFIX for n in names if n in ort_params}
    ort_run = _session(_expose(qdq_proto, list(dq.values())))
    noise = {n: {"onnxruntime": Noise(), "onebuild": Noise()} for n in names}
    renamed = set()
    for sample in evaluation:
        want = _outputs(float_run, {x: sample})
        got = _outputs(ort_run, {x: sample})
        for n, name in dq.items():
            noise[n]["onnxruntime"].add(want[n], got[name])
        trace, ours_float = {}, {}

        def observe(value, array, trace=trace):
            if value.name.endswith("_q") and value.name[:-2] in noise and value.quant:
                trace[value.name[:-2]] = dequantize(array, value.quant)

        def observe_float(value, array, ours_float=ours_float):
            if value.name in noise:
                ours_float[value.name] = array

        Interpreter(quantized, observe).run({x: sample})
        Interpreter(graph, observe_float).run({x: sample})
        for n, array in trace.items():
            reference = ours_float.get(n)
            if reference is None or reference.shape != array.shape:
                continue
            noise[n]["onebuild"].add(reference, array)
            if want[n].shape != reference.shape or not np.allclose(
                want[n], reference, rtol=1e-3, atol=1e-3 * float(np.abs(want[n]).max())
            ):
                renamed.add(n)  # O1 changed what the name holds (a folded affine, say)
    producers = {o: n.op_type for n in proto.graph.node for o in n.output}
    rows = []
    for n in names:
        row = {"tensor": n, "op": producers[n]}
        if n in ort_params:
            row["ort_scale"], row["ort_zp"] = ort_params[n]
            row["ort_db"] = noise[n]["onnxruntime"].db
            if args.per_sample:
                row["ort_db_each"] = noise[n]["onnxruntime"].each
        if n in ours and ours[n].quant is not None and len(ours[n].quant.scale) == 1:
            row["ob_scale"], row["ob_zp"] = ours[n].quant.scale[0], ours[n].quant.zero_point[0]
            if noise[n]["onebuild"].signal:
                row["ob_db"] = noise[n]["onebuild"].db
                if args.per_sample:
                    row["ob_db_each"] = noise[n]["onebuild"].each
            if n in renamed:
                row["same_value"] = False
        rows.append(row)
    print(json.dumps(rows))
    both = [r for r in rows if "ort_db" in r and "ob_db" in r and "same_value" not in r]
    print(f"# {len(both)} tensors in both; largest drops of onebuild below onnxruntime:")
    for r in sorted(both, key=lambda r: r["ob_db"] - r["ort_db"])[: args.worst]:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
