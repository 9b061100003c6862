"""Which of the artifacts on disk belong to the settings a report is written for.

Written by a build: the build's own results decide (steps that ran, were restored or were up to
date; a failed step's outputs only when its failed run wrote them, as a failed gate writes its
accuracy report). Written by `onebuild report`: what `onebuild status` predicts for the recipe
and its `--set` options; only steps it finds up to date are shown, since any other step's
outputs on disk are another build's (other options, other inputs, or older code).
"""

from dataclasses import dataclass
from pathlib import Path

from ..engine.dag import StepResult
from ..engine.ownership import log_path
from ..engine.status import status
from ..engine.tasks_plan import StepTask
from ..plan import Plan

MADE = ("run", "restored", "up-to-date")


@dataclass(frozen=True)
class Freshness:
    current: bool  # its outputs on disk are made with these settings
    verdict: str  # what the build did with it, or what `status` says a build would do
    why: str = ""  # the reasons behind a verdict that is not up to date


def freshness(
    plan: Plan, tasks: list[StepTask], results: list[StepResult] | None
) -> dict[str, Freshness]:
    """Task name -> its freshness, from the results of the build that just ran (if any), else
    from `status`."""
    if results is not None:
        done = {(r.step, r.part): r for r in results if r.recipe == str(plan.recipe)}
        return {t.name: _after_build(t, done.get((t.step, t.label))) for t in tasks}
    predicted = {(s.step, s.part): s for s in status([plan])}
    verdicts = {}
    for task in tasks:  # a fan-out that waits for its partition has one entry, without part
        state = predicted.get((task.step, task.label)) or predicted.get((task.step, ""))
        if state is None:
            verdicts[task.name] = Freshness(False, "pending", "its partition is not built")
        else:
            why = "; ".join(state.reasons)
            verdicts[task.name] = Freshness(state.status == "up-to-date", state.status, why)
    return verdicts


def _after_build(task: StepTask, result: StepResult | None) -> Freshness:
    if result is None:  # a part of a partition that this build did not reach
        return Freshness(False, "not run", "its partition did not run in this build")
    if result.status in MADE:
        return Freshness(True, result.status)
    if result.blocked:
        return Freshness(False, "not run", "a step it depends on failed")
    return Freshness(_written_by_failed_run(task), "failed", result.error or "")


def _written_by_failed_run(task: StepTask) -> bool:
    """Whether every output was written after the step claimed them (the record a failed
    run leaves is the claim it wrote before it started)."""
    try:
        claimed = log_path(task.outputs).stat().st_mtime_ns
        return all(Path(p).stat().st_mtime_ns >= claimed for p in task.outputs)
    except OSError:
        return False
