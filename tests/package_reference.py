"""The quantized model as its package computes it: the kernels a package ships as circle with
onert's arithmetic (`serde/circle_arith.py`: what onert computes, and what the package runtime
reads), the others (`.tvn`, `.obir` parts) with onebuild's own."""

import json
from pathlib import Path

from onebuild.graph_ir.ir import Graph
from onebuild.graph_ir.serde import load_ir
from onebuild.graph_ir.serde.circle_arith import use_onert_arithmetic


def as_packaged(reference: Graph, package: Path, parts: Path | None = None) -> Graph:
    """`reference` (changed in place) as `package` computes it; `parts`: the partition step's
    folder of part IR files (`m.00002_cpu.obir` for `m.part.00002_cpu.circle`), None for a
    package of one model."""
    manifest = json.loads((package / "metadata/MANIFEST").read_text())
    kinds = dict(zip(manifest["models"], manifest["model-types"]))
    if parts is None:
        (kind,) = kinds.values()
        circle = reference.nodes if kind == "circle" else []
    else:
        names = set()
        for model in (m for m, kind in kinds.items() if kind == "circle"):
            part = parts / model.replace(".part.", ".").replace(".circle", ".obir")
            names |= {node.name for node in load_ir(part).main.nodes}
        circle = [node for node in reference.nodes if node.name in names]
    use_onert_arithmetic(circle)
    return reference
