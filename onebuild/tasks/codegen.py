"""The codegen step: quantized IR file -> a target binary (.tvn for trix_sim).

Without a [partition] step the whole model must run on the target; its float boundary
(QuantizeLinear on the inputs, DequantizeLinear on the outputs) moves into the binary's I/O
parameters, which the runtime applies, as ONE's runtime does with a .tvn header.
"""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    import hashlib

    from ..compile import CodegenOptions, compile_graph, options_from
    from ..fileio import atomic_write_bytes
    from ..graph_ir.serde import load_ir

    source = hashlib.sha256(inputs[0].read_bytes()).hexdigest()
    options = options_from(CodegenOptions, config)
    binary = compile_graph(load_ir(inputs[0]).main, options, {"source_sha256": source})
    atomic_write_bytes(outputs[0], binary)
