"""IR -> TFLite mappings of resizing and the normalizations (BatchNormalization, LRN,
LayerNormalization), for `circle_write.Writer`; in circle, the forms onert 0.1.0 runs where it
lacks a kernel (the reader folds them back: `circle_read_fuse`)."""

import numpy as np

from .circle_ops import NHWC, _require, _stored
from .tflite_schema import VALID


def resize(w, node):
    x, attrs = node.inputs[0], node.attrs
    sizes = attrs["sizes"]
    _require(len(x.shape) == 4 and list(sizes[:2]) == list(x.shape[:2]) and not attrs.get("roi"))
    _require(_scaled_by_sizes(x.shape, sizes, attrs["scales"]))
    mode = attrs.get("mode", "nearest")
    coords = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode == "linear":
        _require(
            coords in ("half_pixel", "align_corners", "asymmetric") and not attrs.get("antialias")
        )
        code = "RESIZE_BILINEAR"
    else:
        _require(
            mode == "nearest"
            and coords == "asymmetric"
            and attrs.get("nearest_mode", "round_prefer_floor") == "floor"
        )
        code = "RESIZE_NEAREST_NEIGHBOR"
        factors = (sizes[2] // x.shape[2], sizes[3] // x.shape[3])
        if w.fmt == "circle" and tuple(sizes[2:]) == (
            x.shape[2] * factors[0],
            x.shape[3] * factors[1],
        ):
            _repeat(w, node, factors)
            return
    size = w.constant(np.asarray(sizes[2:], np.int32), f"{node.name}_size")
    w.op(
        code,
        [w.get(x, NHWC), size],
        [w.define(node.output, NHWC)],
        align_corners=coords == "align_corners",
        half_pixel_centers=coords == "half_pixel",
    )


def _scaled_by_sizes(shape, sizes, scales) -> bool:
    """Whether the scales are the size ratios (TFLite resizes by out / in, given the size): in
    float64, or in float32 for scales a model gave (float32(1 / 3) for 9 -> 3)."""
    ratios = [s / d for s, d in zip(sizes, shape)]
    as_float32 = np.asarray(sizes, np.float32) / np.asarray(shape, np.float32)
    return list(scales) == ratios or np.array_equal(np.asarray(scales, np.float32), as_float32)


def _repeat(w, node, factors: tuple[int, int]) -> None:
    """Nearest upsampling by whole factors (each pixel repeated sh x sw times) as RESHAPE and
    CONCATENATION of copies, along the width, then the height (onert 0.1.0 has no
    RESIZE_NEAREST_NEIGHBOR kernel: "KernelGenerator: NYI"); the reader folds it back."""
    x, out = node.inputs[0], node.output
    n, c, h, width = x.shape
    sh, sw = factors
    source = w.get(x, NHWC)
    stages = (((n * h, width, 1, c), sw), ((n, h, 1, width * sw * c), sh))
    for index, (shape, factor) in enumerate(stages):
        rows = w.new_tensor(f"{out.name}_rows{index}", x.dtype, shape, quant=x.quant)
        dims = w.constant(np.asarray(shape, np.int32), f"{node.name}_rows{index}_shape")
        w.op("RESHAPE", [source, dims], [rows])
        copies = (*shape[:2], factor, shape[3])
        source = w.new_tensor(f"{out.name}_copies{index}", x.dtype, copies, quant=x.quant)
        w.op("CONCATENATION", [rows] * factor, [source], axis=2)
    dims = w.constant(np.asarray(_stored(out.shape, NHWC), np.int32), f"{node.name}_shape")
    w.op("RESHAPE", [source, dims], [w.define(out, NHWC)])


def batch_norm(w, node):
    x, scale, bias, mean, var = node.inputs
    _require(all(v.is_const for v in (scale, bias, mean, var)) and len(x.shape) >= 2)
    eps = node.attrs.get("epsilon", 1e-5)
    factor = scale.numpy() / np.sqrt(var.numpy() + eps)
    shift = bias.numpy() - mean.numpy() * factor
    perm = w.home_of(x)
    rank = len(x.shape)
    shape = [1] * rank
    shape[1] = -1
    operands = []
    for data, name in ((factor, "scale"), (shift, "shift")):
        data = data.astype(x.dtype).reshape(shape)
        if perm is not None:
            data = data.transpose(perm)
        operands.append(w.constant(np.ascontiguousarray(data), f"{node.name}_{name}"))
    scaled = w.new_tensor(f"{node.output.name}_scaled", x.dtype, _stored(x.shape, perm))
    w.op("MUL", [w.get(x, perm), operands[0]], [scaled])
    w.op("ADD", [scaled, operands[1]], [w.define(node.output, perm)])


def lrn(w, node):
    """LOCAL_RESPONSE_NORMALIZATION in tflite; in circle, which ONE's runtime runs and whose cpu
    backend has no LRN kernel, x * (bias + CONV_2D(x * x, band of alpha / size)) ^ -beta."""
    x, attrs = node.inputs[0], node.attrs
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    _require(len(x.shape) == 4 and x.dtype == np.float32)
    xi = w.get(x, NHWC)
    if w.fmt != "circle":
        _require(size % 2 == 1)
        w.op(
            "LOCAL_RESPONSE_NORMALIZATION",
            [xi],
            [w.define(node.output, NHWC)],
            radius=(size - 1) // 2,
            bias=bias,
            alpha=alpha / size,
            beta=beta,
        )
        return
    shape = _stored(x.shape, NHWC)
    channels = x.shape[1]
    squares = w.new_tensor(f"{x.name}_squares", x.dtype, shape)
    w.op("MUL", [xi, xi], [squares])
    band = np.zeros((channels, 1, 1, channels), np.float32)
    before, after = (size - 1) // 2, size // 2
    for c in range(channels):
        band[c, 0, 0, max(0, c - before) : c + after + 1] = np.float32(alpha / size)
    scale = w.new_tensor(f"{node.output.name}_scale", x.dtype, shape)
    operands = [
        squares,
        w.constant(band, f"{node.name}_window"),
        w.constant(np.full(channels, bias, np.float32), f"{node.name}_bias"),
    ]
    w.op(
        "CONV_2D",
        operands,
        [scale],
        padding=VALID,
        stride_h=1,
        stride_w=1,
        dilation_h=1,
        dilation_w=1,
    )
    power = w.new_tensor(f"{node.output.name}_power", x.dtype, shape)
    exponent = w.constant(np.asarray([-beta], np.float32), f"{node.name}_exponent")
    w.op("POW", [scale, exponent], [power])
    w.op("MUL", [xi, power], [w.define(node.output, NHWC)])


def layer_norm(w, node):
    """Float LayerNormalization (no TFLite operator) as (x - mean) / sqrt(mean((x - mean)^2) +
    eps) * gamma + beta: MEAN, SUB, MUL, MEAN, ADD, SQRT, DIV, MUL, ADD in the IR's order."""
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    _require(x.dtype == np.float32 and scale.is_const and (bias is None or bias.is_const))
    out, rank = node.output, len(x.shape)
    axes = list(range(node.attrs.get("axis", -1) % rank, rank))
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))

    def tensor(part: str, shape) -> int:
        return w.new_tensor(f"{out.name}_{part}", x.dtype, shape)

    xi = w.get(x, None)
    reduce = w.constant(np.asarray(axes, np.int32), f"{node.name}_axes")
    epsilon = np.asarray(node.attrs.get("epsilon", 1e-5), np.float32)
    steps = [
        ("MEAN", [xi, reduce], "mean", kept),
        ("SUB", ["x", "mean"], "centered", x.shape),
        ("MUL", ["centered", "centered"], "squares", x.shape),
        ("MEAN", ["squares", reduce], "variance", kept),
        ("ADD", ["variance", w.constant(epsilon, f"{node.name}_epsilon")], "shifted", kept),
        ("SQRT", ["shifted"], "root", kept),
        ("DIV", ["centered", "root"], "normalized", x.shape),
        ("MUL", ["normalized", w.constant(scale.numpy(), scale.name)], "scaled", x.shape),
    ]
    if bias is not None:
        steps.append(("ADD", ["scaled", w.constant(bias.numpy(), bias.name)], "shifted_", None))
    made = {"x": xi}
    for i, (code, operands, part, shape) in enumerate(steps):
        last = i == len(steps) - 1
        target = w.define(out, None) if last else tensor(part, shape)
        inputs = [made[o] if isinstance(o, str) else o for o in operands]
        options = {"keep_dims": True} if code == "MEAN" else {}
        w.op(code, inputs, [target], **options)
        made[part] = target
