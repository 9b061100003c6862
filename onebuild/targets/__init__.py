"""Compilation targets: a `Target` protocol and discovery through entry points.

A target is any object registered in the `onebuild.targets` entry-point group (pyproject:
`[project.entry-points."onebuild.targets"] name = "package.module:Class"`); trix_sim registers
itself exactly this way. onebuild only talks to targets through this protocol.
"""

from importlib.metadata import entry_points
from typing import Any, Protocol

import numpy as np

from ..errors import UserError
from ..graph_ir.ir import Graph, Node

GROUP = "onebuild.targets"


class Target(Protocol):
    name: str

    def supports(self, node: Node, hw: str) -> list[str]:
        """Why `node` cannot run on the target (empty when it can)."""

    def lower(self, graph: Graph, hw: str) -> Any:
        """The target's op descriptions of a quantized graph (raises if unsupported)."""

    def encode(self, graph: Graph, hw: str, pref: str, meta: dict) -> bytes:
        """A compiled binary of `graph`."""

    def estimate(self, graph: Graph, hw: str) -> dict:
        """The performance model's estimate without compiling: `cycles`, `microseconds`,
        `roofline_cycles`, `macs` and per-layer `layers` (cycles, DRAM bytes)."""

    def simulate(self, binary: bytes, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
        """Run a compiled binary: (outputs, performance report)."""

    def describe(self) -> dict:
        """Hardware presets and the supported-operator constraints, for `onebuild targets`."""


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def target_module(name: str) -> str | None:
    """The module that implements target `name` (None if no such target is installed)."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    return found[0].value.split(":")[0] if found else None


def load_target(name: str) -> Target:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(available()) or "none installed"
        raise UserError(f"unknown target '{name}' (known: {known})")
    return found[0].load()()
