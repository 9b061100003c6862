"""Cascading: consecutive layers run together in row stripes, so the tensors between them live
only in SRAM stripes and never go to DRAM (Vela's cascading).

Each stripe loads the first layer's input rows, computes each layer's rows that the next
layer's stripe reads (rows shared by two stripes are computed twice: the windows' overlap),
then the last layer's stripe, and stores it. Plain LOAD/EXEC/STORE instructions: nothing new
for the simulator, only their order and SRAM addresses.
"""

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .fusion import fuse_pools, fused_parts, silent
from .hardware import Hardware
from .lower import WINDOWED, Layer, Program, tile_input_rows
from .opcodes import EXEC, PIPELINE_TILES, align
from .perf import exec_cycles

if TYPE_CHECKING:
    from .codegen import Emitter


def find_cascades(program: Program, keeps: Callable[[str], bool]) -> dict[int, int]:
    """first -> last layer of the longest runs of layers that can cascade: each layer after
    the first directly follows the one before and is the only reader of its output, which is
    not a model output; no epilogues. The first layer's input must not be kept in SRAM
    (`keeps`); intermediates may be (`plan` prices what cascading them saves), and the last
    layer's output leaves the SRAM if the run is cascaded."""
    readers: dict[str, int] = {}
    for layer in program.layers:
        for name in layer.inputs:
            readers[name] = readers.get(name, 0) + 1

    def joins(index: int) -> bool:  # layer index + 1 can follow layer index in stripes
        first, second = program.layers[index], program.layers[index + 1]
        return (
            second.kind in WINDOWED
            and "epilogue" not in second.attrs
            and second.inputs == [first.output]
            and readers.get(first.output) == 1
            and first.output not in program.outputs
        )

    runs, index = {}, 0
    while index < len(program.layers) - 1:
        first = program.layers[index]
        last = index
        if first.kind in WINDOWED and "epilogue" not in first.attrs and not keeps(first.inputs[0]):
            while last + 1 < len(program.layers) and joins(last):
                last += 1
        if last > index:
            runs[index] = last
        index = last + 1
    return runs


def _weights(layer: Layer) -> int:
    weights = layer.arrays.get("weights")
    return 0 if weights is None else align(weights.nbytes)


def weight_bytes(layers: list[Layer]) -> list[int]:
    """SRAM bytes of each layer's weights (all stay loaded through the cascade)."""
    return [_weights(layer) for layer in layers]


def stripes(program: Program, layers: list[Layer], rows: int) -> list[list[tuple[int, int]]]:
    """Per stripe of `rows` output rows of the last layer: the row range of the first layer's
    input, then of each layer's output."""
    result = []
    out_h = program.tensors[layers[-1].output].shape[1]
    for r0 in range(0, out_h, rows):
        ranges = [(r0, min(out_h, r0 + rows))]
        for layer in reversed(layers):
            height = program.tensors[layer.inputs[0]].shape[1]
            out = program.tensors[layer.output].shape[1]
            ranges.insert(0, tile_input_rows(layer, *ranges[0], height, out))
        result.append(ranges)
    return result


def stripe_bytes(program: Program, layers: list[Layer], ranges: list[tuple[int, int]]) -> list[int]:
    """SRAM bytes of a stripe's rows of the first input and of every layer's output."""
    sizes = []
    for name, (lo, hi) in zip([layers[0].inputs[0], *(x.output for x in layers)], ranges):
        t = program.tensors[name]
        sizes.append(align(t.shape[0] * (hi - lo) * t.shape[2] * np.dtype(t.dtype).itemsize))
    return sizes


def _estimate(program: Program, hw: Hardware, parts: list[tuple[Layer, int, int]]) -> int:
    """Cycles of (layer, output rows, DRAM bytes) parts: the larger of compute and DMA."""
    compute = dma = 0
    for layer, rows, moved in parts:
        out, x = (program.tensors[n].shape for n in (layer.output, layer.inputs[0]))
        compute += exec_cycles(hw, layer, rows, out[0], out, x) if rows else 0
        dma += math.ceil(moved / hw.dram_bytes_per_cycle)
    return max(compute, dma)


def plan(
    program: Program,
    hw: Hardware,
    layers: list[Layer],
    avail: int,
    buffers: int,
    keeps: Callable[[str], bool],
) -> tuple[int, int] | None:
    """(last layer's output rows per stripe, bytes per stripe slot), or None when no stripe
    fits or the perf model expects the recomputed overlap rows to cost more than the DRAM round
    trips save (tensors kept in SRAM, `keeps`, cost none apart, and leave the SRAM together).
    At least PIPELINE_TILES stripes where the height allows (DMA overlaps compute)."""
    fixed = sum(weight_bytes(layers))
    rows = max(1, -(-program.tensors[layers[-1].output].shape[1] // PIPELINE_TILES))
    while True:
        cut = stripes(program, layers, rows)
        slot = max(sum(stripe_bytes(program, layers, ranges)) for ranges in cut)
        if fixed + buffers * slot <= avail:
            break
        if rows == 1:
            return None
        rows = (rows + 1) // 2
    apart, t = 0, program.tensors
    for layer in layers:
        moved = _weights(layer) + sum(
            t[n].nbytes for n in (layer.inputs[0], layer.output) if not keeps(n)
        )
        apart += _estimate(program, hw, [(layer, t[layer.output].shape[1], moved)])
    together = []
    for ranges in cut:
        sizes = stripe_bytes(program, layers, ranges)
        together += [(layer, hi - lo, 0) for layer, (lo, hi) in zip(layers, ranges[1:])]
        together.append((layers[0], 0, sizes[0] + sizes[-1]))
    # the weights, once; a kept output's readers will read it from DRAM
    together.append((layers[0], 0, fixed + keeps(layers[-1].output) * t[layers[-1].output].nbytes))
    if _estimate(program, hw, together) >= apart:
        return None
    return rows, slot


def plan_cascades(em: "Emitter", budget: int) -> None:
    """Runs of layers cascaded where they fit and the perf model expects them to be faster
    (else the longest faster prefix); their tensors then leave the SRAM-resident ones (`budget`
    bytes, if any), which are planned again without them. A max pool in a cascade runs in the
    output stage of the convolution before it (fusion.fuse_pools)."""

    def keeps(name: str) -> bool:
        return name in em.resident

    for first, last in find_cascades(em.p, keeps).items():
        for end in range(last, first, -1):
            avail = em.hw.sram_bytes - max(em.pool[first : end + 1])
            layers = em.p.layers[first : end + 1]
            planned = plan(em.p, em.hw, layers, avail, em.buffers, keeps)
            if planned is not None:
                em.cascades[first] = (end, *planned)
                break
    if budget and em.cascades:
        striped = {
            id(em.p.layers[i]) for f, (e, *_) in em.cascades.items() for i in range(f, e + 1)
        }
        em.keep_resident(budget, frozenset(striped))
        for first, (end, _, slot) in list(em.cascades.items()):  # the rest may be placed anew
            avail = em.hw.sram_bytes - max(em.pool[first : end + 1])
            if sum(weight_bytes(em.p.layers[first : end + 1])) + em.buffers * slot > avail:
                del em.cascades[first]
    for first, (end, _, _) in em.cascades.items():
        fuse_pools(em.p, first, end)
    em.fused, em.silent = fused_parts(em.p), silent(em.p)


def emit_cascade(em: "Emitter", index: int) -> None:
    """The cascade starting at layer `index` in row stripes: each stripe loads the first
    layer's input rows, computes every layer's rows the next one reads (in SRAM only), and
    stores the last layer's stripe. Every layer's weights load once, at the first stripe. A
    convolution with a fused max pool has one EXEC per stripe, over the pool's rows."""
    end, rows, slot = em.cascades[index]
    layers = em.p.layers[index : end + 1]
    weights = weight_bytes(layers)
    fixed = sum(weights)
    em.use(index, fixed + em.buffers * slot)
    at = [sum(weights[:j]) for j in range(len(layers))]
    channels = [em.p.tensors[x.output].shape[0] for x in layers]
    for number, ranges in enumerate(stripes(em.p, layers, rows)):
        em.tile()
        for j, layer in enumerate(layers if number == 0 else ()):  # weights stay for all stripes
            per_channel, _, _ = em.constants(layer)
            if per_channel:
                em.load_weights(index + j, 0, channels[j], per_channel, at[j])
        sizes = stripe_bytes(em.p, layers, ranges)
        buffers = [fixed + number % em.buffers * slot]
        for size in sizes[:-1]:
            buffers.append(buffers[-1] + size)
        x = em.p.tensors[layers[0].inputs[0]]
        em.load_rows(index, layers[0].inputs[0], *ranges[0], 0, x.shape[0], buffers[0])
        for j, (lo, hi) in enumerate(ranges[1:]):
            if j and layers[j - 1].attrs.get("epilogue") == index + j:
                continue  # a max pool in the output stage of the convolution before it
            if layers[j].attrs.get("epilogue") == index + j + 1:  # its rows are the pool's
                lo, hi = ranges[j + 2]
                args = (lo, hi - lo, 0, channels[j], buffers[j], 0, at[j], buffers[j + 2])
            else:
                args = (lo, hi - lo, 0, channels[j], buffers[j], 0, at[j], buffers[j + 1])
            em.emit(EXEC, index + j, *args)
        em.store_rows(end, layers[-1].output, *ranges[-1], 0, channels[-1], buffers[-1])
