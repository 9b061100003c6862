"""Real models at plain uint8, built as a user builds them (`onebuild build` on a recipe:
import, O1, MinMax calibration, uint8, pack), then the package's circle run by onert 0.1.0.
Prints JSON per model: the package's model types (all `circle` is the point: onert cannot load
`.obir`); the largest difference (in steps of each output's scale, LSB) between onert's outputs
and the package's as onebuild runs it (the circle read with onert's arithmetic,
`serde/circle_arith.py`), and between onert's and the quantized model's (`quantize.obir`,
onebuild's own rounding) with the share of elements that differ; the SQNR (dB) of the
quantized model and of onert against the float model in onnxruntime; for class scores how often
the top-1 classes agree; and per operator type the difference when onert runs each node alone
on onebuild's input codes, against the node read back from its circle and against the node
itself (`each_operator`); on evaluation images the calibration did not see (`real_models.py`:
PP-OCR's direction classifier on text lines, its detector on page tiles).

    python bench/circle_onert.py [--models ocr_cls,ocr_det] [--samples 8] [--keep DIR]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from real_models import MODELS, fixed_export, samples

from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.metrics import sqnr_db
from onebuild.graph_ir.serde import load_ir, read_circle, write_circle
from onebuild.npz import write_npz
from onebuild.runtime.package import load_package, run_package

CLASSES = 1000  # an output of at most this many values per sample holds class scores
RECIPE = """[import]
source = "{name}.onnx"
input_shapes = {{ "{input}" = {shape} }}
[optimize]
[quantize]
dtype = "uint8"
calibration = "calib.npz"
[pack]
output = "out/{name}.nnpkg"
[build]
dir = "build"
"""


def build(model, folder: Path, count: int) -> tuple[Path, str, np.ndarray]:
    """The model's recipe and calibration data in `folder`, built by the `onebuild` command:
    (package, input name, evaluation images)."""
    path = fixed_export(model, folder)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    calib, evaluation = samples(model, count)
    write_npz(folder / "calib.npz", {name: calib})
    shape = list(model.input_shape)
    (folder / "r.toml").write_text(RECIPE.format(name=model.name, input=name, shape=shape))
    command = [str(Path(sys.executable).parent / "onebuild"), "build", "r.toml"]
    subprocess.run(command, cwd=folder, check=True)
    return folder / "out" / f"{model.name}.nnpkg", name, evaluation


def output_scales(folder: Path) -> dict[str, float]:
    """Each float output's code scale: the parameters of the codes its DequantizeLinear reads."""
    graph = load_ir(folder / "build" / "quantize.obir").main
    scales = {}
    for value in graph.outputs:
        node = value.producer
        while node.op != "DequantizeLinear":
            node = node.inputs[0].producer
        scales[value.name] = node.inputs[0].quant.scale[0]
    return scales


def run_onert(path: Path, images, many: bool = False) -> list[list[np.ndarray]]:
    """Each image (or, `many`, each list of inputs) through onert's native session on the
    circle file. The bindings read an array's memory without holding it: the arrays given
    to `set_input` are kept alive, C-contiguous, until the run ends (a temporary contiguous
    copy of the detector's transposed images was freed before `run`: wrong codes)."""
    from onert.native import libnnfw_api_pybind as nnfw  # the reference runtime (test extra)

    session = nnfw.infer.nnfw_session(str(path), "cpu")
    session.set_prepare_config(nnfw.prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
    session.prepare()
    results = []
    for x in images:
        held = [np.ascontiguousarray(array) for array in (x if many else [x])]
        for i, array in enumerate(held):
            session.set_input(i, array)
        session.run()
        results.append([np.array(session.get_output(i)) for i in range(session.output_size())])
    return results


def measure(model, folder: Path, count: int) -> dict:
    package, name, images = build(model, folder, count)
    manifest = json.loads((package / "metadata" / "MANIFEST").read_text())
    packaged, _ = run_package(load_package(package), {name: images})
    graph = load_ir(folder / "build" / "quantize.obir").main
    ours = Interpreter(graph).run_batch({name: images})  # onebuild's own rounding
    (circle,) = manifest["models"]
    theirs = run_onert(package / circle, images)
    reference = ort.InferenceSession(
        str(folder / f"{model.name}.onnx"), providers=["CPUExecutionProvider"]
    )
    floats = [reference.run(None, {name: x}) for x in images]
    scales = output_scales(folder)
    result = {"model": model.name, "samples": len(images), "model_types": manifest["model-types"]}
    for i, (key, mine) in enumerate(ours.items()):
        got = np.stack([r[i] for r in theirs]).reshape(mine.shape)
        want = np.stack([f[i] for f in floats]).reshape(mine.shape).astype(np.float64)
        lsb = np.rint(np.abs(got.astype(np.float64) - mine) / scales[key])
        package_lsb = np.rint(np.abs(got.astype(np.float64) - packaged[key]) / scales[key])
        result[key] = {
            "onert_vs_package_max_lsb": int(package_lsb.max()),
            "onert_vs_quantized_model_max_lsb": int(lsb.max()),
            "share_differing": float(np.mean(lsb > 0)),
            "sqnr_db_quantized_model": sqnr_db(np.sum(want**2), np.sum((want - mine) ** 2)),
            "sqnr_db_onert": sqnr_db(np.sum(want**2), np.sum((want - got) ** 2)),
        }
        if mine[0].size <= CLASSES:  # class scores: how often the decisions agree
            top = [a.reshape(len(a), -1).argmax(1) for a in (mine, got, want)]
            result[key]["top1_onert_equals_onebuild"] = float(np.mean(top[0] == top[1]))
            result[key]["top1_onebuild_equals_float"] = float(np.mean(top[0] == top[2]))
    result["each_operator_alone"] = each_operator(folder, images[0], name)
    return result


def alone(node) -> Model:
    """A copy of `node` as a model of its own: its activations graph inputs."""
    graph = Graph(node.name)
    made: dict[int, object] = {}
    for v in node.inputs:
        if id(v) not in made:
            if v.is_const:
                copy = graph.add_constant(v.numpy(), v.name)
            else:
                copy = graph.add_input(v.name, v.dtype, v.shape)
            copy.quant = v.quant
            made[id(v)] = copy
    inputs = [made[id(v)] for v in node.inputs]
    copy = graph.make_node(node.op, inputs, dict(node.attrs), node.name)
    copy.output.quant = node.output.quant
    graph.outputs.append(copy.output)
    return Model([graph], {})


def each_operator(folder: Path, image: np.ndarray, name: str) -> dict:
    """Per operator type, when onert runs each quantized node alone (written as circle) on
    onebuild's input codes of one image: the largest difference (LSB) from the node read back
    from that circle (`max_lsb_vs_circle`: onert's arithmetic, 0 when onebuild models it), and
    from the node itself (`max_lsb`, `share`: onebuild's own rounding)."""
    graph = load_ir(folder / "build" / "quantize.obir").main
    values = [n.output for n in graph.nodes]
    graph.outputs.extend(v for v in values if v not in graph.outputs)
    ours = {name: image[None], **Interpreter(graph).run_batch({name: image[None]})}
    worst: dict[str, list] = {}
    for node in graph.nodes:
        out = node.output
        if out.quant is None or None in node.inputs or node.op == "Identity":
            continue
        active = {id(v): v for v in node.inputs if not v.is_const}.values()
        feeds = [ours[v.name][0] for v in active]
        path = folder / "operator.circle"
        path.write_bytes(write_circle(alone(node)))
        (got,) = run_onert(path, [feeds], many=True)[0]
        diff = np.abs(got.astype(np.int64) - ours[out.name][0].astype(np.int64))
        back = read_circle(path).main
        read = Interpreter(back).run({v.name: f for v, f in zip(back.inputs, feeds)})
        exact = np.abs(got.astype(np.int64) - read[back.outputs[0].name].astype(np.int64))
        key = node.op + (f" {node.attrs['function']}" if node.op == "QLookup" else "")
        entry = worst.setdefault(key, [0, 0, 0, 0])
        entry[0] = max(entry[0], int(diff.max()))
        entry[1] += int(np.count_nonzero(diff))
        entry[2] += diff.size
        entry[3] = max(entry[3], int(exact.max()))
    return {
        k: {"max_lsb_vs_circle": e, "max_lsb": m, "share": c / n, "codes": n}
        for k, (m, c, n, e) in sorted(worst.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ocr_cls,ocr_det")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="build in this folder (kept)")
    args = parser.parse_args()
    chosen = [m for m in MODELS if m.name in args.models.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        for model in chosen:
            folder = root / model.name
            folder.mkdir(parents=True, exist_ok=True)
            print(json.dumps(measure(model, folder, args.samples)), flush=True)


if __name__ == "__main__":
    main()
