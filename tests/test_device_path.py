"""The device path needs none of the build system: packages (folder and zip), the on-device flow
(record, quantize, codegen, switch, partitioned codegen) and the Session API run in a process
where pydantic, doit and onnx cannot be imported, and give what the full installation gives."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from onebuild.npz import read_npz, write_npz
from onebuild.packing import zip_bytes
from onebuild.runtime.package import load_package, run_package

ROOT = Path(__file__).parent.parent

DEVICE = r"""
import importlib.abc, json, sys
from pathlib import Path

class NotOnTheDevice(importlib.abc.MetaPathFinder):
    names = {"pydantic", "doit", "onnx"}

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is not installed on this device")

sys.meta_path.insert(0, NotOnTheDevice())

import numpy as np
from onebuild import Session
from onebuild.npz import read_npz, write_npz
from onebuild.runtime.package import load_package, run_package

work = Path(sys.argv[1])
images = read_npz(work / "images.npz")["input"]
results = {}
for name in ("npu.nnpkg", "npu.nnpkg.zip", "mobilenet_npu.nnpkg"):
    feeds = read_npz(work / ("mobilenet.npz" if "mobilenet" in name else "images.npz"))
    outputs, _ = run_package(load_package(work / name), feeds, False)
    write_npz(work / f"{name}.out.npz", outputs)

# the on-device flow, switched by the package's own config (ODC_AUTO_COMPILE)
session = Session(work / "odc.nnpkg", workspace=work / "ws")
for image in images[:40]:
    session.run({"input": image})
results["auto"] = [session.state, session.reason]

# the nnfw flow by hand: record, quantize, codegen
manual = Session(work / "odc.nnpkg", workspace=work / "ws2")
manual.set_execute_config("DUMP_MINMAX")
for image in images[:8]:
    manual.run({"input": image})
manual.reset_execute_config()
manual.quantize()
quantized = manual.run({"input": images[0]})["logits"]
manual.codegen("trix_sim", "performance")
compiled = manual.run({"input": images[0]})["logits"]
results["manual"] = [manual.state, bool(np.array_equal(quantized, compiled))]

# a model the NPU cannot run whole: partitioned on the device
mobilenet = Session(work / "mobilenet.nnpkg", workspace=work / "ws3")
mobilenet.set_odc_param_minmax_records_count(4)
for x in read_npz(work / "mobilenet.npz")["x"][:5]:
    mobilenet.run_with_auto_compilation({"x": x})
results["partitioned"] = [mobilenet.state, mobilenet.reason]
results["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in NotOnTheDevice.names)
print(json.dumps(results))
"""


def _build(recipe: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "onebuild.cli", "build", str(recipe)],
        check=True,
        capture_output=True,
    )


def test_packages_and_the_session_run_without_the_build_system(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    examples, out = tmp_path / "examples", tmp_path / "out"
    (examples / "mobilenet_float.toml").write_text(
        '[import]\nsource = "models/tiny_mobilenet.onnx"\ninput_shapes = { x = [1, 3, 32, 32] }\n'
        '[optimize]\n[pack]\noutput = "../out/mobilenet.nnpkg"\n'
    )
    for recipe in ("digits_npu", "digits_odc", "tiny_mobilenet_npu", "mobilenet_float"):
        _build(examples / f"{recipe}.toml")
    work = tmp_path / "device"
    work.mkdir()
    shutil.copytree(out / "digits_npu.nnpkg", work / "npu.nnpkg")
    (work / "npu.nnpkg.zip").write_bytes(zip_bytes(work / "npu.nnpkg", "npu.nnpkg"))
    shutil.copytree(out / "tiny_mobilenet_npu.nnpkg", work / "mobilenet_npu.nnpkg")
    shutil.copytree(out / "mobilenet.nnpkg", work / "mobilenet.nnpkg")
    # the ODC package without auto-compilation's record count changed: its own config decides
    shutil.copytree(out / "digits_odc.nnpkg", work / "odc.nnpkg")
    images = read_npz(examples / "digits" / "data" / "test.npz")["input"][:40]
    write_npz(work / "images.npz", {"input": images})
    mobilenet = read_npz(examples / "models" / "tiny_mobilenet_calib.npz")
    write_npz(work / "mobilenet.npz", {"x": mobilenet["x"][:5]})

    result = subprocess.run(
        [sys.executable, "-c", DEVICE, str(work)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["auto"] == ["COMPILED", None]
    assert report["manual"] == ["COMPILED", True]
    assert report["partitioned"] == ["COMPILED", None]
    assert (work / "ws3" / "compiled.nnpkg" / "metadata" / "MANIFEST").is_file()
    # the same outputs as with everything installed
    for name in ("npu.nnpkg", "npu.nnpkg.zip", "mobilenet_npu.nnpkg"):
        feeds = read_npz(work / ("mobilenet.npz" if "mobilenet" in name else "images.npz"))
        expected, _ = run_package(load_package(work / name), feeds, False)
        device = read_npz(work / f"{name}.out.npz")
        for key, array in expected.items():
            np.testing.assert_array_equal(device[key], array)
