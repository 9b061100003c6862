"""Running and describing .tvn files for the CLI: batches of float or raw quantized data."""

import contextlib
from collections import Counter

import numpy as np

from ...errors import FormatError, UserError
from ...graph_ir.quant.params import dequantize, quantize
from ...npz import check_finite, source_of
from .codegen import EXEC, LOAD, STORE, Module
from .hardware import load_hardware
from .simulator import Simulator


@contextlib.contextmanager
def _naming_the_file(module: Module):
    """Format errors the simulator finds (an instruction inconsistent with the program) name
    the .tvn file, as the decoder's do."""
    try:
        yield
    except FormatError as error:
        source = getattr(module, "source", "")
        if not source or str(error).startswith(source):
            raise
        raise FormatError(
            f"{source}: not a valid .tvn file: {error} (recompile the model to rewrite it)"
        ) from None


def _hardware(module: Module):
    """The preset the module was compiled for (an unknown one names the file)."""
    try:
        return load_hardware(module.meta.get("hardware", "?"))
    except UserError as error:
        source = getattr(module, "source", "")
        raise UserError(f"{source}: {error}" if source else str(error)) from None


def run_batches(module: Module, feeds: dict[str, np.ndarray], raw: bool):
    """Outputs for `[N, *dims]` inputs (float, quantized with the I/O parameters, unless raw)
    and the performance summary of one inference."""
    hw = _hardware(module)
    count = check_feeds(module, feeds, raw)
    results, report = [], None
    for index in range(count):
        sample = {}
        for name in module.inputs:
            t, x = module.tensors[name], np.asarray(feeds[name][index])
            if raw:
                sample[name] = x
            else:
                sample[name] = quantize(x.astype(np.float64), module.tensors[name].params, t.dtype)
        with _naming_the_file(module):
            outputs, report = Simulator(module, hw).run(sample)
        results.append(outputs)
    stacked = {n: np.stack([r[n] for r in results]) for n in module.outputs}
    if not raw:
        stacked = {n: dequantize(a, module.tensors[n].params) for n, a in stacked.items()}
    return stacked, report.summary(hw, module)


def check_feeds(module: Module, feeds: dict[str, np.ndarray], raw: bool) -> int:
    """One-line errors for inputs the program cannot take; returns the sample count.

    Every input must be given with shape `[N, *dims]`, N >= 1 and the same for all inputs;
    float data must be finite (NaN and Inf have no quantized code), raw data must already be
    the input's integer type."""
    where, counts = source_of(feeds), {}
    for name in module.inputs:
        if name not in feeds:
            given = ", ".join(sorted(feeds)) or "none"
            raise UserError(f"{where}: missing input '{name}'; inputs given: {given}")
        t, x = module.tensors[name], np.asarray(feeds[name])
        if x.ndim == 0 or tuple(x.shape[1:]) != t.dims or not len(x):
            raise UserError(
                f"{where}: input '{name}' has shape {list(x.shape)}, "
                f"expected [N, {', '.join(map(str, t.dims))}] with N >= 1"
            )
        if raw and x.dtype != np.dtype(t.dtype):
            raise UserError(f"{where}: input '{name}' is {x.dtype}; --raw needs {t.dtype} codes")
        if not raw and x.dtype.kind not in "biuf":
            raise UserError(f"{where}: input '{name}' has dtype {x.dtype}; expected numbers")
        counts[name] = len(x)
    if len(set(counts.values())) > 1:
        raise UserError(f"{where}: inputs have different sample counts: {counts}")
    if not raw:
        check_finite({n: feeds[n] for n in module.inputs}, where)
    return next(iter(counts.values()), 1)


def describe(module: Module) -> dict:
    """Header, I/O segments, instruction counts and the performance summary (one inference)."""
    hw = _hardware(module)
    zeros = {
        n: np.full(module.tensors[n].dims, module.tensors[n].zero_point, module.tensors[n].dtype)
        for n in module.inputs
    }
    with _naming_the_file(module):
        _, report = Simulator(module, hw).run(zeros)
    summary = report.summary(hw, module)

    def io(name: str) -> dict:
        t = module.tensors[name]
        return {"name": name, "dims": list(t.dims), "dtype": t.dtype, "layout": "NCHW",
                "scale": t.scale, "zero_point": t.zero_point}  # fmt: skip

    ops = Counter({LOAD: "LOAD", STORE: "STORE", EXEC: "EXEC"}[int(op)] for op in module.code[:, 0])
    summary["layers_table"] = summary.pop("layers")
    return {
        "meta": module.meta,
        "inputs": [io(n) for n in module.inputs],
        "outputs": [io(n) for n in module.outputs],
        "layers": len(module.layers),
        "instructions": dict(sorted(ops.items())),
        "weight_bytes": len(module.blob),
        **summary,
    }
