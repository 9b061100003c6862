"""Step cache keys cover the code that implements each step: editing any module a step imports
changes its key, and a build with edited code reruns exactly the steps that import it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_build import RECIPE  # the import -> optimize -> pack project of the build tests

import onebuild
from onebuild.engine.code_digest import _closure

PACKAGE = Path(onebuild.__file__).parent
MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
STEP_MODULES = [
    "import_model", "optimize", "calibrate", "quantize", "evaluate", "partition", "codegen", "pack"
]  # fmt: skip


def _copy_package(folder: Path) -> Path:
    shutil.copytree(PACKAGE, folder / "onebuild", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


EDIT_EVERY_FILE = r"""
import sys
from pathlib import Path
from onebuild.engine import code_digest as cd
from onebuild.targets import target_module

def digest(step):
    for f in (cd._digest, cd._file_digest):
        f.cache_clear()
    extra = target_module("trix_sim") if step in ("codegen", "partition", "pack") else None
    return cd.step_code_digest("onebuild.tasks." + step, extra)

steps = sys.argv[1].split(",")
unchanged = []
for step in steps:
    extra = target_module("trix_sim") if step in ("codegen", "partition", "pack") else None
    files = set(cd._closure("onebuild.tasks." + step))
    if extra:
        files |= cd._closure(extra)
    for path in sorted(files):
        before = digest(step)
        text = path.read_bytes()
        path.write_bytes(text + b"\n# edited\n")
        after = digest(step)
        path.write_bytes(text)
        if before == after:
            unchanged.append(f"{step}: {path}")
print("\n".join(unchanged))
"""


def test_editing_any_module_a_step_imports_changes_its_key(tmp_path):
    root = _copy_package(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", EDIT_EVERY_FILE, ",".join(STEP_MODULES)],
        cwd=root,  # `python -c` puts the working folder first on sys.path: the copy, not ours
        env=_env(root),
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "", result.stdout


DIGESTS = r"""
import os
import onebuild
assert onebuild.__file__.startswith(os.getcwd()), onebuild.__file__  # the copy runs
from onebuild.engine.code_digest import step_code_digest
from onebuild.targets import target_module
print([step_code_digest("onebuild.tasks." + s, target_module("trix_sim")) for s in
       ("import_model", "quantize", "codegen")])
"""


def test_installs_at_other_paths_share_keys(tmp_path):
    """CI runners check out and install at different paths: the same code must give the same
    keys, or a shared step cache never hits (the key named each file by its absolute path)."""
    digests = [
        subprocess.run(
            [sys.executable, "-c", DIGESTS],
            cwd=_copy_package(tmp_path / name),
            env=_env(tmp_path / name),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for name in ("runner-a", "other/runner-b")
    ]
    assert digests[0] == digests[1] and digests[0].count("'") == 6


def test_closure_follows_function_level_imports_and_package_data():
    files = {p.relative_to(PACKAGE).as_posix() for p in _closure("onebuild.tasks.codegen")}
    # codegen imports these inside its run() function; the target's presets are package data
    assert {"graph_ir/quant/model_io.py", "graph_ir/serde/irfile.py"} <= files
    target = {p.relative_to(PACKAGE).as_posix() for p in _closure("onebuild.targets.trix_sim")}
    assert "targets/trix_sim/configs/trix-m.toml" in target
    # the steps package imports no step module: the other steps do not count
    assert "tasks/__init__.py" in files and "tasks/quantize.py" not in files


def test_a_build_after_editing_a_module_reruns_exactly_the_steps_that_import_it(tmp_path):
    root = _copy_package(tmp_path / "code")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(MODEL, project / "model.onnx")
    (project / "r.toml").write_text(RECIPE)

    def build() -> dict[str, str]:
        result = subprocess.run(
            [sys.executable, "-m", "onebuild.cli", "build", "r.toml", "--json"],
            cwd=project,
            env=_env(root),
            capture_output=True,
            text=True,
            check=True,
        )
        return {s["step"]: s["status"] for s in json.loads(result.stdout)["steps"]}

    assert set(build().values()) == {"run"}
    api = root / "onebuild" / "compile.py"
    api.write_text(api.read_text() + "\n# a comment changes no output, but the code changed\n")
    # optimize goes through the compile API: it reruns (its cache key changed, so nothing is
    # restored); import and pack (with the TRIX target, which reads onebuild.version only) do
    # not import it, and optimize's output comes out byte-identical
    assert build() == {"import": "up-to-date", "optimize": "run", "pack": "up-to-date"}
    assert build() == {"import": "up-to-date", "optimize": "up-to-date", "pack": "up-to-date"}


RUN_ONE_STEP = r"""
import json, sys
from pathlib import Path
task = json.loads(sys.argv[1])
from onebuild.tasks import STEPS
before = set(sys.modules)
outputs = [Path(sys.argv[2]) / Path(p).name for p in task["outputs"]]
STEPS[task["step"]].run(task["config"], [Path(p) for p in task["inputs"]], outputs)
print(json.dumps(sorted(sys.modules[n].__file__ for n in set(sys.modules) - before
                        if n.startswith("onebuild") and getattr(sys.modules[n], "__file__", None))))
"""


def test_every_module_a_step_loads_when_it_runs_is_in_its_key(tmp_path):
    """Independent of the source scan: run each step of a partitioned NPU build in a fresh
    interpreter and compare the onebuild modules it loads while running with its key's files
    (a partitioned and a single-binary package: pack reads binaries through their target)."""
    from onebuild.targets import target_module

    examples = tmp_path / "examples"
    shutil.copytree(Path(__file__).parent.parent / "examples", examples)
    shutil.copytree(Path(__file__).parent.parent / "recipes", tmp_path / "recipes")
    recipes = [examples / "tiny_mobilenet_npu.toml", examples / "digits_npu.toml"]
    subprocess.run(
        [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes)],
        capture_output=True,
        check=True,
    )
    from onebuild.engine.tasks_plan import StepTask, known_tasks
    from onebuild.plan import load_plan
    from onebuild.targets import available
    from onebuild.tasks import STEPS

    plans = [load_plan(recipe) for recipe in recipes]
    tasks = [t for plan in plans for t in known_tasks(plan) if isinstance(t, StepTask)]
    steps_seen = set()
    for index, task in enumerate(tasks):
        step = task.step
        scratch = tmp_path / f"scratch{index}"
        scratch.mkdir()
        description = {
            "step": step,
            "config": task.config,
            "inputs": [str(p) for p in task.inputs],
            "outputs": [str(p) for p in task.outputs],
        }
        result = subprocess.run(
            [sys.executable, "-c", RUN_ONE_STEP, json.dumps(description), str(scratch)],
            capture_output=True,
            text=True,
            check=True,
        )
        loaded = {Path(p) for p in json.loads(result.stdout.splitlines()[-1])}
        module = {"import": "import_model"}.get(step, step)
        covered = set(_closure(f"onebuild.tasks.{module}"))
        targets = available() if STEPS[step].reads_binaries else [task.config.get("target")]
        for target in filter(None, targets):
            covered |= _closure(target_module(target))
        missing = sorted(str(p) for p in loaded - covered)
        assert not missing, f"[{step}] loaded modules its cache key does not cover: {missing}"
        steps_seen.add(step)
    assert steps_seen >= {"import", "optimize", "calibrate", "quantize", "partition", "codegen"}
    assert "pack" in steps_seen


def test_the_npu_targets_code_is_not_the_device_runtime():
    """The TRIX plugin needs only onebuild's version number: an edit of the on-device Session
    must not invalidate every codegen and pack entry (it did: the plugin imported the number
    from onebuild/__init__.py, whose lazy `Session` import the scan follows)."""
    files = {
        p.relative_to(Path(onebuild.__file__).parent).as_posix()
        for p in _closure("onebuild.targets.trix_sim")
    }
    assert "version.py" in files and "targets/trix_sim/codegen.py" in files
    assert not any(f.startswith("runtime/") for f in files), sorted(files)
