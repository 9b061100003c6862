"""Compiled binaries, target-independent: their I/O, and batches of float or raw data.

A target's `load` returns a `Binary`; everything outside the target (the CLI, packages, the
Session) runs and describes binaries through this protocol and `run_binary` only.
"""

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..errors import UserError
from ..graph_ir.quant.params import dequantize, quantize
from ..graph_ir.tensor import QuantParams
from ..npz import check_finite, refuse_codes, source_of
from ..progress import Progress


@dataclass(frozen=True)
class BinaryTensor:
    """An input or output of a binary: quantized data of `dtype`, shape `dims` (one sample)."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    quant: QuantParams


class Binary(Protocol):
    source: str  # the file it was loaded from
    inputs: list[BinaryTensor]
    outputs: list[BinaryTensor]
    memory_bytes: int  # device memory it needs (weights and activations)

    def run(self, sample: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
        """One inference on quantized arrays without a sample axis: the outputs and the
        performance summary (at least `cycles` and `milliseconds`)."""

    def describe(self) -> dict:
        """What `onebuild inspect --json` shows: `meta`, `inputs`, `outputs` (name, dims,
        dtype, scale, zero_point) and the performance report of one inference."""

    def report(self, info: dict) -> list[str]:
        """`describe()`'s result as lines of text for people (`onebuild inspect`)."""


def run_binary(binary: Binary, feeds: dict[str, np.ndarray], raw: bool):
    """Outputs for `[N, *dims]` inputs (float, quantized with the I/O parameters, unless raw)
    and the performance summary of one inference."""
    count = check_feeds(binary, feeds, raw)
    progress = Progress(f"run {binary.source or 'binary'}", count) if count > 1 else None
    results, summary = [], {}
    for index in range(count):
        sample = {}
        for t in binary.inputs:
            x = np.asarray(feeds[t.name][index])
            sample[t.name] = x if raw else quantize(x.astype(np.float64), t.quant, t.dtype)
        outputs, summary = binary.run(sample)
        results.append(outputs)
        if progress:
            progress(index + 1)
    if progress:
        progress.finish()
    stacked = {t.name: np.stack([r[t.name] for r in results]) for t in binary.outputs}
    if not raw:
        stacked = {t.name: dequantize(stacked[t.name], t.quant) for t in binary.outputs}
    return stacked, summary


def check_feeds(binary: Binary, feeds: dict[str, np.ndarray], raw: bool) -> int:
    """One-line errors for inputs the binary cannot take; returns the sample count.

    Every input must be given with shape `[N, *dims]`, N >= 1 and the same for all inputs;
    without `raw` data must be float (integer data could be codes or values) and finite (NaN
    and Inf have no quantized code), raw data must already be the input's integer type."""
    where, counts = source_of(feeds), {}
    for t in binary.inputs:
        if t.name not in feeds:
            given = ", ".join(sorted(feeds)) or "none"
            raise UserError(f"{where}: missing input '{t.name}'; inputs given: {given}")
        x = np.asarray(feeds[t.name])
        if x.ndim == 0 or tuple(x.shape[1:]) != t.dims or not len(x):
            raise UserError(
                f"{where}: input '{t.name}' has shape {list(x.shape)}, "
                f"expected [N, {', '.join(map(str, t.dims))}] with N >= 1"
            )
        if raw and x.dtype != np.dtype(t.dtype):
            raise UserError(f"{where}: input '{t.name}' is {x.dtype}; --raw needs {t.dtype} codes")
        if not raw:  # integer data could be codes or values: never guessed
            refuse_codes(t.name, x, where)
            if x.dtype.kind != "f":
                raise UserError(f"{where}: input '{t.name}' has dtype {x.dtype}; expected floats")
        counts[t.name] = len(x)
    if len(set(counts.values())) > 1:
        raise UserError(f"{where}: inputs have different sample counts: {counts}")
    if not raw:
        check_finite({t.name: feeds[t.name] for t in binary.inputs}, where)
    return next(iter(counts.values()), 1)
