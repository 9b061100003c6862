"""A recipe's plan as step tasks: the files each step reads and writes, and its cache key.

Each enabled step becomes one task ([quantize] up to four: calibrate, quantize, the accuracy
measurement and its gate). After a partition, one codegen task per NPU part and the pack exist
only once the partition has run: a `FanOut` creates them from the partition's connection file.
The build (`dag`), its forecast (`status`) and the `dag` command read the same tasks.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..packing import archive_path
from ..plan import Plan
from ..targets import binary_suffix
from ..tasks import STEPS
from ..tasks import calibrate as calibrate_step
from ..tasks import evaluate as evaluate_step
from ..tasks import measure as measure_step
from ..tasks import quantize as quantize_step
from .step_cache import step_key


@dataclass
class StepTask:
    """One step of one recipe, with the files it reads and writes.

    `inputs` are passed to the step; `after` are extra dependencies it only waits for (an
    accuracy report: a failed gate stops everything downstream).
    """

    recipe: Path
    step: str
    config: dict
    inputs: list[Path]
    outputs: list[Path]
    targets: list[Path]
    cache: Path
    after: list[Path] = field(default_factory=list)
    label: str = ""  # tells apart the tasks of a fan-out (one per NPU part)
    remote: str | None = None  # build.cache as an fsspec URL, fronted by `cache`

    @property
    def name(self) -> str:
        return f"{self.recipe}::{self.step}" + (f":{self.label}" if self.label else "")


@dataclass
class FanOut:
    """Tasks of one step that exist only once the task named `after` has run: one codegen
    task per NPU part, and the pack that collects them. `expand` returns None until the
    files it reads exist; `expand(folder)` reads the partition from another copy of its
    folder (a cache entry the partition would be restored from)."""

    recipe: Path
    step: str
    after: str
    expand: Callable[..., list[StepTask] | None]
    outputs: list[Path] = field(default_factory=list)  # those known before `after` has run

    @property
    def name(self) -> str:
        return f"{self.recipe}::{self.step}"


def task_key(task: StepTask, input_digests: list[str]) -> str:
    """The step cache key of `task` given its inputs' content digests: the step, its code's
    digest, its config and its inputs."""
    code = STEPS[task.step].code(task.config)
    return step_key(task.step, code, task.config, input_digests, task.recipe.parent)


def plan_tasks(plan: Plan) -> list[StepTask | FanOut]:
    """The chain of step tasks of one recipe; after a partition, codegen and pack fan out."""
    cache = plan.cache_dir or plan.build_dir / "cache"
    tasks: list[StepTask] = []
    previous, gates = Path(plan.steps["import"]["source"]), []
    float_model = previous

    def add(step: str, config: dict, inputs: list[Path], outputs=None, targets=None) -> Path:
        outputs = outputs or [plan.build_dir / f"{step}.obir"]
        task = StepTask(plan.recipe, step, config, inputs, outputs, targets or outputs, cache)
        task.remote = plan.cache_url
        tasks.append(task)
        return outputs[0]

    for step, config in plan.steps.items():
        if step == "quantize":
            float_model = previous
            previous, gates = _quantize_tasks(add, config, previous, plan.build_dir)
            continue
        if step == "partition":
            folder = plan.build_dir / "partition"
            connection = folder / f"{config['name']}.conn.json"
            extra = [Path(config["part_file"])] if config["part_file"] else []
            if config["cpu_precision"] == "float":
                extra.append(float_model)
            add(step, config, [previous, *extra], [folder], [connection])
            tasks[-1].after, gates = gates, []
            tasks.extend(_fan_out(plan, cache, tasks[-1].name, connection))
            break
        if step == "pack":
            add(step, config, [previous], *_pack_outputs(config))
        elif step == "import":  # with the weights an ONNX model keeps beside it
            weights = [Path(file) for file in config.get("external_data", [])]
            previous = add(step, config, [previous, *weights])
        elif step == "codegen":
            binary = f"codegen.{binary_suffix(config['target'])}"
            previous = add(step, config, [previous], [plan.build_dir / binary])
        else:
            previous = add(step, config, [previous])
        tasks[-1].after, gates = gates, []
    return tasks


def known_tasks(plan: Plan) -> list[StepTask | FanOut]:
    """The plan's tasks, fan-outs expanded where the files they read exist already."""
    tasks: list[StepTask | FanOut] = []
    for task in plan_tasks(plan):
        expanded = task.expand() if isinstance(task, FanOut) else None
        tasks.extend([task] if expanded is None else expanded)
    return tasks


def _fan_out(plan: Plan, cache: Path, partition: str, connection: Path) -> list[FanOut]:
    """One codegen task per NPU part (named by its number), then the pack of all parts."""
    folder = connection.parent
    codegen = plan.steps["codegen"]
    out = plan.build_dir / "codegen"
    suffix = binary_suffix(codegen["target"])
    remote = plan.cache_url

    def parts(copy: Path | None) -> list[tuple[str, Path, Path | None]] | None:
        source = (copy or folder) / connection.name
        if not source.is_file():
            return None
        info = json.loads(source.read_text())
        found = []
        for part in info["parts"]:
            source = folder / part["file"]
            compiled = None if part["backend"] == "cpu" else out / f"{source.stem}.{suffix}"
            found.append((source.stem.rsplit(".", 1)[-1], source, compiled))
        return found

    def codegen_tasks(copy: Path | None = None) -> list[StepTask] | None:
        found = parts(copy)
        if found is None:
            return None
        return [
            StepTask(plan.recipe, "codegen", codegen, [s], [c], [c], cache, [], label, remote)
            for label, s, c in found
            if c is not None
        ]

    def pack_tasks(copy: Path | None = None) -> list[StepTask] | None:
        found = parts(copy)
        if found is None or "pack" not in plan.steps:
            return None if found is None else []
        config = plan.steps["pack"]
        models = [c or s for _, s, c in found]
        outputs, targets = _pack_outputs(config)
        return [
            StepTask(
                plan.recipe,
                "pack",
                config,
                [connection, *models],
                outputs,
                targets,
                cache,
                remote=remote,
            )
        ]

    fan_outs = [FanOut(plan.recipe, "codegen", partition, codegen_tasks)]
    if "pack" in plan.steps:
        package = _pack_outputs(plan.steps["pack"])[0]
        fan_outs.append(FanOut(plan.recipe, "pack", fan_outs[0].name, pack_tasks, package))
    return fan_outs


def _pack_outputs(config: dict) -> tuple[list[Path], list[Path]]:
    package = Path(config["output"])
    outputs, targets = [package], [package / "metadata" / "MANIFEST"]
    if config.get("archive"):
        outputs.append(archive_path(package))
        targets.append(archive_path(package))
    return outputs, targets


def _quantize_tasks(add, config: dict, model: Path, build_dir: Path) -> tuple[Path, list[Path]]:
    """[quantize] becomes up to four tasks: calibrate (statistics, reused when only the dtype
    changes), quantize, measure (the quantized model against the float one on the accuracy
    data) and evaluate (the gate's thresholds on that measurement, which later steps wait for:
    a changed threshold reruns only this)."""
    inputs = [model]
    if config["mode"] == "full":
        data = [Path(config["calibration"])] if config["calibration"] else []
        stats = build_dir / "calibrate.npz"
        add("calibrate", calibrate_step.step_config(config), [model, *data], [stats])
        inputs.append(stats)
    step = quantize_step.step_config(config)
    quantized = add("quantize", step, inputs + quantize_step.measured_data(step))
    accuracy = config.get("accuracy")
    if not accuracy:
        return quantized, []
    data = [Path(accuracy["data"])] + ([Path(accuracy["labels"])] if accuracy["labels"] else [])
    measured, report = build_dir / "quantize.measured.json", build_dir / "quantize.accuracy.json"
    # the float reference is equalized as the quantized model was, so layers compare like for like
    equalized = config["mode"] == "full" and config["equalization"]
    add(
        "measure",
        measure_step.step_config(accuracy, equalized),
        [model, quantized, *data],
        [measured],
    )
    add("evaluate", evaluate_step.step_config(accuracy), [measured], [report])
    return quantized, [report]
