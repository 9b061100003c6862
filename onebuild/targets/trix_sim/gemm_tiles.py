"""How a Gemm over M rows ([M, K] @ [K, N]) runs: as channel parts where it is wider than the
preset's `max_channels`, each tiled in SRAM (rows per tile, output channels per weight chunk).
The code generator emits these tiles and the performance model counts their weight passes, so
both read the one plan here.

A row tile's input rows are loaded once (a vector used in place where it is resident); the
weights then stream through in chunks of output channels, so they are read from DRAM once per
row tile: all M rows in one tile where that leaves room for a chunk as wide as the MAC array
(or every channel), else fewer rows (halving) until it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .hardware import Hardware
from .opcodes import ALIGN, MAX_DMA_COUNT, align

if TYPE_CHECKING:  # lower.py builds its layers with `channel_parts`
    from .lower import Layer, TensorDesc


@dataclass(frozen=True)
class GemmTiles:
    m: int  # rows of the input
    k: int  # reduction
    n: int  # output channels
    rows: int  # rows per row tile
    chunk: int  # output channels per weight chunk
    in_bytes: int  # SRAM of a row tile's input (0: used in place)
    slot: int  # SRAM of one weight chunk and its output tile

    @property
    def row_tiles(self) -> int:
        return math.ceil(self.m / self.rows)

    def need(self, buffers: int) -> int:
        return self.in_bytes + buffers * self.slot


def channel_parts(layer: Layer, max_channels: int) -> list[Layer]:
    """A gemm with more output channels than `max_channels` (a CTC head's classes) as gemm
    layers of at most that many, named `node:index`, each writing its columns of the output
    from `ch_offset` on; any other layer as it is."""
    n = layer.arrays["weights"].shape[0] if layer.kind == "gemm" else 0
    if n <= max_channels:
        return [layer]
    parts = []
    for index, c0 in enumerate(range(0, n, max_channels)):
        rows = slice(c0, c0 + max_channels)
        arrays = {k: np.ascontiguousarray(a[rows]) for k, a in layer.arrays.items()}
        attrs = {**layer.attrs, "ch_offset": c0}
        parts.append(replace(layer, name=f"{layer.name}:{index}", attrs=attrs, arrays=arrays))
    return parts


def layer_node(layer: Layer) -> str:
    """The IR node a layer comes from: its name, less the `:index` of a gemm's channel part."""
    return layer.name.rpartition(":")[0] if "ch_offset" in layer.attrs else layer.name


def gemm_rows(layer: Layer, tensors: dict[str, TensorDesc]) -> int:
    """M: the rows of a gemm's output [M, N] (1 for a vector)."""
    return math.prod(tensors[layer.output].dims[:-1])


def gemm_tiles(
    hw: Hardware,
    layer: Layer,
    tensors: dict[str, TensorDesc],
    avail: int,
    buffers: int,
    in_place: bool = False,
    out_item: int | None = None,
) -> GemmTiles:
    """The tiles of `layer` in `avail` bytes of SRAM with `buffers` weight/output slots;
    `in_place`: the input is resident (a vector: one row tile); `out_item`: bytes per output
    code staged in SRAM (0 where the output is resident)."""
    weights = layer.arrays["weights"]
    n, k = weights.shape
    m = gemm_rows(layer, tensors)
    x_item = np.dtype(tensors[layer.inputs[0]].dtype).itemsize
    if out_item is None:
        out_item = np.dtype(tensors[layer.output].dtype).itemsize
    per_row = k * weights.itemsize

    def plan(rows: int) -> GemmTiles:
        in_bytes = 0 if in_place else align(rows * k * x_item)
        budget = avail - in_bytes
        chunk = max(1, min(n, budget // (buffers * (per_row + rows * out_item + ALIGN))))
        slot = align(chunk * per_row) + align(rows * chunk * out_item)
        while chunk > 1 and in_bytes + buffers * slot > avail:
            chunk -= 1
            slot = align(chunk * per_row) + align(rows * chunk * out_item)
        return GemmTiles(m, k, n, rows, chunk, in_bytes, slot)

    rows = min(m, MAX_DMA_COUNT)  # a row tile's output is stored by one 2-D DMA
    tiles = plan(rows)
    least = min(n, hw.mac_cols)
    while rows > 1 and (tiles.chunk < least or tiles.need(buffers) > avail):
        rows = (rows + 1) // 2
        tiles = plan(rows)
    return tiles
