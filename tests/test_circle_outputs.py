"""Graph outputs that operators of the same circle also read. onert 0.1.0, with outputs
allocated by the runtime (`ENABLE_INTERNAL_OUTPUT_ALLOC`, how its Python API runs), plans such
an output like an inner tensor: freed after its last reader, its memory goes to a tensor made
later, whose data the output then returns (docs/circle-tflite.md). The circle writer writes
these outputs by a copy (RESHAPE to the same shape) of the tensor the readers read, and the
reader folds the copy back. `old_circle` writes a model without the copies, as before: onert
gets it wrong (those checks fail once onert is fixed; then the copies can go)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import (
    DIGITS,
    digits_images,
    digits_with_heads,
    operator_list,
    run_litert,
    run_onert,
)

from onebuild import compile as C
from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.quant.model_io import quantize_inputs
from onebuild.graph_ir.serde import load_ir, read_circle, write_circle
from onebuild.graph_ir.serde.circle_exact import exact_circle
from onebuild.graph_ir.serde.circle_write import Writer
from onebuild.recipe import load_recipe
from onebuild.runtime.package import load_package, run_package


def old_circle(model: Model, monkeypatch) -> bytes:
    """The circle as the writer wrote it before: every output written by its producer."""
    with monkeypatch.context() as patch:
        patch.setattr(Writer, "_copied_outputs", lambda self, outputs: outputs)
        return write_circle(model)


def chain(ops: tuple[str, ...], keep: tuple[int, ...]) -> Model:
    """A row [1, 64] through `ops` one after the other; the outputs are the values at `keep`."""
    graph = Graph("chain")
    value = graph.add_input("x", np.float32, (1, 64))
    values = []
    for i, op in enumerate(ops):
        value = graph.make_node(op, [value], name=f"{op.lower()}{i}").output
        values.append(value)
    graph.outputs = [values[i] for i in keep]
    return Model([graph])


def rows(count: int, start: int = 0) -> np.ndarray:
    """Digit images as rows [1, 64], centred: (pixel - 8) / 4."""
    images = digits_images(start + count)[start:]
    return ((images.reshape(count, 1, 64) - 8) / 4).astype(np.float32)


def uint8(model: Model) -> Model:
    """Calibrated on 64 other digit rows, uint8 per tensor with uint8 inputs and outputs."""
    stats = C.calibrate(model.main, [("calib", {"x": rows(64, start=64)})])
    options = C.QuantizeOptions(
        dtype="uint8", granularity="layer", input_type="uint8", output_type="uint8"
    )
    return C.quantize(model, options, stats)


def errors(model: Model, results: list, feeds: np.ndarray) -> list[float]:
    """Per output, the largest difference from onebuild's interpreter (in LSB for codes)."""
    graph = model.main
    want = Interpreter(graph).run_batch({graph.inputs[0].name: feeds})
    worst = []
    for i, value in enumerate(graph.outputs):
        got = np.stack([r[i] for r in results]).astype(np.float64)
        worst.append(float(np.abs(got - want[value.name]).max()))
    return worst


def in_runtimes(model: Model, feeds: np.ndarray, tmp_path, monkeypatch) -> dict[str, list]:
    """Each output's largest error in onert (the old and the new circle) and LiteRT."""
    samples = [[x] for x in feeds]
    return {
        "old": errors(model, run_onert(old_circle(model, monkeypatch), tmp_path, samples), feeds),
        "onert": errors(model, run_onert(write_circle(model), tmp_path, samples), feeds),
        "litert": errors(model, run_litert(write_circle(model, "tflite"), samples), feeds),
    }


def test_float_output_read_inside_the_model(tmp_path, monkeypatch):
    """x -> RELU -> a (output) -> LOGISTIC -> TANH -> c (output): a's memory, free after
    LOGISTIC, went to TANH's output."""
    model = chain(("Relu", "Sigmoid", "Tanh"), (0, 2))
    assert operator_list(write_circle(model)) == ["RELU", "LOGISTIC", "TANH", "RESHAPE"]
    measured = in_runtimes(model, rows(64), tmp_path, monkeypatch)
    assert measured["old"][0] > 0.1  # a holds tanh values
    assert max(measured["onert"]) < 1e-6 and max(measured["litert"]) < 1e-6


def test_uint8_output_read_inside_the_model(tmp_path, monkeypatch):
    """x -> Relu -> a (output) -> HardSigmoid -> Exp -> c (output), uint8 (Relu as DEQUANTIZE,
    RELU, QUANTIZE; the other two as tables): a came back up to 255 LSB off; now onert and
    LiteRT give onebuild's codes bit for bit."""
    model = uint8(chain(("Relu", "HardSigmoid", "Exp"), (0, 2)))
    feeds = quantize_inputs(model.main, {"x": rows(64)})["x"]
    measured = in_runtimes(model, feeds, tmp_path, monkeypatch)
    assert measured["old"][0] >= 100
    assert measured["onert"] == [0, 0] and measured["litert"] == [0, 0]


def test_output_read_by_the_last_operator_only_was_right(tmp_path, monkeypatch):
    """An output whose reader is the last operator: nothing is made after it is freed, so
    onert was right before; the copy changes nothing there."""
    model = uint8(chain(("Relu", "Sigmoid"), (0, 1)))
    feeds = quantize_inputs(model.main, {"x": rows(64)})["x"]
    measured = in_runtimes(model, feeds, tmp_path, monkeypatch)
    assert measured["old"] == measured["onert"] == [0, 0]


@pytest.mark.parametrize("head", ["Relu", "HardSigmoid"])
def test_digits_logits_feeding_a_table(head, tmp_path, monkeypatch):
    """The digits CNN at uint8 with its logits an output and a table on them (a package's CPU
    part whose output also feeds a table): the logits came back over 200 LSB off; now within
    onert's 1 LSB (its two roundings), and its head is exactly the table of its own logits,
    so the logits returned are the ones the head read. LiteRT: bit for bit."""
    model = digits_with_heads("uint8", (head,), "layer")
    graph = model.main
    feeds = quantize_inputs(graph, {"input": digits_images(64)})["input"]
    measured = in_runtimes(model, feeds, tmp_path, monkeypatch)
    assert measured["old"][0] > 200
    assert measured["onert"][0] <= 1 and measured["litert"] == [0, 0]
    results = run_onert(write_circle(model), tmp_path, [[x] for x in feeds])
    logits = np.stack([r[0] for r in results])
    table = next(n for n in graph.nodes if n.op == "QLookup").inputs[1].numpy()
    np.testing.assert_array_equal(np.stack([r[1] for r in results]), table[logits])


def test_onert_output_beside_a_reshape(tmp_path, monkeypatch):
    """x -> RELU -> a (output), a -> RESHAPE -> SOFTMAX -> c (output): onert returned c's
    values for a (why the light-model tests exposed no second output); now a's own."""
    graph = Graph("reshape_output")
    x = graph.add_input("x", np.float32, (1, 64))
    a = graph.make_node("Relu", [x], name="a").output
    b = graph.make_node("Reshape", [a], {"shape": [8, 8]}, name="b").output
    c = graph.make_node("Softmax", [b], {"axis": -1}, name="c").output
    graph.outputs = [a, c]
    model = Model([graph])
    measured = in_runtimes(model, rows(16), tmp_path, monkeypatch)
    assert measured["old"][0] > 0.1
    assert max(measured["onert"]) < 1e-6 and max(measured["litert"]) < 1e-6


@pytest.mark.parametrize("quantized", [False, True])
def test_copies_only_where_read_and_folded_back(quantized):
    """A copy per output an operator reads (float: one listed twice, one copy), none for the
    others; the reader folds each back: the same nodes, names and outputs, bit for bit
    (`exact_circle`). (A quantized output listed twice, two names: see the next test.)"""
    model = chain(("Relu", "Sigmoid", "Tanh"), (0, 1, 2) if quantized else (0, 0, 1, 2))
    if quantized:
        model = uint8(model)
    data, reason = exact_circle(model)
    assert reason is None
    assert operator_list(data).count("RESHAPE") == 2  # relu0 and sigmoid1, not tanh2
    back = read_circle(data).main
    assert [n.op for n in back.nodes] == [n.op for n in model.main.nodes if n.op != "Identity"]
    assert [v.name for v in back.outputs] == [v.name for v in model.main.outputs]
    plain = chain(("Relu", "Sigmoid"), (1,))
    assert "RESHAPE" not in operator_list(write_circle(plain))


@pytest.mark.parametrize(("keep", "copies"), [((0, 0, 1, 2), 3), ((2, 2), 2), ((0, 2, 1, 2), 4)])
def test_a_quantized_output_listed_twice_is_exact_circle(keep, copies):
    """With quantized model outputs, an output listed twice is two IR values of two names;
    the writer gives each a copy of the tensor (whether an operator reads it or not) and the
    reader folds the second back as an Identity of the first. The old writer's one tensor
    could hold only one of the names: `exact_circle` refused it and packages kept `.obir`."""
    model = uint8(chain(("Relu", "Sigmoid", "Tanh"), keep))
    names = [v.name for v in model.main.outputs]
    assert len(set(names)) == len(names) == len(keep)  # two names for the repeated one
    data, reason = exact_circle(model)
    assert reason is None, reason
    assert operator_list(data).count("RESHAPE") == copies  # one per IR value read or repeated
    assert [v.name for v in read_circle(data).main.outputs] == names


def packed(tmp_path, outputs: list[str]) -> tuple[Path, Model]:
    """Built as a user builds it (uint8 model I/O, packed): input -> HardSigmoid -> gate ->
    Erf -> Exp -> out, the model's outputs named by `outputs`; the package and the quantized
    model it came from."""
    nodes = [
        helper.make_node("HardSigmoid", ["input"], ["gate"], alpha=0.2, beta=0.5, name="hs"),
        helper.make_node("Erf", ["gate"], ["erf"], name="erf"),
        helper.make_node("Exp", ["erf"], ["out"], name="exp"),
    ]
    shutil.copy(DIGITS / "data" / "calib.npz", tmp_path / "calib.npz")
    onnx_model = make_model(nodes, [("input", [1, 1, 8, 8])], outputs)
    (tmp_path / "m.onnx").write_bytes(onnx_model.SerializeToString())
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\ndtype = "uint8"\n'
        'input_type = "uint8"\noutput_type = "uint8"\ncalibration = "calib.npz"\n'
        '[pack]\noutput = "out/m.nnpkg"\n'
    )
    results = build([load_recipe(recipe, [])], progress=lambda message: None)
    assert not [r.error for r in results if r.status == "failed"]
    return tmp_path / "out" / "m.nnpkg", load_ir(tmp_path / "build" / "r" / "quantize.obir")


def test_package_whose_output_listed_twice_runs_in_onert(tmp_path):
    """outputs [gate, out, gate], quantized (uint8 model outputs: two IR values, gate and
    gate_1): the package was `.obir` (one circle tensor cannot hold two names); now one
    `.circle`, and onert returns every output, both gates included, equal to onebuild's
    package run bit for bit."""
    package, model = packed(tmp_path, ["gate", "out", "gate"])
    assert json.loads((package / "metadata" / "MANIFEST").read_text())["models"] == ["m.circle"]
    graph = model.main
    assert [v.name for v in graph.outputs] == ["gate", "out", "gate_1"]
    feeds = quantize_inputs(graph, {"input": digits_images(64)})
    want, _ = run_package(load_package(package), feeds, raw=True)
    samples = [[x] for x in feeds["input"]]
    outputs = run_onert((package / "m.circle").read_bytes(), tmp_path, samples)
    for index, value in enumerate(graph.outputs):
        got = np.stack([r[index] for r in outputs])
        np.testing.assert_array_equal(got, want[value.name], value.name)
    assert len(np.unique(want["gate"])) > 16  # the gates hold real codes, not a constant
    np.testing.assert_array_equal(want["gate"], want["gate_1"])


def test_package_whose_output_feeds_a_table(tmp_path, monkeypatch):
    """Built as a user builds it (uint8 model I/O, packed): input -> HardSigmoid -> gate
    (output) -> Erf -> Exp -> out (output), the tables CAST + GATHER. onert's outputs on 64
    digit images equal onebuild's package run bit for bit (gate came back wrong from the old
    writer's circle), as LiteRT's do on the model as tflite."""
    package, model = packed(tmp_path, ["gate", "out"])
    assert json.loads((package / "metadata" / "MANIFEST").read_text())["models"] == ["m.circle"]
    graph = model.main
    feeds = quantize_inputs(graph, {"input": digits_images(64)})
    want, _ = run_package(load_package(package), feeds, raw=True)
    samples = [[x] for x in feeds["input"]]
    data = (package / "m.circle").read_bytes()
    assert operator_list(data).count("RESHAPE") == 4  # three tables' and the copy of gate
    old = np.stack([r[0] for r in run_onert(old_circle(model, monkeypatch), tmp_path, samples)])
    assert not np.array_equal(old, want["gate"])
    for runtime, outputs in (
        ("onert", run_onert(data, tmp_path, samples)),
        ("litert", run_litert(write_circle(model, "tflite"), samples)),
    ):
        for index, value in enumerate(graph.outputs):
            got = np.stack([r[index] for r in outputs])
            np.testing.assert_array_equal(got, want[value.name], f"{runtime} {value.name}")
