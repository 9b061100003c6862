"""The accuracy gate of [quantize.accuracy]: the `measure` step's JSON + thresholds -> the JSON
report (`quantize.accuracy.json`: the measurement and the gate's checks).

The report is written in every case; below a threshold the step then fails, naming the checks
that failed and the layers that lose the most.
"""

import json
import logging
from pathlib import Path
from typing import Any

WORST_LAYERS = 5
log = logging.getLogger("onebuild.progress")  # quiet with --json, like progress lines


def step_config(accuracy: dict[str, Any]) -> dict[str, Any]:
    """The thresholds: every option of [quantize.accuracy] but what `measure` measures with."""
    return {k: v for k, v in accuracy.items() if k not in ("data", "labels")}


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    from ..errors import GateFailed
    from ..fileio import atomic_write_bytes, read_regular
    from ..gates import apply_gate, described, failures, gate_next_step, json_safe
    from .measure import db

    report = apply_gate(config, json.loads(read_regular(inputs[0], 1 << 30)))
    checks = report["gate"]["checks"]
    text = json.dumps(json_safe(report), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(outputs[0], text.encode())
    failed = [c for c in checks if not c["passed"]]
    if failed:
        worst = ", ".join(_worst(layer, db) for layer in report["layers"][:WORST_LAYERS])
        raise GateFailed(
            f"accuracy gate failed: {failures(checks)}; worst layers: {worst}; "
            f"{gate_next_step(report.get('mixed_precision'))}; see {outputs[0]}"
        )
    if checks:
        log.info("evaluate: accuracy gate passed: %s", described(checks))


def _worst(layer: dict, db) -> str:
    """A worst layer in the gate's message: its SQNR, its type, whether it was promoted."""
    how = f"{layer['dtype']}, promoted by mixed precision" if layer["promoted"] else layer["dtype"]
    return f"{layer['node']} ({db(layer['sqnr_db'])}, {how})"
