"""Packages in ONE's formats: whole models and CPU parts as `.circle`, run by onebuild's runtime
bit for bit as the IR they came from, and by onert (the real ONE runtime, a test extra) to the
same numbers; what the circle writer cannot express stays an IR file, and the build says why."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import onert  # the oracle is a test extra
import onnx
import pytest
from onnx import helper
from onnx_builders import make_model
from package_reference import as_packaged
from test_partition import assert_package_matches_reference, build_statuses, write_project

from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_ir, read_circle, write_circle
from onebuild.recipe import load_recipe
from onebuild.runtime.package import load_package, run_package

ROOT = Path(__file__).resolve().parent.parent
DIGITS_IMPORT = '[import]\nsource = "digits/digits.onnx"\ninput_shapes = { input = [1, 1, 8, 8] }\n'
MOBILENET_IMPORT = (
    '[import]\nsource = "models/tiny_mobilenet.onnx"\ninput_shapes = { x = [1, 3, 32, 32] }\n'
)
RECIPES = {  # name: (recipe, test data, input)
    "digits_float": (DIGITS_IMPORT + "[optimize]\n", "digits/data/test.npz"),
    "digits_uint8": (None, "digits/data/test.npz"),  # examples/digits.toml itself
    "mobilenet_float": (MOBILENET_IMPORT + "[optimize]\n", "models/tiny_mobilenet_calib.npz"),
    "mobilenet_uint8": (
        MOBILENET_IMPORT + '[optimize]\n[quantize]\ndtype = "uint8"\n'
        'calibration = "models/tiny_mobilenet_calib.npz"\n',
        "models/tiny_mobilenet_calib.npz",
    ),
}


class Collect(logging.Handler):
    """The onebuild logger's messages, kept."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, Path, list[str]]]:
    """Each recipe built in a copy of the examples: (package, build folder, pack warnings)."""
    folder = tmp_path_factory.mktemp("pkgcircle")
    examples = folder / "examples"
    shutil.copytree(ROOT / "examples", examples)
    shutil.copytree(ROOT / "recipes", folder / "recipes")
    result = {}
    for name, (text, _) in RECIPES.items():
        recipe = examples / "digits.toml"
        if text is not None:
            recipe = examples / f"{name}.toml"
            recipe.write_text(
                text + f'[pack]\noutput = "../out/{name}.nnpkg"\n[build]\ndir = "../build/{name}"\n'
            )
        handler = Collect()
        logger = logging.getLogger("onebuild")
        logger.addHandler(handler)
        try:
            results = build([load_recipe(recipe, [])], progress=lambda message: None)
        finally:
            logger.removeHandler(handler)
        assert not [r.error for r in results if r.status == "failed"]
        stem = "digits" if text is None else name
        package = folder / "out" / f"{stem}.nnpkg"
        warnings = [m for m in handler.messages if "pack:" in m]
        result[name] = (package, folder / "build" / stem, warnings)
    return result


def test_digits_packages_hold_circle_and_run_as_their_ir(built):
    """float and uint8: one `.circle`, model type "circle", outputs equal the IR model's."""
    for name, stage in (("digits_float", "optimize"), ("digits_uint8", "quantize")):
        package, build_dir, warnings = built[name]
        manifest = json.loads((package / "metadata/MANIFEST").read_text())
        stem = package.stem
        assert manifest["models"] == [f"{stem}.circle"] and manifest["model-types"] == ["circle"]
        assert (package / f"{stem}.circle").read_bytes()[4:8] == b"CIR0" and not warnings
        feeds = dict(np.load(ROOT / "examples/digits/data/test.npz"))
        got, _ = run_package(load_package(package), feeds)
        reference = as_packaged(load_ir(build_dir / f"{stage}.obir").main, package)
        want = Interpreter(reference).run_batch(feeds)
        np.testing.assert_array_equal(got["logits"], want["logits"])


def onert_outputs(package: Path, images: np.ndarray) -> np.ndarray:
    """onert's outputs for each sample, the package folder loaded by `onert.infer.session`."""
    session = onert.infer.session(str(package))
    return np.stack([session.infer([x])[0] for x in images])


def test_onert_runs_the_digits_packages(built):
    """onert 0.1.0 loads each package folder (MANIFEST, circle) and gives onebuild's numbers:
    float within 1e-4 relative, uint8 bit for bit (the package runtime reads the circle's
    kernels with onert's arithmetic: `serde/circle_arith.py`)."""
    images = np.load(ROOT / "examples/digits/data/test.npz")["input"]
    float_package = built["digits_float"][0]
    want, _ = run_package(load_package(float_package), {"input": images})
    got = onert_outputs(float_package, images)
    rel = np.abs(got - want["logits"]).max() / np.abs(want["logits"]).max()
    print(f"digits float in onert: {rel:.2g} relative over {len(images)} test images")
    assert rel <= 1e-4

    package, build_dir, _ = built["digits_uint8"]
    want, _ = run_package(load_package(package), {"input": images})
    graph = load_ir(build_dir / "quantize.obir").main
    dequantize = next(n for n in graph.nodes if n.op == "DequantizeLinear")
    scale = dequantize.inputs[0].quant.scale[0]
    lsb = np.rint(np.abs(onert_outputs(package, images) - want["logits"]) / scale)
    share = float(np.mean(lsb > 0))
    print(f"digits uint8 in onert: max {lsb.max():.0f} LSB, {share:.1%} of logits differ")
    assert lsb.max() == 0


def mobilenet_images() -> np.ndarray:
    """The 16 calibration images (halved 64x64 photo crops, see
    examples/models/make_tiny_mobilenet_calib.py) and 48 full-resolution 32x32 crops of
    scikit-learn's two bundled photographs in [0, 1], as [64, 1, 3, 32, 32]."""
    from sklearn.datasets import load_sample_images

    crops = []
    for picture in load_sample_images().images:
        h, w, _ = picture.shape
        for i in range(24):
            top, left = (37 * i) % (h - 32), (91 * i) % (w - 32)
            crop = picture[top : top + 32, left : left + 32].astype(np.float32) / 255
            crops.append(crop.transpose(2, 0, 1)[None])
    calib = np.load(ROOT / "examples/models/tiny_mobilenet_calib.npz")["x"]
    return np.concatenate([calib, np.stack(crops)])


def onert_all_outputs(package: Path, images: np.ndarray) -> list[np.ndarray]:
    """Every output of the package folder in onert, per output stacked over the samples."""
    session = onert.infer.session(str(package))
    results = [session.infer([x]) for x in images]
    return [np.stack([r[i] for r in results]) for i in range(len(results[0]))]


def test_tiny_mobilenet_float_runs_in_onert(built):
    """The float package holds `.circle` (HardSwish as x * RELU6(x + 3) * 1/6 and the k = s
    ConvTranspose as a 1x1 CONV_2D and DEPTH_TO_SPACE: onert 0.1.0 has neither a HARD_SWISH
    nor a TRANSPOSE_CONV kernel), which reads back as the same ops and runs as its IR bit for
    bit; onert loads the package folder and gives onebuild's outputs within 1e-4 relative on
    64 images (noise and photographs); LiteRT runs the model as tflite (its HARD_SWISH,
    TRANSPOSE_CONV) likewise."""
    package, build_dir, warnings = built["mobilenet_float"]
    manifest = json.loads((package / "metadata/MANIFEST").read_text())
    assert manifest["model-types"] == ["circle"] and not warnings
    feeds = {"x": mobilenet_images()}
    graph = load_ir(build_dir / "optimize.obir").main
    want = Interpreter(graph).run_batch(feeds)
    got, _ = run_package(load_package(package), feeds)
    for key, array in want.items():
        np.testing.assert_array_equal(got[key], array)
    model = read_circle(package / "mobilenet_float.circle")
    assert [n.op for n in model.main.nodes] == [n.op for n in graph.nodes]  # spellings fold
    for value, result in zip(graph.outputs, onert_all_outputs(package, feeds["x"])):
        reference = want[value.name]
        rel = np.abs(result - reference).max() / np.abs(reference).max()
        print(f"tiny_mobilenet float in onert: output {value.name} {rel:.2g} relative")
        assert rel <= 1e-4, value.name
    from ai_edge_litert import interpreter as litert

    runner = litert.Interpreter(model_content=write_circle(model, "tflite"))
    runner.allocate_tensors()
    (given,), outputs = runner.get_input_details(), runner.get_output_details()
    assert sorted(d["name"] for d in outputs) == sorted(want)
    for i, x in enumerate(feeds["x"][:4]):
        runner.set_tensor(given["index"], x)
        runner.invoke()
        for detail in outputs:
            expected = want[detail["name"]][i]
            rel = np.abs(runner.get_tensor(detail["index"]) - expected).max()
            assert rel / np.abs(expected).max() <= 1e-4, (detail["name"], rel)


def output_scale(graph, value) -> float:
    """The scale of the uint8 codes a float output is made from: dequantized directly, or (the
    GELU head) a ReduceMean of dequantized codes."""
    node = value.producer
    if node.op != "DequantizeLinear":
        node = node.inputs[0].producer
    assert node.op == "DequantizeLinear"
    return node.inputs[0].quant.scale[0]


def test_tiny_mobilenet_uint8_runs_in_onert(built):
    """The uint8 package holds `.circle`: its lookup tables (Swish, HardSwish, GELU) and its
    QSoftmax are DEQUANTIZE, the function in float, QUANTIZE (onert 0.1.0 has no uint8 GELU
    or HARD_SWISH; its SOFTMAX fixes the output scale at 1/256, coarser than the model's), read
    back as the same QLookup and QSoftmax ops, so the package runs as its IR with onert's
    arithmetic bit for bit (requantizing kernels round twice in onert, once in the IR: within
    1 LSB of the IR's own outputs), and onert gives the package's outputs bit for bit on 64
    images, noise and photographs."""
    package, build_dir, warnings = built["mobilenet_uint8"]
    manifest = json.loads((package / "metadata/MANIFEST").read_text())
    assert manifest["models"] == ["mobilenet_uint8.circle"] and not warnings
    feeds = {"x": mobilenet_images()}
    graph = load_ir(build_dir / "quantize.obir").main
    own = Interpreter(graph).run_batch(feeds)
    want = Interpreter(as_packaged(graph, package)).run_batch(feeds)
    got, _ = run_package(load_package(package), feeds)
    for key, array in want.items():
        np.testing.assert_array_equal(got[key], array)
        step = output_scale(graph, graph.outputs[list(want).index(key)])
        assert np.abs(array - own[key]).max() <= step * (1 + 1e-4), key
    ops = [n.op for n in read_circle(package / "mobilenet_uint8.circle").main.nodes]
    assert ops.count("QLookup") == 4 and ops.count("QSoftmax") == 1
    for value, result in zip(graph.outputs, onert_all_outputs(package, feeds["x"])):
        lsb = np.abs(result - want[value.name]) / output_scale(graph, value)
        share = float(np.mean(np.rint(lsb) > 0))
        print(
            f"tiny_mobilenet uint8 in onert: output {value.name} max {lsb.max():.2f} LSB, ", end=""
        )
        print(f"{share:.1%} of {lsb.size} elements differ by a step")
        assert lsb.max() <= 1e-4, value.name


def conv_chain(rng) -> onnx.ModelProto:
    """conv -> relu -> conv -> relu -> conv, 3x3 with padding."""
    nodes, inits, x = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 8), (8, 8), (8, 4)], start=1):
        w = rng.normal(0, 0.4, (cout, cin, 3, 3)).astype(np.float32)
        inits += [(f"w{i}", w), (f"b{i}", rng.normal(0, 0.1, cout).astype(np.float32))]
        y = f"c{i}" if i < 3 else "y"
        nodes.append(
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], pads=[1] * 4, name=f"conv{i}")
        )
        if i < 3:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    return make_model(nodes, [("x", [1, 3, 12, 12])], ["y"], inits)


def test_a_cpu_part_the_writer_expresses_is_circle(tmp_path):
    """A convolution pinned to the CPU: the package holds `m.part.00002_cpu.circle` between two
    `.tvn` parts, named as ONE's partitioner names them, and runs bit for bit as the quantized
    model as the package computes it (that part with onert's arithmetic); onert runs that part
    alone bit for bit as onebuild's runtime."""
    rng = np.random.default_rng(3)
    recipe = write_project(tmp_path, conv_chain(rng), rng, 'opname = { conv2 = "cpu" }')
    build_statuses(recipe)
    package = tmp_path / "out/m.nnpkg"
    manifest = json.loads((package / "metadata/MANIFEST").read_text())
    assert manifest["models"] == [
        "m.part.00001_trix.tvn",
        "m.part.00002_cpu.circle",
        "m.part.00003_trix.tvn",
    ]
    assert manifest["model-types"] == ["tvn", "circle", "tvn"]
    assert manifest["model-configs"][1] == "m.part.00002_cpu.cfg"
    assert_package_matches_reference(tmp_path)
    part = read_circle(package / "m.part.00002_cpu.circle").main
    assert [n.op for n in part.nodes] == ["QConv"]
    x = part.inputs[0]
    feeds = np.random.default_rng(5).integers(0, 256, (8, *x.shape), dtype=np.uint8)
    want = Interpreter(part).run_batch({x.name: feeds})[part.outputs[0].name]
    from onert.native import libnnfw_api_pybind as nnfw

    session = nnfw.infer.nnfw_session(str(package / "m.part.00002_cpu.circle"), "cpu")
    session.set_prepare_config(nnfw.prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
    session.prepare()
    got = []
    for sample in feeds:
        session.set_input(0, np.ascontiguousarray(sample))
        session.run()
        got.append(np.array(session.get_output(0)))
    lsb = np.abs(np.stack(got).astype(int) - want.astype(int))
    print(f"cpu part in onert: max {lsb.max()} LSB, {np.mean(lsb > 0):.1%} differ")
    assert lsb.max() == 0


def test_session_on_a_circle_package_writes_a_quantized_circle_and_a_tvn(built, tmp_path):
    """The on-device flow in ONE's formats: a Session on the float `digits_float.circle`
    package records 12 runs, writes `quantized.circle` and `model.tvn`; both give what the
    build makes from the same circle and the same 12 inputs."""
    from onebuild.npz import write_npz
    from onebuild.runtime.models import BinaryModel, load_binary
    from onebuild.runtime.session import Session

    package = built["digits_float"][0]
    calib = np.load(ROOT / "examples/digits/data/calib.npz")["input"][:12]
    session = Session(package, workspace=tmp_path / "ws")
    session.set_odc_param_minmax_records_count(len(calib))
    for x in calib:
        session.run_with_auto_compilation({"input": x})
    assert session.state == "COMPILED" and session.reason is None
    ws = tmp_path / "ws"
    assert (ws / "quantized.circle").read_bytes()[4:8] == b"CIR0"
    assert not (ws / "quantized.obir").exists() and (ws / "model.tvn").is_file()

    write_npz(tmp_path / "calib.npz", {"input": calib})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "{package / "digits_float.circle"}"\n[quantize]\ndtype = "uint8"\n'
        'calibration = "calib.npz"\n[codegen]\n[build]\ndir = "b"\n'
    )
    results = build([load_recipe(recipe, [])], progress=lambda message: None)
    assert not [r.error for r in results if r.status == "failed"]
    images = np.load(ROOT / "examples/digits/data/test.npz")["input"][:32]
    quantized = Interpreter(read_circle(ws / "quantized.circle").main)
    graph = load_ir(tmp_path / "b/quantize.obir").main
    reference = Interpreter(as_packaged(graph, package))  # the circle: onert's arithmetic
    np.testing.assert_array_equal(
        quantized.run_batch({"input": images})["logits"],
        reference.run_batch({"input": images})["logits"],
    )
    binary = BinaryModel(load_binary(tmp_path / "b/codegen.tvn"))
    for x in images[:8]:
        want = binary.run({"input": x})["logits"]
        np.testing.assert_array_equal(session.run({"input": x})["logits"], want)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[: len(data) // 2], "models[0] 'digits.circle'"),
        (lambda data: data[:4] + b"TFL3" + data[8:], "not a circle model (no CIR0 identifier)"),
        (lambda data: data[:4] + b"XXXX" + data[8:], "not a circle model (no CIR0 identifier)"),
    ],
)
def test_a_damaged_circle_in_a_package_is_one_line(built, tmp_path, capsys, damage, message):
    from onebuild.cli import main

    package = tmp_path / "digits.nnpkg"
    shutil.copytree(built["digits_uint8"][0], package)
    model = package / "digits.circle"
    model.write_bytes(damage(model.read_bytes()))
    images = tmp_path / "x.npz"
    np.savez(images, input=np.load(ROOT / "examples/digits/data/test.npz")["input"][:2])
    code = main(["run", str(package), "-i", str(images), "-o", str(tmp_path / "y.npz")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def conv_global_pool() -> onnx.ModelProto:
    """conv 3->16 -> relu -> global average pool: the pool's output range is a fraction of its
    input's, so quantization gives it a finer scale."""
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.5, (16, 3, 3, 3)).astype(np.float32)
    w -= w.mean(axis=(2, 3), keepdims=True)  # edge filters: sparse, peaky activations
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool"),
    ]
    bias = rng.normal(0, 0.01, 16).astype(np.float32)
    return make_model(nodes, [("x", [1, 3, 32, 32])], ["y"], [("w", w), ("b", bias)])


def litert_outputs(model, images: np.ndarray) -> np.ndarray:
    """LiteRT's output for each sample of the model written as tflite."""
    from ai_edge_litert import interpreter as litert

    runner = litert.Interpreter(model_content=write_circle(model, "tflite"))
    runner.allocate_tensors()
    (given,), (taken,) = runner.get_input_details(), runner.get_output_details()
    results = []
    for x in images:
        runner.set_tensor(given["index"], x)
        runner.invoke()
        results.append(runner.get_tensor(taken["index"]).copy())
    return np.stack(results)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_a_quantized_global_average_pool_rounds_once_in_onert_and_litert(tmp_path, dtype):
    """A global average pool that rescales (output scale finer than the input's) is MEAN in
    circle and tflite: onert (uint8) and LiteRT (int8, its quantized convolution's type)
    rescale it in one rounding as onebuild does, within 1 LSB (as AVERAGE_POOL_2D then QUANTIZE
    it was rounded at the input's coarse scale first: 9 LSB off, 94-96 % of outputs differing),
    and the package reads back as the same QAveragePool, bit for bit."""
    onnx.save(conv_global_pool(), tmp_path / "m.onnx")
    photos = mobilenet_images()
    np.savez(tmp_path / "calib.npz", x=photos[:16])
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[import]\nsource = "m.onnx"\n[quantize]\ndtype = "{dtype}"\n'
        'calibration = "calib.npz"\n[pack]\noutput = "m.nnpkg"\n'
    )
    results = build([load_recipe(recipe, [])], progress=lambda message: None)
    assert not [r.error for r in results if r.status == "failed"]
    model = load_ir(tmp_path / "build/r/quantize.obir")
    graph = model.main
    pool = next(n for n in graph.nodes if n.op == "QAveragePool")
    assert pool.inputs[0].quant.scale[0] > 4 * pool.output.quant.scale[0]  # rescaled
    package = tmp_path / "m.nnpkg"
    circle = read_circle(package / "m.circle").main
    kernel = {k: v for k, v in pool.attrs.items() if k != "float_op"}  # circle has no float op
    assert [n.attrs for n in circle.nodes if n.op == "QAveragePool"] == [kernel]
    feeds = photos[16:]
    want = Interpreter(as_packaged(graph, package)).run_batch({"x": feeds})["y"]
    got, _ = run_package(load_package(package), {"x": feeds})
    np.testing.assert_array_equal(got["y"], want)
    runtime = "onert" if dtype == "uint8" else "LiteRT"
    result = onert_outputs(package, feeds) if dtype == "uint8" else litert_outputs(model, feeds)
    lsb = np.rint(np.abs(result.reshape(want.shape) - want) / output_scale(graph, graph.outputs[0]))
    share = float(np.mean(lsb > 0))
    print(f"global average pool in {runtime}: max {lsb.max():.0f} LSB, {share:.1%} differ")
    assert lsb.max() <= 1 and share < 0.5, runtime
