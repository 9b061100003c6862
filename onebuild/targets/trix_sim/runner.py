"""A .tvn program as a `Binary`: one inference in the simulator, and its description."""

import contextlib
from collections import Counter

import numpy as np

from ...errors import FormatError, UserError
from ..binary import BinaryTensor
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


class TvnBinary:
    """A .tvn program as a `Binary` (targets/binary.py): run in the simulator."""

    def __init__(self, module: Module):
        self.module = module
        self.source = getattr(module, "source", "")
        self.inputs = [_tensor(module.tensors[n]) for n in module.inputs]
        self.outputs = [_tensor(module.tensors[n]) for n in module.outputs]
        self.memory_bytes = module.dram_bytes
        self._simulator: Simulator | None = None  # kept: later runs reuse what the first set up

    def run(self, sample: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
        hw = _hardware(self.module)
        with _naming_the_file(self.module):
            if self._simulator is None:
                self._simulator = Simulator(self.module, hw)
            try:
                outputs, report = self._simulator.run(sample)
            except BaseException:
                self._simulator = None  # a run that failed half-way leaves nothing to reuse
                raise
        return outputs, report.summary(hw, self.module)

    def describe(self) -> dict:
        return describe(self.module)

    def report(self, info: dict) -> list[str]:
        return report(info)


def _tensor(t) -> BinaryTensor:
    return BinaryTensor(t.name, t.dtype, tuple(t.dims), t.params)


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
    for index, layer in enumerate(summary["layers_table"].values()):
        layer["index"] = index  # execution order (JSON output sorts the table by name)
    summary["layers_without_instructions"] = [  # reshapes, fused Adds and pools: not timed
        layer.name for layer in module.layers if layer.name not in summary["layers_table"]
    ]
    return {
        "meta": module.meta,
        "inputs": [io(n) for n in module.inputs],
        "outputs": [io(n) for n in module.outputs],
        "layers": len(module.layers),
        "instructions": dict(sorted(ops.items())),
        "weight_bytes": len(module.blob),
        **summary,
    }


def report(info: dict) -> list[str]:
    """`describe()` as text for people: header, I/O, instructions, cycles, per layer."""
    lines = []
    meta = info["meta"]
    lines.append(
        f"TRIX binary for {meta.get('hardware')} ({meta.get('pref')}), {meta.get('compiler')}"
    )
    for kind in ("inputs", "outputs"):
        lines.append(f"{kind}:")
        for v in info[kind]:
            lines.append(
                f"  {v['name']}: {v['dtype']}{v['dims']} {v['layout']} "
                f"scale={v['scale']:.6g} zero_point={v['zero_point']}"
            )
    counts = ", ".join(f"{n} {op}" for op, n in info["instructions"].items())
    untimed = info.get("layers_without_instructions", [])
    quiet = f" ({len(untimed)} without instructions: {', '.join(untimed)})" if untimed else ""
    lines.append(
        f"{info['layers']} layers{quiet}, instructions: {counts}; weights "
        f"{info['weight_bytes']} bytes"
    )
    lines.append(
        f"cycles: {info['cycles']:,} ({info['milliseconds']} ms); roofline "
        f"{info['roofline_cycles']:,} (x{info['roofline_ratio']}); MAC utilization "
        f"{info['mac_utilization']:.1%}; DRAM {info['dram_bytes']:,} bytes; SRAM peak "
        f"{info['sram_peak_bytes']:,}; arena {info['arena_bytes']:,}"
    )
    lines.append(
        "layer                          kind       cycles    compute        DMA   DRAM bytes"
    )
    for name, layer in info["layers_table"].items():
        lines.append(
            f"  {name[:28]:<28} {layer['kind']:<8} {layer['cycles']:>9,} "
            f"{layer['compute_cycles']:>10,} {layer['dma_cycles']:>10,} {layer['dram_bytes']:>12,}"
        )
    lines.append(
        "(cycles: the layer's share of the total; compute / DMA: busy cycles of each engine)"
    )
    return lines
