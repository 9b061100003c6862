"""Accuracy gates: thresholds on the error metrics of a candidate model against its float one.

Shared by the build's [quantize.accuracy] step and the on-device session's switch decisions.
Leaf module: plain data in (metric summaries per output, see `graph_ir.metrics`), checks out.
"""

import math
from typing import Any

THRESHOLDS = {  # threshold key -> (metric, bound)
    "min_sqnr_db": ("sqnr_db", "min"),
    "min_top1_match": ("top1_match", "min"),
    "min_top5_match": ("top5_match", "min"),
    "max_mae": ("mae", "max"),
    "max_mse": ("mse", "max"),
    "max_mape": ("mape", "max"),
    "max_mpeir": ("mpeir", "max"),
}


def gate_checks(
    config: dict[str, Any], outputs: dict[str, dict], accuracy: dict | None = None
) -> list[dict[str, Any]]:
    """One entry per configured threshold and output: what was measured, whether it passed."""
    checks = []
    for name, metrics in outputs.items():
        for key, (metric, bound) in THRESHOLDS.items():
            if config.get(key) is not None and metrics.get(metric) is not None:
                checks.append(
                    {
                        "check": f"{metric} of '{name}'",
                        "value": metrics[metric],
                        bound: config[key],
                    }
                )
    if config.get("max_accuracy_drop") is not None and accuracy:
        drop = accuracy["reference"] - accuracy["candidate"]
        checks.append({"check": "accuracy drop", "value": drop, "max": config["max_accuracy_drop"]})
    for check in checks:
        value = check["value"]
        check["passed"] = value >= check["min"] if "min" in check else value <= check["max"]
    return checks


def apply_gate(config: dict[str, Any], measured: dict) -> dict:
    """The accuracy report: a measurement (the `measure` step's JSON, an SQNR of null meaning
    no noise at all) with the gate's checks under these thresholds (`gate`; a check of no
    noise has the value infinity: `json_safe` before writing)."""
    outputs = {
        name: {**m, "sqnr_db": math.inf if m.get("sqnr_db", 0) is None else m["sqnr_db"]}
        for name, m in measured["outputs"].items()
    }
    checks = gate_checks(config, outputs, measured.get("accuracy"))
    gate = {"passed": all(c["passed"] for c in checks), "checks": checks}
    return {**measured, "gate": gate}


def failures(checks: list[dict[str, Any]]) -> str:
    """The failed checks in one line, e.g. "sqnr_db of 'y' = 12.3 (needs >= 20)"."""
    return described([c for c in checks if not c["passed"]])


def described(checks: list[dict[str, Any]]) -> str:
    """Checks in one line, e.g. "sqnr_db of 'y' = 38.2 (needs >= 20)"."""
    return "; ".join(
        f"{c['check']} = {c['value']:.4g} (needs {'>=' if 'min' in c else '<='} "
        f"{c.get('min', c.get('max')):g})"
        for c in checks
    )


FIRST_STEPS = '[quantize.mixed_precision] target_sqnr_db = 30, [quantize] method = "mse", '


def first_steps(extra: str = "") -> str:
    """The settings to try on a model quantized without mixed precision (`extra`: more)."""
    return f'{FIRST_STEPS}{extra}or dtype = "int16"'


def _db(step: dict) -> float:
    """A search probe's SQNR (null: no noise); one that stopped early counts as missing."""
    if "sqnr_db" not in step:
        return -math.inf
    return math.inf if step["sqnr_db"] is None else step["sqnr_db"]


def search_limit(record: dict) -> str:
    """Why mixed precision missed its target (its record, see `quant.mixed_precision`) and what
    to change: the MAC budget when one bound the search, else the floor (all promoted)."""
    target, dtype = record["target_sqnr_db"], record["dtype"]
    budget = record.get("max_high_precision_mac_fraction")
    steps = record.get("steps", [])
    meeting = [s for s in steps if _db(s) >= target]
    if budget is not None and meeting:
        least = min(s["high_precision_mac_fraction"] for s in meeting)
        return (
            f"the budget max_high_precision_mac_fraction = {budget:g} bound it (the fewest "
            f"probed that met it: {100 * least:.1f} % of MACs in {dtype}): raise it or lower "
            "target_sqnr_db"
        )
    floor = max(steps, key=lambda s: s["promoted"], default={})
    reached = f"{_db(floor):.1f} dB" if floor else "less"
    return (
        f"with every layer in {dtype} the outputs reach {reached} (the floor): try "
        f'[quantize.mixed_precision] dtype = "float32", [quantize] method = "mse" or a lower '
        "target_sqnr_db"
    )


def gate_next_step(record: dict | None) -> str:
    """What to try after a failed accuracy gate, given the mixed-precision record if any."""
    if record is None:
        return f"try {first_steps()}"
    if not record["target_met"]:
        return f"mixed precision missed its target: {search_limit(record)}"
    seen = record.get("measured_on") or {}
    unseen = record.get("unseen")
    where = f" on the {seen['samples']} {seen['data']} samples it measured" if seen else ""
    text = f"mixed precision met its {record['target_sqnr_db']:g} dB target{where}"
    if unseen:
        text += f" ({_db(unseen):.1f} dB on the {unseen['samples']} it did not see)"
    return f"{text}: {unseen_hint(record)}"


def unseen_hint(record: dict) -> str:
    """What to try when mixed precision met its target on its samples but not on others."""
    if record["high_precision_mac_fraction"] >= 1 - 1e-9:  # nothing left to promote
        return (
            f"every layer is already {record['dtype']}: try [quantize.mixed_precision] dtype = "
            '"float32", or a lower target'
        )
    return "try more [quantize.mixed_precision] samples, or a target_sqnr_db above the gate's"


def json_safe(value):
    """JSON has no infinity: an SQNR with no noise at all is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
