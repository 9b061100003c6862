"""The pass manager: runs passes, checks what they claim, verifies the graph after each one."""

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import OneBuildError, PassError
from ..ir import Graph, Model
from ..verify import verify
from .cleanup import eliminate_dead_code, remove_identities
from .fold import fold_constants
from .fold_affine import fold_affine
from .fuse import batchnorm_to_conv, fold_batchnorm, fuse_activations
from .patterns import fuse_patterns
from .split_heads import slice_before_transpose

Pass = Callable[[Graph], bool]
"""A pass rewrites a graph in place and returns whether it changed anything."""


@dataclass(frozen=True)
class PassRecord:
    name: str
    graph: str
    modified: bool
    seconds: float


PASSES: dict[str, Pass] = {
    "remove_identities": remove_identities,
    "fold_constants": fold_constants,
    "fuse_patterns": fuse_patterns,
    "fold_affine": fold_affine,
    "fold_batchnorm": fold_batchnorm,
    "batchnorm_to_conv": batchnorm_to_conv,
    "fuse_activations": fuse_activations,
    "slice_before_transpose": slice_before_transpose,
    "eliminate_dead_code": eliminate_dead_code,
}

PRESETS: dict[str, list[str]] = {
    "O0": [],
    "O1": [
        "remove_identities",
        "fold_constants",
        "fuse_patterns",
        "fold_affine",
        "fold_batchnorm",
        "batchnorm_to_conv",
        "fuse_activations",
        "slice_before_transpose",
        "eliminate_dead_code",
    ],
}


def fingerprint(graph: Graph) -> str:
    """A digest of the graph's structure, attributes and constant identities."""
    digest = hashlib.sha256()
    for node in graph.nodes:
        ins = ",".join("" if v is None else v.name for v in node.inputs)
        outs = ",".join(f"{v.name}:{v.dtype}{v.shape}" for v in node.outputs)
        digest.update(f"{node.op}|{node.name}|{ins}|{outs}|{sorted(node.attrs.items())}\n".encode())
    for value in graph.constants.values():
        digest.update(f"c|{value.name}|{id(value.const)}\n".encode())
    digest.update(("o|" + ",".join(v.name for v in graph.outputs)).encode())
    return digest.hexdigest()


def run_passes(model: Model, names: Sequence[str], check: bool = True) -> list[PassRecord]:
    """Run the named passes once each over every subgraph, in order.

    With `check`, a pass that reports no change but changed the graph, or that leaves the graph
    invalid, is an error; every failure names the passes that ran before it.
    """
    records: list[PassRecord] = []
    for name in names:
        if name not in PASSES:
            raise PassError(f"unknown pass '{name}' (known: {', '.join(sorted(PASSES))})")
        for graph in model.graphs:
            before = fingerprint(graph) if check else ""
            start = time.perf_counter()
            try:
                modified = PASSES[name](graph)
                if check:
                    if not modified and fingerprint(graph) != before:
                        raise PassError(f"pass '{name}' changed graph '{graph.name}' but said not")
                    verify(graph)
            except Exception as error:
                history = ", ".join(r.name for r in records) or "none"
                detail = error if isinstance(error, OneBuildError) else repr(error)
                raise PassError(
                    f"pass '{name}' failed on graph '{graph.name}' (passes run before: "
                    f"{history}): {detail}"
                ) from error
            records.append(PassRecord(name, graph.name, modified, time.perf_counter() - start))
    return records


def run_preset(model: Model, preset: str = "O1", max_rounds: int = 8) -> list[PassRecord]:
    """Run a preset to a fixed point: repeat it until a whole round changes nothing."""
    if preset not in PRESETS:
        raise PassError(f"unknown preset '{preset}' (known: {', '.join(PRESETS)})")
    records: list[PassRecord] = []
    for _ in range(max_rounds):
        round_records = run_passes(model, PRESETS[preset])
        records.extend(round_records)
        if not any(r.modified for r in round_records):
            break
    return records
