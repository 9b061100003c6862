"""Build steps: one thin module per step, config in, artifacts out.

Each step module defines `run(config, inputs, outputs)`. A step's cache key covers the digest of
its code (`onebuild.engine.code_digest`): the step module, everything it imports and the code of
the target plugin it uses (its `target` option; every installed target for pack, which reads
compiled binaries); no version number to bump by hand. Step
modules load when their step runs, so this package imports none of them.
"""

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Step:
    name: str
    module: str
    reads_binaries: bool = False  # loads compiled binaries through their (any) target

    def run(self, config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
        import_module(self.module).run(config, inputs, outputs)

    def code(self, config: dict[str, Any]) -> str:
        """Digest of the code that computes this step's outputs under `config`."""
        from ..engine.code_digest import step_code_digest
        from ..targets import available, target_module

        targets = available() if self.reads_binaries else [config.get("target")]
        return step_code_digest(self.module, *(target_module(t) for t in targets if t))


STEPS: dict[str, Step] = {
    name: Step(name, f"{__name__}.{module}", name == "pack")
    for name, module in (
        ("import", "import_model"),
        ("optimize", "optimize"),
        ("calibrate", "calibrate"),
        ("quantize", "quantize"),
        ("measure", "measure"),
        ("evaluate", "evaluate"),
        ("partition", "partition"),
        ("codegen", "codegen"),
        ("pack", "pack"),
    )
}
