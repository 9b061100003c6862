"""What a build would do, and why, read from the step logs (no step runs)."""

import json
from dataclasses import dataclass
from pathlib import Path

from ..plan import Plan
from ..tasks import STEPS
from .dag import FanOut, StepTask, known_tasks
from .step_cache import StepCache, step_key, tree_digest


@dataclass
class StepStatus:
    recipe: str
    step: str
    status: str  # "up-to-date" | "run" | "restored" (from the step cache)
    reasons: list[str]
    outputs: list[str]
    seconds: float = 0.0
    part: str = ""  # the partition a fan-out task works on


def _reasons(task: StepTask) -> list[str]:
    log_path = Path(f"{task.outputs[0]}.log")
    if not log_path.is_file():
        return ["never built"]
    try:
        log = json.loads(log_path.read_text())
    except (OSError, ValueError):
        return ["its build log is unreadable"]
    if log.get("status") == "running":
        return ["its last run did not finish"]
    reasons = []
    if log.get("code") != STEPS[task.step].code(task.config):
        reasons.append("onebuild's code for this step changed")
    old = log.get("config", {})
    changed = sorted(k for k in set(old) | set(task.config) if old.get(k) != task.config.get(k))
    if changed:
        reasons.append("option(s) changed: " + ", ".join(changed))
    for kind, paths, verb in (
        ("input", task.inputs, "changed"),
        ("output", task.outputs, "was modified"),
    ):
        recorded = log.get(f"{kind}s", {})
        for path in paths:
            if not path.exists():
                reasons.append(f"{kind} {path.name} is missing")
            elif recorded.get(str(path)) != tree_digest(path):
                reasons.append(f"{kind} {path.name} {verb}")
    return reasons


def status(plans: list[Plan]) -> list[StepStatus]:
    results = []
    for plan in plans:
        upstream = None
        for task in known_tasks(plan):
            if isinstance(task, FanOut):
                why = "its tasks are created once [partition] has run"
                results.append(StepStatus(str(plan.recipe), task.step, "run", [why], []))
                continue
            reasons = _reasons(task)
            if upstream:
                reasons.append(f"reruns if [{upstream}] changes its output")
                state = "run"
            elif not reasons:
                state = "up-to-date"
            elif _cached(task):
                state = "restored"
            else:
                state, upstream = "run", task.step
            outputs = [str(p) for p in task.outputs]
            results.append(
                StepStatus(str(plan.recipe), task.step, state, reasons, outputs, part=task.label)
            )
    return results


def _cached(task: StepTask) -> bool:
    """Whether the step cache holds this step's result for its current inputs and config."""
    if not all(p.exists() for p in task.inputs):
        return False
    code = STEPS[task.step].code(task.config)
    digests = [tree_digest(p) for p in task.inputs]
    key = step_key(task.step, code, task.config, digests, task.recipe.parent)
    return StepCache(task.cache).has(key)
