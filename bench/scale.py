"""Scaling out: 16 recipes (4 model pipelines x 4 calibration methods) built serially, with
`-j 2`, and on a Dask LocalCluster of 1 and 2 worker processes; then a second "machine" (a fresh
project folder) that restores everything from the shared step cache. Prints JSON.

Pipelines: the digits CNN to a CPU package and to a TRIX NPU package, the MobileNet-style export
to a CPU package and partitioned for the NPU (one codegen task per NPU part). Each build runs as
a whole `onebuild build` process in its own fresh folder, as a CI job would.

Usage: python bench/scale.py [--out FILE]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DIGITS = """
[import]
source = "digits/digits.onnx"
input_shapes = {{ input = [1, 1, 8, 8] }}
[optimize]
[quantize]
method = "{method}"
calibration = "digits/data/calib.npz"
"""
MOBILENET = """
[import]
source = "models/tiny_mobilenet.onnx"
input_shapes = {{ x = [1, 3, 32, 32] }}
[optimize]
[quantize]
method = "{method}"
calibration = "models/tiny_mobilenet_calib.npz"
"""
NPU = '[codegen]\ntarget = "trix_sim"\nhw = "trix-m"\n'
PIPELINES = {
    "digits": DIGITS,
    "digits_npu": DIGITS + NPU,
    "mobilenet": MOBILENET,
    "mobilenet_npu": MOBILENET + '[partition]\nbackends = ["trix", "cpu"]\n' + NPU,
}
METHODS = ("minmax", "percentile", "mse", "moving_average")


def project(folder: Path, cache: Path) -> list[Path]:
    """A fresh folder with the example data and the 16 recipes, sharing `cache`."""
    folder.mkdir(parents=True)
    shutil.copytree(EXAMPLES / "digits", folder / "digits", ignore=shutil.ignore_patterns("*.py"))
    shutil.copytree(EXAMPLES / "models", folder / "models")
    recipes = []
    for pipeline, text in PIPELINES.items():
        for method in METHODS:
            name = f"{pipeline}_{method}"
            recipe = folder / f"{name}.toml"
            body = text.format(method=method)
            body += f'[pack]\noutput = "out/{name}.nnpkg"\n[build]\ncache = "{cache}"\n'
            recipe.write_text(body)
            recipes.append(recipe)
    return recipes


def timed_build(recipes: list[Path], *args: str) -> dict:
    command = [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes), "--json", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"build {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    steps = json.loads(done.stdout)["steps"]
    statuses = {}
    for step in steps:
        statuses[step["status"]] = statuses.get(step["status"], 0) + 1
    return {
        "seconds": round(seconds, 2),
        "steps": statuses,
        "step_seconds": round(sum(s["seconds"] for s in steps), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="onebuild-scale-"))
    try:
        shared = work / "shared-cache"
        runs = {
            "serial": (shared, ()),
            "jobs_2": (work / "cache-j2", ("-j", "2")),
            "dask_1_worker": (work / "cache-d1", ("--executor", "dask", "-j", "1")),
            "dask_2_workers": (work / "cache-d2", ("--executor", "dask", "-j", "2")),
        }
        result = {"recipes": 16, "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
        for name, (cache, options) in runs.items():
            result[name] = timed_build(project(work / name, cache), *options)
        result["fresh_folder_from_shared_cache"] = timed_build(project(work / "fresh", shared))
        serial = result["serial"]["seconds"]
        result["speedup"] = {
            name: round(serial / result[name]["seconds"], 2)
            for name in ("jobs_2", "dask_1_worker", "dask_2_workers")
        }
        result["load_after"] = os.getloadavg()[0]
        text = json.dumps(result, indent=2)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
