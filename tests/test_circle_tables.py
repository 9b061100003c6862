"""8-bit lookup tables of no named function (HardSigmoid, Exp, Erf, Mish, a Clip with odd
bounds) in circle and tflite as CAST + GATHER from the table (`serde/circle_table.py`): onert
and LiteRT give the tables bit for bit, the reader folds them back to the same QLookups, a
HardSigmoid model packs as circle, and another tool's CAST + GATHER that is no such table reads
as Cast and Gather."""

import json
import shutil

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model
from test_circle import DIGITS, digits_images, operator_names, run_litert, run_onert

from onebuild import compile as C
from onebuild.engine.dag import build
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.quant.model_io import quantize_inputs
from onebuild.graph_ir.serde import load_ir, load_onnx, read_circle, write_circle
from onebuild.graph_ir.serde.circle_write import Writer
from onebuild.graph_ir.serde.tflite_schema import TYPE_CODES
from onebuild.graph_ir.tensor import QuantParams
from onebuild.npz import read_npz
from onebuild.recipe import load_recipe
from onebuild.runtime.package import load_package, run_package

HEADS = ("HardSigmoid", "Exp", "Erf", "Mish", "Clip")


def heads_model(dtype: str) -> Model:
    """The digits CNN with HardSigmoid (Paddle's slope 0.2), Exp, Erf, Mish and Clip(-0.3, 0.7)
    heads on its logits, calibrated on the digits calibration images and quantized per tensor:
    each head is a lookup table of its calibrated parameters."""
    model = load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]})
    C.optimize(model)
    graph = model.main
    logits = graph.outputs[0]
    extra = {"Clip": [graph.add_constant(np.float32(v), f"clip_{v}") for v in (-0.3, 0.7)]}
    attrs = {"HardSigmoid": {"alpha": 0.2, "beta": 0.5}}
    for op in HEADS:
        node = graph.make_node(op, [logits, *extra.get(op, [])], attrs.get(op, {}), op.lower())
        graph.outputs.append(node.output)
    calib = read_npz(DIGITS / "data" / "calib.npz")["input"]
    stats = C.calibrate(graph, [(f"b{i}", {"input": calib[i : i + 32]}) for i in (0, 32)])
    options = C.QuantizeOptions(dtype=dtype, granularity="layer", input_type=dtype)
    return C.quantize(model, options, stats)


def codes_model(dtype: str) -> tuple[Model, np.ndarray]:
    """Every input code [1, 256] of the heads' input parameters through each head's own
    table (as QLookup nodes); and those codes."""
    heads = [n for n in heads_model(dtype).main.nodes if n.op == "QLookup"]
    assert [n.attrs["function"] for n in heads] == list(HEADS)
    graph = Graph("tables")
    x = graph.add_input("codes", np.dtype(dtype), (1, 256))
    x.quant = heads[0].inputs[0].quant
    for head in heads:
        table = graph.add_constant(head.inputs[1].numpy(), f"{head.name}_table")
        node = graph.make_node("QLookup", [x, table], dict(head.attrs), head.name)
        node.output.quant = head.output.quant
        graph.outputs.append(node.output)
    info = np.iinfo(dtype)
    return Model([graph], {}), np.arange(info.min, info.max + 1).astype(dtype).reshape(1, 256)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_tables_in_onert_and_litert_bit_for_bit(dtype, tmp_path):
    """The heads' tables on every input code: written as CAST + GATHER (int8 through QUANTIZE
    moving the zero point by 128: onert has no int8 CAST or GATHER), onert (circle and
    tflite) and LiteRT (tflite) give each table exactly, and both files read back to the same
    QLookups (function names kept) with the same tables."""
    model, codes = codes_model(dtype)
    graph = model.main
    want = Interpreter(graph).run({"codes": codes})
    for fmt in ("circle", "tflite"):
        data = write_circle(model, fmt)
        assert {"CAST", "GATHER"} <= operator_names(data)
        assert "DEQUANTIZE" not in operator_names(data)
        back = read_circle(data).main
        assert [(n.op, n.attrs) for n in back.nodes] == [(n.op, n.attrs) for n in graph.nodes]
        for mine, theirs in zip(graph.nodes, back.nodes):
            np.testing.assert_array_equal(theirs.inputs[1].numpy(), mine.inputs[1].numpy())
            assert theirs.output.quant == mine.output.quant
        runs = {"onert": run_onert(data, tmp_path, [[codes]], f"m.{fmt}")}
        if fmt == "tflite":
            runs["litert"] = run_litert(data, [[codes]])
        for runtime, ((*outputs,),) in runs.items():
            assert len(outputs) == len(graph.outputs) == len(HEADS)
            for value, got in zip(graph.outputs, outputs):
                np.testing.assert_array_equal(got, want[value.name], f"{runtime} {value.name}")


def hardsigmoid_recipe(folder, dtype: str):
    """input -> HardSigmoid (Paddle's slope 0.2, as PP-OCR's squeeze-excitation gates) and
    Erf, quantized to `dtype` with quantized model inputs and outputs, calibrated on the
    digits calibration images, packed."""
    nodes = [
        helper.make_node("HardSigmoid", ["input"], ["gate"], alpha=0.2, beta=0.5, name="hs"),
        helper.make_node("Erf", ["input"], ["erf"], name="erf"),
    ]
    shutil.copy(DIGITS / "data" / "calib.npz", folder / "calib.npz")
    onnx_model = make_model(nodes, [("input", [1, 1, 8, 8])], ["gate", "erf"])
    (folder / "m.onnx").write_bytes(onnx_model.SerializeToString())
    recipe = folder / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\n'
        f'dtype = "{dtype}"\ninput_type = "{dtype}"\noutput_type = "{dtype}"\n'
        'calibration = "calib.npz"\n[pack]\noutput = "out/m.nnpkg"\n'
    )
    return recipe


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_hardsigmoid_model_packs_as_circle_that_onert_runs(dtype, tmp_path):
    """Built as a user builds it, the package holds `.circle` (no `.obir`, which onert cannot
    load), and onert's outputs on 64 digit images equal onebuild's bit for bit, as LiteRT's do
    on the model as tflite."""
    results = build(
        [load_recipe(hardsigmoid_recipe(tmp_path, dtype), [])], progress=lambda message: None
    )
    assert not [r.error for r in results if r.status == "failed"]
    package = tmp_path / "out" / "m.nnpkg"
    manifest = json.loads((package / "metadata" / "MANIFEST").read_text())
    assert manifest["model-types"] == ["circle"]
    model = load_ir(tmp_path / "build" / "r" / "quantize.obir")
    graph = model.main
    feeds = quantize_inputs(graph, {"input": digits_images(64)})
    want, _ = run_package(load_package(package), feeds, raw=True)
    np.testing.assert_array_equal(want["gate"], Interpreter(graph).run_batch(feeds)["gate"])
    samples = [[x] for x in feeds["input"]]
    for runtime, outputs in (
        ("onert", run_onert((package / "m.circle").read_bytes(), tmp_path, samples)),
        ("litert", run_litert(write_circle(model, "tflite"), samples)),
    ):
        assert [len(r) for r in outputs] == [2] * 64
        for index, value in enumerate(graph.outputs):
            got = np.stack([r[index] for r in outputs])
            np.testing.assert_array_equal(got, want[value.name], f"{runtime} {value.name}")


def foreign(codes: str, quantized: bool, table: np.ndarray, offset: int | None = None) -> bytes:
    """Another tool's tflite file: codes [1, 64] -> CAST int32 [-> ADD offset] -> GATHER from
    a constant table whose parameters the output carries."""
    graph = Graph("foreign")
    x = graph.add_input("codes", np.dtype(codes), (1, 64))
    x.quant = QuantParams((0.05,), (0,)) if quantized else None
    y = graph.make_node("Identity", [x], {}, "y").output
    graph.outputs.append(y)
    w = Writer(graph, "tflite")
    source = w.define(x, None)
    index = w.new_tensor("index", np.int32, (1, 64))
    types = {"in_data_type": TYPE_CODES[x.dtype], "out_data_type": TYPE_CODES[np.dtype(np.int32)]}
    w.op("CAST", [source], [index], **types)
    if offset is not None:
        moved = w.new_tensor("moved", np.int32, (1, 64))
        w.op("ADD", [index, w.constant(np.asarray([offset], np.int32), "offset")], [moved])
        index = moved
    params = QuantParams((0.01,), (3,))
    values = w.constant(table, "table", params)
    out = w.define(y, None, params)
    w.tensors[out].dtype, w.tensors[out].shape = table.dtype, (1, 64, *table.shape[1:])
    w.op("GATHER", [values, index], [out], axis=0)
    return w.serialize()


TABLE = np.arange(256).astype(np.uint8)[::-1].copy()


@pytest.mark.parametrize(
    "codes, quantized, table, offset, folds",
    [
        ("uint8", True, TABLE, None, True),  # the table form: a QLookup
        ("uint8", False, TABLE, None, False),  # indices, not quantized codes
        ("uint8", True, np.resize(TABLE, 300), None, False),  # 300 entries
        ("uint8", True, np.stack([TABLE, TABLE], axis=1), None, False),  # rows of 2
        ("int8", True, np.resize(TABLE, 300), 150, False),  # int8 codes + 150
    ],
)
def test_other_cast_gather_is_not_folded(codes, quantized, table, offset, folds):
    """Only the table form folds into a QLookup; other CAST + GATHER files read as Cast (+ Add)
    + Gather, which run as LiteRT runs the file."""
    data = foreign(codes, quantized, table, offset)
    back = read_circle(data).main
    ops = [n.op for n in back.nodes if n.op != "Identity"]
    assert ops == (["QLookup"] if folds else ["Cast", *["Add"] * (offset is not None), "Gather"])
    info = np.iinfo(codes)
    feed = np.random.default_rng(0).integers(info.min, info.max + 1, (1, 64), dtype=codes)
    (want,) = run_litert(data, [[feed]])[0]
    got = Interpreter(back).run({"codes": feed})[back.outputs[0].name]
    np.testing.assert_array_equal(got, want)
