"""TRIX instruction opcodes and limits (docs/tvn-format.md), and the emitters' shared tiling
constant."""

LOAD, STORE, EXEC = 1, 2, 3
MAX_DMA_COUNT = 1 << 16  # blocks per 2-D DMA
PIPELINE_TILES = 8  # the fewest tiles per layer when double-buffering
