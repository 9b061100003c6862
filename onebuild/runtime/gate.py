"""The session's accuracy gate: a candidate model against the float one on recorded inputs.

The recorded inputs are runs whose ranges the quantization used: the gate catches broken
quantization, not a recording too narrow for the inputs that follow. Every report says so
(`on_calibration_inputs`), and a pass on fewer than FEW_RECORDS inputs is a warning.
"""

import numpy as np

from ..gates import failures, gate_checks
from ..graph_ir.metrics import OutputMetrics
from ..progress import Progress
from ..targets.host_cpu import HostCpu

Reference = list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
FEW_RECORDS = 8  # a pass on fewer calibration inputs than this says little about other inputs


def gate_report(
    model, reference: Reference, outputs: list[str], thresholds: dict, candidate: str = "model"
) -> dict:
    """Run `model` (the `candidate`) on each recorded input of `reference` (inputs, float
    outputs) and check the metrics per output against `thresholds`; with no records nothing
    passes. Models with a cost estimate (binaries, packages) add it, from the last gate run,
    for backend = auto."""
    metrics = {name: OutputMetrics() for name in outputs}
    progress = Progress(f"gate {candidate}", len(reference))
    for index, (feeds, want) in enumerate(reference):
        got = model.run(feeds)
        for name, metric in metrics.items():
            metric.update(want[name], got[name])
        progress(index + 1)
    progress.finish()
    summaries = {name: metric.summary() for name, metric in metrics.items()}
    checks = gate_checks(thresholds, summaries)
    report = {
        "samples": len(reference),
        "outputs": summaries,
        "checks": checks,
        "passed": bool(reference) and all(check["passed"] for check in checks),
        "on_calibration_inputs": True,  # no held-out inputs: see the module's docstring
    }
    if reference and hasattr(model, "cost"):
        latency, memory = model.cost(HostCpu())
        report.update(microseconds=latency, memory_bytes=memory)
    return report


def gate_reason(gates: dict[str, dict], candidate: str) -> str:
    """Why the session did not switch to `candidate`, from its gate report."""
    report = gates[candidate]
    if not report["samples"]:
        return f"the {candidate} model was not switched to: no recorded inputs to check it on"
    previous = "float" if candidate == "quantized" else "quantized"
    return (
        f"the {candidate} model failed the accuracy gate on {report['samples']} recorded "
        f"input(s): {failures(report['checks'])}; staying on the {previous} model"
    )


def thin_pass(gates: dict[str, dict], candidate: str) -> str | None:
    """A warning when `candidate` passed its gate on only a few calibration inputs, else None."""
    report = gates[candidate]
    if not report["passed"] or report["samples"] >= FEW_RECORDS:
        return None
    return (
        f"the {candidate} model passed the accuracy gate on only {report['samples']} recorded "
        "input(s), the ones its ranges came from: it may do worse on other inputs; record at "
        f"least {FEW_RECORDS} runs (ODC_MINMAX_RECORDS, ODC_GATE_SAMPLES) for a wider check"
    )
