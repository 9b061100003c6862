"""onert 0.1.0's gaps by operator and type (`serde/onert_gaps.py`), each reproduced with one
operator in the onert wheel: int8 TRANSPOSE and FULLY_CONNECTED fail at run time, and no int16
tensor runs. A package holding such a circle says so in one line (it said nothing, and the
int8 package failed only in onert's `run`), and `export` no longer claims "onert runs this
file" for it."""

import logging

import numpy as np
import pytest
from test_circle import DIGITS, operator_list, run_onert
from test_quantized_prelu import quantized_stem

from onebuild import compile as api
from onebuild.cli import main
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.serde import load_onnx, save_ir
from onebuild.graph_ir.serde.circle_write import write_flatbuffer
from onebuild.graph_ir.serde.onert_gaps import GAPS, onert_gaps
from onebuild.npz import read_npz
from onebuild.packing import write_package


def alone(node) -> Graph:
    """`node` as a graph of its own, its computed inputs graph inputs."""
    graph = Graph("one")
    inputs = []
    for v in node.inputs:
        new = (
            graph.add_constant(v.numpy(), v.name)
            if v.is_const
            else graph.add_input(v.name, v.dtype, v.shape)
        )
        new.quant = v.quant
        inputs.append(new)
    made = graph.make_node(node.op, inputs, dict(node.attrs), node.name, [node.output.name])
    made.output.quant = node.output.quant
    graph.outputs = [made.output]
    return graph


def digits(dtype: str, granularity: str = "channel") -> Model:
    model = api.optimize(load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}))
    stats = api.calibrate(model.main, read_npz(DIGITS / "data" / "calib.npz"))
    options = api.QuantizeOptions(
        dtype=dtype, input_type=dtype, output_type=dtype, granularity=granularity
    )
    return api.quantize(model, options, stats)


def one_operator(op: str, dtype: str) -> bytes:
    """A circle of one operator `op` on `dtype` codes, from the stem (TRANSPOSE: its input
    layout change) or the digits classifier (FULLY_CONNECTED: its dense layer, per-tensor
    weights: uint8 per-channel ones are written as a 1x1 CONV_2D)."""
    if op == "TRANSPOSE":
        model = quantized_stem(dtype, input_type=dtype)
        (node,) = [n for n in model.main.nodes if n.op == "Transpose"]
    else:
        (node,) = [n for n in digits(dtype, "layer").main.nodes if n.op == "QGemm"]
    data = write_flatbuffer(Model([alone(node)]), "circle")
    assert operator_list(data) == [op]
    return data


def runs_in_onert(data: bytes, tmp_path) -> bool:
    from onebuild.graph_ir.serde import read_circle

    graph = read_circle(data).main
    feeds = [[np.zeros(v.shape, v.dtype) for v in graph.inputs]]
    try:
        run_onert(data, tmp_path, feeds)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("gap", sorted(GAPS))
def test_each_listed_gap_fails_in_onert_and_runs_in_uint8(gap, tmp_path):
    op, dtype = gap
    data = one_operator(op, dtype)
    assert not runs_in_onert(data, tmp_path)
    assert f"{op} {dtype} x1" in onert_gaps(data)
    uint8 = one_operator(op, "uint8")
    assert runs_in_onert(uint8, tmp_path) and onert_gaps(uint8) is None


def test_int16_circles_do_not_run_in_onert(tmp_path):
    data = write_flatbuffer(digits("int16"), "circle")
    assert not runs_in_onert(data, tmp_path)
    assert "int16 tensors" in onert_gaps(data)


def test_pack_says_which_parts_onert_cannot_run(tmp_path):
    notes = {}
    for dtype in ("uint8", "int8"):
        model = quantized_stem(dtype, input_type=dtype)
        save_ir(model, tmp_path / f"{dtype}.obir")
        notes[dtype] = write_package(tmp_path / f"{dtype}.nnpkg", [tmp_path / f"{dtype}.obir"])
        assert (tmp_path / f"{dtype}.nnpkg" / f"{dtype}.circle").exists()
    assert notes["uint8"] == []
    (note,) = notes["int8"]
    assert note.startswith("int8.obir packs as circle, but onert 0.1.0 cannot run it")
    assert "TRANSPOSE int8" in note


def test_export_names_the_gap_instead_of_claiming_onert_runs_it(tmp_path, caplog):
    save_ir(digits("int16"), tmp_path / "d.obir")
    with caplog.at_level(logging.WARNING, "onebuild"):
        assert main(["export", str(tmp_path / "d.obir"), "-o", str(tmp_path / "d.tflite")]) == 0
    assert "onert 0.1.0 cannot run it (int16 tensors" in caplog.text
    assert "onert runs this file" not in caplog.text
