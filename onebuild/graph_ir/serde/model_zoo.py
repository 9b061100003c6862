"""Real architectures for tests and benchmarks: the "light" model graphs shipped in the onnx
package (ResNet50, SqueezeNet, ...), with their constant-fill weights replaced by seeded random
ones of sane scale (He-normal convolutions, BatchNorm statistics near identity)."""

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_MODELS = (
    "resnet50",
    "squeezenet",
    "shufflenet",
    "inception_v1",
    "inception_v2",
    "densenet121",
    "vgg19",
    "bvlc_alexnet",
    "zfnet512",
)


def light_model_path(name: str) -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def _random_weight(rng: np.random.Generator, shape, reader: str, index: int) -> np.ndarray:
    if reader == "BatchNormalization":  # scale, bias, mean, var
        if index == 1:  # scale below 1 keeps residual sums from growing through deep nets
            return rng.uniform(0.2, 0.7, shape)
        if index == 4:
            return rng.uniform(0.5, 1.5, shape)
        return rng.normal(0.0, 0.1, shape)
    if len(shape) >= 2:  # Conv / Gemm weights
        fan_in = int(np.prod(shape[1:])) if reader != "Gemm" else min(shape)
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    if reader == "Mul":  # per-channel scale of the BN-like Mul/Add pairs
        return rng.uniform(0.5, 1.5, shape)
    return rng.normal(0.0, 0.05, shape)


def light_model(name: str, seed: int = 0, expose_logits: bool = False) -> onnx.ModelProto:
    """The light model `name` with every ConstantOfShape weight replaced by a seeded initializer.

    With `expose_logits`, the input of the final Softmax becomes a second graph output, so that
    comparisons are not blunted by a saturated softmax.
    """
    model = onnx.load(str(light_model_path(name)))
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    readers: dict[str, tuple[str, int]] = {}
    for node in graph.node:
        for index, tensor in enumerate(node.input):
            readers.setdefault(tensor, (node.op_type, index))
    # Follow Unsqueeze chains to the real reader (densenet / inception_v2 scale-shift pairs).
    for node in graph.node:
        if node.op_type == "Unsqueeze" and node.output[0] in readers:
            readers[node.input[0]] = readers[node.output[0]]
    rng = np.random.default_rng(seed)
    kept, weights = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        reader, index = readers.get(node.output[0], ("", 0))
        data = _random_weight(rng, shape, reader, index).astype(np.float32)
        weights.append(numpy_helper.from_array(data, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    inputs = [i for i in graph.input if i.name not in {w.name for w in weights}]
    del graph.input[:]
    graph.input.extend(inputs)
    graph.initializer.extend(weights)
    if expose_logits:
        softmax = [n for n in graph.node if n.op_type == "Softmax"]
        if softmax:
            graph.output.append(onnx.helper.make_empty_tensor_value_info(softmax[-1].input[0]))
    return model
