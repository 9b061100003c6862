"""The HTML build report: built for the two NPU examples with `[build] report = true`, rendered
in a real headless chromium (no console errors, no network, every figure drawn), screenshots
kept under build/report-screenshots/ (a CI artifact); deterministic; its histograms checked
against onnxruntime; its graph layout and its errors."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from browser import Chromium, chromium_path

from onebuild.datasets import iter_batches
from onebuild.graph_ir.macs import graph_macs
from onebuild.graph_ir.quant.histograms import value_histograms
from onebuild.graph_ir.serde import load_ir
from onebuild.report.graph_svg import _layers, _Node

ROOT = Path(__file__).parent.parent
SCREENSHOTS = ROOT / "build" / "report-screenshots"
EXAMPLES = ("digits_npu", "tiny_mobilenet_npu")


def onebuild(*args: str, cwd: Path, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The examples and presets copied and both NPU examples built with report = true."""
    root = tmp_path_factory.mktemp("report")
    shutil.copytree(ROOT / "examples", root / "examples")
    shutil.copytree(ROOT / "recipes", root / "recipes")
    recipes = [f"examples/{name}.toml" for name in EXAMPLES]
    done = onebuild("build", *recipes, "--set", "build.report=true", cwd=root)
    assert done.returncode == 0, done.stderr
    for name in EXAMPLES:
        assert f"report: {root / 'build' / name / 'report.html'}" in done.stdout
    return root


def _npu_parts(built: Path) -> int:
    partition = built / "build/tiny_mobilenet_npu/partition/tiny_mobilenet.partition.json"
    parts = json.loads(partition.read_text())["parts"]
    return sum(part["backend"] != "cpu" for part in parts)


def test_reports_render_in_headless_chromium(built):
    assert chromium_path(), "chromium is not installed: apt-get install -y chromium (.ci/run does)"
    expected = {
        "digits_npu": {"graph", "sqnr", "histograms", "timeline0", "roofline"},
        "tiny_mobilenet_npu": {"graph", "sqnr", "histograms", "roofline"}
        | {f"timeline{i}" for i in range(_npu_parts(built))},  # one per NPU binary
    }
    with Chromium() as browser:
        for name in EXAMPLES:
            page = built / "build" / name / "report.html"
            load = browser.open(page, SCREENSHOTS / f"{name}.png", "figure > svg")
            assert load.errors == [], (name, load.errors)
            assert load.requests == [page.resolve().as_uri()]  # self-contained: nothing fetched
            assert {figure for figure, _, _ in load.sizes} == expected[name]
            assert all(w > 100 and h > 100 for _, w, h in load.sizes), load.sizes
            shot = (SCREENSHOTS / f"{name}.png").read_bytes()
            assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 50_000
            width, height = int.from_bytes(shot[16:20]), int.from_bytes(shot[20:24])
            assert width == 1280 and height >= load.height - 1
            check_layout(name, json.loads(browser.evaluate(FIGURE_BOXES)))
        broken = built / "broken.html"  # the checks above can fail: a page that breaks them
        broken.write_text(
            '<figure id="f"><svg width="0" height="0"></svg></figure><img src="missing.png">'
            "<script>console.error('drawn wrong'); undefinedFunction();</script>"
        )
        load = browser.open(broken, built / "broken.png", "figure > svg")
        assert len(load.errors) == 3, load.errors  # console error, exception, failed fetch
        assert load.requests[1:] == [(built / "missing.png").as_uri()]
        assert load.sizes == [("f", 0, 0)]
        squeezed = built / "squeezed.html"  # an axes 10 % wide, a legend entry cut at the edge
        squeezed.write_text(
            '<figure id="timeline0"><svg width="400" height="100"><g id="axes_1"><g id="patch_2">'
            '<rect width="40" height="50"/></g></g><text x="370" y="80">DMA busy</text></svg>'
            "</figure>"
        )
        browser.open(squeezed, built / "squeezed.png", "figure > svg")
        figures = json.loads(browser.evaluate(FIGURE_BOXES))
        with pytest.raises(AssertionError, match="patch|40"):
            check_layout("squeezed", figures)
        figures[0][3] = []  # without the axes: the text still sticks out
        with pytest.raises(AssertionError, match="squeezed"):
            check_layout("squeezed", figures)


# per figure: its id, the width and height of its picture, the plotting area of each axes and
# the box of each text, as (x, y, width, height) relative to the picture, as chromium draws them
FIGURE_BOXES = """JSON.stringify(Array.from(document.querySelectorAll('figure > svg')).map(svg => {
  const s = svg.getBoundingClientRect();
  const box = e => { const r = e.getBoundingClientRect();
    return [r.left - s.left, r.top - s.top, r.width, r.height]; };
  const all = q => Array.from(svg.querySelectorAll(q)).map(box);
  return [svg.parentElement.id, s.width, s.height,
          all('g[id^="axes_"] > g[id^="patch_"]:first-child'), all('text')];
}))"""


def check_layout(page: str, figures: list) -> None:
    """No chart squeezed or cut: a timeline's or roofline's axes at least half the picture's
    width (a histogram's, one of three side by side, a fifth), every text (legend entries,
    labels) inside the picture."""
    assert figures, page
    for name, width, height, axes, texts in figures:
        least = 0.5 if name.startswith(("timeline", "roofline", "sqnr")) else 0.2
        assert all(w >= least * width for _, _, w, _ in axes), (page, name, width, axes)
        for x, y, w, h in texts:
            inside = x >= -1 and y >= -1 and x + w <= width + 1 and y + h <= height + 1
            assert inside, (page, name, (width, height), (x, y, w, h))


def test_report_content_follows_the_build_records(built):
    text = (built / "build/tiny_mobilenet_npu/report.html").read_text()
    assert "<script" not in text and "<img" not in text and "<link" not in text
    partition = built / "build/tiny_mobilenet_npu/partition/tiny_mobilenet.partition.json"
    fallbacks = json.loads(partition.read_text())["fallbacks"]
    assert len(fallbacks) >= 2  # the GELU head: its DequantizeLinear and ReduceMean
    for fallback in fallbacks:  # each CPU fallback is listed with its reason
        row = f"<td>{fallback['node']}</td><td>{fallback['op']}</td><td>{fallback['reasons'][0]}"
        assert row in text
    assert text.count("<tr><td>codegen</td>") == _npu_parts(built)  # one task per NPU part
    for part in sorted((built / "out/tiny_mobilenet_npu.nnpkg").rglob("*.tvn")):
        assert f'<td>{part.name}</td><td class="num">' in text
    for part in sorted((built / "out/tiny_mobilenet_npu.nnpkg").rglob("*.obir")):
        assert f"<td>{part.name}</td><td>circle/tflite export: " in text  # why not circle
    digits = (built / "build/digits_npu/report.html").read_text()
    assert re.search(r"<td>accuracy drop</td><td>0</td><td>0.01</td><td>passed", digits)


def test_report_is_deterministic_and_written_by_command_and_build(built):
    first = (built / "build/digits_npu/report.html").read_bytes()
    assert b'<td><span class="run">run</span></td>' in first  # what this build did
    again = onebuild("build", "examples/digits_npu.toml", "--set", "build.report=true", cwd=built)
    assert again.returncode == 0, again.stderr
    second = (built / "build/digits_npu/report.html").read_bytes()
    assert b'<span class="up-to-date">up-to-date</span>' in second
    third = onebuild("build", "examples/digits_npu.toml", "--set", "build.report=true", cwd=built)
    assert third.returncode == 0 and (built / "build/digits_npu/report.html").read_bytes() == second
    outputs = []
    for _ in range(2):
        done = onebuild("report", "examples/digits_npu.toml", cwd=built)
        assert done.returncode == 0, done.stderr
        outputs.append((built / "build/digits_npu/report.html").read_bytes())
    assert outputs[0] == outputs[1]
    assert not list((built / "build/digits_npu").glob("*.tmp*"))  # written atomically
    assert onebuild("clean", "examples/digits_npu.toml", cwd=built).returncode == 0
    done = onebuild("build", "examples/digits_npu.toml", "--set", "build.report=true", cwd=built)
    text = (built / "build/digits_npu/report.html").read_text()
    assert "8 tasks; 8 last restored from the step cache" in text, done.stderr  # cache hits


def test_histograms_agree_with_onnxruntime(built):
    """The report's activation counts against onnxruntime's values of the same layers."""
    model = onnx.load(ROOT / "examples/digits/digits.onnx")
    names = ["p1", "logits"]
    for name in names[:-1]:
        model.graph.output.append(onnx.helper.make_value_info(name, onnx.TypeProto()))
    session = ort.InferenceSession(model.SerializeToString())
    data = np.load(ROOT / "examples/digits/data/calib.npz")["input"][:100]
    reference = {n: [] for n in names}
    for sample in data:
        for n, v in zip(names, session.run(names, {"input": sample})):
            reference[n].append(v)
    edges = {"p1": np.linspace(-0.5, 4.0, 41), "logits": np.linspace(-30, 20, 51)}
    graph = load_ir(built / "build/digits_npu/optimize.obir").main
    batches = iter_batches(built / "examples/digits/data/calib.npz", [("input", (1, 1, 8, 8))])
    counts = value_histograms(graph, batches, edges, max_samples=100, chunk=7)
    for n in names:
        values = np.clip(np.concatenate([r.ravel() for r in reference[n]]), *edges[n][[0, -1]])
        expected = np.histogram(values, edges[n])[0]
        assert counts[n].sum() == expected.sum() == values.size
        assert np.abs(counts[n] - expected).sum() <= 2, (n, counts[n], expected)  # bin edges


def test_layered_layout_orders_a_diamond_and_a_chain():
    nodes = [_Node(f"n{i}", "Op", 0, [], []) for i in range(5)]
    rows = _layers(nodes, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])
    assert rows == [[0], [1, 2], [3], [4]]
    assert nodes[1].x < nodes[2].x and nodes[0].x == nodes[3].x == nodes[4].x == 0.5


def test_report_errors_are_one_line(built, tmp_path):
    (tmp_path / "r.toml").write_text('[import]\nsource = "m.onnx"\n')
    shutil.copy(ROOT / "examples/models/tiny_mobilenet.onnx", tmp_path / "m.onnx")
    unbuilt = onebuild("report", "r.toml", cwd=tmp_path)
    assert unbuilt.returncode == 2 and "not built yet; run 'onebuild build" in unbuilt.stderr
    assert len(unbuilt.stderr.splitlines()) == 1
    blocker = tmp_path / "no_matplotlib"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('blocked for this test')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}
    missing = onebuild("report", "examples/digits_npu.toml", cwd=built, env=env)
    assert missing.returncode == 2, missing.stderr
    message = (
        "onebuild: error: the HTML report draws its charts with matplotlib, which is not "
        "installed: pip install 'onebuild[report]'"
    )
    assert missing.stderr.strip() == message
    before = (built / "build/digits_npu/quantize.obir").stat().st_mtime_ns
    args = [
        "examples/digits_npu.toml",
        "--set",
        "build.report=true",
        "--set",
        "quantize.dtype=int16",
    ]
    refused = onebuild("build", *args, cwd=built, env=env)  # said before building anything
    assert refused.returncode == 2 and refused.stderr.strip() == message
    assert (built / "build/digits_npu/quantize.obir").stat().st_mtime_ns == before


def test_mixed_precision_choices_are_shown_as_the_quantized_model_has_them(built):
    override = 'quantize.layers=[{names=["conv1", "fc"], dtype="int16"}]'
    done = onebuild("build", "examples/digits.toml", "--set", "build.report=true", "--set",
                    override, cwd=built)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "evaluate: accuracy gate passed: sqnr_db of 'logits' = " in done.stderr  # said
    text = (built / "build/digits/report.html").read_text()
    row = "<tr><td>conv1, fc</td><td>int16</td><td>channel</td><td>conv1: int16, fc: int16</td>"
    assert row in text
    assert '<figure id="sqnr">' in text and '<figure id="histograms">' in text
    assert '<figure id="roofline">' not in text  # no NPU in this recipe


def test_layers_left_in_float_by_mixed_precision_are_shown_as_float(built):
    """Layers left in float32 (by the recipe, or promoted by automatic mixed precision) have no
    quantization noise, an SQNR of null in the accuracy report: the report says so (it failed
    the build with a TypeError)."""
    explicit = ['quantize.layers=[{names=["conv1"], dtype="float32"}]']
    automatic = ["quantize.mixed_precision.target_sqnr_db=60",
                 "quantize.mixed_precision.dtype=float32"]  # fmt: skip
    for options in (explicit, automatic):
        args = [a for option in ["build.report=true", *options] for a in ("--set", option)]
        done = onebuild("build", "examples/digits.toml", *args, cwd=built)
        assert done.returncode == 0, done.stderr
        text = (built / "build/digits/report.html").read_text()
        accuracy = json.loads((built / "build/digits/quantize.accuracy.json").read_text())
        exact = [layer for layer in accuracy["layers"] if layer["sqnr_db"] is None]
        assert exact, accuracy["layers"]  # the case that failed: null SQNRs
        for layer in exact:  # float layers named as such, with a note for the missing bar
            assert f">{layer['node']} ({layer['op']}, float32)<" in text
        assert text.count(">float32: not quantized, no noise<") == len(exact)
        for layer in accuracy["layers"]:
            if layer["sqnr_db"] is not None:
                assert f">{layer['sqnr_db']:.1f}<" in text  # a bar with its value
    promoted = accuracy["mixed_precision"]["promoted"]
    assert "<h3>Automatic mixed precision</h3>" in text and len(promoted) == 6
    assert "6 layer(s) promoted to float32, 100.0 % of the MACs" in text
    for node in promoted:
        assert f"<tr><td>{node}</td><td>float32</td></tr>" in text
    assert "<td>no noise</td>" in text  # the gate's output SQNR, infinite


def test_roofline_points_stay_under_the_roofs(built, tmp_path):
    """Every layer's point is under min(peak, intensity x bandwidth) of its hardware, on the
    NPU examples and on SqueezeNet, whose cascades overlap layers (n3: a 1,090-cycle span for
    6,050 compute cycles; MACs over the span alone were 2.8x the peak)."""
    from onebuild.graph_ir.serde.model_zoo import light_model
    from onebuild.plan import load_plan
    from onebuild.report.charts_npu import roofline_points
    from onebuild.report.collect import collect

    onnx.save(light_model("squeezenet"), tmp_path / "squeezenet.onnx")
    images = np.random.default_rng(0).random((4, 1, 3, 224, 224), dtype=np.float32)
    np.savez(tmp_path / "images.npz", data_0=images)
    (tmp_path / "sq.toml").write_text(
        f'extends = "{ROOT / "recipes/npu-uint8.toml"}"\n[import]\nsource = "squeezenet.onnx"\n'
        '[quantize]\ncalibration = "images.npz"\n[pack]\noutput = "sq.nnpkg"\n'
    )
    done = onebuild("build", "sq.toml", "--set", "build.report=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    recipes = [built / f"examples/{name}.toml" for name in EXAMPLES] + [tmp_path / "sq.toml"]
    binaries = [b for recipe in recipes for b in collect(load_plan(recipe)).binaries]
    assert len(binaries) == 3
    overlapped = 0
    for binary in binaries:
        points = roofline_points(binary)
        assert points and binary.peak_macs and binary.bytes_per_cycle
        for intensity, attained in points:
            roof = min(binary.peak_macs, intensity * binary.bytes_per_cycle)
            assert attained <= roof * (1 + 1e-9), (binary.name, intensity, attained, roof)
        layers = binary.info["layers_table"].values()
        overlapped += sum(layer["cycles"] < layer["compute_cycles"] for layer in layers)
    assert overlapped  # the case that went above the peak is there
    assert max(y for _, y in roofline_points(binaries[-1])) >= 0.5 * binaries[-1].peak_macs
    # as chromium draws SqueezeNet's roofline: no text covers another, most points are named
    with Chromium() as browser:
        page = tmp_path / "build/sq/report.html"
        browser.open(page, SCREENSHOTS / "squeezenet.png", "figure > svg")
        figures = {f[0]: f for f in json.loads(browser.evaluate(FIGURE_BOXES))}
    texts = figures["roofline"][4]
    for i, (x, y, w, h) in enumerate(texts):
        for a, b, c, d in texts[i + 1 :]:
            apart = x + w <= a + 1 or a + c <= x + 1 or y + h <= b + 1 or b + d <= y + 1
            assert apart, ((x, y, w, h), (a, b, c, d))
    page = (tmp_path / "build/sq/report.html").read_text()
    # the histograms run the float model on as many samples as 1e9 MACs allow (here 2 of 4)
    macs = graph_macs(load_ir(tmp_path / "build/sq/optimize.obir").main)
    assert 1e9 // macs == 2 and "counts on 2 calibration samples" in page
    roofline = page.split('<figure id="roofline">')[1]
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", roofline.split("</figure>")[0])
    points = len(roofline_points(binaries[-1]))
    assert sum(label in binaries[-1].info["layers_table"] for label in labels) >= points // 2


def test_package_models_left_in_ir_say_why(tmp_path):
    """A package member that pack kept as onebuild's IR (control flow has no circle form) is
    listed in the report with the reason, also when pack was restored and printed nothing."""
    from onebuild.graph_ir.serde import load_onnx, save_ir
    from onebuild.report.collect import _not_circle

    model = load_onnx(ROOT / "tests/data/torch_models/value_if.onnx")
    save_ir(model, tmp_path / "model.obir")
    (reason,) = _not_circle(tmp_path).values()
    assert "If (node" in reason


UP_TO_DATE = '<td><span class="up-to-date">up-to-date</span></td>'


def test_report_for_settings_not_built_leaves_other_builds_out(built):
    """`report --set` for options never built shows no figures of the build on disk (it showed
    the uint8 build's under an int16 heading); after building them it shows theirs. A build
    whose gate fails shows the failed gate's report, not the package of an earlier build."""
    int16 = ["examples/digits_npu.toml", "--set", "quantize.dtype=int16"]
    page = built / "build/digits_npu/report.html"
    accuracy = built / "build/digits_npu/quantize.accuracy.json"
    uint8_worst = json.loads(accuracy.read_text())["layers"][0]["sqnr_db"]
    done = onebuild("report", *int16, cwd=built)
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "<p>full int16, channel granularity" in text
    command = f"onebuild build {built / 'examples/digits_npu.toml'} --set quantize.dtype=int16"
    assert (
        "Not built with these settings: [quantize], [measure], [evaluate], [codegen], [pack]. "
        "What another "
        f"build left in their place is not shown; run <code>{command}</code> first." in text
    )
    assert "<th>with these settings</th>" in text  # the column says what it means, filled
    assert text.count(UP_TO_DATE) == 3  # import, optimize, calibrate
    assert "a build would run it (option(s) changed: dtype)" in text  # quantize
    for figure in ("sqnr", "timeline0", "roofline"):  # the uint8 build's, left out
        assert f'<figure id="{figure}">' not in text
    assert "<h3>Accuracy gate</h3>" not in text and "<h2>Package</h2>" in text
    assert "[codegen]: not built with these settings, left out" in text
    assert onebuild("build", *int16, cwd=built).returncode == 0
    assert onebuild("report", *int16, cwd=built).returncode == 0
    text = page.read_text()
    assert "Not built with these settings" not in text and text.count(UP_TO_DATE) == 8
    int16_worst = json.loads(accuracy.read_text())["layers"][0]["sqnr_db"]
    assert int16_worst > uint8_worst + 20 and f">{int16_worst:.1f}<" in text  # int16's figures
    for figure in ("sqnr", "timeline0", "roofline"):
        assert f'<figure id="{figure}">' in text
    gate = ["--set", "quantize.accuracy.min_sqnr_db=90", "--set", "build.report=true"]
    failed = onebuild("build", *int16, *gate, cwd=built)
    assert failed.returncode == 1 and "accuracy gate failed" in failed.stderr
    text = page.read_text()
    assert "Not built with these settings: [codegen], [pack]. " in text  # the gate stopped
    assert '<figure id="timeline0">' not in text  # the int16 build's binary, not this one's
    assert "this build did not make them (see its errors)" in text
    assert '<span class="failed">failed</span> (outputs of the failed run)' in text
    assert '<figure id="sqnr">' in text and "<td>90.0</td>" in text  # the failed gate's report
    assert "<td>metadata/MANIFEST</td>" not in text
    assert "[pack]: not built with these settings" in text
    restore = onebuild("build", "examples/digits_npu.toml", "--set", "build.report=true", cwd=built)
    assert restore.returncode == 0  # the fixture's build and report, as they were


def _cells(text: str, heading: str) -> list[list[str]]:
    """The rows of the table after `heading`, as cell texts."""
    table = text.split(heading)[1].split("<table>")[1].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    return [
        [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows
    ]


def test_end_to_end_latency_per_part_adds_up(built):
    """The latency table: per part the partition's estimate (compute, invocation, the handoffs
    charged to it: each NPU part's inputs and outputs, all from or to the CPU here) and the
    simulator's time of its binary (`onebuild inspect --json`); totals that add up."""
    from onebuild.targets.host_cpu import HostCpu

    folder = built / "build/tiny_mobilenet_npu/partition"
    estimate = json.loads((folder / "tiny_mobilenet.partition.json").read_text())["estimate"]
    text = (built / "build/tiny_mobilenet_npu/report.html").read_text()
    rows = _cells(text, "<h3>End-to-end latency</h3>")
    assert len(rows) == len(estimate["parts"]) + 1
    cpu, simulated = HostCpu(), 0.0
    for row, part in zip(rows, estimate["parts"]):
        stem = row[0]
        graph = load_ir(folder / f"{stem}.obir").main
        if part["backend"] == "cpu":
            assert float(row[4]) == 0.0
            simulated += part["microseconds"]
            continue
        handoffs = sum(cpu.handoff(v) for v in [*graph.inputs, *graph.outputs])
        assert float(row[4]) == pytest.approx(handoffs, abs=0.05)
        assert float(row[3]) == cpu.npu_invoke_us
        tvn = built / f"build/tiny_mobilenet_npu/codegen/{stem}.tvn"
        info = json.loads(onebuild("inspect", str(tvn), "--json", cwd=built).stdout)
        us = info["cycles"] / 1000  # trix-m: 1000 MHz
        assert float(row[6]) == pytest.approx(us, abs=0.05)
        assert float(row[7]) == pytest.approx(us + cpu.npu_invoke_us + handoffs, abs=0.1)
        simulated += us + cpu.npu_invoke_us + handoffs
    total = rows[-1]
    assert float(total[4]) == pytest.approx(estimate["handoffs"], abs=0.05)
    assert float(total[5]) == pytest.approx(estimate["microseconds"], abs=0.05)
    assert float(total[7]) == pytest.approx(simulated, abs=0.2)
    # one binary of the whole model: simulated, one invocation, its inputs and outputs handed over
    digits = (built / "build/digits_npu/report.html").read_text()
    info = json.loads(
        onebuild("inspect", "build/digits_npu/codegen.tvn", "--json", cwd=built).stdout
    )
    tensors = [*info["inputs"], *info["outputs"]]  # as the NPU takes and gives them
    handoffs = sum(
        cpu.handoff_bytes(np.prod(t["dims"]) * np.dtype(t["dtype"]).itemsize) for t in tensors
    )
    whole = info["cycles"] / 1000 + cpu.npu_invoke_us + handoffs
    assert (
        f"<p>{whole:.1f} us for one inference: {info['cycles'] / 1000:.1f} us simulated" in digits
    )
