"""A second, tiny onebuild target, registered through the `onebuild.targets` entry-point group
by its own distribution metadata (tests put this folder on PYTHONPATH).

Its "NPU" runs quantized convolutions and additions only; a binary is the part's IR file behind
a magic, run by the reference interpreter. Nothing of onebuild names it: recipes select it with
`[codegen] target = "tiny"`, packages with the model type "tiny".
"""

import os
import tempfile
from pathlib import Path

from onebuild.errors import FormatError, ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Model
from onebuild.graph_ir.serde import load_ir, save_ir
from onebuild.targets.binary import BinaryTensor

RUNS = {"QConv", "QAdd"}
MAGIC = b"TINY\0"


class TinyTarget:
    name = "tiny"
    backend = "tiny"
    model_type = "tiny"
    magic = MAGIC

    def supports(self, node, hw):
        reasons = [] if node.op in RUNS else [f"{node.op} is not a tiny operation"]
        for value in [*node.inputs, *node.outputs]:
            if value is not None and value.quant is None and value.const is None:
                reasons.append(f"'{value.name}' is not quantized")
        return reasons

    def lower(self, graph, hw):
        problems = [r for node in graph.nodes for r in self.supports(node, hw)]
        if problems:
            raise ModelError(f"graph '{graph.name}' cannot run on tiny: {'; '.join(problems)}")
        return graph

    def encode(self, graph, hw, pref="performance", meta=None):
        self.lower(graph, hw)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "part.obir"
            save_ir(Model([graph]), path)
            return MAGIC + path.read_bytes()

    def estimate(self, graph, hw):
        cycles = 100 * len(graph.nodes)
        return {"cycles": cycles, "microseconds": cycles / 1000.0, "roofline_cycles": cycles,
                "macs": 0, "layers": {}}  # fmt: skip

    def describe(self):
        return {"presets": {"tiny-1": {}}, "constraints": {"ops": sorted(RUNS)}}

    def load(self, path: str | os.PathLike):
        data = Path(path).read_bytes()
        if not data.startswith(MAGIC):
            raise FormatError(f"{path}: not a tiny binary")
        with tempfile.TemporaryDirectory() as folder:
            ir = Path(folder) / "part.obir"
            ir.write_bytes(data[len(MAGIC) :])
            graph = load_ir(ir).main
        return TinyBinary(str(path), graph)


class TinyBinary:
    def __init__(self, source: str, graph):
        self.source, self.graph = source, graph
        self.inputs = [_tensor(v) for v in graph.inputs]
        self.outputs = [_tensor(v) for v in graph.outputs]
        self.memory_bytes = int(sum(v.const.nbytes for v in graph.constants.values()))

    def run(self, sample):
        outputs = Interpreter(self.graph).run(sample)
        return outputs, {"cycles": 100 * len(self.graph.nodes), "milliseconds": 0.0001}

    def describe(self):
        io = [{"name": t.name, "dims": list(t.dims), "dtype": t.dtype} for t in self.inputs]
        return {
            "meta": {"target": "tiny"},
            "inputs": io,
            "outputs": [],
            "nodes": len(self.graph.nodes),
        }

    def report(self, info):
        return [f"tiny binary: {info['nodes']} node(s), inputs {info['inputs']}"]


def _tensor(value) -> BinaryTensor:
    return BinaryTensor(value.name, value.dtype.name, tuple(value.shape), value.quant)
