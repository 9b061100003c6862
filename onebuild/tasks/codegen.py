"""The codegen step: quantized IR file -> a target binary (.tvn for trix_sim).

Without a [partition] step the whole model must run on the target; its float boundary
(QuantizeLinear on the inputs, DequantizeLinear on the outputs) moves into the binary's I/O
parameters, which the runtime applies, as ONE's runtime does with a .tvn header.
"""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    import hashlib

    from ..fileio import atomic_write_bytes
    from ..graph_ir.quant.model_io import with_quantized_io
    from ..graph_ir.serde import load_ir
    from ..targets import load_target

    target = load_target(config["target"])
    graph = with_quantized_io(load_ir(inputs[0]).main)
    source = hashlib.sha256(inputs[0].read_bytes()).hexdigest()
    binary = target.encode(graph, config["hw"], config["pref"], {"source_sha256": source})
    atomic_write_bytes(outputs[0], binary)
