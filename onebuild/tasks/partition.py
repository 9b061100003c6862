"""The partition step: quantized IR file -> a folder of part IR files, `<base>.conn.json` and a
report `<base>.partition.json` (strategy, estimated latency, every CPU fallback and why).

With `cpu_precision = "float"` the CPU parts are recomputed from the float model (a further
input), quantizing and dequantizing only at their boundaries.
"""

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("onebuild.progress")  # quiet with --json, like progress lines


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import CodegenOptions, PartitionOptions, options_from, partition
    from ..graph_ir.partition.part_file import read_part_file
    from ..graph_ir.serde import load_ir
    from ..targets.placement import report_lines

    maps = read_part_file(config["part_file"]) if config["part_file"] else {}
    float_graph = load_ir(inputs[-1]).main if config["cpu_precision"] == "float" else None
    result = partition(
        load_ir(inputs[0]).main,
        config["name"],
        options_from(PartitionOptions, config),
        options_from(CodegenOptions, config),
        float_graph,
        maps,
    )
    result.save(outputs[0])
    log.info("\n".join(report_lines(config["name"], result.report)))
