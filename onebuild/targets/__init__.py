"""Compilation targets: a `Target` protocol and discovery through entry points.

A target is any object registered in the `onebuild.targets` entry-point group (pyproject:
`[project.entry-points."onebuild.targets"] name = "package.module:Class"`); trix_sim registers
itself exactly this way. onebuild only talks to targets through this protocol: it compiles
graphs with `encode`, and loads, runs and describes the binaries with `load` (a `Binary`,
`targets/binary.py`); a package names each model's type, and the target of that type runs it.
"""

from __future__ import annotations

import os
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UserError

if TYPE_CHECKING:  # finding targets loads no numpy: a no-op build needs their names only
    from ..graph_ir.ir import Graph, Node
    from .binary import Binary

GROUP = "onebuild.targets"


class Target(Protocol):
    name: str
    backend: str  # the backend its binaries run on (nnpackage BACKENDS, partition names)
    model_type: str  # its binaries' file suffix and nnpackage model-type ("tvn")
    magic: bytes  # how its binaries begin
    channel_dtypes: tuple[str, ...]  # dtypes of values quantized per channel it lowers

    def supports(self, node: Node, hw: str) -> list[str]:
        """Why `node` cannot run on the target (empty when it can)."""

    def lower(self, graph: Graph, hw: str) -> Any:
        """The target's op descriptions of a quantized graph (raises if unsupported)."""

    def encode(self, graph: Graph, hw: str, pref: str, meta: dict) -> bytes:
        """A compiled binary of `graph`."""

    def estimate(self, graph: Graph, hw: str) -> dict:
        """The performance model's estimate without compiling: `cycles`, `microseconds`,
        `roofline_cycles`, `macs` and per-layer `layers` (cycles, DRAM bytes)."""

    def load(self, path: str | os.PathLike) -> Binary:
        """A compiled binary from a file (validated: a bad file is a FormatError)."""

    def describe(self) -> dict:
        """Hardware presets and the supported-operator constraints, for `onebuild targets`."""


@cache
def _registered() -> dict:
    """The `onebuild.targets` entry points by name (read once per process: a build asks for
    a target's code digest and suffix for every task)."""
    found: dict = {}
    for entry in entry_points(group=GROUP):
        found.setdefault(entry.name, entry)
    return found


def available() -> list[str]:
    return sorted(_registered())


def target_module(name: str) -> str | None:
    """The module that implements target `name` (None if no such target is installed)."""
    entry = _registered().get(name)
    return entry.value.split(":")[0] if entry else None


@cache
def load_target(name: str) -> Target:
    entry = _registered().get(name)
    if entry is None:
        known = ", ".join(available()) or "none installed"
        raise UserError(f"unknown target '{name}' (known: {known})")
    return entry.load()()


@cache
def installed() -> tuple[Target, ...]:
    return tuple(load_target(name) for name in available())


def target_of_type(model_type: str) -> Target | None:
    """The installed target whose binaries are of `model_type` (e.g. "tvn")."""
    return next((t for t in installed() if t.model_type == model_type), None)


def channel_dtypes(name: str) -> tuple[str, ...]:
    """The dtypes in which target `name` lowers values quantized per channel (none if its
    class does not say)."""
    return tuple(getattr(load_target(name), "channel_dtypes", ()))


def binary_target(path: str | os.PathLike) -> Target | None:
    """The installed target whose binaries begin as the file at `path` does, if any."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(max((len(t.magic) for t in installed()), default=0))
    except OSError:
        return None
    return next((t for t in installed() if head.startswith(t.magic)), None)


def check_target(
    target: str, hw: str | None, where: str = "", keys=("target", "hardware preset")
) -> None:
    """Refuse a target that is not installed, or a hardware preset it lacks (None: its
    default), with one line listing what is installed; `where` prefixes it and `keys` name
    the two settings as their source spells them (`ODC_TARGET`, `codegen.hw`, ...)."""
    if target not in available():
        raise UserError(
            f"{where}{keys[0]} '{target}' is not an installed target (installed: "
            f"{', '.join(available()) or 'none'})"
        )
    presets = _presets(target)
    if hw is not None and presets and hw not in presets:
        raise UserError(
            f"{where}{keys[1]} '{hw}' is not a preset of target {target} (its presets: "
            f"{', '.join(presets)})"
        )


def check_preset(hw: str) -> None:
    """Refuse a hardware preset that no installed target has, listing the presets."""
    presets = {name: _presets(name) for name in available()}
    if not any(hw in names or not names for names in presets.values()):
        listing = "; ".join(f"{name}: {', '.join(names)}" for name, names in presets.items())
        raise UserError(f"no installed target has hardware preset '{hw}' ({listing})")


@cache
def _presets(target: str) -> tuple[str, ...]:
    """The hardware presets target `target` describes (none: it takes any)."""
    return tuple(load_target(target).describe().get("presets", {}))


def default_hw(name: str) -> str | None:
    """The hardware preset target `name` compiles for when none is named: its `default_hw`,
    else the first of its presets (None: it describes none and takes any)."""
    target = load_target(name)
    if getattr(target, "default_hw", None):
        return target.default_hw
    return next(iter(target.describe().get("presets", {})), None)


def binary_suffix(name: str) -> str:
    """The file suffix of target `name`'s binaries (its model type, e.g. "tvn")."""
    return load_target(name).model_type
