"""Partition `opcode` keys: IR op names and circle operator names (ONE's `.part` files) pin the
quantized nodes they name; an unknown key is a one-line error listing the close names."""

from pathlib import Path

import pytest

from onebuild import compile as c
from onebuild.cli import main
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.partition.part_file import read_part_file
from onebuild.graph_ir.serde import load_model
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
        ("CONV_2D", CONVS),
        ("DEPTHWISE_CONV_2D", DEPTHWISE),
        ("Conv", CONVS + DEPTHWISE),
        ("SOFTMAX", ["/Softmax"]),
        ("Softmax", ["/Softmax"]),  # QSoftmax answers to its float op
        ("softmax", ["/Softmax"]),
        ("FULLY_CONNECTED", ["/fc/Gemm"]),
        ("MatMul", ["/fc/Gemm"]),  # a QGemm stands for Gemm and MatMul
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
