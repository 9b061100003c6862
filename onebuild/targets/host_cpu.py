"""A cost model of the host CPU that runs the parts an NPU does not, and of CPU<->NPU handoffs.

One big core of a phone SoC: int8 dot-product SIMD, float SIMD, a per-operator dispatch cost and
DRAM bandwidth shared with the NPU. The figures are defaults a user can reason about, not a
measurement of any particular chip; partitioning only compares costs computed the same way.
"""

from dataclasses import dataclass

import numpy as np

from ..graph_ir.interpreter import release_schedule
from ..graph_ir.ir import Graph, Node, Value
from ..graph_ir.macs import MATMUL_LIKE, macs
from ..graph_ir.ops import OPS


@dataclass(frozen=True)
class HostCpu:
    name: str = "host-cpu"
    clock_mhz: int = 2000
    int_macs_per_cycle: int = 16  # int8 dot-product SIMD, one core
    float_macs_per_cycle: int = 8  # fp32 FMA SIMD
    elements_per_cycle: int = 4  # elementwise / pooling / lookup
    dram_bytes_per_cycle: int = 8
    op_overhead_us: float = 1.0  # kernel dispatch per operator
    handoff_us: float = 20.0  # one CPU<->NPU handoff (cache maintenance, signalling)
    npu_invoke_us: float = 50.0  # starting one NPU model (driver call, command stream)

    def node_us(self, node: Node) -> float:
        """Time of one node on the CPU: the larger of compute and memory traffic, plus dispatch."""
        out = node.outputs[0]
        integer = np.issubdtype(out.dtype, np.integer)
        rate = self.int_macs_per_cycle if integer else self.float_macs_per_cycle
        if node.op in MATMUL_LIKE:
            compute = macs(node) / rate
        elif OPS[node.op].view:
            compute = 0.0
        else:
            window = int(np.prod(node.attrs.get("kernel_shape", [1])))
            if node.op == "LRN":
                window = int(node.attrs.get("size", 1))
            compute = out.size * window / self.elements_per_cycle
        moved = sum(_nbytes(v) for v in [*node.inputs, *node.outputs] if v is not None)
        memory = moved / self.dram_bytes_per_cycle if compute else 0.0
        return max(compute, memory) / self.clock_mhz + self.op_overhead_us

    def graph_us(self, graph: Graph) -> float:
        """Time of running every node of `graph` on the CPU, one after another."""
        return sum(self.node_us(n) for n in graph.nodes)

    def memory_bytes(self, graph: Graph) -> int:
        """Memory to run `graph` on the CPU: its constants plus the peak of the activations
        alive at once (each freed after its last reader, as the interpreter does)."""
        read = {id(v): v for n in graph.nodes for v in n.inputs if v is not None}
        weights = sum(_nbytes(v) for v in read.values() if v.is_const)
        live = peak = sum(_nbytes(v) for v in graph.inputs)
        for node, released in zip(graph.nodes, release_schedule(graph)):
            live += sum(_nbytes(v) for v in node.outputs)
            peak = max(peak, live)
            live -= sum(_nbytes(read[value_id]) for value_id in released)
        return weights + peak

    def handoff(self, value: Value) -> float:
        """Handing one tensor between the CPU and the NPU (shared DRAM: sync plus one copy)."""
        return self.handoff_bytes(_nbytes(value))

    def handoff_bytes(self, nbytes: int) -> float:
        """Handing a tensor of `nbytes` bytes between the CPU and the NPU."""
        return self.handoff_us + nbytes / self.dram_bytes_per_cycle / self.clock_mhz


def _nbytes(value: Value) -> int:
    return value.size * value.dtype.itemsize
