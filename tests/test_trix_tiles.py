"""TRIX codegen tile shapes: convolutions whose weights stream through SRAM in chunks keep their
tiles as wide as the MAC array."""

import math

import numpy as np

from onebuild.graph_ir.passes import run_preset
from onebuild.graph_ir.passes.cleanup import eliminate_dead_code
from onebuild.graph_ir.quant.calibrate import calibrate
from onebuild.graph_ir.quant.config import QuantConfig
from onebuild.graph_ir.quant.quantize_graph import quantize_graph
from onebuild.graph_ir.serde.model_zoo import light_model
from onebuild.graph_ir.serde.onnx_import import import_onnx
from onebuild.targets.trix_sim.codegen import EXEC, generate
from onebuild.targets.trix_sim.hardware import load_hardware
from onebuild.targets.trix_sim.lower import lower
from onebuild.targets.trix_sim.perf import exec_cycles


def test_resnet50_convolutions_keep_the_array_busy_on_trix_u65():
    """On `trix-u65` (512 KiB SRAM) the last stage's 1x1 convolutions from 2048 to 512 channels
    read an SRAM-resident input while their 1 MiB of weights stream in chunks; their tiles were
    one channel wide (16x the array cycles their MACs need). Every convolution's tiles now
    cost less than twice its ideal array cycles."""
    model = import_onnx(light_model("resnet50", seed=1, expose_logits=True))
    run_preset(model)
    graph = model.main
    x = graph.inputs[0]
    samples = np.random.default_rng(0).random((1, *x.shape), dtype=np.float32)
    config = QuantConfig("uint8", input_type="uint8", output_type="uint8")
    quantized = quantize_graph(graph, calibrate(graph, {x.name: samples}).ranges, config)
    quantized.outputs = quantized.outputs[-1:]
    eliminate_dead_code(quantized)
    hw = load_hardware("trix-u65")
    module = generate(lower(quantized, hw), hw, "performance")
    spent: dict[int, int] = {}
    for op, index, _, rows, _, chs, *_ in module.code.tolist():
        layer = module.layers[index]
        if op == EXEC and layer.kind == "conv":
            shapes = module.tensors[layer.output].shape, module.tensors[layer.inputs[0]].shape
            spent[index] = spent.get(index, 0) + exec_cycles(hw, layer, rows, chs, *shapes)
    assert len(spent) == 53  # every convolution of ResNet50
    for index, cycles in spent.items():
        layer = module.layers[index]
        weights, (m, oh, ow) = layer.arrays["weights"], module.tensors[layer.output].shape
        reduction = math.ceil(int(np.prod(weights.shape[1:])) / hw.mac_rows)
        ideal = reduction * oh * ow * math.ceil(m / hw.mac_cols)
        assert cycles < 2 * ideal, layer.name
