"""Op descriptions -> a TRIX instruction stream with explicit memory planning.

DRAM holds the constant blob (weights, tables) followed by the activation arena; arena offsets
come from liveness (a tensor's bytes are reused once its last reader has run; Reshape aliases its
input). Every layer runs as tiles of output rows (and, for large weights, chunks of output
channels) sized so the tile's working set fits the SRAM: with the `performance` preference two
input/output buffer sets alternate (double buffering: the DMA of tile i+1 overlaps the compute of
tile i); with `memory` one set is used and the arena packs tensors best-fit, which lowers peak
DRAM use at the cost of overlap.

Instruction = (opcode, layer, 8 unsigned args):
  LOAD  dram, sram, block, count, dram_stride, sram_stride    (2-D DMA, DRAM -> SRAM)
  STORE sram, dram, block, count, sram_stride, dram_stride    (2-D DMA, SRAM -> DRAM)
  EXEC  row0, rows, ch0, chs, in_sram, in2_sram, w_sram, out_sram
"""

from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from .hardware import Hardware
from .lower import Layer, Program, TensorDesc, input_rows, window_span

LOAD, STORE, EXEC = 1, 2, 3
ALIGN = 16
PREFERENCES = ("performance", "memory", "compile_time")
PIPELINE_TILES = 8  # the fewest tiles per layer when double-buffering
CHANNELWISE = ("maxpool", "avgpool", "add", "mul", "lookup", "requant")


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


def _blob(layers: list[Layer]) -> tuple[bytes, dict[tuple[int, str], int]]:
    parts, offsets, size = [], {}, 0
    for index, layer in enumerate(layers):
        for name in sorted(layer.arrays):
            data = np.ascontiguousarray(layer.arrays[name]).tobytes()
            offsets[(index, name)] = size
            padded = data + b"\0" * (align(len(data)) - len(data))
            parts.append(padded)
            size += len(padded)
    return b"".join(parts), offsets


def plan_arena(program: Program, best_fit: bool) -> tuple[dict[str, int], int]:
    """DRAM arena offsets from liveness; Reshape outputs alias their input."""
    root = {}
    for name in program.inputs:
        root[name] = name
    for layer in program.layers:
        root[layer.output] = root[layer.inputs[0]] if layer.kind == "reshape" else layer.output
    end = len(program.layers)
    first, last = {}, {}
    for name in program.inputs:
        first[name] = -1
    for index, layer in enumerate(program.layers):
        first.setdefault(root[layer.output], index)
        for name in layer.inputs:
            last[root[name]] = index
    for name in program.outputs:
        last[root[name]] = end
    sizes = {r: program.tensors[r].nbytes for r in set(root.values())}
    order = (
        sorted(sizes, key=lambda r: (-sizes[r], first[r], r))
        if best_fit
        else sorted(sizes, key=lambda r: (first[r], r))
    )
    placed: list[tuple[int, int, int, int]] = []  # offset, size, first, last
    offsets, total = {}, 0
    for name in order:
        lo, hi, size = first[name], last.get(name, first[name]), align(sizes[name])
        busy = sorted((o, s) for o, s, f, la in placed if not (la < lo or f > hi))
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        placed.append((offset, size, lo, hi))
        offsets[name] = offset
        total = max(total, offset + size)
    return {name: offsets[root[name]] for name in root}, total


class _Emitter:
    def __init__(self, program: Program, hw: Hardware, pref: str, dram, array_at, base):
        self.p, self.hw, self.dram, self.array_at, self.base = program, hw, dram, array_at, base
        self.buffers = 2 if pref == "performance" else 1
        self.code: list[tuple[int, ...]] = []
        self.tiles: list[dict] = []  # the current layer's tiles, emitted by `flush`
        self.sram_peak = 0

    def tile(self, barrier: bool = False) -> None:
        """Start a tile. A barrier tile's loads wait for the previous tile's compute (its loads
        overwrite SRAM the previous tile still reads, e.g. the next weight chunk)."""
        self.tiles.append({"barrier": barrier, LOAD: [], EXEC: [], STORE: []})

    def emit(self, op: int, layer: int, *args: int) -> None:
        args = [int(a) for a in args] + [0] * (8 - len(args))
        self.tiles[-1][op].append((op, layer, *args))

    def flush(self) -> None:
        """Emit the layer's tiles; with two buffers, tile i+1's loads go before tile i's
        compute and store, so the DMA of the next tile overlaps the current compute."""
        tiles, self.tiles = self.tiles, []
        if tiles:
            self.code += tiles[0][LOAD]
        for i, tile in enumerate(tiles):
            following = tiles[i + 1] if i + 1 < len(tiles) else None
            prefetch = following is not None and self.buffers > 1 and not following["barrier"]
            if prefetch:
                self.code += following[LOAD]
            self.code += tile[EXEC] + tile[STORE]
            if following is not None and not prefetch:
                self.code += following[LOAD]

    def tensor(self, name: str) -> tuple[TensorDesc, int]:
        return self.p.tensors[name], self.base + self.dram[name]

    def load_rows(self, layer: int, name: str, r0: int, r1: int, c0: int, cs: int, sram: int):
        """Rows [r0, r1) of channels [c0, c0 + cs) of a (C, H, W) tensor into SRAM."""
        t, at = self.tensor(name)
        _, h, w = t.shape
        item = np.dtype(t.dtype).itemsize
        block = (r1 - r0) * w * item
        if block:
            src = at + (c0 * h + r0) * w * item
            self.emit(LOAD, layer, src, sram, block, cs, h * w * item, block)

    def store_rows(self, layer: int, name: str, r0: int, r1: int, ch0: int, chs: int, sram: int):
        t, at = self.tensor(name)
        _, h, w = t.shape
        item = np.dtype(t.dtype).itemsize
        block = (r1 - r0) * w * item
        dram = at + (ch0 * h + r0) * w * item
        self.emit(STORE, layer, sram, dram, block, chs, block, h * w * item)

    def use(self, nbytes: int) -> None:
        self.sram_peak = max(self.sram_peak, nbytes)
        if nbytes > self.hw.sram_bytes:
            raise UserError(
                f"codegen: a tile needs {nbytes} bytes of SRAM, {self.hw.name} has "
                f"{self.hw.sram_bytes}"
            )

    # -- layers ------------------------------------------------------------------------------
    def layer(self, index: int, layer: Layer) -> None:
        if layer.kind == "gemm":
            self.gemm(index, layer)
        elif layer.kind == "concat":
            self.concat(index, layer)
        elif layer.kind != "reshape":
            self.spatial(index, layer)
        self.flush()

    def spatial(self, index: int, layer: Layer) -> None:
        out, _ = self.tensor(layer.output)
        x, _ = self.tensor(layer.inputs[0])
        m, oh, ow = out.shape
        c, h, w = x.shape
        out_item, in_item = np.dtype(out.dtype).itemsize, np.dtype(x.dtype).itemsize
        weights = layer.arrays.get("weights")
        table = layer.arrays.get("table")
        inputs = len(layer.inputs)
        channelwise = layer.kind in CHANNELWISE  # output channel i reads input channel i only
        per_channel = 0 if weights is None else int(np.prod(weights.shape[1:])) * weights.itemsize
        chunk, weight_slots = self._weight_chunk(m, per_channel)

        def sizes(rows: int, chs: int) -> tuple[int, int]:
            span = min(h, window_span(layer, rows))
            reads = chs if channelwise else c
            return align(reads * span * w * in_item), align(chs * rows * ow * out_item)

        def slot(rows: int, chs: int) -> int:
            in_size, out_size = sizes(rows, chs)
            return inputs * in_size + out_size

        def fixed(chs: int) -> int:
            tables = 0 if table is None else align(table.nbytes)
            return tables + weight_slots * align(chs * per_channel)

        rows = oh
        while rows > 1 and fixed(chunk) + self.buffers * slot(rows, chunk) > self.hw.sram_bytes:
            rows = (rows + 1) // 2
        while fixed(chunk) + self.buffers * slot(rows, chunk) > self.hw.sram_bytes and chunk > 1:
            chunk = (chunk + 1) // 2
        while self.buffers > 1 and rows > 1 and -(-oh // rows) * -(-m // chunk) < PIPELINE_TILES:
            rows = (rows + 1) // 2  # enough tiles for DMA and compute to overlap
        in_size, _ = sizes(rows, chunk)
        base0 = fixed(chunk)
        self.use(base0 + self.buffers * slot(rows, chunk))
        tile = 0
        for number, ch0 in enumerate(range(0, m, chunk)):
            chs = min(chunk, m - ch0)
            w_sram = number % max(weight_slots, 1) * align(chunk * per_channel)
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                # one weight slot: the next chunk's weights overwrite the ones in use
                self.tile(barrier=r0 == 0 and weight_slots == 1 and weights is not None)
                if table is not None and tile == 0:
                    src = self.array_at[(index, "table")]
                    self.emit(LOAD, index, src, 0, table.nbytes, 1, 0, 0)
                if weights is not None and r0 == 0:
                    src = self.array_at[(index, "weights")] + ch0 * per_channel
                    self.emit(LOAD, index, src, w_sram, chs * per_channel, 1, 0, 0)
                base = base0 + (tile % self.buffers) * slot(rows, chunk)
                i0, i1 = input_rows(layer, r0, r1, h)
                c0, cs = (ch0, chs) if channelwise else (0, c)
                self.load_rows(index, layer.inputs[0], i0, i1, c0, cs, base)
                if inputs == 2:
                    self.load_rows(index, layer.inputs[1], i0, i1, c0, cs, base + in_size)
                out_sram = base + inputs * in_size
                args = (r0, r1 - r0, ch0, chs, base, base + in_size, w_sram, out_sram)
                self.emit(EXEC, index, *args)
                self.store_rows(index, layer.output, r0, r1, ch0, chs, out_sram)
                tile += 1

    def _weight_chunk(self, channels: int, per_channel: int) -> tuple[int, int]:
        """Output channels per weight chunk and the number of weight slots. Weights that fit
        half the SRAM load once; larger ones stream in chunks (a multiple of the MAC array's
        columns where possible), double-buffered with the `performance` preference so the
        next chunk's DMA overlaps this chunk's compute."""
        if not per_channel:
            return channels, 0
        half = self.hw.sram_bytes // 2
        if channels * per_channel <= half:
            return channels, 1
        slots = self.buffers
        chunk = max(1, (half + half // 4) // slots // per_channel)
        if chunk >= self.hw.mac_cols:
            chunk -= chunk % self.hw.mac_cols
        return min(chunk, channels), slots

    def gemm(self, index: int, layer: Layer) -> None:
        x, x_at = self.tensor(layer.inputs[0])
        out, _ = self.tensor(layer.output)
        n, k = layer.arrays["weights"].shape
        item = layer.arrays["weights"].itemsize
        in_bytes = align(x.nbytes)
        per_row = k * item
        budget = self.hw.sram_bytes - in_bytes
        out_item = np.dtype(out.dtype).itemsize
        chunk = max(1, min(n, budget // (self.buffers * (per_row + out_item + ALIGN))))
        slot = align(chunk * per_row) + align(chunk * out_item)
        self.use(in_bytes + self.buffers * slot)
        for tile, ch0 in enumerate(range(0, n, chunk)):
            chs = min(chunk, n - ch0)
            self.tile()
            if tile == 0:
                self.emit(LOAD, index, x_at, 0, x.nbytes, 1, 0, 0)
            w_sram = in_bytes + (tile % self.buffers) * slot
            out_sram = w_sram + align(chunk * per_row)
            src = self.array_at[(index, "weights")] + ch0 * per_row
            self.emit(LOAD, index, src, w_sram, chs * per_row, 1, 0, 0)
            self.emit(EXEC, index, 0, 1, ch0, chs, 0, 0, w_sram, out_sram)
            self.store_rows(index, layer.output, 0, 1, ch0, chs, out_sram)

    def concat(self, index: int, layer: Layer) -> None:
        """Each input requantized into its channel range of the output, tile by tile."""
        out, _ = self.tensor(layer.output)
        _, oh, ow = out.shape
        ch0 = 0
        for part, name in enumerate(layer.inputs):
            x, _ = self.tensor(name)
            c = x.shape[0]
            item = max(np.dtype(x.dtype).itemsize, np.dtype(out.dtype).itemsize)
            rows = oh
            while rows > 1 and self.buffers * 2 * align(c * rows * ow * item) > self.hw.sram_bytes:
                rows = (rows + 1) // 2
            slot = 2 * align(c * rows * ow * item)
            self.use(self.buffers * slot)
            for tile, r0 in enumerate(range(0, oh, rows)):
                r1 = min(oh, r0 + rows)
                self.tile(barrier=tile == 0)  # parts use different buffer layouts
                in_sram = (tile % self.buffers) * slot
                out_sram = in_sram + slot // 2
                self.load_rows(index, name, r0, r1, 0, c, in_sram)
                self.emit(EXEC, index, r0, r1 - r0, ch0, c, in_sram, part, 0, out_sram)
                self.store_rows(index, layer.output, r0, r1, ch0, c, out_sram)
            ch0 += c


def generate(program: Program, hw: Hardware, pref: str = "performance", meta=None) -> Module:
    if pref not in PREFERENCES:
        raise UserError(f"codegen preference '{pref}' is not one of {', '.join(PREFERENCES)}")
    blob, array_at = _blob(program.layers)
    dram, arena = plan_arena(program, best_fit=pref == "memory")
    base = align(len(blob))
    emitter = _Emitter(program, hw, pref, dram, array_at, base)
    for index, layer in enumerate(program.layers):
        emitter.layer(index, layer)
    code = np.array(emitter.code, dtype=np.uint32).reshape(-1, 10)
    return Module(
        meta=dict(meta or {}, hardware=hw.name, pref=pref),
        tensors=program.tensors,
        dram={k: base + v for k, v in dram.items()},
        layers=program.layers,
        arrays={k: v for k, v in array_at.items()},
        blob=blob,
        code=code,
        inputs=program.inputs,
        outputs=program.outputs,
        arena_bytes=arena,
        sram_peak=emitter.sram_peak,
    )
