"""Every attribute a kernel or type inference reads unconditionally (`attrs["key"]`) is one
its op requires in IR files (`ir_attrs.REQUIRED`), so a file lacking it fails at load with one
line naming the node and the attribute, never inside a kernel."""

import ast
import inspect
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_structural_mutations import _ir_parts, _ir_resealed

from onebuild.cli import main
from onebuild.errors import FormatError
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.serde import load_ir, save_ir
from onebuild.graph_ir.serde.ir_attrs import REQUIRED
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.npz import write_npz


def _reads(fn, param: str, seen: set) -> set[str]:
    """The keys `fn` reads as `param["key"]`, and those of the graph_ir functions it passes
    `param` to (by position or keyword), followed through their own parameters."""
    fn = inspect.unwrap(fn)
    if fn in seen:
        return set()
    seen.add(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return set()
    module, keys = sys.modules[fn.__module__], set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == param
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        callee = getattr(module, node.func.id, None)
        if not (callable(callee) and callee.__module__.startswith("onebuild.graph_ir")):
            continue
        try:
            names = list(inspect.signature(inspect.unwrap(callee)).parameters)
        except (TypeError, ValueError):
            continue
        passed = [names[i] for i, a in enumerate(node.args) if _is(a, param) and i < len(names)]
        passed += [k.arg for k in node.keywords if _is(k.value, param) and k.arg]
        for name in passed:
            keys |= _reads(callee, name, seen)
    return keys


def _is(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _first_parameter(fn) -> str:
    return next(iter(inspect.signature(inspect.unwrap(fn)).parameters))


def test_every_attribute_a_kernel_reads_is_required_in_ir_files():
    unlisted = {}
    for op, definition in sorted(OPS.items()):
        kernel = definition.kernel.__wrapped__
        keys = _reads(kernel, _first_parameter(kernel), set())
        keys |= _reads(definition.infer, _first_parameter(definition.infer), set())
        missing = sorted(keys - set(REQUIRED.get(op, ())))
        if missing:
            unlisted[op] = missing
    assert not unlisted, f"add these to ir_attrs.REQUIRED: {unlisted}"
    assert len(REQUIRED) > 60  # the scan sees the reads it checks (CumSum's, say)
    assert {"axis", "exclusive", "reverse"} <= _reads(
        OPS["CumSum"].kernel.__wrapped__, "attrs", set()
    )


def _model(op: str):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits, outputs = [], [y]
    if op == "TopK":
        inits = [helper.make_tensor("k", TensorProto.INT64, [1], [2])]
        node = helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)
        outputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, None))
    elif op == "CumSum":
        inits = [helper.make_tensor("axis", TensorProto.INT64, [], [0])]
        node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    elif op == "Trilu":
        node = helper.make_node("Trilu", ["x"], ["y"])
    else:
        inits = [helper.make_tensor("i", TensorProto.INT64, [4, 4], [1, 0, 3, 2] * 4)]
        node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    graph = helper.make_graph([node], "g", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "op, attribute",
    [("TopK", "k"), ("CumSum", "exclusive"), ("Trilu", "upper"), ("GatherElements", "axis")],
)
def test_an_ir_file_without_a_required_attribute_is_refused_in_one_line(
    tmp_path, capsys, op, attribute
):
    path = tmp_path / "m.obir"
    save_ir(import_onnx(_model(op)), path)
    load_ir(path)  # as written, it loads
    header, blob = _ir_parts(path.read_bytes())
    node = next(n for n in header["graphs"][0]["nodes"] if n["op"] == op)
    del node["attrs"][attribute]
    path.write_bytes(_ir_resealed(header, blob))
    with pytest.raises(FormatError, match=f"{op} needs attribute\\(s\\) {attribute}"):
        load_ir(path)
    write_npz(tmp_path / "x.npz", {"x": np.ones((1, 4, 4), np.float32)})
    assert (
        main(["run", str(path), "-i", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and attribute in err[0] and node["name"] in err[0], err
