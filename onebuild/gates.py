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


def json_safe(value):
    """JSON has no infinity: an SQNR with no noise at all is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
