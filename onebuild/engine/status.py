"""What a build would do, and why, read from the step logs and the step cache (no step runs).

The prediction follows the build in step order, tracking where each artifact's content will
come from: unchanged (up-to-date), a cache entry's copy (restored: downstream steps are judged
on that copy, and a restored partition's parts decide the codegen tasks), or a recomputation
whose result cannot be known before it runs: the steps that depend on it are `pending` (the
build will run them, restore them or, when the new output is byte-identical, leave them).
"""

from dataclasses import dataclass
from pathlib import Path

from ..plan import Plan
from ..tasks import STEPS
from .build_folder import busy
from .ownership import log_path, outputs_intact, read_log
from .step_cache import open_cache, tree_digest
from .tasks_plan import StepTask, plan_tasks, task_key

UNKNOWN = "unknown"  # the digest of content that a step will recompute


@dataclass
class StepStatus:
    recipe: str
    step: str
    status: str  # "up-to-date" | "run" | "restored" (from the step cache) | "pending"
    reasons: list[str]
    outputs: list[str]
    seconds: float = 0.0
    part: str = ""  # the partition a fan-out task works on


class _Forecast:
    """Where each artifact's content will be once the build ran: outputs replaced by a cache
    entry's copy, or by a recomputation (UNKNOWN)."""

    def __init__(self) -> None:
        self.replaced: dict[Path, Path | None] = {}
        self.pending: dict[Path, str] = {}  # output -> the step that recomputes it
        self.running = False  # a build holds the folder's lock now

    def where(self, path: Path) -> Path | None:
        for output, copy in self.replaced.items():
            if path == output or output in path.parents:
                return None if copy is None else copy / path.relative_to(output)
        return path

    def digest(self, path: Path) -> str | None:
        """The content digest `path` will have; UNKNOWN if recomputed, None if missing."""
        where = self.where(path)
        if where is None:
            return UNKNOWN
        return tree_digest(where) if where.exists() else None

    def producer(self, path: Path) -> str:
        return next(step for out, step in self.pending.items() if out in (path, *path.parents))


def status(plans: list[Plan]) -> list[StepStatus]:
    results = []
    for plan in plans:
        forecast = _Forecast()
        forecast.running = busy(plan.build_dir)
        states: dict[str, str] = {}  # task (or fan-out) name -> predicted state
        for item in plan_tasks(plan):
            if isinstance(item, StepTask):
                tasks = [item]
            else:  # fan-outs are as the partition goes: `after` names it (or a fan-out of it)
                states[item.name] = states.get(item.after, "")
                folder = plan.build_dir / "partition"
                copy = forecast.where(folder)
                unknown = states[item.name] in ("run", "pending") or copy is None
                tasks = None if unknown else item.expand(None if copy == folder else copy)
            if tasks is None:  # the partition reruns: its parts are not known yet
                why = "its tasks are created once [partition] has run"
                results.append(StepStatus(str(plan.recipe), item.step, "pending", [why], []))
                continue
            for task in tasks:
                state, reasons = _predict(task, forecast)
                states[task.name] = state
                outputs = [str(p) for p in task.outputs]
                results.append(
                    StepStatus(
                        str(plan.recipe), task.step, state, reasons, outputs, part=task.label
                    )
                )
    return results


def _predict(task: StepTask, forecast: _Forecast) -> tuple[str, list[str]]:
    digests = [forecast.digest(p) for p in task.inputs]
    waits = [forecast.digest(p) for p in task.after]
    unknown = [p for p, d in zip([*task.inputs, *task.after], [*digests, *waits]) if d == UNKNOWN]
    if unknown:
        step = forecast.producer(unknown[0])
        own = _reasons(task, digests, forecast.running, skip=set(unknown))  # cannot stay, then
        forecast.replaced.update({p: None for p in task.outputs})
        forecast.pending.update({p: step for p in task.outputs})
        if own and own != ["never built"]:
            return "pending", [f"runs or restores once [{step}] has run", *own]
        return "pending", [f"runs, restores or stays as it is once [{step}] has run"]
    reasons = _reasons(task, digests, forecast.running)
    reasons += [f"{p.name} changes" for p, d in zip(task.after, waits) if d != tree_digest(p)]
    if not reasons:
        return "up-to-date", []
    if None not in digests:
        key = task_key(task, digests)
        entry = open_cache(task.cache, task.remote).located(key)
        if isinstance(entry, Path):
            forecast.replaced.update({p: entry / str(i) for i, p in enumerate(task.outputs)})
            return "restored", reasons
        if entry is not None:  # only the remote cache has it: its content is not fetched here
            forecast.replaced.update({p: None for p in task.outputs})
            forecast.pending.update({p: task.step for p in task.outputs})
            return "restored", [*reasons, f"from the remote cache {task.remote}"]
    forecast.replaced.update({p: None for p in task.outputs})
    forecast.pending.update({p: task.step for p in task.outputs})
    return "run", reasons


def _reasons(
    task: StepTask, digests: list[str | None], running: bool, skip: set[Path] = frozenset()
) -> list[str]:
    """Why the build would not leave the step as it is (empty: it would); inputs in `skip`
    (recomputed first) are not compared."""
    path = log_path(task.outputs)
    if not path.exists() and not path.is_symlink():
        return ["never built"]
    log = read_log(task.outputs)
    if log is None:
        return ["its build log is unreadable"]
    if log.get("status") == "running":
        return ["a build is running it now" if running else "its last run failed or did not finish"]
    if log.get("recipe") != str(task.recipe):  # its inputs and options are the other one's
        return [f"another recipe's step made its outputs since ({log.get('recipe')})"]
    reasons = []
    if log.get("code") != STEPS[task.step].code(task.config):
        reasons.append("onebuild's code for this step changed")
    old, recorded = log.get("config"), log.get("inputs")
    old = old if isinstance(old, dict) else {}
    recorded = recorded if isinstance(recorded, dict) else {}
    changed = sorted(k for k in set(old) | set(task.config) if old.get(k) != task.config.get(k))
    if changed:
        reasons.append("option(s) changed: " + ", ".join(changed))
    for path, digest in zip(task.inputs, digests):
        if path in skip:
            continue
        if digest is None:
            reasons.append(f"input {path.name} is missing")
        elif recorded.get(str(path)) != digest:
            reasons.append(f"input {path.name} changed")
    if not outputs_intact(task.outputs, task.recipe):
        reasons.append("an output is missing or was modified")
    return reasons
