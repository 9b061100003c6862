"""Partitioning, multi-model nnpackages and the package runtime, through real recipe builds.

The reference is the unpartitioned quantized model run by the interpreter: a partitioned package
(NPU parts compiled to .tvn and simulated, CPU parts interpreted) must equal it bit for bit.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import make_model
from sklearn.metrics.pairwise import cosine_similarity

from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.serde import load_ir
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.npz import write_npz
from onebuild.recipe import load_recipe
from onebuild.runtime.package import load_package, run_package

EXAMPLES = Path(__file__).parent.parent / "examples"


def mixed_model(rng) -> onnx.ModelProto:
    """conv -> relu -> conv -> Softmax over the width (CPU) -> conv -> conv: NPU, CPU, NPU
    parts (the NPU runs Softmax over channels only)."""

    def conv(x, y, cin, cout, name):
        w = rng.normal(0, 0.4, (cout, cin, 3, 3)).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        inits.extend([(f"{name}_w", w), (f"{name}_b", b)])
        return helper.make_node(
            "Conv", [x, f"{name}_w", f"{name}_b"], [y], pads=[1, 1, 1, 1], name=name
        )

    inits: list = []
    nodes = [
        conv("x", "c1", 3, 8, "conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        conv("r1", "c2", 8, 8, "conv2"),
        helper.make_node("Softmax", ["c2"], ["s"], axis=3, name="softmax"),
        conv("s", "c3", 8, 8, "conv3"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        conv("r3", "y", 8, 4, "conv4"),
    ]
    return make_model(nodes, [("x", [1, 3, 12, 12])], ["y"], inits)


def write_project(folder: Path, model: onnx.ModelProto, rng, extra: str = "") -> Path:
    """An ONNX file, calibration data and a partition recipe in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "m.onnx")
    weights = {i.name for i in model.graph.initializer}
    graph_input = next(i for i in model.graph.input if i.name not in weights)
    shape = [d.dim_value or 1 for d in graph_input.type.tensor_type.shape.dim]
    data = {graph_input.name: rng.random((3, *shape), dtype=np.float32)}
    write_npz(folder / "calib.npz", data)
    write_npz(folder / "eval.npz", {k: v[:2] for k, v in data.items()})
    recipe = folder / "r.toml"
    recipe.write_text(
        f"""
[import]
source = "m.onnx"
input_shapes = {{ "{graph_input.name}" = {shape} }}
[optimize]
[quantize]
dtype = "uint8"
calibration = "calib.npz"
[partition]
{extra}
[codegen]
hw = "trix-m"
[pack]
output = "out/m.nnpkg"
"""
    )
    return recipe


def build_statuses(recipe: Path, *overrides: str) -> dict[str, str]:
    results = build([load_recipe(recipe, list(overrides))], progress=lambda message: None)
    failed = [r.error for r in results if r.status == "failed"]
    assert not failed, failed
    return {f"{r.step} {r.part}".strip(): r.status for r in results}


def assert_package_matches_reference(folder: Path) -> dict:
    """The package's outputs equal the quantized model's, bit for bit; returns the report."""
    package = load_package(folder / "out/m.nnpkg")
    reference = load_ir(folder / "build/r/quantize.obir").main
    feeds = dict(np.load(folder / "eval.npz", allow_pickle=False))
    got, _ = run_package(package, feeds)
    want = Interpreter(reference).run_batch(feeds)
    assert set(got) == {v.name for v in reference.outputs}
    for name, array in got.items():
        np.testing.assert_array_equal(array, want[name])
    return json.loads((folder / "build/r/partition/m.partition.json").read_text())


def test_digits_package_is_bit_exact(tmp_path, rng):
    recipe = write_project(tmp_path, onnx.load(EXAMPLES / "digits/digits.onnx"), rng)
    assert build_statuses(recipe)["codegen 00001_trix"] == "run"
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["trix"]


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v1", "densenet121"])
def test_light_model_packages_are_bit_exact(tmp_path, rng, name):
    model = light_model(name, seed=1, expose_logits=True)
    recipe = write_project(tmp_path, model, rng)
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    backends = [p["backend"] for p in report["parts"]]
    assert "trix" in backends
    manifest = json.loads((tmp_path / "out/m.nnpkg/metadata/MANIFEST").read_text())
    assert len(manifest["models"]) == len(backends)
    assert (manifest["major-version"], manifest["minor-version"]) == ("1", "3")
    if name in ("shufflenet", "inception_v1"):  # Transpose, LRN stay on the CPU
        assert "cpu" in backends and manifest["model-connect"]
    if name == "densenet121":  # BatchNorms after Concats became depthwise convs: all NPU
        assert backends == ["trix"]


def test_unsupported_op_in_the_middle_gives_npu_cpu_npu(tmp_path, rng):
    recipe = write_project(tmp_path, mixed_model(rng), rng)
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["trix", "cpu", "trix"]
    softmax = [f for f in report["fallbacks"] if f["node"] == "softmax"]
    why = "Softmax must run over axis 1 (the channels of each position)"
    assert softmax and why in softmax[0]["reasons"]
    connection = json.loads((tmp_path / "build/r/partition/m.conn.json").read_text())
    assert connection["source"] == {
        "inputs": ["0:0:0"],
        "outputs": ["2:0:0"],
        "input_names": ["x"],
        "output_names": ["y"],
    }
    assert [(e["from"], e["to"]) for e in connection["conn"]] == [
        ("0:0:0", ["1:0:0"]),
        ("1:0:0", ["2:0:0"]),
    ]


def test_changing_one_override_recompiles_only_that_partition(tmp_path, rng):
    recipe = write_project(tmp_path, mixed_model(rng), rng)
    first = build_statuses(recipe)
    assert first["codegen 00001_trix"] == first["codegen 00003_trix"] == "run"
    assert set(build_statuses(recipe).values()) == {"up-to-date"}
    again = build_statuses(recipe, "partition.opname={conv4='cpu'}")
    assert again["partition"] == "run" and again["pack"] == "run"
    assert again["codegen 00001_trix"] == "up-to-date"
    assert again["codegen 00003_trix"] == "run"
    assert "quantize" in again and again["quantize"] == "up-to-date"
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["trix", "cpu", "trix", "cpu"]


def test_manual_maps_and_part_files(tmp_path, rng):
    part = tmp_path / "p" / "m.part"
    part.parent.mkdir()
    part.write_text(
        "[partition]\nbackends=trix,cpu\ndefault=cpu\ncomply=opname\n\n[OPNAME]\nconv1=cpu\n"
    )
    recipe = write_project(tmp_path / "p", mixed_model(rng), rng, 'part_file = "m.part"')
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path / "p")
    assert [p["backend"] for p in report["parts"]][:1] == ["cpu"]
    conv1 = next(f for f in report["fallbacks"] if f["node"] == "conv1")
    assert "partition opcode/opname maps" in conv1["reasons"][0]
    recipe = write_project(tmp_path / "q", mixed_model(rng), rng, 'opcode = { Conv = "cpu" }')
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path / "q")
    assert all(p["backend"] == "cpu" for p in report["parts"])


def test_impossible_override_is_a_clear_error(tmp_path, rng):
    recipe = write_project(tmp_path, mixed_model(rng), rng, 'opname = { softmax = "trix" }')
    results = build([load_recipe(recipe)], progress=lambda message: None)
    error = next(r.error for r in results if r.step == "partition")
    assert "node 'softmax' (QSoftmax) cannot run on trix" in error


def test_cost_strategy_is_never_slower_than_capability(tmp_path, rng):
    recipe = write_project(tmp_path, mixed_model(rng), rng, 'strategy = "cost"')
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    capability, chosen = report["explanation"][0].split(";")
    assert float(chosen.split()[1]) <= float(capability.split()[1])
    assert report["estimate"]["microseconds"] <= float(capability.split()[1]) + 0.1


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A built NPU-CPU-NPU package to corrupt, and its evaluation inputs."""
    folder = tmp_path_factory.mktemp("pkg")
    rng = np.random.default_rng(7)
    build_statuses(write_project(folder, mixed_model(rng), rng))
    return folder / "out/m.nnpkg", folder / "eval.npz"


def _corrupt(package: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = tmp_path / "bad.nnpkg"
    shutil.copytree(package, copy)
    manifest = json.loads((copy / "metadata/MANIFEST").read_text())
    edit(manifest, copy)
    (copy / "metadata/MANIFEST").write_text(json.dumps(manifest))
    return copy


def _drop(key):
    return lambda m, folder: m.pop(key)


def _set(key, value):
    return lambda m, folder: m.__setitem__(key, value)


def _not_circle(m, folder):
    """The CPU part, declared circle, holds the first NPU part's bytes."""
    (folder / m["models"][1]).write_bytes((folder / m["models"][0]).read_bytes())


def _truncate(m, folder):
    tvn = folder / m["models"][0]
    tvn.write_bytes(tvn.read_bytes()[:100])


@pytest.mark.parametrize(
    "edit, message",
    [
        (_drop("models"), "missing 'models'"),
        (_drop("pkg-inputs"), "missing 'pkg-inputs'"),
        (_set("major-version", 2), "'major-version' must be a version number string"),
        (_set("model-types", ["tvn", "circle", "onnx"]), "'onnx' is not supported"),
        (_not_circle, "the file is not a circle model"),
        (_set("pkg-inputs", ["7:0:0"]), "names model 7, the package has 3"),
        (_set("pkg-outputs", ["2:0:5"]), "names output 5 of"),
        (_set("pkg-inputs", ["0-0-0"]), 'is not a "model:subgraph:io" reference'),
        (_set("model-connect", [{"from": "0:0:0", "to": ["1:0:0"]}]), "fed by neither"),
        (
            _set(
                "model-connect",
                [
                    {"from": "0:0:0", "to": ["1:0:0"]},
                    {"from": "1:0:0", "to": ["2:0:0"]},
                    {"from": "2:0:0", "to": ["0:0:0"]},
                ],
            ),
            "already fed by pkg-inputs",
        ),
        (
            _set("model-connect", [{"from": "0:0:0", "to": ["2:0:0"]}, {"from": "1:0:0"}]),
            'expected {"from": ref',
        ),
        (_set("models", ["../m.part.00001_trix.tvn", "a", "b"]), "points outside the package"),
        (_set("models", ["/etc/passwd", "a", "b"]), "points outside the package"),
        (
            _set(
                "model-configs",
                ["m.part.00002_cpu.cfg", "m.part.00002_cpu.cfg", "m.part.00003_trix.cfg"],
            ),
            "asks for backend 'cpu', but a tvn model runs on 'trix'",
        ),
        (_truncate, "models[0] 'm.part.00001_trix.tvn'"),
    ],
)
def test_malformed_packages_are_rejected_in_one_line(package, tmp_path, capsys, edit, message):
    from onebuild.cli import main

    bad = _corrupt(package[0], tmp_path, edit)
    code = main(["run", str(bad), "-i", str(package[1]), "-o", str(tmp_path / "o.npz")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.npz").exists()


def test_cycles_and_type_mismatches_are_rejected(package, tmp_path):
    from onebuild.errors import FormatError

    def cycle(m, folder):
        m["pkg-inputs"] = ["1:0:0"]
        m["model-connect"] = [
            {"from": "2:0:0", "to": ["0:0:0"]},
            {"from": "0:0:0", "to": ["2:0:0"]},
        ]

    def mismatch(m, folder):
        m["model-connect"] = [{"from": "0:0:0", "to": ["1:0:0", "2:0:0"]}]

    with pytest.raises(FormatError, match="cycle through models"):
        load_package(_corrupt(package[0], tmp_path / "a", cycle))
    with pytest.raises(FormatError, match="0:0:0 is uint8.* but 2:0:0 expects uint8"):
        load_package(_corrupt(package[0], tmp_path / "b", mismatch))


def test_zip_packages_run_and_verify(package, tmp_path, capsys):
    from onebuild.cli import main
    from onebuild.packing import zip_bytes

    archive = tmp_path / "m.nnpkg.zip"
    archive.write_bytes(zip_bytes(package[0], "m.nnpkg"))
    out = tmp_path / "o.npz"
    assert main(["run", str(archive), "-i", str(package[1]), "-o", str(out)]) == 0
    feeds = dict(np.load(package[1]))
    direct, _ = run_package(load_package(package[0]), feeds)
    np.testing.assert_array_equal(np.load(out)["y"], direct["y"])
    capsys.readouterr()
    reference = package[0].parent.parent / "m.onnx"
    args = ["verify", str(archive), "--reference", str(reference), "-i", str(package[1]), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"]["y"]["sqnr_db"] > 15
    # y is a map [C, H, W] per sample: SQNR, the largest error and cosine, no top-k nor MAPE
    assert set(report["outputs"]["y"]) == {"kind", "sqnr_db", "max_abs_error", "cosine"}
    assert report["outputs"]["y"]["kind"] == "dense"
    session = ort.InferenceSession(str(reference))
    want = np.stack([session.run(["y"], {"x": sample})[0] for sample in feeds["x"]])
    got = direct["y"].reshape(len(want), -1).astype(np.float64)
    want = want.reshape(len(want), -1).astype(np.float64)
    assert report["outputs"]["y"]["max_abs_error"] == pytest.approx(np.abs(got - want).max())
    cosine = np.diag(cosine_similarity(want, got)).mean()  # scikit-learn's, per sample
    assert report["outputs"]["y"]["cosine"] == pytest.approx(cosine, rel=1e-6)
    assert [m["backend"] for m in report["models"]] == ["trix", "cpu", "trix"]
    assert report["models"][0]["cycles"] > 0
    # end to end, counted as the partition's estimate is: the same handoffs, the NPU simulated
    estimate = json.loads(
        (package[0].parent.parent / "build/r/partition/m.partition.json").read_text()
    )
    total = report["end_to_end"]
    assert total["handoffs"] == 4 and total["npu_parts"] == 2  # x, c2, s, y: NPU <-> CPU
    assert total["handoff_us"] == pytest.approx(estimate["estimate"]["handoffs"], abs=1e-3)
    models = report["models"]
    npu = sum(m["milliseconds"] * 1e3 + 50.0 for m in models if m["backend"] == "trix")
    cpu = [p["microseconds"] for p in estimate["estimate"]["parts"] if p["backend"] == "cpu"]
    assert total["microseconds"] == pytest.approx(npu + sum(cpu) + total["handoff_us"], abs=1e-3)


def test_float_cpu_parts_trade_exactness_for_accuracy(tmp_path, rng):
    """Convolutions forced to the CPU: float CPU parts lose far less than quantized ones."""
    model = mixed_model(rng)
    sqnr = {}
    for precision in ("quantized", "float"):
        extra = f'opname = {{ conv2 = "cpu", conv3 = "cpu" }}\ncpu_precision = "{precision}"'
        folder = tmp_path / precision
        recipe = write_project(folder, model, rng, extra)
        build_statuses(recipe)
        report = json.loads((folder / "build/r/partition/m.partition.json").read_text())
        assert report["cpu_parts_left_quantized"] == []
        assert [p["backend"] for p in report["parts"]] == ["trix", "cpu", "trix"]
        feeds = dict(np.load(folder / "eval.npz"))
        got, _ = run_package(load_package(folder / "out/m.nnpkg"), feeds)
        reference = load_ir(folder / "build/r/optimize.obir").main
        want = Interpreter(reference).run_batch(feeds)["y"].astype(np.float64)
        noise = float(((got["y"] - want) ** 2).sum())
        sqnr[precision] = 10 * np.log10(float((want**2).sum()) / noise)
    assert sqnr["float"] > sqnr["quantized"] + 1, sqnr


def run_parts(partitioning, feeds: dict) -> list:
    """Execute split parts in order with the interpreter, wiring them by the connections."""
    produced = {}
    sources = {t: e.source for e in partitioning.edges for t in e.targets}
    entry = {ref: i for i, ref in enumerate(partitioning.inputs)}
    names = list(feeds)
    for k, part in enumerate(partitioning.parts):
        inputs = {}
        for i, value in enumerate(part.graph.inputs):
            if (k, i) in entry:
                inputs[value.name] = feeds[names[entry[(k, i)]]]
            else:
                inputs[value.name] = produced[sources[(k, i)]]
        result = Interpreter(part.graph).run(inputs)
        for i, value in enumerate(part.graph.outputs):
            produced[(k, i)] = result[value.name]
    return [produced[ref] for ref in partitioning.outputs]


@pytest.mark.parametrize("seed", range(6))
def test_any_backend_labeling_splits_into_an_equivalent_acyclic_program(seed):
    """Random labelings of inception_v1 (branches, concats): the parts, run in order and wired
    by the connections, compute what the whole graph computes."""
    from onebuild.graph_ir.partition.regions import split
    from onebuild.graph_ir.passes import run_preset
    from onebuild.graph_ir.serde.onnx_import import import_onnx

    model = import_onnx(light_model("inception_v1", seed=1, expose_logits=True))
    run_preset(model)
    graph = model.main
    rng = np.random.default_rng(seed)
    backends = {n.name: ("trix", "cpu")[int(rng.integers(0, 2))] for n in graph.nodes}
    partitioning = split(graph, backends, "m")
    assert all(
        backends[n.name] == part.backend for part in partitioning.parts for n in part.graph.nodes
    )
    assert sum(len(p.graph.nodes) for p in partitioning.parts) == len(graph.nodes)
    x = graph.inputs[0]
    feeds = {x.name: rng.random(x.shape, dtype=np.float32)}
    want = Interpreter(graph).run(feeds)
    got = run_parts(partitioning, feeds)
    for value, array in zip(graph.outputs, got):
        np.testing.assert_array_equal(array, want[value.name])


def test_input_read_by_two_parts_is_relayed():
    """x feeds parts on both backends: the first part relays it to the later one."""
    from onebuild.graph_ir.ir import Graph
    from onebuild.graph_ir.partition.regions import split

    graph = Graph("g")
    x = graph.add_input("x", np.float32, (1, 4))
    a = graph.make_node("Relu", [x], name="relu").output
    b = graph.make_node("Neg", [x], name="neg").output
    graph.outputs = [graph.make_node("Add", [a, b], name="add").output]
    partitioning = split(graph, {"relu": "cpu", "neg": "trix", "add": "cpu"}, "m")
    assert [p.backend for p in partitioning.parts] == ["trix", "cpu"]
    assert partitioning.inputs == [(0, 0)]
    assert [v.name for v in partitioning.parts[0].graph.outputs][-1] == "x/relay"
    feeds = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
    (got,) = run_parts(partitioning, feeds)
    np.testing.assert_array_equal(got, np.maximum(feeds["x"], 0) - feeds["x"])


def test_an_input_that_is_also_an_output_builds_into_a_bit_exact_package(tmp_path, rng):
    """x is an output of the model as it is: a first CPU part without nodes hands it on (to the
    package output of the same name and to the parts that read it); the build used to fail."""
    model = mixed_model(rng)
    model.graph.output.append(helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None))
    model.graph.output[-1].type.CopyFrom(model.graph.input[0].type)
    recipe = write_project(tmp_path, model, rng)
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    assert report["parts"][0] == {"backend": "cpu", "file": "m.00001_cpu.obir", "nodes": 0}
    feeds = dict(np.load(tmp_path / "eval.npz", allow_pickle=False))
    got, _ = run_package(load_package(tmp_path / "out/m.nnpkg"), feeds)
    np.testing.assert_array_equal(got["x"], feeds["x"])
