"""Data-dependent control flow (ONNX If and Loop as IR ops holding subgraphs), unrolled Loops,
and NonZero, against onnxruntime, on digits images (scikit-learn's bundled data): import, IR
files, verify, passes, ONNX export, and a package whose Loop runs on the CPU."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sklearn.datasets import load_digits

from onebuild.errors import DynamicValueError, FormatError, IRError, ModelError
from onebuild.graph_ir.interpreter import Interpreter
from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.serde import load_ir, load_model, save_ir
from onebuild.graph_ir.serde.onnx_export import export_onnx
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.graph_ir.verify import verify
from onebuild.npz import write_npz

VALUE_IF = Path(__file__).parent / "data" / "torch_models" / "value_if.onnx"
ROWS = (load_digits().data[:40] / 16.0).astype(np.float32)  # 40 images, flattened to 64


def _info(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _branch(name: str, nodes, out: str, shape) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_info(out, shape)])


def ink_model(else_shape=(1, 64), nested: bool = False) -> onnx.ModelProto:
    """y = If(mean(x) > 0.3): Relu(x - 0.5) [or, nested: If(mean(x) > 0.33): x * 3 else -x]
    else x * 2 (reshaped to `else_shape`)."""
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    then_nodes = [
        helper.make_node("Constant", [], ["h"], value=half),
        helper.make_node("Sub", ["x", "h"], ["d"]),
        helper.make_node("Relu", ["d"], ["t"]),
    ]
    if nested:
        inner_then = _branch("it", [helper.make_node("Mul", ["x", "three"], ["a"])], "a", [1, 64])
        inner_else = _branch("ie", [helper.make_node("Neg", ["x"], ["b"])], "b", [1, 64])
        then_nodes = [
            helper.make_node("Greater", ["ink", "denser"], ["dense"]),
            helper.make_node(
                "If", ["dense"], ["t"], then_branch=inner_then, else_branch=inner_else
            ),
        ]
    shape = helper.make_tensor("s", TensorProto.INT64, [len(else_shape)], list(else_shape))
    else_nodes = [
        helper.make_node("Mul", ["x", "two"], ["e0"]),
        helper.make_node("Constant", [], ["shape"], value=shape),
        helper.make_node("Reshape", ["e0", "shape"], ["e"]),
    ]
    constants = [("two", 2.0), ("three", 3.0), ("threshold", 0.3), ("denser", 0.33)]
    nodes = [
        helper.make_node("Constant", [], [name], value_float=value) for name, value in constants
    ]
    nodes += [
        helper.make_node("ReduceMean", ["x"], ["ink"], keepdims=0),
        helper.make_node("Greater", ["ink", "threshold"], ["inky"]),
        helper.make_node(
            "If",
            ["inky"],
            ["y"],
            name="pick",
            then_branch=_branch("then", then_nodes, "t", [1, 64]),
            else_branch=_branch("else", else_nodes, "e", list(else_shape)),
        ),
    ]
    return _model(nodes, [_info("x", [1, 64])], [_info("y", None)])


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString())
    return session.run(None, {"x": x})[0]


def _conditions(graph, rows) -> list[bool]:
    """The If condition each sample computes, seen through the interpreter's observer."""
    condition = next(n for n in graph.nodes if n.op == "If").inputs[0]
    seen: list[bool] = []
    interpreter = Interpreter(graph, lambda v, a: seen.append(bool(a)) if v is condition else None)
    for row in rows:
        interpreter.run({"x": row[None]})
    return seen


@pytest.mark.parametrize("nested", [False, True])
def test_value_dependent_if_runs_the_branch_the_data_selects(nested):
    model = ink_model(nested=nested)
    ir = import_onnx(model, "ink.onnx")
    assert [n.op for n in ir.main.nodes].count("If") == 1
    verify(ir.main)
    taken = _conditions(ir.main, ROWS)
    assert 0 < sum(taken) < len(taken)  # real images take both branches
    interpreter = Interpreter(ir.main)
    for row in ROWS:
        want = _ort(model, row[None])
        np.testing.assert_allclose(interpreter.run({"x": row[None]})["y"], want, rtol=1e-6)
    if nested:  # the inner If reads x from two scopes out: an input of both Ifs
        outer = ir.main.nodes[-1]
        inner = next(n for n in outer.attrs["then_branch"].nodes if n.op == "If")
        assert [v.name for v in outer.inputs[1:]] == ["ink", "x"]
        assert [v.name for v in inner.inputs[1:]] == ["x"]
        dense = [row for row in ROWS if row.mean() > 0.33]
        assert dense and len(dense) < sum(taken)  # real images take all three paths


def test_branches_giving_different_types_are_refused():
    with pytest.raises(ModelError, match=r"node 'pick' \(If\).*both branches must give the same"):
        import_onnx(ink_model(else_shape=(64,)), "ink.onnx")


def test_pinned_condition_folds_to_one_branch():
    ir = import_onnx(ink_model(), "ink.onnx", input_values={"x": ROWS[:1]})
    assert "If" not in {n.op for n in ir.main.nodes}


def test_never_batched_and_run_batch_matches_onnxruntime():
    model = ink_model()
    interpreter = Interpreter(import_onnx(model, "ink.onnx").main)
    assert not interpreter.batchable
    got = interpreter.run_batch({"x": ROWS[:, None]})["y"]
    want = np.stack([_ort(model, row[None]) for row in ROWS])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_passes_keep_what_branches_read():
    """Relu's output is read only inside the If's branches: dead-code elimination keeps it."""
    model = load_model(VALUE_IF, {"x": [1, 1, 8, 8]})
    run_preset(model)
    node = next(n for n in model.main.nodes if n.op == "If")
    captured = node.inputs[1]
    assert captured.producer is not None and captured.producer.op == "Conv"
    session = ort.InferenceSession(str(VALUE_IF))
    images = ROWS.reshape(-1, 1, 1, 8, 8)
    for image in images:
        want = session.run(None, {"x": image})[0]
        got = Interpreter(model.main).run({"x": image})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_round_trips_through_an_ir_file(tmp_path):
    model = load_model(VALUE_IF, {"x": [1, 1, 8, 8]})
    first = save_ir(model, tmp_path / "a.obir")
    loaded = load_ir(tmp_path / "a.obir")
    verify(loaded.main)
    assert len(loaded.graphs) == 1  # branches belong to the If, not to the model's list
    header = _header(tmp_path / "a.obir")
    assert [g["name"] for g in header["graphs"]] == ["main_graph", "/If.then_branch",
                                                     "/If.else_branch"]  # fmt: skip
    attrs = next(n for n in header["graphs"][0]["nodes"] if n["op"] == "If")["attrs"]
    assert attrs == {"then_branch": 1, "else_branch": 2}
    assert save_ir(loaded, tmp_path / "b.obir") == first  # same graph, same bytes
    images = ROWS.reshape(-1, 1, 1, 8, 8)
    want = Interpreter(model.main).run_batch({"x": images})["y"]
    np.testing.assert_array_equal(Interpreter(loaded.main).run_batch({"x": images})["y"], want)


def _header(path: Path) -> dict:
    data = path.read_bytes()
    size = int.from_bytes(data[16:24], "little")
    return json.loads(data[40 : 40 + size])


@pytest.mark.parametrize(
    ("reference", "message"),
    [(0, r"then_branch: 0 is out of range \[1, 2\]"), (3, r"3 is out of range \[1, 2\]")],
)
def test_ir_file_refuses_subgraph_references_that_do_not_follow(tmp_path, reference, message):
    from test_structural_mutations import _ir_parts, _ir_resealed

    save_ir(load_model(VALUE_IF, {"x": [1, 1, 8, 8]}), tmp_path / "a.obir")
    header, blob = _ir_parts((tmp_path / "a.obir").read_bytes())
    node = next(n for n in header["graphs"][0]["nodes"] if n["op"] == "If")
    node["attrs"]["then_branch"] = reference
    (tmp_path / "b.obir").write_bytes(_ir_resealed(header, blob))
    with pytest.raises(FormatError, match=message):
        load_ir(tmp_path / "b.obir")


def test_verify_checks_branches():
    ir = import_onnx(ink_model(), "ink.onnx")
    node = ir.main.nodes[-1]
    branch = node.attrs["else_branch"]
    branch.outputs = [branch.inputs[0], branch.inputs[0]]
    with pytest.raises(IRError, match="node 'pick' \\(If\\).*else_branch gives"):
        verify(ir.main)


def nonzero_model(constant: bool) -> onnx.ModelProto:
    """NonZero of a constant mask (a digits image) or of the input; indices -> float."""
    mask = helper.make_tensor("m", TensorProto.FLOAT, [8, 8], ROWS[0].tolist())
    source = "mask" if constant else "x"
    nodes = [
        helper.make_node("Constant", [], ["mask"], value=mask),
        helper.make_node("NonZero", [source], ["nz"], name="where"),
        helper.make_node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["f", "axes"], ["s"], keepdims=0),
        helper.make_node("Add", ["s", "x0"], ["y"]),
        helper.make_node("ReduceSum", ["x"], ["x0"], keepdims=0),
    ]
    nodes.insert(0, helper.make_node("Constant", [], ["axes"], value_ints=[1]))
    return _model(nodes, [_info("x", [8, 8])], [_info("y", None)])


def test_nonzero_of_a_constant_folds():
    model = nonzero_model(constant=True)
    ir = import_onnx(model, "nz.onnx")
    assert "NonZero" not in {n.op for n in ir.main.nodes}
    x = ROWS[1].reshape(8, 8)
    np.testing.assert_allclose(Interpreter(ir.main).run({"x": x})["y"], _ort(model, x), 1e-6)


def test_nonzero_of_data_is_refused_with_how_to_pin():
    with pytest.raises(DynamicValueError, match=r"'where' \(NonZero\): its output shape") as info:
        import_onnx(nonzero_model(constant=False), "nz.onnx")
    assert "constants = { x = ... }" in str(info.value) and info.value.graph_inputs == ["x"]


def loop_model(trip_count: int | None) -> onnx.ModelProto:
    """h = x; repeat M times: h = 0.5 h + x (carried), collecting h (scan output); M a constant,
    or the input `m` when `trip_count` is None."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Mul", ["h_in", "half"], ["scaled"]),
            helper.make_node("Add", ["scaled", "x"], ["h_out"]),
            helper.make_node("Identity", ["h_out"], ["h_scan"]),
        ],
        "body",
        [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL),
         _info("h_in", [1, 64])],
        [_info("cond_out", [], TensorProto.BOOL), _info("h_out", [1, 64]),
         _info("h_scan", [1, 64])],
    )  # fmt: skip
    nodes = [helper.make_node("Constant", [], ["half"], value_float=0.5)]
    inputs = [_info("x", [1, 64])]
    if trip_count is None:
        inputs.append(_info("m", [], TensorProto.INT64))
    else:
        m = helper.make_tensor("m", TensorProto.INT64, [], [trip_count])
        nodes.append(helper.make_node("Constant", [], ["m"], value=m))
    nodes.append(
        helper.make_node("Loop", ["m", "", "x"], ["y", "scan"], name="accumulate", body=body)
    )
    return _model(nodes, inputs, [_info("y", [1, 64]), _info("scan", None)])


def test_loop_with_a_constant_trip_count_is_unrolled():
    model = loop_model(4)
    ir = import_onnx(model, "loop.onnx")
    ops = [n.op for n in ir.main.nodes]
    assert "Loop" not in ops and ops.count("Add") == 4
    session = ort.InferenceSession(model.SerializeToString())
    interpreter = Interpreter(ir.main)
    for row in ROWS[:8]:
        want = dict(zip(["y", "scan"], session.run(None, {"x": row[None]})))
        got = interpreter.run({"x": row[None]})
        assert got["scan"].shape == (4, 1, 64)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_loop_with_a_data_dependent_trip_count_needs_it_pinned():
    with pytest.raises(
        DynamicValueError, match=r"'accumulate' \(Loop\): its trip count.*m.*scan outputs"
    ):
        import_onnx(loop_model(None), "loop.onnx")
    ir = import_onnx(loop_model(None), "loop.onnx", input_values={"m": 3})
    assert [n.op for n in ir.main.nodes].count("Add") == 3


@pytest.mark.parametrize("nested", [False, True])
def test_exported_if_runs_in_onnxruntime(nested):
    """IR -> ONNX: branches become subgraphs reading the If's inputs by name."""
    ir = import_onnx(ink_model(nested=nested), "ink.onnx")
    session = ort.InferenceSession(export_onnx(ir).SerializeToString())
    interpreter = Interpreter(ir.main)
    for row in ROWS:
        want = interpreter.run({"x": row[None]})["y"]
        np.testing.assert_array_equal(session.run(["y"], {"x": row[None]})[0], want)


def while_model() -> onnx.ModelProto:
    """Halve h (starting at x) while mean(h) > 0.02, adding 0.001 x each time; count the steps:
    the trip count depends on the image, so the Loop stays control flow."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["h_in", "half"], ["halved"]),
            helper.make_node("Mul", ["x", "small"], ["nudge"]),
            helper.make_node("Add", ["halved", "nudge"], ["h_out"]),
            helper.make_node("Add", ["n_in", "one"], ["n_out"]),
            helper.make_node("ReduceMean", ["h_out"], ["level"], keepdims=0),
            helper.make_node("Greater", ["level", "cutoff"], ["cond_out"]),
        ],
        "body",
        [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL),
         _info("h_in", [1, 64]), _info("n_in", [])],
        [_info("cond_out", [], TensorProto.BOOL), _info("h_out", [1, 64]), _info("n_out", [])],
    )  # fmt: skip
    constants = [("half", 0.5), ("small", 0.001), ("one", 1.0), ("cutoff", 0.02), ("zero", 0.0)]
    nodes = [helper.make_node("Constant", [], [n], value_float=v) for n, v in constants]
    nodes += [
        helper.make_node("ReduceMean", ["x"], ["start"], keepdims=0),
        helper.make_node("Greater", ["start", "cutoff"], ["going"]),
        helper.make_node("Loop", ["", "going", "x", "zero"], ["y", "steps"], name="halve",
                         body=body),
    ]  # fmt: skip
    return _model(nodes, [_info("x", [1, 64])], [_info("y", [1, 64]), _info("steps", [])])


def test_data_dependent_loop_runs_as_control_flow(tmp_path):
    model = while_model()
    ir = import_onnx(model, "while.onnx")
    loop = next(n for n in ir.main.nodes if n.op == "Loop")
    assert [v.name for v in loop.inputs[2:]] == ["x", "zero", "x"]  # carried, then read
    save_ir(ir, tmp_path / "w.obir")
    loaded = load_ir(tmp_path / "w.obir")
    verify(loaded.main)
    session = ort.InferenceSession(model.SerializeToString())
    exported = ort.InferenceSession(export_onnx(loaded).SerializeToString())
    interpreter, steps = Interpreter(loaded.main), set()
    for row in ROWS:
        want = session.run(None, {"x": row[None]})
        got = interpreter.run({"x": row[None]})
        np.testing.assert_allclose(got["y"], want[0], rtol=1e-6)
        assert got["steps"] == want[1]
        steps.add(float(got["steps"]))
        np.testing.assert_array_equal(exported.run(["y"], {"x": row[None]})[0], got["y"])
    assert len(steps) > 1  # images loop different numbers of times


def test_data_dependent_loop_builds_to_a_package_run_on_the_cpu(tmp_path):
    from test_partition import assert_package_matches_reference, build_statuses

    onnx.save(while_model(), tmp_path / "m.onnx")
    write_npz(tmp_path / "calib.npz", {"x": ROWS[:24, None]})
    write_npz(tmp_path / "eval.npz", {"x": ROWS[24:, None]})
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[import]\nsource = "m.onnx"\n[optimize]\n[quantize]\ndtype = "uint8"\n'
        'calibration = "calib.npz"\n[partition]\n[codegen]\nhw = "trix-m"\n'
        '[pack]\noutput = "out/m.nnpkg"\n'
    )
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    assert [p["backend"] for p in report["parts"]] == ["cpu"]
    fallback = next(f for f in report["fallbacks"] if f["op"] == "Loop")
    assert fallback["reasons"] == ["control flow runs on the CPU"]
