"""The simulated TRIX NPU: hardware presets, constraints, lowering, codegen, .tvn, simulator.

`TrixSim` is the `Target` that onebuild discovers through the `onebuild.targets` entry point.
"""

import os
from dataclasses import asdict

from ... import __version__
from ...graph_ir.ir import Graph, Node
from .codegen import generate
from .constraints import CONSTRAINTS, reason, unsupported
from .hardware import load_hardware, presets
from .lower import Program, lower
from .perf import estimate
from .runner import TvnBinary
from .tvn import MAGIC, encode, load_tvn


class TrixSim:
    name = "trix_sim"
    backend = "trix"
    model_type = "tvn"
    magic = MAGIC

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

    def load(self, path: str | os.PathLike) -> TvnBinary:
        return TvnBinary(load_tvn(path))
