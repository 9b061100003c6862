"""Cascading: two consecutive layers run together in row stripes, so the intermediate tensor
lives only in SRAM stripes and never goes to DRAM (Vela's cascading).

Each stripe loads the producer's input rows, computes the producer's rows that the consumer's
stripe reads (rows shared by two stripes are computed twice: the window's overlap), computes
the consumer's stripe from them and stores it. Plain LOAD/EXEC/STORE instructions: nothing new
for the simulator, only their order and SRAM addresses.
"""

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .hardware import Hardware
from .lower import Layer, Program, tile_input_rows
from .memory import align
from .opcodes import EXEC, PIPELINE_TILES
from .perf import exec_cycles

if TYPE_CHECKING:
    from .codegen import Emitter


STRIPED = ("conv", "maxpool", "avgpool")  # layers that run on row tiles of every channel


def find_cascades(program: Program, keeps: Callable[[str], bool]) -> dict[int, int]:
    """producer -> consumer pairs to cascade: the consumer directly follows the producer and is
    the only reader of its output, which is not a model output; neither has an epilogue; the
    producer's input and output are not kept in SRAM (`keeps`; the consumer's output may be,
    but leaves the SRAM if the pair is cascaded)."""
    readers: dict[str, int] = {}
    for layer in program.layers:
        for name in layer.inputs:
            readers[name] = readers.get(name, 0) + 1
    pairs, taken = {}, set()
    for index, (first, second) in enumerate(zip(program.layers, program.layers[1:])):
        names = [first.inputs[0], first.output]
        if (
            index not in taken
            and first.kind in STRIPED
            and second.kind in STRIPED
            and second.inputs == [first.output]
            and readers.get(first.output) == 1
            and first.output not in program.outputs
            and not any(map(keeps, names))
            and "epilogue" not in first.attrs
            and "epilogue" not in second.attrs
        ):
            pairs[index] = index + 1
            taken |= {index, index + 1}
    return pairs


def _weights(layer: Layer) -> int:
    weights = layer.arrays.get("weights")
    return 0 if weights is None else align(weights.nbytes)


def stripes(program: Program, first: Layer, second: Layer, rows: int) -> list[tuple]:
    """Per stripe of `rows` consumer output rows: (r0, r1) of the consumer, (p0, p1) of the
    producer it reads, (i0, i1) of the producer's input."""
    _, h, _ = program.tensors[first.inputs[0]].shape
    _, mid_h, _ = program.tensors[first.output].shape
    _, out_h, _ = program.tensors[second.output].shape
    result = []
    for r0 in range(0, out_h, rows):
        r1 = min(out_h, r0 + rows)
        p0, p1 = tile_input_rows(second, r0, r1, mid_h, out_h)
        i0, i1 = tile_input_rows(first, p0, p1, h, mid_h)
        result.append((r0, r1, p0, p1, i0, i1))
    return result


def stripe_bytes(program: Program, first: Layer, second: Layer, stripe: tuple) -> list[int]:
    """SRAM bytes of a stripe's producer input, intermediate rows and consumer output."""
    r0, r1, p0, p1, i0, i1 = stripe
    sizes = []
    for name, count in ((first.inputs[0], i1 - i0), (first.output, p1 - p0)):
        t = program.tensors[name]
        sizes.append(align(t.shape[0] * count * t.shape[2] * np.dtype(t.dtype).itemsize))
    out = program.tensors[second.output]
    sizes.append(align(out.shape[0] * (r1 - r0) * out.shape[2] * np.dtype(out.dtype).itemsize))
    return sizes


def weight_bytes(first: Layer, second: Layer) -> tuple[int, int]:
    """SRAM bytes of each layer's weights (both stay loaded through the cascade)."""
    return _weights(first), _weights(second)


def _estimate(program: Program, hw: Hardware, parts: list[tuple[Layer, int, int]]) -> int:
    """Cycles of the two layers run as `parts` (stripes, or one whole-layer part each when
    not cascaded): the larger of the compute and the DMA."""
    compute = dma = 0
    for layer, rows, moved in parts:
        out, x = (program.tensors[n].shape for n in (layer.output, layer.inputs[0]))
        compute += exec_cycles(hw, layer, rows, out[0], out, x)
        dma += math.ceil(moved / hw.dram_bytes_per_cycle)
    return max(compute, dma)


def plan(program: Program, hw: Hardware, first: Layer, second: Layer, avail: int, buffers: int):
    """(consumer rows per stripe, bytes per stripe slot), or None when no stripe fits or the
    perf model expects the recomputed overlap rows to cost more than the DRAM round trip
    saves. At least PIPELINE_TILES stripes where the height allows, so DMA and compute overlap."""
    fixed = sum(weight_bytes(first, second))
    tensors = program.tensors
    x, mid, out = (tensors[n] for n in (first.inputs[0], first.output, second.output))
    rows = max(1, -(-out.shape[1] // PIPELINE_TILES))
    while True:
        cut = stripes(program, first, second, rows)
        slot = max(sum(stripe_bytes(program, first, second, s)) for s in cut)
        if fixed + buffers * slot <= avail:
            break
        if rows == 1:
            return None
        rows = (rows + 1) // 2
    apart = [
        (first, mid.shape[1], fixed + x.nbytes + mid.nbytes),
        (second, out.shape[1], mid.nbytes + out.nbytes),
    ]
    together = [(first, 0, fixed)]  # weights once; each stripe moves its input and output
    for r0, r1, p0, p1, i0, i1 in cut:
        sizes = stripe_bytes(program, first, second, (r0, r1, p0, p1, i0, i1))
        together += [(first, p1 - p0, sizes[0]), (second, r1 - r0, sizes[2])]
    if _estimate(program, hw, together) >= _estimate(program, hw, apart):
        return None
    return rows, slot


def plan_cascades(em: "Emitter", budget: int) -> None:
    """Pairs of layers run together in row stripes (cascade.py) where they fit and the
    perf model expects them to be faster; a cascade's output then leaves the SRAM-resident
    tensors (`budget` bytes of them, if any), which are planned again without it."""
    for first, second in find_cascades(em.p, lambda n: n in em.resident).items():
        avail = em.hw.sram_bytes - max(em.pool[first], em.pool[second])
        layers = em.p.layers[first], em.p.layers[second]
        planned = plan(em.p, em.hw, *layers, avail, em.buffers)
        if planned is not None:
            em.cascades[first] = planned
    if budget and em.cascades:
        striped = {id(em.p.layers[i + j]) for i in em.cascades for j in (0, 1)}
        em.keep_resident(budget, frozenset(striped))
        for first in list(em.cascades):  # what stays resident around them may differ
            avail = em.hw.sram_bytes - max(em.pool[first], em.pool[first + 1])
            layers = em.p.layers[first], em.p.layers[first + 1]
            slot = em.cascades[first][1]
            if sum(weight_bytes(*layers)) + em.buffers * slot > avail:
                del em.cascades[first]


def emit_cascade(em: "Emitter", index: int) -> None:
    """Layer `index` and the next one in row stripes: each stripe loads the first one's
    input rows, computes the rows of its output the second one's stripe reads (into SRAM
    only), then that stripe, and stores it. Both layers' weights load once."""
    first, second = em.p.layers[index], em.p.layers[index + 1]
    rows, slot = em.cascades[index]
    weights = weight_bytes(first, second)
    fixed = sum(weights)
    em.use(index, fixed + em.buffers * slot)
    mid, out = (em.p.tensors[n].shape[0] for n in (first.output, second.output))
    for number, stripe in enumerate(stripes(em.p, first, second, rows)):
        r0, r1, p0, p1, i0, i1 = stripe
        em.tile()
        for at, (j, layer) in zip((0, weights[0]), enumerate((first, second), index)):
            per_channel, _, _ = em.constants(layer)
            if per_channel and number == 0:
                em.load_weights(j, 0, em.p.tensors[layer.output].shape[0], per_channel, at)
        base = fixed + number % em.buffers * slot
        in_size, mid_size, _ = stripe_bytes(em.p, first, second, stripe)
        x = em.p.tensors[first.inputs[0]]
        em.load_rows(index, first.inputs[0], i0, i1, 0, x.shape[0], base)
        mid_at, out_at = base + in_size, base + in_size + mid_size
        em.emit(EXEC, index, p0, p1 - p0, 0, mid, base, 0, 0, mid_at)
        em.emit(EXEC, index + 1, r0, r1 - r0, 0, out, mid_at, 0, weights[0], out_at)
        em.store_rows(index + 1, second.output, r0, r1, 0, out, out_at)
