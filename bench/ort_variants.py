"""Helpers of `quantize_vs_ort.py` that need only numpy and onnx: neutral jitter of activation
scales (the measurement's noise) and onnxruntime's recommended pre-processing."""

import hashlib
from pathlib import Path

import numpy as np
import onnx

JITTER = 0.003  # relative standard deviation of each activation scale in a jitter run
OUTPUT_SUFFIX = "_QuantizeLinear_Input"  # quantize_static's name for a graph output's tensor


def factors(names, seed: int) -> dict[str, float]:
    """One factor 1 + JITTER z per distinct name, z standard normal drawn from `seed` and the
    name alone: a tensor both quantizers hold under one name gets the same factor in both (the
    tools' runs are paired there), whatever other names each holds."""
    return {name: 1.0 + JITTER * _normal(name, seed) for name in sorted(set(names))}


def _normal(name: str, seed: int) -> float:
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    return float(np.random.default_rng([seed, key]).standard_normal())


def jitter_ranges(ranges: dict[str, tuple[float, float]], seed: int) -> dict:
    """Each calibrated range [lo, hi] as [lo f, hi f] with its factor f: the scale times f, the
    zero point (nearly) unchanged."""
    scale = factors(ranges, seed)
    return {name: (lo * scale[name], hi * scale[name]) for name, (lo, hi) in ranges.items()}


def jitter_channel_ranges(ranges: dict[str, tuple[np.ndarray, np.ndarray]], seed: int) -> dict:
    """Each channel's calibrated range (values quantized per channel) times its own factor:
    such a value has a scale per channel, each perturbed as a tensor's scale is (factors drawn
    apart from the per-tensor ones)."""
    names = {name: [f"{name}[{c}]" for c in range(len(lo))] for name, (lo, _) in ranges.items()}
    scale = factors([n for each in names.values() for n in each], seed + 10_000)
    return {
        name: tuple(np.asarray(a) * np.array([scale[n] for n in names[name]]) for a in pair)
        for name, pair in ranges.items()
    }


def jitter_qdq(proto: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of a QDQ model with every activation scale (the initializer its QuantizeLinear
    shares with its DequantizeLinear) multiplied by the factor of the first tensor it quantizes
    (named as in the float model; a scale also serves the outputs of MaxPool, Reshape, ...);
    weights (initializers, or Constant outputs as NNCF quantizes them) are left alone."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    inits = {i.name: i for i in copy.graph.initializer}
    weights = {*inits, *(n.output[0] for n in copy.graph.node if n.op_type == "Constant")}
    tensors = {}
    for n in copy.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in weights and n.input[1] in inits:
            tensors.setdefault(n.input[1], n.input[0].removesuffix(OUTPUT_SUFFIX))
    factor = factors(tensors.values(), seed)
    for name, tensor in tensors.items():
        scale = onnx.numpy_helper.to_array(inits[name]).astype(np.float64) * factor[tensor]
        inits[name].CopyFrom(onnx.numpy_helper.from_array(scale.astype(np.float32), name))
    return copy


def preprocess(path: Path, output: Path) -> None:
    """onnxruntime's `quant_pre_process` (shape inference and its graph optimizations, which
    fold BatchNormalization into the Conv before it), as its quantizer's warning recommends;
    opsets below 13 are converted to 13, where quantize_static's per-channel DequantizeLinear
    (an `axis` attribute) is valid."""
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(path), str(output), skip_symbolic_shape=True)
    proto = onnx.load(output)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:
        onnx.save(version_converter.convert_version(proto, 13), output)
