"""The TRIX performance model: cycles of each instruction from the hardware preset and the op
description it executes, and the roofline lower bound of a whole program.

MAC-array ops map the reduction (input channels x kernel taps) onto `mac_rows` and output
channels onto `mac_cols`, one output pixel per cycle; depthwise convolutions use the vector unit
when that is faster; a fused epilogue (an add or requantization of each output code,
`fusion.py`) runs in the output stage at `vector_lanes` codes per cycle, overlapped. Pooling,
elementwise, lookup and requantization run on `vector_lanes` elements per cycle (an average
pool reads each window's kh kw codes; a max pool takes `vector_lanes` two-operand maxima per
cycle, separably where that is fewer: `pool_ops`). A DMA costs its latency plus bytes /
bandwidth.
"""

import math

from .fusion import epilogue_operand, fuse_epilogues, fused_parts, silent
from .gemm_tiles import gemm_tiles, layer_node
from .hardware import Hardware
from .lower import Layer, Program


def dma_cycles(hw: Hardware, nbytes: int) -> int:
    return hw.dma_latency_cycles + math.ceil(nbytes / hw.dram_bytes_per_cycle)


def exec_cycles(hw: Hardware, layer: Layer, rows: int, chs: int, out_shape, in_shape) -> int:
    """Cycles of one EXEC: `rows` output rows of `chs` output channels."""
    _, _, ow = out_shape
    pixels = rows * ow
    if layer.kind == "conv":
        cycles = _conv_cycles(hw, layer, pixels, chs)
        if "epilogue" in layer.attrs:  # the output stage's add or requantize, overlapped
            cycles = max(cycles, math.ceil(chs * pixels / hw.vector_lanes))
        return cycles
    if layer.kind == "gemm":  # one input row per cycle through the array, as a pixel
        k = layer.arrays["weights"].shape[1]
        return rows * math.ceil(k / hw.mac_rows) * math.ceil(chs / hw.mac_cols)
    if layer.kind == "maxpool":
        return max(1, math.ceil(chs * pool_ops(layer, rows, ow, in_shape[1]) / hw.vector_lanes))
    window = 1
    if layer.kind == "avgpool":
        window = layer.attrs["kernel"][0] * layer.attrs["kernel"][1]
    elif layer.kind == "softmax":
        window = 4  # maximum, exponentials, sum, scaling: four passes over the tile
    return max(1, math.ceil(chs * pixels * window / hw.vector_lanes))


def _conv_cycles(hw: Hardware, layer: Layer, pixels: int, chs: int) -> int:
    """A convolution's `pixels` outputs of `chs` channels on the MAC array (a depthwise one on
    the vector unit when that is faster)."""
    weights = layer.arrays["weights"]
    per_group_out = weights.shape[0] // layer.attrs["group"]
    reduction = int(weights.shape[1] * weights.shape[2] * weights.shape[3])
    groups = math.ceil(chs / per_group_out)
    array = groups * math.ceil(reduction / hw.mac_rows) * pixels
    array *= math.ceil(min(chs, per_group_out) / hw.mac_cols)
    vector = math.ceil(chs * pixels * reduction / hw.vector_lanes)
    return max(1, min(array, vector) if per_group_out == 1 else array)


def conv_pool_cycles(
    hw: Hardware, conv: Layer, pool: Layer, rows: int, chs: int, conv_rows: int, shapes
) -> int:
    """Cycles of an EXEC of a convolution with a max pool in its output stage (fusion.py):
    `rows` pool output rows from `conv_rows` convolution rows of `chs` channels (`shapes`: the
    convolution's and the pool's output); the larger of the MAC array's work and the pool's
    maxima on the vector unit, which overlap."""
    (_, height, width), (_, _, ow) = shapes
    vector = math.ceil(chs * pool_ops(pool, rows, ow, height) / hw.vector_lanes)
    return max(_conv_cycles(hw, conv, conv_rows * width, chs), vector)


def pool_ops(layer: Layer, rows: int, ow: int, height: int) -> int:
    """Vector results (two-operand maxima, at least one per output) of `rows` output rows of
    a max pool per channel, in the cheaper of two orders: each window alone (kh kw - 1 maxima
    per output), or separably: kw - 1 per output column of every
    padded input row the tile spans, then kh - 1 per output (a row's maxima shared by the
    windows that overlap on it)."""
    a = layer.attrs
    (kh, kw), (sh, _), (dh, _) = a["kernel"], a["strides"], a["dilations"]
    span = min((rows - 1) * sh + (kh - 1) * dh + 1, height + a["pads"][0] + a["pads"][2])
    outputs = rows * ow
    direct = outputs * (kh * kw - 1)
    separable = span * ow * (kw - 1) + outputs * (kh - 1)
    return max(outputs, min(direct, separable))


def streamed_bytes(layer: Layer) -> int:
    """Constant bytes a layer DMAs into SRAM (weights, lookup tables)."""
    return sum(a.nbytes for k, a in layer.arrays.items() if k in ("weights", "table"))


def gemm_estimate(hw: Hardware, layer: Layer, tensors) -> tuple[int, int]:
    """Cycles and DRAM bytes of a gemm as `gemm_tiles` plans it: its input once, its output
    columns once, its weights once per row tile. Over rows in one tile (nothing to overlap)
    the loads, the compute and the store follow each other; else the larger of compute and
    DMA."""
    plan = gemm_tiles(hw, layer, tensors, hw.sram_bytes, 2)
    x, out = tensors[layer.inputs[0]], tensors[layer.output]
    compute = exec_cycles(hw, layer, plan.m, plan.n, out.shape, x.shape)
    loaded = x.nbytes + plan.row_tiles * streamed_bytes(layer)
    stored = out.nbytes * plan.n // out.dims[-1]
    if plan.m > 1 and plan.row_tiles * math.ceil(plan.n / plan.chunk) == 1:
        return dma_cycles(hw, loaded) + compute + dma_cycles(hw, stored), loaded + stored
    return max(compute, dma_cycles(hw, loaded + stored)), loaded + stored


def roofline(program: Program, hw: Hardware) -> dict[str, float]:
    """max(MACs / peak MACs per cycle, compulsory DRAM bytes / bandwidth): every streamed
    constant and the model's inputs and outputs moved once."""
    macs = sum(layer.macs(program.tensors) for layer in program.layers)
    io = sum(program.tensors[n].nbytes for n in [*program.inputs, *program.outputs])
    compute = macs / hw.macs_per_cycle
    weights = sum(streamed_bytes(layer) for layer in program.layers)
    memory = (weights + io) / hw.dram_bytes_per_cycle
    return {"macs": macs, "cycles": max(compute, memory), "compute": compute, "memory": memory}


def estimate(program: Program, hw: Hardware) -> dict:
    """Analytical cycles without compiling: per layer, the larger of compute (whole layer on
    the MAC array or vector unit) and DMA (weights once, inputs and output once). Adds and
    Concat parts fused into their convolution (fusion.py) cost what the code generator makes
    of them: the convolution's output stage and the Add's other operand, no layer of their
    own, and a fused intermediate never moves. Layers are reported by the IR node they come
    from (`gemm_tiles.layer_node`)."""
    program = fuse_epilogues(program)
    quiet, parts = silent(program), fused_parts(program)
    total, layers = 0, {}
    for index, layer in enumerate(program.layers):
        if layer.kind == "reshape" or index in quiet:
            continue
        out = program.tensors[layer.output]
        x = program.tensors[layer.inputs[0]]
        compute = exec_cycles(hw, layer, out.shape[1], out.shape[0], out.shape, x.shape)
        if layer.kind == "concat":  # the parts not fused: read, then written into place
            moved = 2 * sum(program.tensors[n].nbytes for n in layer.inputs if n not in parts)
        else:
            moved = out.nbytes + sum(program.tensors[n].nbytes for n in layer.inputs)
            operand = epilogue_operand(program, layer)
            moved += program.tensors[operand].nbytes if operand else 0
        moved += streamed_bytes(layer)
        cycles = max(compute, dma_cycles(hw, moved))
        if layer.kind == "gemm":
            cycles, moved = gemm_estimate(hw, layer, program.tensors)
        entry = layers.setdefault(layer_node(layer), {"kind": layer.kind, "cycles": 0})
        entry["cycles"] += cycles  # a gemm's channel parts add up under its node's name
        entry["dram_bytes"] = entry.get("dram_bytes", 0) + moved
        total += cycles
    bound = roofline(program, hw)
    return {
        "hardware": hw.name,
        "cycles": total,
        "microseconds": total / hw.clock_mhz,
        "roofline_cycles": round(bound["cycles"]),
        "macs": bound["macs"],
        "layers": layers,
    }
