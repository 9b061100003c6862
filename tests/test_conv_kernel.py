"""The Conv and MaxPool kernels against direct loop definitions, over padding, stride, dilation
and rank combinations the ONNX backend cases do not all reach (pads wider than the kernel,
asymmetric pads, 1-D and 3-D windows)."""

import itertools

import numpy as np
import pytest

from onebuild.graph_ir.ops import OPS


def reference_conv(x, w, strides, dilations, pads):
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[i + nd]) for i in range(nd))])
    out = [
        (xp.shape[2 + i] - dilations[i] * (w.shape[2 + i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]
    y = np.zeros((x.shape[0], w.shape[0], *out), dtype=np.float64)
    for position in itertools.product(*map(range, out)):
        window = tuple(
            slice(p * s, p * s + d * (k - 1) + 1, d)
            for p, s, d, k in zip(position, strides, dilations, w.shape[2:])
        )
        patch = xp[(slice(None), slice(None), *window)].astype(np.float64)
        y[(slice(None), slice(None), *position)] = np.tensordot(
            patch, w.astype(np.float64), axes=(range(1, nd + 2), range(1, nd + 2))
        )
    return y


CASES = [  # spatial, kernel, strides, dilations, pads (begins then ends)
    ((9, 11), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((9, 11), (3, 2), (2, 3), (1, 1), (0, 2, 1, 0)),
    ((8, 8), (3, 3), (2, 2), (2, 1), (3, 0, 0, 4)),
    ((5, 6), (2, 2), (1, 1), (1, 1), (4, 4, 4, 4)),  # whole windows inside the padding
    ((7, 7), (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
    ((7, 7), (1, 1), (1, 1), (1, 1), (1, 0, 2, 1)),
    ((13,), (5,), (3,), (2,), (4, 1)),
    ((5, 4, 6), (3, 2, 3), (1, 2, 2), (1, 1, 2), (1, 0, 2, 1, 1, 0)),
]


@pytest.mark.parametrize("spatial, kernel, strides, dilations, pads", CASES)
def test_conv_matches_direct_definition(rng, spatial, kernel, strides, dilations, pads):
    x = rng.standard_normal((2, 4, *spatial)).astype(np.float32)
    w = rng.standard_normal((6, 4, *kernel)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = {"group": 1, "strides": list(strides), "dilations": list(dilations), "pads": list(pads)}
    (y,) = OPS["Conv"].kernel(attrs, x, w, b)
    expected = reference_conv(x, w, strides, dilations, pads) + b.reshape(1, -1, *[1] * len(kernel))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spatial, kernel, strides, dilations, pads", CASES)
def test_max_pool_matches_direct_definition(rng, spatial, kernel, strides, dilations, pads):
    x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
    pads = [min(p, k - 1) for p, k in zip(pads, kernel * 2)]  # ONNX: pads smaller than kernel
    nd = len(kernel)
    attrs = {
        "kernel_shape": list(kernel),
        "strides": list(strides),
        "dilations": list(dilations),
        "pads": pads,
        "ceil_mode": 0,
    }
    (y,) = OPS["MaxPool"].kernel(attrs, x)
    xp = np.pad(
        x, [(0, 0), (0, 0), *((pads[i], pads[i + nd]) for i in range(nd))], constant_values=-np.inf
    )
    for position in itertools.product(*map(range, y.shape[2:])):
        window = tuple(
            slice(p * s, p * s + d * (k - 1) + 1, d)
            for p, s, d, k in zip(position, strides, dilations, kernel)
        )
        expected = xp[(slice(None), slice(None), *window)].max(axis=tuple(range(2, 2 + nd)))
        np.testing.assert_array_equal(y[(slice(None), slice(None), *position)], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spatial, kernel, strides, dilations, pads", CASES)
def test_depthwise_blocks_sum_taps_in_kernel_order(
    rng, monkeypatch, dtype, spatial, kernel, strides, dilations, pads
):
    """The blocked depthwise kernel (several channel blocks here) is bit for bit the sum of
    the taps in kernel order from zero, and the direct definition within float tolerance."""
    from onebuild.graph_ir.ops import conv

    x = rng.standard_normal((2, 7, *spatial)).astype(dtype)
    w = rng.standard_normal((7, 1, *kernel)).astype(dtype)
    attrs = {"group": 7, "strides": list(strides), "dilations": list(dilations), "pads": list(pads)}
    xp = conv.pad_spatial(x, list(pads))
    view = conv.window_view(xp, kernel, strides, dilations)
    expected = np.zeros(view.shape[: 2 + len(kernel)], dtype)
    for index, offset in enumerate(np.ndindex(*kernel)):
        tap = w.reshape(7, -1)[:, index].reshape((1, -1) + (1,) * len(kernel))
        expected += view[(Ellipsis, *offset)] * tap
    monkeypatch.setattr(conv, "DEPTHWISE_BLOCK_BYTES", 3 * expected[0, 0].nbytes)
    (y,) = OPS["Conv"].kernel(attrs, x, w)
    assert y.dtype == dtype and y.tobytes() == expected.tobytes()
    full = np.zeros((7, 7, *kernel), dtype)  # the same conv with group 1
    full[np.arange(7), np.arange(7)] = w[:, 0]
    direct = reference_conv(x, full, strides, dilations, pads)
    np.testing.assert_allclose(y, direct, rtol=1e-5, atol=1e-5)


def test_window_matrices_in_a_kept_buffer_give_what_new_arrays_give(rng, monkeypatch):
    """Conv's window matrix lives in its thread's kept buffer: convolutions of different
    shapes one after another, and on two threads at once, give the bits of new arrays."""
    from concurrent.futures import ThreadPoolExecutor

    from onebuild.graph_ir.ops import conv

    attrs = {"group": 1, "strides": [1, 2], "dilations": [1, 1], "pads": [1, 1, 0, 2]}
    cases = [
        (rng.standard_normal((2, 4, 9, 7)), rng.standard_normal((3, 4, 3, 3))),
        (rng.standard_normal((1, 6, 5, 5)), rng.standard_normal((2, 6, 3, 2))),
        (rng.standard_normal((3, 5, 12, 11)), rng.standard_normal((4, 5, 2, 3))),
    ]
    cases = [(x.astype(np.float32), w.astype(np.float32)) for x, w in cases] + cases
    monkeypatch.setattr(conv, "SCRATCH_BYTES", 0)  # every window matrix a new array
    fresh = [OPS["Conv"].kernel(attrs, x, w)[0] for x, w in cases]
    monkeypatch.setattr(conv, "SCRATCH_BYTES", 1 << 28)
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            kept = list(pool.map(lambda case: OPS["Conv"].kernel(attrs, *case)[0], cases))
            for want, got in zip(fresh, kept):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    for (x, w), want in zip(cases, fresh):  # and on this thread
        np.testing.assert_array_equal(
            OPS["Conv"].kernel(attrs, x, w)[0].view(np.uint8), want.view(np.uint8)
        )
    assert conv._scratch.buffer.nbytes > 0  # the main thread's matrices were kept too
