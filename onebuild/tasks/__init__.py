"""Build steps: one thin module per step, config in, artifacts out.

Each step module defines `run(config, inputs, outputs)`. A step's cache key covers the digest of
its code (`onebuild.engine.code_digest`): the step module, everything it imports and, for steps
with a `target` option, the target plugin's code; no version number to bump by hand. Step
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

    def run(self, config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
        import_module(self.module).run(config, inputs, outputs)

    def code(self, config: dict[str, Any]) -> str:
        """Digest of the code that computes this step's outputs under `config`."""
        from ..engine.code_digest import step_code_digest
        from ..targets import target_module

        target = config.get("target")
        return step_code_digest(self.module, target_module(target) if target else None)


STEPS: dict[str, Step] = {
    name: Step(name, f"{__name__}.{module}")
    for name, module in (
        ("import", "import_model"),
        ("optimize", "optimize"),
        ("calibrate", "calibrate"),
        ("quantize", "quantize"),
        ("evaluate", "evaluate"),
        ("partition", "partition"),
        ("codegen", "codegen"),
        ("pack", "pack"),
    )
}
