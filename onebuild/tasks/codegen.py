"""The codegen step: quantized IR file -> a target binary (.tvn for trix_sim).

Without a [partition] step the whole model must run on the target; its float boundary
(QuantizeLinear on the inputs, DequantizeLinear on the outputs) moves into the binary's I/O
parameters, which the runtime applies, as ONE's runtime does with a .tvn header.
"""

from pathlib import Path
from typing import Any


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..compile import CodegenOptions, compile_file, options_from

    compile_file(inputs[0], outputs[0], options_from(CodegenOptions, config))
