"""What the report shows of accuracy: the per-layer SQNR the quantize step measured without an
accuracy gate, and a failed gate's checks and layers (`onebuild report` after the build
stopped at the gate); on the digits CNN."""

import json
import re
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

from onebuild.graph_ir.serde import load_ir

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "digits.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
[quantize]
calibration = "data/calib.npz"
"""
GATE = '[quantize.accuracy]\ndata = "data/test.npz"\nmin_sqnr_db = 90\n[pack]\noutput = "p.nnpkg"\n'


def onebuild(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def project(folder: Path, extra: str = "") -> Path:
    shutil.copy(DIGITS / "digits.onnx", folder)
    shutil.copytree(DIGITS / "data", folder / "data")
    (folder / "r.toml").write_text(RECIPE + extra)
    return folder


def bars(text: str) -> list[str]:
    """The SQNR chart's labels: '<node> (<op>, <type>)' and the values beside the bars."""
    chart = text.split('<figure id="sqnr">')[1].split("</figure>")[0]
    return re.findall(r"<text[^>]*>([^<]*)</text>", chart)


def test_an_ungated_build_shows_the_layers_its_quantize_check_measured(tmp_path):
    folder = project(tmp_path)
    assert onebuild("build", "r.toml", cwd=folder).returncode == 0
    done = onebuild("report", "r.toml", cwd=folder)
    assert done.returncode == 0
    assert re.search(r"report r.toml: 5 parts read or drawn in [\d.]+s", done.stderr)  # progress
    text = (folder / "build/r/report.html").read_text()
    check = json.loads(load_ir(folder / "build/r/quantize.obir").metadata["sqnr_check"])
    assert check["samples"] == 8 and check["data"] == "calibration"
    assert f"{check['samples']} calibration samples, measured by the quantize step" in text
    labels = bars(text)
    for layer in check["layers"]:  # every layer, worst first, with its SQNR
        assert f"{layer['node']} ({layer['op']}, {layer['dtype']})" in labels
        assert f"{layer['sqnr_db']:.1f}" in labels
    assert [layer["sqnr_db"] for layer in check["layers"]] == sorted(
        layer["sqnr_db"] for layer in check["layers"]
    )
    assert "No per-layer SQNR" not in text
    assert escape("the worst layers' outputs") in text  # the histograms follow the worst layers


def test_a_failed_gate_is_shown_from_the_records_on_disk(tmp_path):
    folder = project(tmp_path, GATE)
    done = onebuild("build", "r.toml", cwd=folder)
    assert done.returncode == 1 and "accuracy gate failed" in done.stderr
    gate = json.loads((folder / "build/r/quantize.accuracy.json").read_text())
    assert gate["gate"]["passed"] is False
    assert onebuild("report", "r.toml", cwd=folder).returncode == 0
    text = (folder / "build/r/report.html").read_text()
    assert 'Accuracy gate: <span class="failed">failed</span>' in text
    assert "The build stopped at [evaluate]" in text
    check = gate["gate"]["checks"][0]
    row = f"<td>{escape(check['check'])}</td><td>{check['value']:.4g}</td><td>90.0</td>"
    assert row + '<td><span class="failed">failed</span></td>' in text
    labels = bars(text)
    for layer in gate["layers"]:
        assert f"{layer['node']} ({layer['op']}, {layer['dtype']})" in labels
    assert "Not built with these settings: [evaluate], [pack]" in text
