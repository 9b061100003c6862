"""Running and describing .tvn files for the CLI: batches of float or raw quantized data."""

from collections import Counter

import numpy as np

from ...errors import UserError
from ...graph_ir.quant.params import dequantize, quantize
from .codegen import EXEC, LOAD, STORE, Module
from .hardware import load_hardware
from .simulator import Simulator


def run_batches(module: Module, feeds: dict[str, np.ndarray], raw: bool):
    """Outputs for `[N, *dims]` inputs (float, quantized with the I/O parameters, unless raw)
    and the performance summary of one inference."""
    hw = load_hardware(module.meta.get("hardware", "?"))
    for name in module.inputs:
        if name not in feeds:
            raise UserError(f"missing input '{name}'; inputs given: {', '.join(sorted(feeds))}")
        dims = module.tensors[name].dims
        if tuple(np.shape(feeds[name])[1:]) != dims:
            raise UserError(
                f"input '{name}' has shape {list(np.shape(feeds[name]))}, "
                f"expected [N, {', '.join(map(str, dims))}]"
            )
    count = len(feeds[module.inputs[0]]) if module.inputs else 1
    results, report = [], None
    for index in range(count):
        sample = {}
        for name in module.inputs:
            t, x = module.tensors[name], np.asarray(feeds[name][index])
            if raw:
                if x.dtype != np.dtype(t.dtype):
                    raise UserError(f"input '{name}' is {x.dtype}; --raw needs {t.dtype} codes")
                sample[name] = x
            else:
                sample[name] = quantize(x.astype(np.float64), module.tensors[name].params, t.dtype)
        outputs, report = Simulator(module, hw).run(sample)
        results.append(outputs)
    stacked = {n: np.stack([r[n] for r in results]) for n in module.outputs}
    if not raw:
        stacked = {n: dequantize(a, module.tensors[n].params) for n, a in stacked.items()}
    return stacked, report.summary(hw, module)


def describe(module: Module) -> dict:
    """Header, I/O segments, instruction counts and the performance summary (one inference)."""
    hw = load_hardware(module.meta.get("hardware", "?"))
    zeros = {
        n: np.full(module.tensors[n].dims, module.tensors[n].zero_point, module.tensors[n].dtype)
        for n in module.inputs
    }
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
