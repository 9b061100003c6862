"""What a build left behind, gathered for the report: step records (the `<artifact>.log` files
the engine writes), the partition and accuracy reports, calibration statistics, what each
compiled binary's target says about it, and the package's files. Reads only; a missing
artifact (a step not enabled or not built yet) leaves its part out, and so does one that is
not made with the report's settings (`freshness`)."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.dag import StepResult
from ..engine.ownership import LOG_LIMIT
from ..engine.tasks_plan import StepTask, known_tasks
from ..errors import UserError
from ..fileio import read_regular
from ..gates import apply_gate, json_safe
from ..plan import Plan
from ..targets import binary_target
from .freshness import Freshness, freshness


@dataclass
class StepRecord:
    """One task: what its log says (the last time it ran or was restored) and whether its
    outputs belong to the settings of the report (`freshness`)."""

    step: str
    part: str
    status: str  # from the log: run, restored, did not finish; "not built" without one
    seconds: float | None
    cache_key: str
    outputs: list[tuple[str, int]]  # (path relative to the build folder or recipe, bytes)
    fresh: Freshness


@dataclass
class Binary:
    """A compiled binary: its file, the target's description of one inference, the peak
    MACs per cycle and DRAM bytes per cycle of its hardware (None when the target says not),
    and the simulated time of one inference in microseconds."""

    name: str
    info: dict
    peak_macs: float | None
    bytes_per_cycle: float | None
    microseconds: float | None = None


@dataclass
class BuildData:
    plan: Plan
    steps: list[StepRecord]
    graphs: list[tuple[str, str, Path]] = field(default_factory=list)  # (label, backend, IR)
    partition: dict | None = None
    accuracy: dict | None = None  # quantize.accuracy.json, or the gate applied to measure's
    gate_derived: bool = False  # accuracy is measure's JSON under the recipe's thresholds
    calibration: Path | None = None  # statistics file
    float_model: Path | None = None  # the graph calibration observed
    quantized: Path | None = None  # the quantized model
    binaries: list[Binary] = field(default_factory=list)
    package: list[tuple[str, int]] = field(default_factory=list)
    package_path: Path | None = None
    not_circle: dict[str, str] = field(default_factory=dict)  # package IR file -> why not circle
    by_build: bool = False  # written by a build (else by `onebuild report`)

    def stale(self, *steps: str) -> list[StepRecord]:
        """The tasks of these steps whose outputs are not made with the report's settings."""
        return [s for s in self.steps if s.step in steps and not s.fresh.current]


def collect(
    plan: Plan, results: list[StepResult] | None = None, tick: Callable[[], None] = lambda: None
) -> BuildData:
    """The build of `plan` as it is on disk; `results` are the statuses of the build that
    just ran (if any); `tick` is called after each compiled binary is read (simulated once)."""
    tasks = [t for t in known_tasks(plan) if isinstance(t, StepTask)]
    if not any(_log(t) for t in tasks):
        raise UserError(
            f"{plan.recipe}: nothing built yet in {plan.build_dir}; run 'onebuild build "
            f"{plan.recipe.name}' first"
        )
    fresh = freshness(plan, tasks, results)
    records = [_record(plan, t, fresh[t.name]) for t in tasks]
    data = BuildData(plan, records, by_build=results is not None)
    gate = next((t.config for t in tasks if t.step == "evaluate"), {})
    tasks = [t for t in tasks if fresh[t.name].current]  # other builds' outputs are left out
    by_step = {t.step: t for t in tasks if not t.label}
    measured = None
    for task in tasks:
        if task.step == "calibrate" and task.outputs[0].is_file():
            data.calibration, data.float_model = task.outputs[0], task.inputs[0]
        elif task.step == "quantize" and task.outputs[0].is_file():
            data.quantized = task.outputs[0]
        elif task.step == "evaluate" and task.outputs[0].is_file():
            data.accuracy = _json(task.outputs[0])
        elif task.step == "measure" and task.outputs[0].is_file():
            measured = _json(task.outputs[0])
        elif task.step == "partition":
            _partition(data, task.outputs[0], plan.steps["partition"]["name"])
        elif task.step == "codegen" and task.outputs[0].is_file():
            data.binaries.append(_binary(task.outputs[0], plan.build_dir))
            tick()
        elif task.step == "pack" and task.outputs[0].is_dir():
            data.package_path = task.outputs[0]
            data.package = _files(task.outputs[0], task.outputs[0])
            data.not_circle = _not_circle(task.outputs[0])
    if data.accuracy is None and measured is not None:  # the gate failed, or is not run yet
        data.accuracy, data.gate_derived = json_safe(apply_gate(gate, measured)), True
    model = next((s for s in ("quantize", "optimize", "import") if s in plan.steps), None)
    if "partition" not in plan.steps and model in by_step:
        backend = "npu" if "codegen" in plan.steps else "cpu"
        if by_step[model].outputs[0].is_file():
            data.graphs = [("whole model", backend, by_step[model].outputs[0])]
    return data


def _log(task: StepTask) -> dict | None:
    path = Path(f"{task.outputs[0]}.log")
    return _json(path) if path.is_file() else None


def _json(path: Path) -> dict:
    try:
        record = json.loads(read_regular(path, LOG_LIMIT))
    except (OSError, ValueError, RecursionError) as error:
        raise UserError(f"{path}: unreadable build record ({error}); build again") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}: unreadable build record (not a JSON object); build again")
    return record


def _relative(path: Path, plan: Plan) -> str:
    for base in (plan.build_dir, plan.recipe.parent):
        if path.is_relative_to(base):
            return str(path.relative_to(base))
    return str(path)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def _record(plan: Plan, task: StepTask, fresh: Freshness) -> StepRecord:
    log = _log(task) or {}
    outputs = [(_relative(p, plan), _size(p)) for p in task.outputs]
    return StepRecord(
        task.step,
        task.label,
        {"running": "did not finish"}.get(log.get("status"), log.get("status", "not built")),
        log.get("seconds"),
        str(log.get("cache_key", ""))[:12],
        outputs,
        fresh,
    )


def _partition(data: BuildData, folder: Path, name: str) -> None:
    report = folder / f"{name}.partition.json"
    if not report.is_file():
        return
    data.partition = _json(report)
    for number, part in enumerate(data.partition["parts"], 1):
        backend = "cpu" if part["backend"] == "cpu" else "npu"
        data.graphs.append((f"part {number} ({part['backend']})", backend, folder / part["file"]))


def _binary(path: Path, build_dir: Path) -> Binary:
    target = binary_target(path)
    if target is None:
        raise UserError(f"{path}: no installed target reads this binary")
    info = target.load(path).describe()
    hardware = target.describe().get("presets", {}).get(info.get("hardware"), {})
    peak = hardware.get("mac_rows", 0) * hardware.get("mac_cols", 0) or None
    name = str(path.relative_to(build_dir)) if path.is_relative_to(build_dir) else path.name
    clock = hardware.get("clock_mhz")
    us = info["cycles"] / clock if clock and "cycles" in info else None
    return Binary(name, info, peak, hardware.get("dram_bytes_per_cycle"), us)


def _not_circle(package: Path) -> dict[str, str]:
    """Each IR model (.obir) the package holds, with the reason pack kept it out of circle
    (the same check pack ran; its warning is not repeated when pack is restored from cache)."""
    from ..graph_ir.serde import load_ir
    from ..graph_ir.serde.circle_exact import exact_circle

    reasons = {}
    for path in sorted(package.rglob("*.obir")):
        _, reason = exact_circle(load_ir(path))
        reasons[str(path.relative_to(package))] = reason or "circle is exact now (packed before)"
    return reasons


def _files(folder: Path, base: Path) -> list[tuple[str, int]]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return [(str(p.relative_to(base)), p.stat().st_size) for p in files]
