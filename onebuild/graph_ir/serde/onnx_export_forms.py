"""ONNX forms of IR nodes that take a choice or more than one node, for `onnx_export`: Resize by
`sizes` or by `scales`, and a dilated average pool's QDQ form."""

import numpy as np

from ...errors import UserError
from ..ir import Node
from ..ops.pool import window_sums


def resize(ex, node: Node, inputs: list[str], attrs: dict):
    """`sizes` when the scales are the size ratios (onnxruntime then resizes by
    float32(out) / float32(in)), else `scales` when onnxruntime's output shape from them,
    trunc(float32(scale) * in), is the node's, else the sizes under a keep_aspect_ratio_policy
    that gives back its scale and sizes; a node none reproduces is refused."""
    roi = (
        ""
        if attrs.get("roi") is None
        else ex.constant(np.asarray(attrs["roi"], np.float32), f"{node.name}_roi")
    )
    dims = np.asarray(node.inputs[0].shape, np.float32)
    sizes, scales = np.asarray(attrs["sizes"]), np.asarray(attrs["scales"], np.float32)
    keep = {k: v for k, v in attrs.items() if k not in ("roi", "sizes", "scales")}
    ratios = [s / d for s, d in zip(attrs["sizes"], node.inputs[0].shape)]
    if list(attrs["scales"]) == ratios or np.array_equal(scales, sizes.astype(np.float32) / dims):
        sizes = ex.constant(sizes.astype(np.int64), f"{node.name}_sizes")
        return "Resize", [inputs[0], roi, "", sizes], keep
    if np.array_equal((scales * dims).astype(np.int64), sizes):
        scales = ex.constant(scales, f"{node.name}_scales")
        return "Resize", [inputs[0], roi, scales], keep
    policy = _aspect_policy(sizes, scales, dims)
    if policy is not None and not roi:
        axes = [i for i, d in enumerate(node.inputs[0].shape) if (sizes[i], scales[i]) != (d, 1)]
        given = ex.constant(sizes[axes].astype(np.int64), f"{node.name}_sizes")
        attrs = {**keep, "axes": axes, "keep_aspect_ratio_policy": policy}
        return "Resize", [inputs[0], "", "", given], attrs
    raise UserError(
        f"node '{node.name}' (Resize): no ONNX Resize has both its output shape "
        f"{list(map(int, sizes))} and its scales {scales.tolist()} (onnxruntime takes the "
        "shape from scales by truncation, the scales from sizes as ratios); resize the source "
        "model by sizes or by scales whose product with the input shape truncates to its sizes"
    )


def _aspect_policy(sizes: np.ndarray, scales: np.ndarray, dims: np.ndarray) -> str | None:
    """The keep_aspect_ratio_policy under which onnxruntime, given these sizes on the resized
    axes, picks these scales and rounds back to these sizes (one scale for them all, as the
    importer gives a policy's Resize), or None."""
    resized = (sizes != dims) | (scales != 1)
    if not resized.any() or len(set(scales[resized])) != 1:
        return None
    ratios = sizes[resized].astype(np.float32) / dims[resized]
    for policy, pick in (("not_larger", np.min), ("not_smaller", np.max)):
        scale = np.float32(pick(ratios))
        rounded = np.floor((scale * dims[resized]).astype(np.float64) + 0.5)  # std::round
        if scale == scales[resized][0] and np.array_equal(rounded, sizes[resized]):
            return policy
    return None


def dilated_average(ex, node: Node, source: str, target: str) -> None:
    """A dilated average pool as the window sums (a Conv of ones per channel, zeros past the
    edges) times 1 / each window's count: onnxruntime's default optimization fuses
    DQ -> AveragePool -> Q into QLinearAveragePool, which has no dilations (the model
    does not load)."""
    attrs, x = node.attrs, node.inputs[0]
    nd = len(x.shape) - 2
    kernel, strides, dilations = attrs["kernel_shape"], attrs["strides"], attrs["dilations"]
    pads = list(attrs.get("pads", [0] * 2 * nd))
    # end pads up to the last window's end (past it, none: floor mode drops those cells)
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    spans = zip(node.output.shape[2:], strides, reach, x.shape[2:], pads)
    ends = [max((o - 1) * s + r - size - begin, 0) for o, s, r, size, begin in spans]
    ones = np.ones((x.shape[1], 1, *kernel), np.float32)
    sums = ex.fresh(f"{node.name}_sums")
    ex.emit(
        "Conv",
        [source, ex.constant(ones, f"{node.name}_window")],
        [sums],
        node.name,
        group=x.shape[1],
        kernel_shape=list(kernel),
        strides=list(strides),
        dilations=list(dilations),
        pads=pads[:nd] + ends,
    )
    _, counts = window_sums(attrs, np.zeros((1, 1, *x.shape[2:]), np.float32))
    weights = ex.constant((1 / counts).astype(np.float32), f"{node.name}_reciprocal_counts")
    ex.emit("Mul", [sums, weights], [target], f"{node.name}/mean")
