"""Whole models on the NPU (issue 19, acceptance 1): a MobileNetV3-style network (hard-swish,
depthwise convolutions, squeeze-excitation with a computed per-channel gate, a residual Add,
a Softmax classifier) builds through a recipe into at most 3 NPU parts with >= 95 % of its MACs
on the NPU (measured: one part, every MAC), and the package is bit-exact with the quantized
model on real photos. The weights are seeded He-initialized, not trained: what is measured here
is what runs where and bit-exactness, which do not depend on training."""

from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx_builders import make_model
from sklearn.datasets import load_sample_images
from test_partition import assert_package_matches_reference, build_statuses, write_project

from onebuild.graph_ir.serde import load_ir
from onebuild.npz import read_npz, write_npz

TORCH_MODELS = Path(__file__).parent / "data" / "torch_models"
DIGITS = Path(__file__).parent.parent / "examples" / "digits"


def mobilenet_v3_style(rng):
    inits, nodes = [], []

    def conv(x, cin, cout, k, stride=1, group=1, name=""):
        w = rng.normal(0, np.sqrt(2 / (cin // group * k * k)), (cout, cin // group, k, k))
        inits.extend([(f"{name}_w", w.astype(np.float32)), (f"{name}_b", np.zeros(cout, "f4"))])
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}_w", f"{name}_b"],
                [name],
                name=name,
                group=group,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
            )
        )
        return name

    def act(x, op, name):
        nodes.append(helper.make_node(op, [x], [name], name=name))
        return name

    def squeeze_excite(x, channels, name):
        pooled = act(x, "GlobalAveragePool", f"{name}_pool")
        hidden = act(
            conv(pooled, channels, channels // 4, 1, name=f"{name}_fc1"), "Relu", f"{name}_r"
        )
        gate = act(
            conv(hidden, channels // 4, channels, 1, name=f"{name}_fc2"), "HardSigmoid", f"{name}_g"
        )
        nodes.append(helper.make_node("Mul", [x, gate], [f"{name}_out"], name=f"{name}_mul"))
        return f"{name}_out"

    x = act(conv("image", 3, 16, 3, 2, name="stem"), "HardSwish", "stem_hs")
    # block 1: depthwise stride 2 with squeeze-excitation (ReLU)
    y = act(conv(x, 16, 16, 3, 2, group=16, name="b1_dw"), "Relu", "b1_dw_r")
    y = conv(squeeze_excite(y, 16, "b1_se"), 16, 16, 1, name="b1_pw")
    # block 2: expand, depthwise 5x5 (hard-swish), squeeze-excitation, project, residual
    z = act(conv(y, 16, 48, 1, name="b2_expand"), "HardSwish", "b2_expand_hs")
    z = act(conv(z, 48, 48, 5, group=48, name="b2_dw"), "HardSwish", "b2_dw_hs")
    z = conv(squeeze_excite(z, 48, "b2_se"), 48, 16, 1, name="b2_pw")
    nodes.append(helper.make_node("Add", [y, z], ["b2_out"], name="b2_add"))
    head = act(conv("b2_out", 16, 64, 1, name="head"), "HardSwish", "head_hs")
    pooled = act(head, "GlobalAveragePool", "head_pool")
    logits = conv(pooled, 64, 10, 1, name="classifier")
    nodes.append(helper.make_node("Flatten", [logits], ["flat"], name="flatten", axis=1))
    nodes.append(helper.make_node("Softmax", ["flat"], ["probs"], name="softmax", axis=1))
    return make_model(nodes, [("image", [1, 3, 64, 64])], ["probs"], inits)


def photo_crops(count: int, size: int = 64) -> np.ndarray:
    """Crops of scikit-learn's bundled photos, scaled to [0, 1] and normalized."""
    crops = []
    for picture in load_sample_images().images:
        h, w, _ = picture.shape
        for i in range(count // 2):
            top, left = (37 * i) % (h - size), (91 * i) % (w - size)
            crop = picture[top : top + size, left : left + size].astype(np.float32) / 255
            crops.append(((crop - 0.45) / 0.25).transpose(2, 0, 1)[None])
    return np.stack(crops)


def test_mobilenet_v3_style_runs_on_the_npu(tmp_path, rng):
    recipe = write_project(tmp_path, mobilenet_v3_style(rng), rng)
    photos = photo_crops(12)
    write_npz(tmp_path / "calib.npz", {"image": photos[:8]})
    write_npz(tmp_path / "eval.npz", {"image": photos[8:]})
    build_statuses(recipe)
    report = assert_package_matches_reference(tmp_path)
    npu_parts = [p for p in report["parts"] if p["backend"] == "trix"]
    macs = report["macs"]
    share = macs.get("trix", 0) / sum(macs.values())
    assert 1 <= len(npu_parts) <= 3 and share >= 0.95, (report["parts"], report["fallbacks"])
    assert [p["backend"] for p in report["parts"]] == ["trix"] and not report["fallbacks"]


def test_a_torch_exported_hard_swish_network_runs_on_the_npu(tmp_path, rng):
    """torch.onnx at opset 13 spells nn.Hardswish as x * HardSigmoid(x); O1 fuses it back into
    one HardSwish (one table), and the NPU takes the whole trained network (digits images)."""
    model = onnx.load(TORCH_MODELS / "hardswish_se.onnx")
    assert [n.op_type for n in model.graph.node].count("HardSigmoid") == 3  # 2 spell hard-swish
    recipe = write_project(tmp_path, model, rng)
    images = read_npz(DIGITS / "data" / "calib.npz")["input"]
    write_npz(tmp_path / "calib.npz", {"x": images[:64]})
    write_npz(tmp_path / "eval.npz", {"x": read_npz(DIGITS / "data" / "test.npz")["input"][:16]})
    build_statuses(recipe)
    optimized = [n.op for n in load_ir(tmp_path / "build/r/optimize.obir").main.nodes]
    assert optimized.count("HardSwish") == 2 and optimized.count("HardSigmoid") == 1  # the gate
    report = assert_package_matches_reference(tmp_path)
    macs = report["macs"]
    assert macs.get("trix", 0) / sum(macs.values()) >= 0.95
    assert [p["backend"] for p in report["parts"]] == ["trix"] and not report["fallbacks"]


def test_an_opcode_map_names_the_function_a_lookup_table_holds(tmp_path, rng):
    """After quantization a hard-swish is a QLookup; a .part-style `opcode = {HardSwish = "cpu"}`
    still finds it (the table's `function` attribute), as ONE's partitioner finds HARD_SWISH."""
    model = onnx.load(TORCH_MODELS / "hardswish_se.onnx")
    recipe = write_project(tmp_path, model, rng, 'opcode = { HardSwish = "cpu" }')
    images = read_npz(DIGITS / "data" / "calib.npz")["input"]
    write_npz(tmp_path / "calib.npz", {"x": images[:16]})
    write_npz(tmp_path / "eval.npz", {"x": images[16:20]})
    build_statuses(recipe)
    quantized = load_ir(tmp_path / "build/r/quantize.obir").main
    functions = [n.attrs.get("function") for n in quantized.nodes if n.op == "QLookup"]
    assert functions.count("HardSwish") == 2
    report = assert_package_matches_reference(tmp_path)
    pinned = [f for f in report["fallbacks"] if "opcode/opname maps" in f["reasons"][0]]
    assert [f["op"] for f in pinned] == ["QLookup", "QLookup"], report["fallbacks"]
