"""ONNX converters of the layer operators: convolution, pooling, Gemm, normalizations,
DepthToSpace/SpaceToDepth and Resize (the rest, and the registry, are in `onnx_ops`).

Attributes and operands are validated here with `onnx_checks`' helpers; a ValueError becomes a
one-line error naming the file and the node.
"""

import math

import numpy as np

from .. import dtypes
from ..ops import broadcast_shape, normalize_axis
from .onnx_checks import non_negative, positive
from .onnx_ops import canonical_axes, converter, per_channel


# -- convolution and pooling -------------------------------------------------------------------
def _spatial(ctx, in_shape, kernel, transposed=False):
    """strides, dilations and explicit pads (begins, then ends) with auto_pad resolved."""
    nd = len(in_shape)
    positive("kernel_shape", kernel, nd)
    strides = positive("strides", ctx.attr("strides", [1] * nd), nd)
    dilations = positive("dilations", ctx.attr("dilations", [1] * nd), nd)
    pads = non_negative("pads", ctx.attr("pads", [0] * (2 * nd)), 2 * nd)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER") and not transposed:
        for i in range(nd):
            out = math.ceil(in_shape[i] / strides[i])
            total = max(
                0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_shape[i]
            )
            small, large = total // 2, total - total // 2
            pads[i], pads[i + nd] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.fail(f"unknown auto_pad '{auto_pad}'")
    return strides, dilations, pads


def _kernel(ctx, x, w) -> list[int]:
    """The kernel shape: W's spatial dims (a kernel_shape attribute must agree)."""
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ValueError(f"input {list(x.shape)} and weight {list(w.shape)} do not fit (N, C, ...)")
    kernel = list(w.shape[2:])
    given = ctx.attr("kernel_shape")
    if given is not None and list(given) != kernel:
        raise ValueError(f"kernel_shape {list(given)} disagrees with the weight's {kernel}")
    return kernel


@converter("Conv")
def conv(ctx):
    x, w = ctx.inputs[0], ctx.inputs[1]
    kernel = _kernel(ctx, x, w)
    strides, dilations, pads = _spatial(ctx, x.shape[2:], kernel)
    attrs = {
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "group": positive("group", [ctx.attr("group", 1)])[0],
    }
    per_channel(ctx, [2], w.shape[0])
    return ctx.emit("Conv", [x, w, ctx.input(2)], attrs)


@converter("ConvTranspose")
def conv_transpose(ctx):
    x, w = ctx.inputs[0], ctx.inputs[1]
    kernel = _kernel(ctx, x, w)
    nd = len(kernel)
    strides, dilations, pads = _spatial(ctx, x.shape[2:], kernel, transposed=True)
    output_padding = non_negative("output_padding", ctx.attr("output_padding", [0] * nd), nd)
    output_shape = ctx.attr("output_shape")
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    same = output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER")
    if same:
        output_shape = [x.shape[2 + i] * strides[i] for i in range(nd)]
    if output_shape is not None:
        output_shape = list(output_shape)[-nd:]
        for i in range(nd):
            total = (
                strides[i] * (x.shape[2 + i] - 1)
                + output_padding[i]
                + (kernel[i] - 1) * dilations[i]
                + 1
                - output_shape[i]
            )
            # SAME with a stride beyond the kernel's extent: onnxruntime pads nothing and
            # returns (in - 1) * stride + extent; onnx.reference pads the output to in * stride
            if total < 0:
                if not same:
                    output_padding[i] -= total
                total = 0
            half = total // 2
            if auto_pad == "SAME_UPPER":
                pads[i], pads[i + nd] = half, total - half
            else:
                pads[i], pads[i + nd] = total - half, half
    attrs = {
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "group": positive("group", [ctx.attr("group", 1)])[0],
        "output_padding": output_padding,
    }
    per_channel(ctx, [2], w.shape[1] * attrs["group"])
    return ctx.emit("ConvTranspose", [x, w, ctx.input(2)], attrs)


def _pool_attrs(ctx, x):
    if len(x.shape) < 3:
        raise ValueError(f"input {list(x.shape)} has no spatial axes")
    kernel = list(ctx.attr("kernel_shape"))
    strides, dilations, pads = _spatial(ctx, x.shape[2:], kernel)
    if any(p >= kernel[i % len(kernel)] for i, p in enumerate(pads)):
        raise ValueError(f"pads {pads} must be smaller than kernel_shape {kernel}")
    return {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "ceil_mode": int(ctx.attr("ceil_mode", 0)),
    }


@converter("MaxPool")
def max_pool(ctx):
    if ctx.wants_output(1):
        raise ctx.fail("the Indices output of MaxPool is not supported")
    if ctx.attr("storage_order", 0):
        raise ctx.fail("storage_order=1 is not supported")
    return ctx.emit("MaxPool", ctx.inputs[:1], _pool_attrs(ctx, ctx.inputs[0]))


@converter("AveragePool")
def average_pool(ctx):
    attrs = _pool_attrs(ctx, ctx.inputs[0])
    attrs["count_include_pad"] = int(ctx.attr("count_include_pad", 0))
    return ctx.emit("AveragePool", ctx.inputs[:1], attrs)


@converter("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx):
    return ctx.emit(ctx.op_type, ctx.inputs)


@converter("Gemm")
def gemm(ctx):
    attrs = {
        "alpha": float(ctx.attr("alpha", 1.0)),
        "beta": float(ctx.attr("beta", 1.0)),
        "transA": int(ctx.attr("transA", 0)),
        "transB": int(ctx.attr("transB", 0)),
    }
    return ctx.emit("Gemm", [ctx.inputs[0], ctx.inputs[1], ctx.input(2)], attrs)


# -- normalization -----------------------------------------------------------------------------
@converter("BatchNormalization")
def batch_normalization(ctx):
    if ctx.attr("training_mode", 0) or any(ctx.node.output[1:]):
        raise ctx.fail("training-mode BatchNormalization is not supported")
    if ctx.opset < 9 and not ctx.attr("spatial", 1):
        raise ctx.fail("BatchNormalization with spatial=0 is not supported")
    if len(ctx.inputs[0].shape) < 2:
        raise ValueError(f"input {list(ctx.inputs[0].shape)} has no channel axis")
    per_channel(ctx, range(1, 5), ctx.inputs[0].shape[1])
    return ctx.emit(
        "BatchNormalization", ctx.inputs[:5], {"epsilon": float(ctx.attr("epsilon", 1e-5))}
    )


@converter("LRN")
def lrn(ctx):
    attrs = {
        "size": positive("size", [ctx.attr("size")])[0],
        "alpha": float(ctx.attr("alpha", 1e-4)),
        "beta": float(ctx.attr("beta", 0.75)),
        "bias": float(ctx.attr("bias", 1.0)),
    }
    return ctx.emit("LRN", ctx.inputs, attrs)


@converter("LayerNormalization")
def layer_normalization(ctx):
    """One IR op; spelled out in reductions when the Mean or InvStdDev output is used too,
    then in float32 when stash_type is 1 (Mean and InvStdDev are float32, Y is cast back)."""
    x, scale = ctx.inputs[:2]
    bias = ctx.input(2)
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(x.shape))
    epsilon = float(ctx.attr("epsilon", 1e-5))
    normalized = tuple(x.shape[axis:])
    for value in (scale, bias):
        if value is not None and broadcast_shape(value.shape, normalized) != normalized:
            raise ValueError(f"'{value.name}' {list(value.shape)} does not fit {list(normalized)}")
    if not any(ctx.node.output[1:]):
        return ctx.emit("LayerNormalization", [x, scale, bias], {"axis": axis, "epsilon": epsilon})
    stash = int(ctx.attr("stash_type", 1)) == 1 and x.dtype != np.float32
    if stash:
        x, scale, bias = (None if v is None else _cast(ctx, v, "float32") for v in (x, scale, bias))
    reduce = {"axes": list(range(axis, len(x.shape))), "keepdims": 1}
    (mean,) = ctx.emit("ReduceMean", [x], reduce)
    (centered,) = ctx.emit("Sub", [x, mean])
    (square,) = ctx.emit("Mul", [centered, centered])
    (variance,) = ctx.emit("ReduceMean", [square], reduce)
    (shifted,) = ctx.emit("Add", [variance, ctx.constant(np.asarray(epsilon, x.dtype))])
    (std,) = ctx.emit("Sqrt", [shifted])
    (inv_std,) = ctx.emit("Reciprocal", [std])
    (normalized,) = ctx.emit("Mul", [centered, inv_std])
    (y,) = ctx.emit("Mul", [normalized, scale])
    if bias is not None:
        (y,) = ctx.emit("Add", [y, bias])
    if stash:
        y = _cast(ctx, y, dtypes.name_of(ctx.inputs[0].dtype))
    return [y, mean, inv_std]


def _cast(ctx, value, to: str):
    (cast,) = ctx.emit("Cast", [value], {"to": to, "saturate": 1, "round_mode": "up"})
    return cast


@converter("GroupNormalization")
def group_normalization(ctx):
    """Opset 18 gives scale and bias per group, 21 per channel: the IR takes them per channel."""
    x, scale, bias = ctx.inputs[:3]
    groups = int(ctx.attr("num_groups"))
    channels = x.shape[1]
    if channels % groups:
        raise ctx.fail(f"{channels} channels do not split into {groups} groups")
    if scale.shape[0] != channels:
        scale, bias = (
            ctx.constant(np.repeat(ctx.const(i, what), channels // groups))
            for i, what in ((1, "scale"), (2, "bias"))
        )
    attrs = {"num_groups": groups, "epsilon": float(ctx.attr("epsilon", 1e-5))}
    return ctx.emit("GroupNormalization", [x, scale, bias], attrs)


@converter("MeanVarianceNormalization")
def mean_variance_normalization(ctx):
    rank = len(ctx.inputs[0].shape)
    axes = canonical_axes(ctx.attr("axes", [0, 2, 3]), rank)
    return ctx.emit("MeanVarianceNormalization", ctx.inputs, {"axes": axes})


@converter("LpNormalization")
def lp_normalization(ctx):
    attrs = {"axis": int(ctx.attr("axis", -1)), "p": int(ctx.attr("p", 2))}
    if attrs["p"] not in (1, 2):
        raise ctx.fail(f"p = {attrs['p']}; ONNX defines only 1 and 2")
    return ctx.emit("LpNormalization", ctx.inputs, attrs)


@converter("InstanceNormalization")
def instance_normalization(ctx):
    x = ctx.inputs[0]
    if len(x.shape) < 3:
        raise ValueError(f"input {list(x.shape)} has no spatial axes")
    per_channel(ctx, (1, 2), x.shape[1])
    attrs = {"epsilon": float(ctx.attr("epsilon", 1e-5))}
    return ctx.emit("InstanceNormalization", ctx.inputs, attrs)


# -- blocks -------------------------------------------------------------------------------------
def _blocksize(ctx) -> int:
    (b,) = positive("blocksize", [ctx.attr("blocksize")])
    if len(ctx.inputs[0].shape) != 4:
        raise ValueError(f"input {list(ctx.inputs[0].shape)} is not 4-D")
    return b


def _block_mode(ctx) -> str:
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"unknown mode '{mode}'")
    return mode


@converter("DepthToSpace")
def depth_to_space(ctx):
    b, channels, mode = _blocksize(ctx), ctx.inputs[0].shape[1], _block_mode(ctx)
    if channels % (b * b):
        raise ValueError(f"{channels} channels do not split into {b}x{b} blocks")
    return ctx.emit("DepthToSpace", ctx.inputs, {"blocksize": b, "mode": mode})


@converter("SpaceToDepth")
def space_to_depth(ctx):
    """mode only when CRD: SpaceToDepth has one from opset 28 (DCR before, and a DCR mode
    written back to an older opset fails the checker)."""
    attrs = {"blocksize": _blocksize(ctx)}
    if ctx.opset >= 28 and _block_mode(ctx) == "CRD":
        attrs["mode"] = "CRD"
    return ctx.emit("SpaceToDepth", ctx.inputs, attrs)


# -- resize ------------------------------------------------------------------------------------
def _legacy_rounding(ctx, scales: list[float]) -> str:
    """Before opset 11 onnxruntime rounds a nearest source index up on a shrinking axis and
    down on a growing one; one nearest_mode cannot do both on different axes."""
    shrinks = {s < 1 for s in scales if s != 1}
    if len(shrinks) > 1 and ctx.attr("mode", "nearest") == "nearest":
        raise ctx.fail(
            f"nearest {ctx.op_type} of opset {ctx.opset} shrinks some axes and grows "
            f"others (scales {scales}); resize them in two nodes or use opset 11"
        )
    return "ceil" if shrinks == {True} else "floor"


@converter("Resize", "Upsample")
def resize(ctx):
    x = ctx.inputs[0]
    rank = len(x.shape)
    legacy = ctx.op_type == "Upsample" or ctx.opset < 11
    if legacy:
        scales = np.float32(ctx.attr("scales")) if ctx.opset < 9 else ctx.const(1, "scales")
        roi, sizes, axes = None, None, None
    else:
        roi, scales, sizes = ctx.const(1, "roi"), ctx.const(2, "scales"), ctx.const(3, "sizes")
        axes = ctx.attr("axes")
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    in_dims = [x.shape[a] for a in axes]
    # Scales and output lengths in float32 as onnxruntime computes them.
    if sizes is not None and sizes.size:
        sizes = [int(s) for s in sizes]
        part_scales = [float(np.float32(s) / np.float32(d)) for s, d in zip(sizes, in_dims)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            scale = np.float32((min if policy == "not_larger" else max)(part_scales))
            sizes = [math.floor(float(scale * np.float32(d)) + 0.5) for d in in_dims]  # half up
            part_scales = [float(scale)] * len(axes)
    elif scales is not None and scales.size:
        part_scales = [float(np.float32(s)) for s in scales]
        # onnxruntime and onnx.reference ignore the roi here (the spec's formula scales by it)
        sizes = [math.floor(np.float32(s) * np.float32(d)) for s, d in zip(part_scales, in_dims)]
    else:
        raise ctx.fail("Resize needs scales or sizes")
    positive("sizes", sizes, len(axes))
    if not all(s > 0 for s in part_scales):
        raise ValueError(f"scales {part_scales} must be positive")
    full_sizes, full_scales = list(x.shape), [1.0] * rank
    for i, axis in enumerate(axes):
        full_sizes[axis], full_scales[axis] = sizes[i], part_scales[i]
    full_roi = None
    if roi is not None and roi.size:
        full_roi = [0.0] * rank + [1.0] * rank
        for i, axis in enumerate(axes):
            full_roi[axis], full_roi[axis + rank] = float(roi[i]), float(roi[i + len(axes)])
    mode = ctx.attr("mode", "nearest")
    attrs = {
        "sizes": full_sizes,
        "scales": full_scales,
        "roi": full_roi,
        "mode": mode,
        "coordinate_transformation_mode": "asymmetric"
        if legacy
        else ctx.attr("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": _legacy_rounding(ctx, full_scales)
        if legacy
        else ctx.attr("nearest_mode", "round_prefer_floor"),
        "cubic_coeff_a": float(ctx.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": int(ctx.attr("exclude_outside", 0)),
        "extrapolation_value": float(ctx.attr("extrapolation_value", 0.0)),
        "antialias": int(ctx.attr("antialias", 0)),
    }
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.fail(f"unknown resize mode '{mode}'")
    if full_sizes == list(x.shape):  # onnxruntime returns the input whatever the scales and
        return ctx.emit("Identity", [x])  # roi say (onnx.reference resamples it)
    return ctx.emit("Resize", [x], attrs)
