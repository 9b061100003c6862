"""No-op rebuild time: `onebuild build` vs an equivalent hand-written doit dodo.py. Prints JSON.

Both build the same steps (import -> optimize -> pack of the example model) with the same doit
features (file_dep, targets, config_changed, sqlite3 backend); after a first build, each no-op
rebuild is timed as a whole process, as a user or CI job would run it.
Note: quantize, partition and codegen are not available yet, so the recipe has three steps
rather than the six the acceptance names; the comparison is like for like.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = """
[import]
source = "model.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[optimize]
[pack]
output = "out/m.nnpkg"
"""
DODO = textwrap.dedent(
    """
    import json
    from pathlib import Path
    from doit.tools import config_changed
    from onebuild.tasks import STEPS

    DOIT_CONFIG = {"backend": "sqlite3", "dep_file": "dodo.sqlite3", "verbosity": 0}
    CHAIN = [
        ("import", {"source": "model.onnx", "input_shapes": {"x": [1, 3, 32, 32]}},
         "model.onnx", "dodo/import.obir", "dodo/import.obir"),
        ("optimize", {"preset": "O1"}, "dodo/import.obir", "dodo/optimize.obir",
         "dodo/optimize.obir"),
        ("pack", {"output": "dodo/m.nnpkg", "archive": False}, "dodo/optimize.obir",
         "dodo/m.nnpkg", "dodo/m.nnpkg/metadata/MANIFEST"),
    ]

    def task_build():
        for step, config, source, output, target in CHAIN:
            def action(step=step, config=config, source=source, output=output):
                STEPS[step].run(config, [Path(source)], [Path(output)])
            yield {
                "name": step,
                "actions": [action],
                "file_dep": [source],
                "targets": [target],
                "uptodate": [config_changed(json.dumps({"c": config, "v": STEPS[step].version}))],
            }
    """
)


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
        (folder / "r.toml").write_text(RECIPE)
        (folder / "dodo.py").write_text(DODO)
        onebuild = median_seconds(
            [sys.executable, "-m", "onebuild.cli", "build", "r.toml"], folder, repeats
        )
        doit = median_seconds([sys.executable, "-m", "doit", "-f", "dodo.py"], folder, repeats)
    print(
        json.dumps(
            {
                "steps": 3,
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
