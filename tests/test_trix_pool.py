"""TRIX pooling: the simulator's separable window maxima and sums equal every window's own
maximum and sum, and the performance model counts the two-operand maxima of the cheaper
order."""

import numpy as np
import pytest

from onebuild.targets.trix_sim.lower import Layer
from onebuild.targets.trix_sim.perf import pool_ops
from onebuild.targets.trix_sim.windows import window_max, window_sum


def _pool(kernel, strides, dilations, pads=(0, 0, 0, 0)) -> Layer:
    attrs = {"kernel": list(kernel), "strides": list(strides), "dilations": list(dilations)}
    return Layer("maxpool", "p", ["x"], "y", {**attrs, "pads": list(pads)})


@pytest.mark.parametrize(
    "kernel, strides, dilations",
    [
        ((3, 3), (2, 2), (1, 1)),
        ((3, 2), (2, 1), (1, 1)),
        ((2, 3), (1, 3), (2, 1)),
        ((1, 1), (1, 1), (1, 1)),
        ((4, 4), (4, 4), (1, 1)),
    ],
)
def test_separable_maxima_and_sums_equal_each_windows(rng, kernel, strides, dilations):
    layer = _pool(kernel, strides, dilations)
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    padded = rng.integers(-128, 128, (3, 17, 13)).astype(np.int8)
    rows = (17 - (kh - 1) * dh - 1) // sh + 1
    ow = (13 - (kw - 1) * dw - 1) // sw + 1
    expected = np.empty((3, rows, ow), np.int8)
    sums = np.empty((3, rows, ow), np.int64)
    for i in range(rows):
        for j in range(ow):
            window = padded[
                :,
                i * sh : i * sh + (kh - 1) * dh + 1 : dh,
                j * sw : j * sw + (kw - 1) * dw + 1 : dw,
            ]
            expected[:, i, j] = window.reshape(3, -1).max(axis=1)
            sums[:, i, j] = window.reshape(3, -1).sum(axis=1, dtype=np.int64)
    got = window_max(layer, padded, rows, ow)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(window_sum(layer, padded, rows, ow), sums)


def test_pool_ops_counts_the_cheaper_order():
    """SqueezeNet's first pool (3x3, stride 2, 111 -> 55 rows): 2 maxima per output column of
    each of the 111 input rows, then 2 per output, instead of 8 per output; a 2x2 stride-2
    pool shares nothing (3 per output either way); a 1x1 pool copies (1 per output)."""
    assert pool_ops(_pool((3, 3), (2, 2), (1, 1)), 55, 55, 111) == 111 * 55 * 2 + 55 * 55 * 2
    assert pool_ops(_pool((3, 3), (2, 2), (1, 1)), 4, 55, 111) == 9 * 55 * 2 + 4 * 55 * 2
    assert pool_ops(_pool((2, 2), (2, 2), (1, 1)), 5, 5, 10) == 25 * 3
    assert pool_ops(_pool((1, 1), (1, 1), (1, 1)), 5, 5, 5) == 25
    padded = _pool((3, 3), (1, 1), (1, 1), (1, 1, 1, 1))  # whole height: 5 rows + 2 padded
    assert pool_ops(padded, 5, 5, 5) == 7 * 5 * 2 + 25 * 2
