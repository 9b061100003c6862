"""Which layers decide onebuild's like-for-like SQNR beside onnxruntime's on one sample.

Both quantizers as `quant_layers.py` runs them (uint8, per-channel int8 weights, MinMax, no bias
correction). The tensors both quantized models hold with the same scale and zero point
("comparable": on the layout detector every hard-swish output, Concat, Resize, the heads) are
numbered in graph order.

- splice (default): onnxruntime's codes (its DequantizeLinear outputs, requantized with the
  shared parameters: exact) are written into onebuild's integer run at comparable tensors 1..k;
  everything after them is onebuild's. The outputs' SQNR against float (all outputs, and
  output `--output`) as k grows from 0 (onebuild's own run) to all (onnxruntime's run up to its
  last comparable tensor) shows where the difference between the two arises: a step between
  k - 1 and k is the effect of the layers between those two tensors.
- `--local K,...`: given onnxruntime's codes at every comparable tensor before the K-th, each
  tool's SQNR at the K-th (the layers in between, on the same input codes), with the share of
  the error energy that is a per-channel mean (constant over the image).

    python bench/ort_splice.py layout_cdla --sample 1 [--step 3] [--local 1,2,3] [--output 4]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
from quant_layers import DQ_SUFFIX, _expose, _ort_params, _outputs, _session, both_quantized
from quantize_vs_ort import _sqnr

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.quant.params import dequantize, quantize


def comparable(proto: onnx.ModelProto, qdq: onnx.ModelProto, quantized) -> dict:
    """Tensor name -> onebuild's quantized value, for the float model's tensors (graph order)
    that both quantized models hold with the same per-tensor scale and zero point."""
    ort_params = _ort_params(qdq)
    ours = {
        v.name[:-2]: v
        for n in quantized.nodes
        for v in n.outputs
        if v.name.endswith("_q") and v.quant is not None and len(v.quant.scale) == 1
    }
    same = {}
    for name in (o for n in proto.graph.node for o in n.output):
        if name in ort_params and name in ours:
            scale, zero_point = ort_params[name]
            quant = ours[name].quant
            if abs(quant.scale[0] / scale - 1) < 1e-5 and quant.zero_point[0] == zero_point:
                same[name] = ours[name]
    return same


class Splicer:
    """onebuild's integer run of one sample with onnxruntime's codes written in."""

    def __init__(self, proto, qdq, graph, quantized, sample: np.ndarray):
        self.quantized, self.names = quantized, [v.name for v in graph.outputs]
        self.same = comparable(proto, qdq, quantized)
        self.order = list(self.same)
        outputs = {o.name for o in qdq.graph.output}
        exposed = {n: n if n in outputs else n + DQ_SUFFIX for n in self.order}
        self.feed = {graph.inputs[0].name: sample}
        theirs = _outputs(_session(_expose(qdq, list(exposed.values()))), self.feed)
        self.theirs = {n: theirs[exposed[n]] for n in self.order}
        self.float = _outputs(_session(_expose(proto, self.order)), self.feed)
        self.reference = [self.float[n] for n in self.names]
        self.ort_outputs = [theirs[n] for n in self.names]

    def run(self, spliced: set[str], capture: str | None = None):
        """The model outputs with onnxruntime's codes at the `spliced` tensors, and onebuild's
        dequantized value of tensor `capture`."""
        caught = {}

        def observe(value, array):
            name = value.name[:-2]
            if value.name.endswith("_q") and name in spliced:
                array[...] = quantize(self.theirs[name], self.same[name].quant, str(array.dtype))
            if value.name.endswith("_q") and name == capture:
                caught["value"] = dequantize(array, self.same[name].quant)

        out = Interpreter(self.quantized, observe).run(self.feed)
        return [out[n] for n in self.names], caught.get("value")

    def splice_row(self, k: int, output: int) -> dict:
        outputs, _ = self.run(set(self.order[:k]))
        return {
            "k": k,
            "tensor": self.order[k - 1] if k else None,
            "sqnr_db": _sqnr([self.reference], [outputs]),
            "output_db": _sqnr([self.reference], [outputs], output),
        }

    def local_row(self, k: int) -> dict:
        """Tensor k with onnxruntime's codes at tensors 1..k-1: each tool's SQNR there and the
        share of its error energy that is a per-channel mean."""
        target = self.order[k - 1]
        _, ours = self.run(set(self.order[: k - 1]), target)
        reference = self.float[target].astype(np.float64)
        row = {"k": k, "tensor": target}
        for who, value in (("ort", self.theirs[target]), ("onebuild", ours)):
            error = value.astype(np.float64) - reference
            means = error.mean(axis=tuple(range(2, error.ndim)), keepdims=True)
            energy = float((error**2).sum())
            row[f"{who}_db"] = round(10 * np.log10(float((reference**2).sum()) / energy), 2)
            share = float(np.broadcast_to(means, error.shape).ravel() @ error.ravel()) / energy
            row[f"{who}_mean_share"] = round(share, 3)
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--sample", type=int, default=0, help="evaluation sample index")
    parser.add_argument("--step", type=int, default=1, help="splice every step-th k")
    parser.add_argument("--output", type=int, default=0, help="output index reported alone")
    parser.add_argument("--local", default="", help="comma-separated k: local mode")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        proto, _, evaluation, qdq, graph, quantized = both_quantized(
            args.model, Path(folder), bias_correction=False
        )
    splicer = Splicer(proto, qdq, graph, quantized, evaluation[args.sample])
    ref, theirs, index = splicer.reference, splicer.ort_outputs, args.output
    print(json.dumps({"onnxruntime": _sqnr([ref], [theirs]), "output": splicer.names[index]}))
    print(json.dumps({"onnxruntime_output_db": _sqnr([ref], [theirs], index)}))
    if args.local:
        for k in (int(k) for k in args.local.split(",")):
            print(json.dumps(splicer.local_row(k)), flush=True)
        return
    count = len(splicer.order)
    for k in sorted({*range(0, count + 1, args.step), count}):
        print(json.dumps(splicer.splice_row(k, index)), flush=True)


if __name__ == "__main__":
    main()
