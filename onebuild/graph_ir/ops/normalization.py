"""Normalizations: BatchNormalization (inference), LRN, Softmax, LogSoftmax, LayerNormalization,
InstanceNormalization, GroupNormalization, MeanVarianceNormalization, LpNormalization."""

import numpy as np

from .registry import (
    NOT_ALONG_AXIS_0,
    NOT_OVER_AXIS_0,
    PER_SAMPLE,
    normalize_axis,
    register,
    same_as_input,
)


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.ndim - 2)


@register("BatchNormalization", same_as_input, batch=PER_SAMPLE)
def batch_normalization(attrs, x, scale, bias, mean, var):
    """Inference form: y = (x - mean) / sqrt(var + epsilon) * scale + bias, per channel."""
    factor = scale / np.sqrt(var + np.asarray(attrs.get("epsilon", 1e-5), var.dtype))
    shift = bias - mean * factor
    shape = _channel_shape(x)
    return (x * factor.reshape(shape) + shift.reshape(shape)).astype(x.dtype, copy=False)


@register("LRN", same_as_input, batch=PER_SAMPLE)
def lrn(attrs, x):
    """Local response normalization across channels (window `size`, centered as ONNX defines)."""
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    before, after = (size - 1) // 2, size // 2  # floor and ceil of (size - 1) / 2
    squares = np.square(x, dtype=np.float64)
    widths = [(0, 0), (before + 1, after)] + [(0, 0)] * (x.ndim - 2)
    csum = np.cumsum(np.pad(squares, widths), axis=1)
    channels = x.shape[1]
    window = csum[:, size : size + channels] - csum[:, :channels]
    return (x / (bias + alpha / size * window) ** beta).astype(x.dtype)


@register("Softmax", same_as_input, batch=NOT_ALONG_AXIS_0, quant="softmax")
def softmax(attrs, x):
    """float16 in float32, rounded once (as LogSoftmax and LayerNormalization)."""
    axis = attrs.get("axis", -1)
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    shifted = wide - wide.max(axis=axis, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


@register("LogSoftmax", same_as_input, batch=NOT_ALONG_AXIS_0)
def log_softmax(attrs, x):
    axis = attrs.get("axis", -1)
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    shifted = wide - wide.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


@register("LayerNormalization", same_as_input, batch=NOT_ALONG_AXIS_0)
def layer_normalization(attrs, x, scale, bias=None):
    """float16 is computed in float32 and rounded once (ONNX's default stash_type)."""
    axis = normalize_axis(attrs.get("axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    wide = x.astype(np.float32) if x.dtype == np.float16 else x
    mean = wide.mean(axis=axes, keepdims=True)
    var = np.square(wide - mean).mean(axis=axes, keepdims=True)
    y = (wide - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5)) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False)


def _standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> np.ndarray:
    """(x - mean) / sqrt(var + epsilon) over `axes`, in float64."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = np.square(x - mean).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon)


@register("InstanceNormalization", same_as_input, batch=PER_SAMPLE)
def instance_normalization(attrs, x, scale, bias):
    """Per sample and channel over the spatial axes, then a per-channel affine."""
    y = _standardize(x, tuple(range(2, x.ndim)), attrs.get("epsilon", 1e-5))
    shape = _channel_shape(x)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register("GroupNormalization", same_as_input, batch=PER_SAMPLE)
def group_normalization(attrs, x, scale, bias):
    """Per sample over `num_groups` channel groups (and the spatial axes); per-channel affine."""
    groups = attrs["num_groups"]
    grouped = x.reshape(x.shape[0], groups, -1)
    y = _standardize(grouped, (2,), attrs.get("epsilon", 1e-5)).reshape(x.shape)
    shape = _channel_shape(x)
    return (y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)


@register("MeanVarianceNormalization", same_as_input, batch=NOT_OVER_AXIS_0)
def mean_variance_normalization(attrs, x):
    """(x - mean) / sqrt(var) over `axes`; ONNX adds 1e-9 to the deviation."""
    x64 = x.astype(np.float64)
    axes = tuple(attrs["axes"])
    mean = x64.mean(axis=axes, keepdims=True)
    std = np.sqrt(np.square(x64 - mean).mean(axis=axes, keepdims=True))
    return ((x64 - mean) / (std + 1e-9)).astype(x.dtype)


@register("LpNormalization", same_as_input, batch=NOT_ALONG_AXIS_0)
def lp_normalization(attrs, x):
    """x divided by its L1 or L2 norm along `axis` (a zero norm leaves zeros)."""
    axis = normalize_axis(attrs.get("axis", -1), x.ndim)
    x64 = x.astype(np.float64)
    if attrs.get("p", 2) == 1:
        norm = np.abs(x64).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.square(x64).sum(axis=axis, keepdims=True))
    return np.divide(x64, norm, out=np.zeros_like(x64), where=norm != 0).astype(x.dtype)
