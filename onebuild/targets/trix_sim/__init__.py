"""The simulated TRIX NPU: hardware presets, constraints, lowering, codegen, .tvn, simulator.

`TrixSim` is the `Target` that onebuild discovers through the `onebuild.targets` entry point.
"""

from dataclasses import asdict

import numpy as np

from ... import __version__
from ...graph_ir.ir import Graph, Node
from .codegen import generate
from .constraints import CONSTRAINTS, reason, unsupported
from .hardware import load_hardware, presets
from .lower import Program, lower
from .perf import estimate
from .simulator import Simulator
from .tvn import decode, encode


class TrixSim:
    name = "trix_sim"

    def supports(self, node: Node, hw: str) -> list[str]:
        return unsupported(node, load_hardware(hw))

    def lower(self, graph: Graph, hw: str) -> Program:
        return lower(graph, load_hardware(hw))

    def encode(self, graph: Graph, hw: str, pref: str = "performance", meta=None) -> bytes:
        hardware = load_hardware(hw)
        meta = {"compiler": f"onebuild {__version__}", **(meta or {})}
        return encode(generate(lower(graph, hardware), hardware, pref, meta))

    def estimate(self, graph: Graph, hw: str) -> dict:
        hardware = load_hardware(hw)
        return estimate(lower(graph, hardware), hardware)

    def describe(self) -> dict:
        return {
            "presets": {name: asdict(load_hardware(name)) for name in presets()},
            "constraints": {c.__name__: reason(c) for c in CONSTRAINTS},
        }

    def simulate(self, binary: bytes, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
        module = decode(binary)
        hardware = load_hardware(module.meta["hardware"])
        outputs, report = Simulator(module, hardware).run(inputs)
        return outputs, report.summary(hardware, module)
