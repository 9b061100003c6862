"""What the report says about mixed precision, the per-layer chart, the calibration
histograms and the NPU layers (counts, roofline labels), and how it draws the model graph
(skip connections beside the boxes, long names inside them); on the digits CNN and a residual
block, no browser."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_mixed_precision import decoy_digits

from onebuild.engine.dag import build
from onebuild.graph_ir.serde import load_ir, load_onnx, save_ir
from onebuild.recipe import load_recipe
from onebuild.report.graph_svg import NODE_W, graph_svg

ROOT = Path(__file__).parent.parent
DIGITS = ROOT / "examples" / "digits"
RECIPE = """
[import]
source = "digits.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
[quantize]
calibration = "data/calib.npz"
[quantize.mixed_precision]
target_sqnr_db = 40
samples = 1
[quantize.accuracy]
data = "data/test.npz"
min_sqnr_db = 30
[build]
report = true
"""


def test_mixed_precision_and_the_layer_chart_say_what_was_measured(tmp_path):
    decoy_digits(tmp_path / "digits.onnx")
    shutil.copytree(DIGITS / "data", tmp_path / "data")
    (tmp_path / "r.toml").write_text(RECIPE)
    plan = load_recipe(tmp_path / "r.toml")
    results = build([plan], progress=lambda message: None)
    assert all(r.status != "failed" for r in results)
    from onebuild.report.page import write_report

    text = write_report(plan, results).read_text()
    accuracy = json.loads((tmp_path / "build/r/quantize.accuracy.json").read_text())
    record = accuracy["mixed_precision"]
    seen = f"{record['sqnr_db']:.1f} dB on the first 1 samples of the accuracy data"
    unseen = f"{record['unseen']['sqnr_db']:.1f} dB on the 359 gate samples it did not see"
    assert f"reached ({seen}, which the gate measures again; {unseen})" in text
    assert "calibration data)" not in text
    # each bar names its layer's type; no output gate line across the layers' bars
    model = load_ir(tmp_path / "build/r/quantize.obir")
    dtypes = {n.name: str(n.outputs[0].dtype) for n in model.main.nodes}
    for layer in accuracy["layers"]:
        assert f">{layer['node']} ({layer['op']}, {dtypes[layer['node']]})<" in text
    assert {"uint8", "int16"} <= {dtypes[layer["node"]] for layer in accuracy["layers"]}
    assert "gate: 30" not in text and ">output type<" in text
    # the histograms count the calibration file's 200 samples, not "the first 256"
    assert "counts on 200 calibration samples" in text


def _residual(path: Path, long_name: str) -> Path:
    """Conv, Relu, two Convs and an Add of the Relu's output: a skip over two layers."""
    rng = np.random.default_rng(0)

    def conv(name: str, x: str, y: str) -> onnx.NodeProto:
        return helper.make_node("Conv", [x, f"{name}.w"], [y], name=name, pads=[1, 1, 1, 1])

    weights = [
        numpy_helper.from_array(rng.normal(0, 0.2, (4, 4, 3, 3)).astype(np.float32), f"{n}.w")
        for n in ("c0", "c1", long_name)
    ]
    nodes = [
        conv("c0", "x", "a"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        conv("c1", "r", "b"),
        conv(long_name, "b", "c"),
        helper.make_node("Add", ["r", "c"], ["y"], name="add"),
    ]
    shape = [1, 4, 8, 8]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _points(d: str) -> list[tuple[float, float]]:
    """Points along an edge's path: M, V, H and C (sampled) commands, absolute."""
    points: list[tuple[float, float]] = []
    for command, args in re.findall(r"([MVHC])([^MVHC]*)", d):
        numbers = [float(v) for v in re.findall(r"-?[\d.]+", args)]
        x, y = points[-1] if points else (0.0, 0.0)
        if command == "M":
            points.append((numbers[0], numbers[1]))
        elif command in "VH":
            end = (x, numbers[0]) if command == "V" else (numbers[0], y)
            points += [(x + (end[0] - x) * t, y + (end[1] - y) * t) for t in np.linspace(0, 1, 50)]
        else:
            (x1, y1), (x2, y2), (x3, y3) = zip(numbers[0::2], numbers[1::2])
            for t in np.linspace(0, 1, 50):
                u = 1 - t
                px = u**3 * x + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3
                py = u**3 * y + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3
                points.append((px, py))
    return points


def test_the_graph_draws_skip_connections_beside_the_boxes(tmp_path):
    long_name = "/Backbone/StageWWW/BlockMMM/Conv_" + "W" * 30
    model = load_onnx(_residual(tmp_path / "m.onnx", long_name))
    save_ir(model, tmp_path / "m.obir")
    svg = graph_svg([("part 1", "cpu", tmp_path / "m.obir")], {})
    boxes = [
        tuple(float(v) for v in box)
        for box in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="(\d+)" height="(\d+)"', svg)
    ]
    assert len(boxes) == 5
    paths = re.findall(r'<path d="([^"]+)"', svg)
    assert len(paths) == 5  # c0-relu, relu-c1, c1-long, long-add and the skip relu-add
    crossings = 0
    for d in paths:
        for x, y, w, h in boxes:  # strictly inside a box (ends touch their own boxes' edges)
            crossings += sum(
                x + 1 < px < x + w - 1 and y + 1 < py < y + h - 1 for px, py in _points(d)
            )
    assert crossings == 0
    skip = [d for d in paths if "V" in d]
    assert len(skip) == 1
    lane = max(px for px, _ in _points(skip[0]))
    assert lane > max(x + w for x, _, w, _ in boxes)  # beside the column of boxes
    # a long name of wide letters: clipped to what fits the box, inside a clipping viewport
    texts = re.findall(
        r'<svg x="[\d.]+" y="[\d.]+" width="([\d.]+)" height="24"><text[^>]*>([^<]*)<', svg
    )
    assert len(texts) == 5 and any("…" in t for _, t in texts), texts
    for width, text in texts:
        assert float(width) < NODE_W and len(text) * 7.0 <= float(width), text


def test_layer_counts_match_the_rows_listed(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    command = [sys.executable, "-m", "onebuild.cli", "build", "examples/digits_npu.toml"]
    done = subprocess.run(
        [*command, "--set", "build.report=true"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    binary = next((tmp_path / "out/digits_npu.nnpkg").glob("*.tvn"))
    inspect = [sys.executable, "-m", "onebuild.cli", "inspect", str(binary)]
    lines = subprocess.run(inspect, capture_output=True, text=True, check=True).stdout
    header = lines.splitlines().index(next(s for s in lines.splitlines() if s.startswith("layer ")))
    rows = [s for s in lines.splitlines()[header + 1 :] if s.startswith("  ")]
    assert len(rows) == 5
    assert "6 layers (1 without instructions: flatten)" in lines
    report = (tmp_path / "build/digits_npu/report.html").read_text()
    assert '<td class="num">5 (+1 without instructions: flatten)</td>' in report
    roofline = report.split('<figure id="roofline">')[1].split("</figure>")[0]
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", roofline)
    assert {"conv1", "conv2", "fc"} <= set(labels), labels  # each point named
