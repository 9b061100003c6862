"""The partition step: quantized IR file -> a folder of part IR files, `<base>.conn.json` and a
report `<base>.partition.json` (strategy, estimated latency, every CPU fallback and why).

With `cpu_precision = "float"` the CPU parts are recomputed from the float model (a further
input), quantizing and dequantizing only at their boundaries.
"""

import json
from pathlib import Path
from typing import Any


def part_files(config: dict[str, Any], backends: list[str]) -> list[str]:
    return [f"{config['name']}.{i + 1:05d}_{b}.obir" for i, b in enumerate(backends)]


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..fileio import atomic_folder, atomic_write_bytes
    from ..graph_ir.ir import Model
    from ..graph_ir.partition.float_parts import float_part
    from ..graph_ir.partition.part_file import read_part_file
    from ..graph_ir.partition.regions import connection_info
    from ..graph_ir.quant.model_io import with_quantized_io
    from ..graph_ir.serde import load_ir, save_ir
    from ..targets import load_target
    from ..targets.placement import Options, place

    settings = {"default": config["default"], "comply": config["comply"]}
    opcode, opname = {}, {}
    if config["part_file"]:
        found = read_part_file(config["part_file"])
        settings.update({k: found[k] for k in ("default", "comply") if k in found})
        opcode, opname = found.get("opcode", {}), found.get("opname", {})
    options = Options(
        accelerator=config["accelerator"],
        hw=config["hw"],
        strategy=config["strategy"],
        opcode={**opcode, **config["opcode"]},
        opname={**opname, **config["opname"]},
        **settings,
    )
    graph = with_quantized_io(load_ir(inputs[0]).main)
    placement = place(graph, config["name"], load_target(config["target"]), options)
    parts = placement.partitioning.parts
    files = part_files(config, [p.backend for p in parts])
    left_quantized = []
    if config["cpu_precision"] == "float":
        float_graph = load_ir(inputs[-1]).main
        for file, part in zip(files, parts):
            recomputed = float_part(part.graph, float_graph) if part.backend == "cpu" else None
            if recomputed is not None:
                part.graph = recomputed
            elif part.backend == "cpu":
                left_quantized.append(file)
    info = connection_info(placement.partitioning, graph, files)
    report = {
        "strategy": options.strategy,
        "cpu_precision": config["cpu_precision"],
        "cpu_parts_left_quantized": left_quantized,
        "hardware": options.hw,
        "estimate": placement.latency,
        "explanation": placement.explanation,
        "fallbacks": placement.fallbacks,
        "parts": [
            {"file": f, "backend": p.backend, "nodes": len(p.graph.nodes)}
            for f, p in zip(files, parts)
        ],
    }
    with atomic_folder(outputs[0]) as folder:
        for file, part in zip(files, parts):
            save_ir(Model([part.graph]), folder / file)
        for suffix, data in ((".conn.json", info), (".partition.json", report)):
            text = json.dumps(data, indent=2, sort_keys=True) + "\n"
            atomic_write_bytes(folder / f"{config['name']}{suffix}", text.encode())
