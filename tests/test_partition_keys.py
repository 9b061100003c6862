"""Partition `opcode` keys: IR op names and circle operator names (ONE's `.part` files) pin the
quantized nodes they name; an unknown key is a one-line error listing the close names."""

from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from onnx_builders import make_model

from onebuild import compile as c
from onebuild.cli import main
from onebuild.errors import FormatError, UserError
from onebuild.graph_ir.ir import Graph, Model
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.partition.op_keys import float_ops, matches
from onebuild.graph_ir.partition.part_file import read_part_file
from onebuild.graph_ir.serde import load_ir, load_model, read_circle, save_ir, write_circle
from onebuild.graph_ir.serde.circle_names import circle_code
from onebuild.graph_ir.serde.flatbuf import Buffer
from onebuild.graph_ir.serde.tflite_schema import BUILTIN_NAMES
from onebuild.npz import read_npz

MODELS = Path(__file__).parent.parent / "examples" / "models"
PINNED = "placed on cpu by the partition opcode/opname maps"

# tiny_mobilenet's quantized nodes, by name (the quantizer keeps the float nodes' names)
CONVS = ["/stem/Conv", "/b1/pw/Conv", "/b1/pj/Conv", "/b2/pw/Conv", "/b2/pj/Conv"]
CONVS += ["/up/ConvTranspose"]  # k = s ConvTranspose: a 1x1 QConv + DepthToSpace, a CONV_2D
DEPTHWISE = ["/b1/dw/Conv", "/b2/dw/Conv"]
HARD_SWISH = ["/b1/Mul_output_0", "/b2/Mul_output_0"]  # QLookup tables holding HardSwish


@pytest.fixture(scope="module")
def quantized():
    model = c.optimize(load_model(MODELS / "tiny_mobilenet.onnx"))
    x = read_npz(MODELS / "tiny_mobilenet_calib.npz")["x"]
    stats = c.calibrate(model.main, [(f"b{i}", {"x": x[i : i + 4]}) for i in (0, 4)])
    return c.quantize(model, c.QuantizeOptions(), stats).main


def pinned_to_cpu(graph, opcode=None, maps=None) -> list[str]:
    options = c.PartitionOptions(opcode=opcode or {})
    report = c.partition(graph, "m", options, maps=maps).report
    return sorted(f["node"] for f in report["fallbacks"] if PINNED in f["reasons"])


@pytest.mark.parametrize(
    ("key", "nodes"),
    [
        ("CONV_2D", [*CONVS, "/fc/Gemm"]),
        ("DEPTHWISE_CONV_2D", DEPTHWISE),
        ("Conv", CONVS + DEPTHWISE),
        ("SOFTMAX", ["/Softmax"]),
        ("Softmax", ["/Softmax"]),  # QSoftmax answers to its float op
        ("softmax", ["/Softmax"]),
        # uint8 with per-channel weights: the writer's 1x1 CONV_2D (onert's uint8
        # FULLY_CONNECTED takes one weight scale)
        ("FULLY_CONNECTED", []),
        ("Gemm", ["/fc/Gemm"]),
        ("MatMul", []),  # the QGemm replaced a Gemm
        ("HARD_SWISH", HARD_SWISH),
        ("HardSwish", HARD_SWISH),
        ("ADD", ["/b1/Add", "/b2/Add"]),
        ("GlobalAveragePool", ["/GlobalAveragePool"]),
        ("MEAN", ["/GlobalAveragePool"]),
        ("RESIZE_NEAREST_NEIGHBOR", []),  # the model's Resize is linear
        ("RESIZE_BILINEAR", ["/Resize"]),
    ],
)
def test_ir_and_circle_names_pin_the_quantized_nodes(quantized, key, nodes):
    assert pinned_to_cpu(quantized, {key: "cpu"}) == sorted(nodes)


def test_part_file_opcodes_are_circle_names(quantized, tmp_path):
    part = tmp_path / "m.part"
    part.write_text("[partition]\nbackends=trix,cpu\ndefault=cpu\n[OPCODE]\nSOFTMAX=cpu\n")
    assert pinned_to_cpu(quantized, maps=read_part_file(part)) == ["/Softmax"]
    part.write_text("[OPCODE]\nDEPTHWISE_CONV2D=cpu\n")
    with pytest.raises(Exception) as caught:
        read_part_file(part)
    assert str(caught.value) == (
        f"{part}: [OPCODE]: unknown op 'DEPTHWISE_CONV2D' (an IR op such as Conv or Softmax, or "
        "a circle operator such as CONV_2D or SOFTMAX; close: DEPTHWISE_CONV_2D)"
    )


def test_unknown_opcode_key_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "r.toml").write_text(
        'extends = "npu-uint8"\n[import]\nsource = "m.onnx"\n[quantize]\ncalibration = "c.npz"\n'
        '[partition]\nopcode = { CONV_2D = "cpu", Softmx = "cpu" }\n'
    )
    assert main(["list", str(tmp_path / "r.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "partition.opcode: unknown op 'Softmx'" in err and "close: Softmax, QSoftmax" in err


def test_every_integer_rule_names_the_float_ops_it_replaces():
    """A float op whose quantization rule makes a new op must be named by that op's
    `quantizes` (else a partition map naming it misses its quantized form)."""
    named = {op for d in OPS.values() for op in d.quantizes}
    kept = ("lookup", "passthrough", "pad", "resize")  # same op, or a table naming its function
    replaced = {name for name, d in OPS.items() if d.quant and d.quant not in kept}
    assert replaced <= named, sorted(replaced - named)


def test_key_order_does_not_decide(quantized):
    """The more specific key wins in either order (a circle name with a condition over an IR
    name); equally specific keys that disagree on a node are refused in one line."""
    depthwise_cpu = [{"DEPTHWISE_CONV_2D": "cpu", "Conv": "trix"}]
    depthwise_cpu.append(dict(reversed(depthwise_cpu[0].items())))
    for opcode in depthwise_cpu:
        assert pinned_to_cpu(quantized, opcode) == sorted(DEPTHWISE)
    for opcode in ({"Conv": "cpu", "CONV_2D": "trix"}, {"CONV_2D": "trix", "Conv": "cpu"}):
        assert pinned_to_cpu(quantized, opcode) == sorted(DEPTHWISE)
    with pytest.raises(UserError) as caught:
        pinned_to_cpu(quantized, {"QConv": "trix", "Conv": "cpu"})
    assert "\n" not in str(caught.value)
    message = "keys Conv=cpu and QConv=trix name node '/stem/Conv' (QConv) with different"
    assert message in str(caught.value)
    assert pinned_to_cpu(quantized, {"QConv": "cpu", "Conv": "cpu"}) == sorted(CONVS + DEPTHWISE)


# Add, Sub, windowed and global average pools, Gemm, MatMul by constant weights (quantized) and
# a MatMul of two activations (stays float: BATCH_MATMUL)
def _mixed_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    make = helper.make_node
    nodes = [
        make("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        make("Add", ["c", "x"], ["a"], name="add"),
        make("Sub", ["a", "c"], ["s"], name="sub"),
        make("AveragePool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="avgpool"),
        make("GlobalAveragePool", ["p"], ["g"], name="gap"),
        make("Flatten", ["g"], ["f"], name="flat"),
        make("Gemm", ["f", "fw", "fb"], ["y1"], transB=1, name="gemm"),
        make("MatMul", ["y1", "mw"], ["y"], name="matmul"),
        make("Transpose", ["y1"], ["t"], perm=[1, 0], name="transpose"),
        make("MatMul", ["t", "y1"], ["z"], name="bmm"),
    ]
    weights = {"w": (4, 4, 3, 3), "fw": (6, 4), "mw": (6, 3)}
    inits = [(k, rng.normal(0, 0.5, shape).astype(np.float32)) for k, shape in weights.items()]
    inits += [("b", np.zeros(4, np.float32)), ("fb", np.zeros(6, np.float32))]
    onnx_model = make_model(nodes, [("x", [1, 4, 8, 8])], ["y", "z"], inits)
    path.write_bytes(onnx_model.SerializeToString())
    return path


def _written_codes(graph, data: bytes) -> dict[str, set[str]]:
    """Node name -> the circle operators written for it (each operator's output tensors are
    attributed to the node whose output name is their longest prefix)."""
    root = Buffer(data, "model").root(None)
    codes = [max(t.scalar(0, "b"), t.scalar(3, "i")) for t in root.tables(1, "operator codes")]
    sub = root.tables(2, "subgraphs")[0]
    names = [t.string(3, "tensor name") for t in sub.tables(0, "tensors")]
    owner = {out.name: node.name for node in graph.nodes for out in node.outputs}
    written: dict[str, set[str]] = {node.name: set() for node in graph.nodes}
    for op in sub.tables(3, "operators"):
        for index in op.array(2, "int32", "outputs"):
            name = names[index]
            heads = [o for o in owner if name == o or name.startswith(o + "_")]
            written[owner[max(heads, key=len)]].add(BUILTIN_NAMES[codes[op.scalar(0, "I")]])
    return written


@pytest.mark.parametrize(("dtype", "granularity"), [("uint8", "channel"), ("int8", "layer")])
def test_circle_names_pin_what_the_writer_writes(tmp_path, dtype, granularity):
    """ADD, SUB, MEAN, AVERAGE_POOL_2D, FULLY_CONNECTED, BATCH_MATMUL, CONV_2D name exactly the
    nodes the circle writer writes as those operators; IR names the float op each replaced,
    recorded on the node (kept through the IR file) or, read back from circle, from attributes."""
    model = c.optimize(load_model(_mixed_model(tmp_path / "m.onnx")))
    x = np.random.default_rng(1).standard_normal((6, 1, 4, 8, 8)).astype(np.float32)
    stats = c.calibrate(model.main, [(f"b{i}", {"x": x[i : i + 2]}) for i in (0, 2, 4)])
    options = c.QuantizeOptions(dtype=dtype, granularity=granularity)
    quantized = c.quantize(model, options, stats)
    save_ir(quantized, tmp_path / "q.obir")
    graph = load_ir(tmp_path / "q.obir").main
    written = _written_codes(graph, write_circle(quantized))
    for code in ("ADD", "SUB", "MEAN", "AVERAGE_POOL_2D", "FULLY_CONNECTED", "BATCH_MATMUL"):
        named = {n.name for n in graph.nodes if matches(code, n, float_ops(n))}
        assert named == {name for name, codes in written.items() if code in codes}, code
    named = {n.name for n in graph.nodes if matches("CONV_2D", n, float_ops(n))}
    assert named == {"conv", *(["gemm", "matmul"] if dtype == "uint8" else [])}
    assert written["bmm"] == {"BATCH_MATMUL"} and written["gap"] >= {"MEAN"}
    ir_names = {"Add": {"add"}, "Sub": {"sub"}, "AveragePool": {"avgpool"}, "ReduceMean": set()}
    ir_names |= {"GlobalAveragePool": {"gap"}, "Gemm": {"gemm"}, "MatMul": {"matmul", "bmm"}}
    for key, nodes in ir_names.items():
        assert {n.name for n in graph.nodes if matches(key, n, float_ops(n))} == nodes, key
    sub = next(n for n in quantized.main.nodes if n.name == "sub")
    sub.attrs["float_op"] = "Conv"  # not one QAdd stands for: the IR file is refused
    save_ir(quantized, tmp_path / "bad.obir")
    with pytest.raises(FormatError, match=r"float_op: QAdd stands for \('Add', 'Sub'\)"):
        load_ir(tmp_path / "bad.obir")
    sub.attrs["float_op"] = "Sub"
    back = read_circle(write_circle(quantized)).main  # no float_op: from attributes
    for key, outputs in (("Add", {"a_q"}), ("Sub", {"s_q"}), ("AveragePool", {"p_q"})):
        assert {n.output.name for n in back.nodes if matches(key, n, float_ops(n))} == outputs


def _choices_graph() -> Graph:
    """Clips, Pads and Splits that the writer writes as different operators."""
    graph = Graph()
    x = graph.add_input("x", np.dtype("float32"), (1, 4, 6, 6))
    bound = lambda v, name: graph.add_constant(np.asarray(v, np.float32), name)  # noqa: E731
    for lo, hi, name in [(-1, 1, "clip_n1_1"), (0, 3, "clip_0_3"), (0, 6, "clip_0_6")]:
        graph.make_node("Clip", [x, bound(lo, f"{name}_lo"), bound(hi, f"{name}_hi")], {}, name)
    graph.make_node("Clip", [x, bound(0, "relu_lo")], {}, "clip_0_inf")
    pads = {"pad_zero": ([0, 0, 1, 1, 0, 0, 1, 1], "constant", 0.0)}
    pads["pad_one"] = ([0, 0, 1, 1, 0, 0, 1, 1], "constant", 1.0)
    pads["pad_reflect"] = ([0, 0, 1, 2, 0, 0, 2, 1], "reflect", 0.0)
    pads["pad_crop"] = ([0, 0, -1, 0, 0, 0, 0, -1], "constant", 0.0)
    for name, (amounts, mode, value) in pads.items():
        graph.make_node("Pad", [x], {"pads": amounts, "mode": mode, "value": value}, name)
    graph.make_node("Split", [x], {"axis": 1, "split": [2, 2]}, "split_equal", ["e0", "e1"])
    graph.make_node("Split", [x], {"axis": 1, "split": [1, 3]}, "split_sizes", ["s0", "s1"])
    graph.outputs = [v for node in graph.nodes for v in node.outputs]
    return graph


def test_circle_names_pick_the_operator_the_writer_chose():
    """RELU6 names Clip(0, 6) alone, MIRROR_PAD a reflecting Pad, SPLIT_V an unequal Split, ...:
    each key names exactly the nodes written with that operator (Clip(0, 3) is a MAXIMUM and a
    MINIMUM; a crop is a SLICE)."""
    graph = _choices_graph()
    written = _written_codes(graph, write_circle(Model([graph])))
    assert written["clip_0_3"] == {"MAXIMUM", "MINIMUM"} and written["pad_crop"] == {"SLICE"}
    codes = ["RELU", "RELU6", "RELU_N1_TO_1", "PAD", "PADV2", "MIRROR_PAD", "SPLIT", "SPLIT_V"]
    for code in codes:
        named = {n.name for n in graph.nodes if matches(code, n, float_ops(n))}
        assert named == {name for name, ops in written.items() if code in ops}, code
    for node in graph.nodes:  # the operator a key names is one the writer wrote
        assert circle_code(node) in written[node.name], node.name
    assert {n.name for n in graph.nodes if matches("Clip", n, float_ops(n))} == {
        "clip_n1_1",
        "clip_0_3",
        "clip_0_6",
        "clip_0_inf",
    }
