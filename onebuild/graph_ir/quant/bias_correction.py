"""Bias correction (Nagel et al. 2019, "Data-Free Quantization"): rounding a layer's weights
shifts its output's mean per channel by the weight error times the input's channel means;
subtracting that shift from the bias undoes it."""

import numpy as np

from ..ir import Node


def corrected_bias(
    node: Node,
    weight: np.ndarray,
    codes: np.ndarray,
    scale,
    bias: np.ndarray,
    mean: np.ndarray,
    axis: int,
) -> np.ndarray:
    """`bias` minus the mean output change that quantizing `weight` to `codes` (times `scale`,
    per channel on `axis`) causes on inputs whose channels average `mean` (zero padding
    ignored); `bias` as it is when `mean` does not match the layer's input channels."""
    if mean.size != _in_channels(node, weight, axis):
        return bias
    shape = [1] * weight.ndim
    shape[axis] = -1
    error = codes * np.asarray(scale).reshape(shape) - weight
    if node.op != "Conv":
        return bias - (error @ mean if axis == 0 else mean @ error)
    groups = node.attrs["group"]
    out_channels, in_per_group = error.shape[:2]
    per_group = error.reshape(groups, out_channels // groups, in_per_group, -1).sum(axis=3)
    return bias - np.einsum("goi,gi->go", per_group, mean.reshape(groups, in_per_group)).ravel()


def _in_channels(node: Node, weight: np.ndarray, axis: int) -> int:
    if node.op == "Conv":
        return weight.shape[1] * node.attrs["group"]
    return weight.shape[1 - axis]
