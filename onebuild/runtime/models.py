"""What a Session runs: an IR model in the interpreter, a target's binary (a .tvn: the TRIX
simulator), or an nnpackage in the package runtime; float32 in and out, one sample at a time.
Each lists the inputs it quantizes (`quantized_inputs`), which must be finite."""

from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..graph_ir.interpreter import Interpreter
from ..graph_ir.ir import Graph
from ..graph_ir.quant.model_io import dequantize_outputs, is_quantized, quantize_inputs
from ..targets import binary_target
from ..targets.binary import Binary, run_binary
from ..targets.host_cpu import HostCpu
from .package import load_package, run_package


class GraphModel:
    """An IR model in the interpreter; float data converted for quantized I/O."""

    def __init__(self, graph: Graph):
        self.graph, self.interpreter = graph, Interpreter(graph)
        self.quantized_inputs = [v.name for v in graph.inputs if is_quantized(v)]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.interpreter.run(quantize_inputs(self.graph, feeds))
        return dequantize_outputs(self.graph, outputs)


class BinaryModel:
    """A target's binary, run through its target."""

    def __init__(self, binary: Binary):
        self.binary, self.summary = binary, None  # the last inference's performance
        self.quantized_inputs = [t.name for t in binary.inputs]  # NPU I/O is quantized

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = {k: v[None] for k, v in feeds.items()}
        outputs, self.summary = run_binary(self.binary, batch, False)
        return {name: array[0] for name, array in outputs.items()}

    def cost(self, cpu: HostCpu) -> tuple[float, int]:
        """Latency (µs: simulated, plus the invocation and the I/O handoffs) and memory."""
        handoffs = len(self.binary.inputs) + len(self.binary.outputs)
        latency = self.summary["milliseconds"] * 1e3 + cpu.npu_invoke_us + cpu.handoff_us * handoffs
        return latency, self.binary.memory_bytes


class PackageModel:
    """An nnpackage in the package runtime (NPU parts simulated, CPU parts interpreted)."""

    def __init__(self, package):
        self.package, self.reports = package, []
        self.quantized_inputs = [spec.name for spec in package.inputs if spec.quantized]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = {k: v[None] for k, v in feeds.items()}
        outputs, self.reports = run_package(self.package, batch)
        return {name: array[0] for name, array in outputs.items()}

    def cost(self, cpu: HostCpu) -> tuple[float, int]:
        """Latency (µs: NPU parts simulated, CPU parts estimated, each handoff) and memory."""
        latency = cpu.handoff_us * sum(len(targets) for _, targets in self.package.manifest.connect)
        memory = 0
        for model, report in zip(self.package.models, self.reports):
            if report is None:
                latency += cpu.graph_us(model.program)
                memory += cpu.memory_bytes(model.program)
            else:
                latency += report["milliseconds"] * 1e3 + cpu.npu_invoke_us
                memory += model.program.memory_bytes
        return latency, memory


def compiled_model(path: Path):
    """A compiled model: one binary, or a package of NPU and CPU parts."""
    if path.is_dir():
        return PackageModel(load_package(path))
    return BinaryModel(load_binary(path))


def load_binary(path: Path) -> Binary:
    """The binary at `path`, loaded by the installed target that recognizes it."""
    target = binary_target(path)
    if target is None:
        raise FormatError(f"{path}: not a compiled binary of any installed target")
    return target.load(path)


def package_latency(package, reports: list[dict | None], cpu: HostCpu) -> dict:
    """One inference of a package run by `run_package` (its `reports`), counted as the
    partitioner's estimate counts it: NPU parts simulated plus an invocation each, CPU parts
    estimated, and a handoff for each tensor passed between the CPU and an NPU part (one per
    connection that crosses, and each package input or output of an NPU part)."""
    on_npu = [report is not None for report in reports]
    handed = [
        package.models[source.model].outputs[source.io]
        for source, targets in package.manifest.connect
        if any(on_npu[t.model] != on_npu[source.model] for t in targets)
    ]
    for refs, side in (
        (package.manifest.pkg_inputs, "inputs"),
        (package.manifest.pkg_outputs, "outputs"),
    ):
        handed += [getattr(package.models[r.model], side)[r.io] for r in refs if on_npu[r.model]]
    handoffs = sum(
        cpu.handoff_bytes(int(np.prod(spec.dims)) * np.dtype(spec.dtype).itemsize)
        for spec in handed
    )
    npu = sum(r["milliseconds"] * 1e3 + cpu.npu_invoke_us for r in reports if r is not None)
    host = sum(cpu.graph_us(m.program) for m, r in zip(package.models, reports) if r is None)
    return {
        "microseconds": npu + host + handoffs,
        "npu_parts": sum(on_npu),
        "invoke_us": cpu.npu_invoke_us,
        "handoffs": len(handed),
        "handoff_us": handoffs,
    }
