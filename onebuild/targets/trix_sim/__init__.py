"""The simulated TRIX NPU: hardware presets, constraints, lowering, codegen, .tvn, simulator.

`TrixSim` is the `Target` that onebuild discovers through the `onebuild.targets` entry point.
Its modules load when a method needs them: finding the target (a build naming its outputs, the
CLI recognizing a file) costs no numpy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .opcodes import MAGIC  # a leaf: finding the target loads neither numpy nor the encoder

if TYPE_CHECKING:
    from ...graph_ir.ir import Graph, Node
    from .lower import Program
    from .runner import TvnBinary


class TrixSim:
    name = "trix_sim"
    backend = "trix"
    model_type = "tvn"
    magic = MAGIC
    channel_dtypes = ("uint8",)  # 8-bit tables per channel (int16 ones are interpolated)
    default_hw = "trix-m"  # the preset compiled for when none is named

    def supports(self, node: Node, hw: str) -> list[str]:
        from .hardware import load_hardware
        from .lower import unsupported

        return unsupported(node, load_hardware(hw))

    def lower(self, graph: Graph, hw: str) -> Program:
        from .hardware import load_hardware
        from .lower import lower

        return lower(graph, load_hardware(hw))

    def encode(self, graph: Graph, hw: str, pref: str = "performance", meta=None) -> bytes:
        from ...version import __version__
        from .codegen import generate
        from .hardware import load_hardware
        from .lower import lower
        from .tvn import encode

        hardware = load_hardware(hw)
        meta = {"compiler": f"onebuild {__version__}", **(meta or {})}
        return encode(generate(lower(graph, hardware), hardware, pref, meta))

    def estimate(self, graph: Graph, hw: str) -> dict:
        from .hardware import load_hardware
        from .lower import lower
        from .perf import estimate

        hardware = load_hardware(hw)
        return estimate(lower(graph, hardware), hardware)

    def describe(self) -> dict:
        from dataclasses import asdict

        from .constraints import reason
        from .hardware import load_hardware, presets
        from .lower import LOWERINGS

        constraints = {c: None for lowering in LOWERINGS.values() for c in lowering.constraints}
        return {
            "presets": {name: asdict(load_hardware(name)) for name in presets()},
            "ops": {op: [c.__name__ for c in lw.constraints] for op, lw in LOWERINGS.items()},
            "constraints": {c.__name__: reason(c) for c in constraints},
        }

    def load(self, path: str | os.PathLike) -> TvnBinary:
        from .runner import TvnBinary
        from .tvn import load_tvn

        return TvnBinary(load_tvn(path))
