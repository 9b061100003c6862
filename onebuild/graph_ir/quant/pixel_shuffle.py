"""ConvTransposes whose windows do not overlap, as a 1x1 Conv and DepthToSpace, for quantization.

A ConvTranspose with kernel = stride = b (the upsampling head of U-Net and DB text detectors,
exported by torch and Paddle) computes each b x b output window from one input pixel: it is a
1x1 Conv to b * b * O channels whose channels DepthToSpace lays out. In that form the Conv
quantizes as any convolution (a weight scale per output channel and offset) and DepthToSpace
is a move of codes, so the layer runs in integers, on the NPU too, instead of staying a float
island between a DequantizeLinear and a QuantizeLinear. The float function is unchanged: both
forms sum the same products.
"""

import numpy as np

from ..ir import Graph
from ..ops.conv import pixel_shuffle_block, pixel_shuffle_weights
from ..passes.fuse import clip_bounds
from ..passes.rewrite import single_reader

CONV_1X1 = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1}


def split_pixel_shuffles(graph: Graph) -> dict[str, str]:
    """Rewrite every such float ConvTranspose with constant weights in place, with the Relu or
    Clip that alone reads it fused into the Conv. The Conv keeps the layer's node name and
    DepthToSpace the last output name; returns {Conv output name: that name}: the two hold the
    same values, so they share a calibrated range."""
    windows = {}
    for node in [n for n in graph.nodes if n.op == "ConvTranspose"]:
        x, weight = node.inputs[:2]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if x.dtype != np.float32 or len(x.shape) != 4 or not weight.is_const:
            continue
        block = pixel_shuffle_block(node.attrs, weight.shape)
        if block is None or (bias is not None and not bias.is_const):
            continue
        data, offsets = pixel_shuffle_weights(
            weight.numpy(), None if bias is None else bias.numpy()
        )
        operands = [
            x,
            graph.add_constant(data, f"{weight.name}_1x1"),
            graph.add_constant(offsets.astype(np.float32), f"{node.name}_bias_1x1"),
        ]
        attrs, out, replaced = dict(CONV_1X1), node.output, [node]
        activation = single_reader(out)
        bounds = None if activation is None else clip_bounds(activation)
        if bounds is not None:  # elementwise, so it commutes with DepthToSpace: fused
            attrs["clip"] = list(bounds)
            out = activation.output
            replaced.insert(0, activation)
        conv = graph.make_node("Conv", operands, attrs, f"{node.name}/1x1", before=node)
        d2s_attrs = {"blocksize": block, "mode": "DCR"}
        name = f"{node.name}/depth_to_space"
        d2s = graph.make_node("DepthToSpace", [conv.output], d2s_attrs, name, before=node)
        out.replace_all_uses_with(d2s.output)
        for old in replaced:
            graph.remove(old)
        for value in (weight, bias):
            if value is not None and not value.users:
                graph.remove_constant(value)
        graph.rename(d2s.output, out.name)
        graph.rename_node(conv, node.name)
        windows[conv.output.name] = d2s.output.name
    return windows
