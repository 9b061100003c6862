"""A package's ODC_* settings hold unless the app or the command line names another value:
the front doors' parameters default to None ("keep the settings"), not to their own values."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onebuild import Session
from onebuild.cli import main
from onebuild.compile import CodegenOptions, compile_file, optimize
from onebuild.graph_ir.serde import load_model, save_ir
from onebuild.npz import read_npz, write_npz
from onebuild.odc import OdcSettings
from onebuild.packing import write_package

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SETTINGS = {"ODC_CODEGEN_PREF": "memory", "ODC_HW": "trix-s", "ODC_MINMAX_RECORDS": "2"}


@pytest.fixture
def package(tmp_path) -> Path:
    model = optimize(load_model(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}))
    save_ir(model, tmp_path / "digits.obir")
    write_package(tmp_path / "p.nnpkg", [tmp_path / "digits.obir"], None, SETTINGS)
    return tmp_path / "p.nnpkg"


def samples(count: int) -> np.ndarray:
    return read_npz(DIGITS / "data" / "calib.npz")["input"][:count]


def test_auto_compilation_compiles_with_the_packages_settings(tmp_path, package):
    session = Session(package, workspace=tmp_path / "ws")
    for x in samples(2):
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED", session.reason
    settings = session.settings
    assert (settings.pref, settings.hw, settings.minmax_records) == ("memory", "trix-s", 2)
    # the binary is the one compiled for trix-s with the memory preference, byte for byte
    ws = session.workspace
    state = json.loads(ws.state_file.read_text())
    quantized = ws.folder / state["artifacts"]["quantized"]["path"]
    want = CodegenOptions("trix_sim", "trix-s", "memory")
    compile_file(quantized, tmp_path / "want.tvn", want)
    assert ws.compiled.read_bytes() == (tmp_path / "want.tvn").read_bytes()
    compile_file(quantized, tmp_path / "default.tvn", CodegenOptions())  # trix-m, performance
    assert ws.compiled.read_bytes() != (tmp_path / "default.tvn").read_bytes()


def test_the_command_line_keeps_the_packages_settings_unless_it_names_others(tmp_path, package):
    write_npz(tmp_path / "in.npz", {"input": samples(3)})
    run = ["run", str(package), "-i", str(tmp_path / "in.npz"), "--auto-compile"]
    assert main([*run, "-o", str(tmp_path / "a.npz"), "--workspace", str(tmp_path / "a")]) == 0
    decided = json.loads((tmp_path / "a" / "state.json").read_text())
    assert decided["state"] == "COMPILED"
    settings = decided["settings"]
    assert (settings["pref"], settings["hw"], settings["minmax_records"]) == ("memory", "trix-s", 2)

    named = ["--pref", "performance", "--hw", "trix-m", "--minmax-runs", "3"]
    out, ws = str(tmp_path / "b.npz"), str(tmp_path / "b")
    assert main([*run, *named, "-o", out, "--workspace", ws]) == 0
    settings = json.loads((tmp_path / "b" / "state.json").read_text())["settings"]
    assert (settings["pref"], settings["hw"], settings["minmax_records"]) == (
        "performance",
        "trix-m",
        3,
    )


def test_naming_the_default_preset_decides_nothing_again():
    """The decision key holds the preset compiled for: --hw trix-m after a run without --hw
    (the same hardware) keeps the decision; another preset does not."""
    assert OdcSettings(hw="trix-m").key == OdcSettings().key
    assert OdcSettings(hw="trix-s").key != OdcSettings().key


def test_codegen_for_a_target_the_packages_hw_is_not_of_is_refused_before_writing(
    tmp_path, package
):
    """--codegen tiny (the second target of tests/data/tiny_target, installed by its entry
    point) keeps the package's ODC_HW=trix-s, a trix_sim preset: refused at once, naming the
    key and --hw. The old code recorded and quantized into the workspace first, then failed at
    codegen with a line that named neither."""
    write_npz(tmp_path / "in.npz", {"input": samples(3)})
    workspace, out = tmp_path / "ws", tmp_path / "o.npz"
    run = ["run", str(package), "-i", str(tmp_path / "in.npz"), "-o", str(out)]
    odc = ["--quantize", "uint8", "--minmax-runs", "2", "--workspace", str(workspace)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "data" / "tiny_target")}
    result = subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *run, *odc, "--codegen", "tiny"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip()
    assert error.count("\n") == 0, error
    assert f"{package}: config.cfg: ODC_HW 'trix-s' is not a preset of target tiny" in error
    assert "(its presets: tiny-1); give --hw" in error
    assert not workspace.exists() and not out.exists()
