"""Data-movement layers of the TRIX NPU: slice (Slice, Split), transpose, pad, depth_to_space
and resize. Each runs as tiles of output channels: a tile DMAs the box of the input it reads
(`source_box`: a range of input channels, rows or columns, the rest whole) into SRAM, moves it
on chip (`move_tile`) and stores the output channels. Shared by codegen (what to load), the
simulator (what EXEC computes) and the .tvn decoder (`output_shape`, to check a layer against
its tensors). Tensors are (C, H, W) of one sample, as everywhere in the target.
"""

import numpy as np

from .lower import PAD_MODES, Layer

MOVES = ("slice", "transpose", "pad", "depth_to_space", "resize")
RESIZE_SHIFT = 8  # resize taps are integers in units of 2^-8 per axis


def source_box(layer: Layer, shape: tuple[int, int, int], o0: int, o1: int):
    """(axis, lo, hi): output channels [o0, o1) read input axis `axis` in [lo, hi), the other
    axes whole."""
    a = layer.attrs
    if layer.kind == "slice":
        start, step = a["starts"][0], a["steps"][0]
        return 0, start + o0 * step, start + (o1 - 1) * step + 1
    if layer.kind == "transpose":
        return a["perm"][0], o0, o1
    if layer.kind == "depth_to_space":
        b2 = a["blocksize"] ** 2
        return (0, o0 * b2, o1 * b2) if a["crd"] else (0, 0, shape[0])
    return 0, o0, o1  # pad, resize: channel by channel


def box_shape(layer: Layer, shape: tuple[int, int, int], o0: int, o1: int) -> tuple:
    axis, lo, hi = source_box(layer, shape, o0, o1)
    return tuple(hi - lo if i == axis else n for i, n in enumerate(shape))


def move_tile(layer: Layer, box: np.ndarray, o0: int, o1: int) -> np.ndarray:
    """Output channels [o0, o1) from the input box `source_box` names."""
    a = layer.attrs
    if layer.kind == "slice":
        (_, _, sc), (h0, h1, sh), (w0, w1, sw) = zip(a["starts"], a["ends"], a["steps"])
        return box[::sc, h0:h1:sh, w0:w1:sw]
    if layer.kind == "transpose":
        return box.transpose(a["perm"])
    if layer.kind == "pad":
        top, left, bottom, right = a["pads"]
        grow = ((0, 0), (top, bottom), (left, right))
        mode = PAD_MODES[a["mode"]]
        if mode == "constant":
            return np.pad(box, grow, constant_values=np.asarray(a["value"]).astype(box.dtype))
        return np.pad(box, grow, mode=mode)
    if layer.kind == "depth_to_space":
        b = a["blocksize"]
        _, h, w = box.shape
        if a["crd"]:
            y = box.reshape(o1 - o0, b, b, h, w).transpose(0, 3, 1, 4, 2)
        else:
            y = box.reshape(b, b, -1, h, w)[:, :, o0:o1].transpose(2, 3, 0, 4, 1)
        return y.reshape(o1 - o0, h * b, w * b)
    rows, cols = layer.arrays["rows"].astype(np.int64), layer.arrays["cols"].astype(np.int64)
    acc = np.einsum("oh,chw,pw->cop", rows, box.astype(np.int64), cols)
    return _round_half_even(acc, 2 * RESIZE_SHIFT).astype(box.dtype)


def _round_half_even(acc: np.ndarray, shift: int) -> np.ndarray:
    """acc / 2^shift rounded to the nearest integer, ties to even (as numpy's rint)."""
    q = acc >> shift
    rest = acc - (q << shift)
    half = 1 << (shift - 1)
    return q + ((rest > half) | ((rest == half) & (q & 1 == 1)))


def output_shape(layer: Layer, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (C, H, W) a move layer makes of an input of `shape` (for validation)."""
    a = layer.attrs
    if layer.kind == "slice":
        return tuple(len(range(*x)) for x in zip(a["starts"], a["ends"], a["steps"]))
    if layer.kind == "transpose":
        return tuple(shape[p] for p in a["perm"])
    if layer.kind == "pad":
        top, left, bottom, right = a["pads"]
        return shape[0], shape[1] + top + bottom, shape[2] + left + right
    if layer.kind == "depth_to_space":
        b = a["blocksize"]
        return shape[0] // (b * b), shape[1] * b, shape[2] * b
    return shape[0], len(layer.arrays["rows"]), len(layer.arrays["cols"])


def _attrs_fit(layer: Layer, shape: tuple[int, int, int]) -> bool:
    a = layer.attrs
    if layer.kind == "slice":
        bounds = zip(a["starts"], a["ends"], a["steps"], shape)
        return all(0 <= lo <= n and 0 <= hi <= n and st > 0 for lo, hi, st, n in bounds)
    if layer.kind == "transpose":
        return sorted(a["perm"]) == [0, 1, 2]
    if layer.kind == "pad":
        return 0 <= a["mode"] < len(PAD_MODES)
    if layer.kind == "depth_to_space":
        return a["blocksize"] >= 1 and shape[0] % a["blocksize"] ** 2 == 0
    rows, cols = layer.arrays["rows"], layer.arrays["cols"]
    return rows.ndim == cols.ndim == 2 and (rows.shape[1], cols.shape[1]) == shape[1:]


def valid(layer: Layer, shape: tuple[int, int, int], out: tuple[int, int, int]) -> bool:
    """Whether a decoded move layer's attributes fit its input `shape` and output `out` (a
    list where an integer belongs, or the reverse, does not)."""
    try:
        return _attrs_fit(layer, shape) and output_shape(layer, shape) == tuple(out)
    except (TypeError, ValueError, IndexError, KeyError):
        return False
