"""Code generation of the layers that copy: data moves (`moves.py`) and Concat parts."""

from typing import TYPE_CHECKING

import numpy as np

from .lower import Layer
from .moves import box_shape, source_box
from .opcodes import EXEC, LOAD, MAX_DMA_COUNT, PIPELINE_TILES, align

if TYPE_CHECKING:
    from .codegen import Emitter


def emit_move(em: "Emitter", index: int, layer: Layer) -> None:
    """Output channel tiles; each loads the input box it reads (`moves.source_box`)."""
    x, x_at = em.tensor(layer.inputs[0])
    m, oh, _ = em.p.tensors[layer.output].shape
    item = np.dtype(x.dtype).itemsize
    out_channel = em.channel_bytes(layer.output)

    def slot(chs: int) -> int:
        return align(int(np.prod(box_shape(layer, x.shape, 0, chs))) * item) + align(
            chs * out_channel
        )

    chs = min(m, MAX_DMA_COUNT)  # a tile's channels are one DMA's blocks
    while em.buffers * slot(chs) > em.avail and chs > 1:
        chs = (chs + 1) // 2
    while em.buffers > 1 and chs > 1 and -(-m // chs) < PIPELINE_TILES:
        chs = (chs + 1) // 2
    em.use(index, em.buffers * slot(chs))
    for tile, o0 in enumerate(range(0, m, chs)):
        count = min(chs, m - o0)
        em.tile()
        base = (tile % em.buffers) * slot(chs)
        axis, lo, hi = source_box(layer, x.shape, o0, o0 + count)
        c, h, w = x.shape
        if axis == 0:
            em.load_rows(index, layer.inputs[0], 0, h, lo, hi - lo, base)
        elif axis == 1:
            em.load_rows(index, layer.inputs[0], lo, hi, 0, c, base)
        else:  # columns [lo, hi) of every row: one strided DMA
            block = (hi - lo) * item
            em.emit(LOAD, index, x_at + lo * item, base, block, c * h, w * item, block)
        out_at = base + slot(chs) - align(chs * out_channel)
        em.emit(EXEC, index, 0, oh, o0, count, base, 0, 0, out_at)
        em.store_rows(index, layer.output, 0, oh, o0, count, out_at)


def emit_concat(em: "Emitter", index: int, layer: Layer) -> None:
    """Each input requantized into its channel range of the output: row tiles, or
    whole-height channel tiles where an operand is SRAM-resident."""
    out = em.p.tensors[layer.output]
    _, oh, _ = out.shape
    out_staged = layer.output not in em.resident
    ch0 = 0
    for part, name in enumerate(layer.inputs):
        c = em.p.tensors[name].shape[0]
        if name in em.fused:  # its producer wrote it into place
            ch0 += c
            continue
        in_staged = name not in em.resident
        whole = not (in_staged and out_staged)
        in_row = em.channel_bytes(name) // oh * in_staged
        out_row = em.channel_bytes(layer.output) // oh * out_staged

        def slot(rows: int, chs: int, in_row=in_row, out_row=out_row) -> int:
            return align(chs * rows * in_row) + align(chs * rows * out_row)

        rows, chs = oh, c
        while not whole and rows > 1 and em.buffers * slot(rows, chs) > em.avail:
            rows = (rows + 1) // 2
        while em.buffers * slot(rows, chs) > em.avail and chs > 1:
            chs = (chs + 1) // 2
        em.use(index, em.buffers * slot(rows, chs))
        tiles = [(r0, k0) for k0 in range(0, c, chs) for r0 in range(0, oh, rows)]
        for tile, (r0, k0) in enumerate(tiles):
            r1, count = min(oh, r0 + rows), min(chs, c - k0)
            em.tile(barrier=tile == 0)  # parts use different buffer layouts
            base = (tile % em.buffers) * slot(rows, chs)
            in_at = base
            if in_staged:
                em.load_rows(index, name, r0, r1, k0, count, in_at)
            else:
                in_at = em.resident[name] + k0 * em.channel_bytes(name)
            out_at = base + align(chs * rows * in_row)
            if not out_staged:
                out_at = em.resident[layer.output] + (ch0 + k0) * em.channel_bytes(layer.output)
            em.emit(EXEC, index, r0, r1 - r0, ch0 + k0, count, in_at, part, 0, out_at)
            if out_staged:
                em.store_rows(index, layer.output, r0, r1, ch0 + k0, count, out_at)
        ch0 += c
