"""The codegen step and the .tvn commands: a recipe builds a TRIX package; inspect and run
work on the binary; targets are discovered through entry points."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from onebuild.cli import main
from onebuild.engine.dag import build
from onebuild.npz import read_npz
from onebuild.recipe import load_recipe
from onebuild.targets import available, load_target

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture
def project(tmp_path):
    shutil.copytree(EXAMPLES / "digits", tmp_path / "digits")
    text = (EXAMPLES / "digits_npu.toml").read_text()
    text = text.replace("../out/", "out/").replace("../build/", "build/")
    (tmp_path / "r.toml").write_text(text)
    return tmp_path


def statuses(project: Path, *overrides: str) -> dict[str, str]:
    plan = load_recipe(project / "r.toml", list(overrides))
    return {r.step: r.status for r in build([plan], progress=lambda message: None)}


def test_trix_sim_is_discovered_as_a_plugin():
    assert "trix_sim" in available()
    assert load_target("trix_sim").name == "trix_sim"


def test_recipe_builds_a_tvn_package_deterministically(project):
    assert set(statuses(project).values()) == {"run"}
    package = project / "out/digits_npu.nnpkg"
    manifest = json.loads((package / "metadata/MANIFEST").read_text())
    assert manifest["models"] == ["digits_npu.tvn"] and manifest["model-types"] == ["tvn"]
    first = (package / "digits_npu.tvn").read_bytes()
    assert statuses(project, "codegen.pref='memory'")["codegen"] == "run"
    assert statuses(project)["codegen"] == "restored"
    assert (package / "digits_npu.tvn").read_bytes() == first
    assert statuses(project, "codegen.hw='trix-s'")["quantize"] == "up-to-date"


def test_inspect_and_run_a_tvn(project, capsys):
    statuses(project)
    binary = project / "build/digits_npu/codegen.tvn"
    assert main(["inspect", str(binary), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"inputs", "outputs", "cycles", "roofline_cycles"} <= set(info)
    assert info["inputs"][0]["dtype"] == "uint8" and info["cycles"] >= info["roofline_cycles"]
    out = project / "out.npz"
    data = project / "digits/data/test.npz"
    assert main(["run", str(binary), "-i", str(data), "-o", str(out)]) == 0
    logits = read_npz(out)["logits"].reshape(360, -1)
    labels = read_npz(project / "digits/data/test_labels.npz")["labels"]
    report = json.loads((project / "build/digits_npu/quantize.accuracy.json").read_text())
    assert np.mean(logits.argmax(1) == labels) == pytest.approx(report["accuracy"]["candidate"])
    assert main(["run", str(binary), "-i", str(data), "-o", str(out), "--raw"]) == 2
    assert "--raw needs uint8" in capsys.readouterr().err


def test_corrupt_tvn_is_one_line_exit_2(project, capsys):
    statuses(project)
    binary = project / "build/digits_npu/codegen.tvn"
    broken = project / "broken.tvn"
    broken.write_bytes(binary.read_bytes()[:-100])
    assert main(["inspect", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "not a valid .tvn file" in err and err.count("\n") == 1


def test_targets_command_lists_presets_and_constraints(capsys):
    assert main(["targets", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["trix_sim"]
    assert {"trix-s", "trix-m"} <= set(info["presets"])
    assert info["presets"]["trix-s"]["sram_bytes"] < info["presets"]["trix-m"]["sram_bytes"]
    assert "max_kernel" in info["constraints"]["kernel_size"]
