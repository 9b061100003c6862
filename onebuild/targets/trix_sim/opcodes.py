"""TRIX instruction opcodes and limits (docs/tvn-format.md), the emitters' shared tiling
constant, DRAM alignment, and `Module`: the compiled program that the code generator makes,
the .tvn encoder writes and the simulator runs. The encoder and the performance model both
read these plain descriptions and never import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from .lower import Layer, TensorDesc

MAGIC = b"TVN\0"  # how every .tvn file begins (tvn.py writes and checks it)
LOAD, STORE, EXEC = 1, 2, 3
MAX_DMA_COUNT = 1 << 16  # blocks per 2-D DMA
PIPELINE_TILES = 8  # the fewest tiles per layer when double-buffering
ALIGN = 16


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Module:
    """Everything a .tvn file holds (see docs/tvn-format.md)."""

    meta: dict
    tensors: dict[str, TensorDesc]
    dram: dict[str, int]  # tensor -> DRAM offset
    layers: list[Layer]
    arrays: dict[tuple[int, str], int]  # (layer, array name) -> DRAM offset in the blob
    blob: bytes
    code: np.ndarray  # [n, 10] uint32: opcode, layer, 8 args
    inputs: list[str]
    outputs: list[str]
    arena_bytes: int = 0
    sram_peak: int = 0

    @property
    def dram_bytes(self) -> int:
        return align(len(self.blob)) + self.arena_bytes
