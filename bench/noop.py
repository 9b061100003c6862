"""No-op rebuild time: `onebuild build` vs an equivalent hand-written doit dodo.py. Prints JSON.

Both build the same six steps (import -> optimize -> quantize (calibrate, quantize) ->
partition -> codegen, one task per NPU part created after partition runs -> pack) of the
MobileNet-style example with the same doit features (file_dep, targets, config_changed, delayed
task creation, sqlite3 backend); after a first build, each no-op rebuild is timed as a whole
process, as a user or CI job would run it. The dodo.py spells out the same step configs.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from onebuild.engine.tasks_plan import StepTask, plan_tasks
from onebuild.recipe import load_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPE = """
[import]
source = "model.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[optimize]
[quantize]
calibration = "calib.npz"
[partition]
[codegen]
[pack]
output = "out/m.nnpkg"
"""
DODO = """
import json
from pathlib import Path
from doit import create_after
from doit.tools import config_changed
from onebuild.tasks import STEPS

DOIT_CONFIG = {"backend": "sqlite3", "dep_file": "dodo.sqlite3", "verbosity": 0}
CHAIN = json.loads(%r)
CODEGEN = json.loads(%r)


def _task(step, config, inputs, outputs, targets, name):
    def action():
        STEPS[step].run(config, [Path(p) for p in inputs], [Path(p) for p in outputs])
    return {
        "name": name,
        "actions": [action],
        "file_dep": inputs,
        "targets": targets,
        "uptodate": [config_changed(json.dumps({"c": config, "v": STEPS[step].code(config)}))],
    }


def task_build():
    for step, config, inputs, outputs, targets in CHAIN:
        yield _task(step, config, inputs, outputs, targets, step)


@create_after(executed="build")
def task_codegen():
    info = json.loads(Path("dodo/partition/model.conn.json").read_text())
    for part in info["parts"]:
        if part["backend"] != "cpu":
            stem = part["file"].rsplit(".", 1)[0]
            out = f"dodo/codegen/{stem}.tvn"
            yield _task("codegen", CODEGEN, [f"dodo/partition/{part['file']}"], [out], [out], stem)


@create_after(executed="codegen")
def task_pack():
    info = json.loads(Path("dodo/partition/model.conn.json").read_text())
    models = []
    for part in info["parts"]:
        stem = part["file"].rsplit(".", 1)[0]
        cpu = part["backend"] == "cpu"
        models.append(f"dodo/partition/{part['file']}" if cpu else f"dodo/codegen/{stem}.tvn")
    config = {"output": "dodo/m.nnpkg", "archive": False}
    inputs = ["dodo/partition/model.conn.json", *models]
    targets = ["dodo/m.nnpkg/metadata/MANIFEST"]
    yield _task("pack", config, inputs, ["dodo/m.nnpkg"], targets, "pack")
"""


def dodo_text(folder: Path) -> str:
    """The dodo.py: the recipe's static steps and codegen config, paths under dodo/."""

    def local(path: Path) -> str:
        text = str(path.relative_to(folder))
        return text.replace("build/r/", "dodo/").replace("out/", "dodo/")

    chain, codegen = [], None
    for task in plan_tasks(load_recipe(folder / "r.toml")):
        if not isinstance(task, StepTask):
            continue
        config = json.loads(json.dumps(task.config).replace(str(folder) + "/", ""))
        paths = [[local(p) for p in group] for group in (task.inputs, task.outputs, task.targets)]
        chain.append([task.step, config, *paths])
        codegen = load_recipe(folder / "r.toml").steps["codegen"]
    return DODO % (json.dumps(chain), json.dumps(codegen))


def median_seconds(command: list[str], folder: Path, repeats: int) -> float:
    subprocess.run(command, cwd=folder, check=True, capture_output=True)  # first, real build
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    repeats = int(os.environ.get("BENCH_REPEATS", "7"))
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        shutil.copy(ROOT / "examples/models/tiny_mobilenet.onnx", folder / "model.onnx")
        shutil.copy(ROOT / "examples/models/tiny_mobilenet_calib.npz", folder / "calib.npz")
        (folder / "r.toml").write_text(RECIPE)
        (folder / "dodo.py").write_text(dodo_text(folder))
        onebuild = median_seconds(
            [sys.executable, "-m", "onebuild.cli", "build", "r.toml"], folder, repeats
        )
        doit = median_seconds([sys.executable, "-m", "doit", "-f", "dodo.py"], folder, repeats)
    print(
        json.dumps(
            {
                "steps": 6,
                "onebuild_noop_s": round(onebuild, 3),
                "doit_dodo_noop_s": round(doit, 3),
                "ratio": round(onebuild / doit, 3),
                "targets": {"onebuild_noop_s": 0.5, "ratio": 2.0},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
