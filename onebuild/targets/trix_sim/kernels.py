"""Compiled kernels of the TRIX simulator, optional (extra `fast`: numba): one pass over the
data where numpy makes several (requantization) or casts in buffered chunks (int64 sums of
codes, codes less a zero point as float32). Each does the same operations in the same
precisions as the numpy code it replaces (no fast-math, so no fused multiply-adds nor
reordering; integer sums are exact in any order), so outputs are bit-identical.
`ONEBUILD_NUMBA=0` keeps the numpy path.

Loaded once per process, when a simulator runs a second time (`Simulator.run`): numba's
import and the loading of the machine code it caches on disk (`cache=True`) cost about 0.45 s,
the first compile on a machine about 0.8 s more, which a one-sample run would not win back
(squeezenet saves about 3 ms a run). From then on every simulator of the process uses them."""

import os
from types import SimpleNamespace

import numpy as np

use = os.environ.get("ONEBUILD_NUMBA", "1") != "0"  # tests switch it to force either path
_loaded: list = []  # [the kernels, or None where numba is missing], once loaded


def load() -> None:
    """Makes the kernels available to `compiled` from now on where numba is installed and
    `use` is on (they compile, or load from numba's cache, at their first call)."""
    if use and not _loaded:
        try:
            import numba
        except Exception:  # missing, or a numba that cannot load (its LLVM, its numpy range)
            _loaded.append(None)
        else:
            jit = numba.njit(cache=True, nogil=True)
            kernels = {
                "requantize": jit(_requantize),
                "row_sums": jit(_row_sums),
                "center": jit(_center),
            }
            _loaded.append(SimpleNamespace(**kernels))


def compiled() -> SimpleNamespace | None:
    """The kernels once `load`ed; None before, where numba is missing or where `use` is off."""
    return _loaded[0] if use and _loaded else None


def _requantize(acc, bias32, scale, offset, zp, qmin, qmax, table, out):
    """out[i, j] = clip(rint(t) + zp, qmin, qmax) per row i (a channel), with t = float64(acc
    + bias32[i]) * scale[i] (the sum in float32) where bias32 has a value per row, else t =
    float64(acc) * scale[i] + offset[i]: `exact.requantize_float`, operation for operation;
    then table[the code's bits] where `table` is not empty (`exact.lookup`)."""
    rows, n = acc.shape
    narrow, mapped, bits = len(bias32) == rows, len(table) > 0, len(table) - 1
    for i in range(rows):
        s, o = scale[i], offset[i]
        b = bias32[i] if narrow else np.float32(0)
        for j in range(n):
            t = np.float64(acc[i, j] + b) * s if narrow else np.float64(acc[i, j]) * s + o
            out[i, j] = min(max(np.rint(t) + zp, qmin), qmax)
        if mapped:  # a second loop: the first stays vectorized
            for j in range(n):
                out[i, j] = table[np.int64(out[i, j]) & bits]


def _row_sums(codes, out):
    """out[i] = the int64 sum of row i of `codes` (a global pool's windows: integers, exact in
    any order)."""
    for i in range(codes.shape[0]):
        total = 0
        for j in range(codes.shape[1]):
            total += codes[i, j]
        out[i] = total


def _center(x, zp, out):
    """out[c, i w + j] = float32(x[c, i, j]) - zp (zp a float32): a 1x1 convolution's GEMM
    operand (`convolve.centered_codes`)."""
    c, h, w = x.shape
    for i in range(c):
        for j in range(h):
            for k in range(w):
                out[i, j * w + k] = np.float32(x[i, j, k]) - zp
