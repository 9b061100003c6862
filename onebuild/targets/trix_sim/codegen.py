"""Op descriptions -> a TRIX instruction stream with explicit memory planning.

DRAM holds the constant blob (weights, tables) followed by the activation arena; arena offsets
come from liveness (a tensor's bytes are reused once its last reader has run; Reshape aliases its
input). Every layer runs as tiles of output rows (and, for large weights, chunks of output
channels) sized so the tile's working set fits the SRAM: with the `performance` preference two
input/output buffer sets alternate (double buffering: the DMA of tile i+1 overlaps the compute of
tile i), weight chunks are double-buffered too, and intermediate tensors that fit stay resident
in the top half of the SRAM from producer to last reader (no DRAM round trip; the layers that
touch them run on whole-height channel tiles and use them in place); with `memory` one set is
used and the arena packs tensors best-fit, which lowers peak DRAM use at the cost of overlap.
A residual Add or a Concat part whose operand a convolution produces runs in that
convolution's output stage (`fusion.py`): the convolution's tiles write the consumer's output.
Runs of convolution and pooling layers where each reads only its predecessor may cascade in row
stripes (`cascade.py`), their intermediate tensors never leaving SRAM.

Instruction = (opcode, layer, 8 unsigned args):
  LOAD  dram, sram, block, count, dram_stride, sram_stride    (2-D DMA, DRAM -> SRAM)
  STORE sram, dram, block, count, sram_stride, dram_stride    (2-D DMA, SRAM -> DRAM)
  EXEC  row0, rows, ch0, chs, in_sram, in2_sram, w_sram, out_sram
"""

import numpy as np

from ...errors import UserError
from .cascade import emit_cascade, plan_cascades
from .copies import emit_concat, emit_move
from .fusion import (
    destination,
    epilogue_operand,
    fuse_epilogues,
    fused_parts,
    silent,
    touched,
)
from .gemm_tiles import gemm_rows, gemm_tiles
from .hardware import Hardware
from .lower import Layer, Program, TensorDesc, tile_input_rows, window_span
from .memory import plan_arena, plan_residency
from .moves import MOVES
from .opcodes import ALIGN, EXEC, LOAD, PIPELINE_TILES, STORE, Module, align

PREFERENCES = ("performance", "memory", "compile_time")
CHANNELWISE = ("maxpool", "avgpool", "add", "mul", "lookup", "requant")


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


class Emitter:
    def __init__(self, program: Program, hw: Hardware, pref: str, dram, array_at, base):
        self.p, self.hw, self.dram, self.array_at, self.base = program, hw, dram, array_at, base
        self.buffers = 2 if pref == "performance" else 1
        self.code: list[tuple[int, ...]] = []
        self.tiles: list[dict] = []  # the current layer's tiles, emitted by `flush`
        self.sram_peak = 0
        self.resident: dict[str, int] = {}  # tensor -> SRAM address, for SRAM-resident tensors
        self.pool: list[int] = [0] * len(program.layers)  # resident bytes (top of SRAM) per layer
        self.avail = hw.sram_bytes  # working SRAM of the current layer, from address 0
        self.fused, self.silent = fused_parts(program), silent(program)
        # first layer of a cascade (cascade.py) -> (last layer, rows per stripe, slot bytes)
        self.cascades: dict[int, tuple[int, int, int]] = {}

    def keep_resident(self, budget: int, striped: frozenset[int] = frozenset()) -> None:
        """Keep intermediate tensors in the top `budget` bytes of SRAM where every layer that
        touches them can run on whole-height tiles in the rest (not `striped` layers: ids of
        cascaded ones, which run on row stripes)."""
        rest = self.hw.sram_bytes - budget

        def fits(layer: Layer) -> bool:
            return id(layer) not in striped and self.whole_height_bytes(layer) <= rest

        offsets, self.pool = plan_residency(self.p, budget, fits)
        top = self.hw.sram_bytes
        self.resident = {}
        for name, offset in offsets.items():
            self.resident[name] = top - offset - align(self.p.tensors[name].nbytes)

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

    def load_table(self, index: int, table: np.ndarray) -> None:
        """A lookup table to SRAM address 0 (layers with a table have no weights)."""
        self.emit(LOAD, index, self.array_at[(index, "table")], 0, table.nbytes, 1, 0, 0)

    def load_weights(self, index: int, ch0: int, chs: int, per_channel: int, sram: int) -> None:
        """The weights (or tables, one per channel) of output channels [ch0, ch0 + chs) to
        SRAM."""
        name = "weights" if "weights" in self.p.layers[index].arrays else "table"
        src = self.array_at[(index, name)] + ch0 * per_channel
        self.emit(LOAD, index, src, sram, chs * per_channel, 1, 0, 0)

    def operand_tile(self, layer: Layer, name: str, r0: int, r1: int, c0: int, cs: int):
        """Rows [r0, r1) and channels [c0, c0 + cs) of operand `name` that a channel-wise tile
        reads: a per-channel vector operand has one row (a scalar one channel too)."""
        if "vector_index" in layer.attrs and name == layer.inputs[1]:
            channels = self.p.tensors[name].shape[0]
            return (0, 1, c0, cs) if channels > 1 else (0, 1, 0, 1)
        return r0, r1, c0, cs

    def channel_bytes(self, name: str) -> int:
        t = self.p.tensors[name]
        return t.shape[1] * t.shape[2] * np.dtype(t.dtype).itemsize

    def use(self, index: int, nbytes: int) -> None:
        self.sram_peak = max(self.sram_peak, nbytes + self.pool[index])
        if nbytes > self.avail:
            layer = self.p.layers[index]
            raise UserError(
                f"codegen: layer '{layer.name}' ({layer.kind}) needs {nbytes} bytes of SRAM for "
                f"one tile, {self.hw.name} has {self.avail} free: choose a larger hardware preset "
                f"or keep the layer on the CPU ([partition] opname map)"
            )

    # -- layers ------------------------------------------------------------------------------
    def layer(self, index: int, layer: Layer) -> None:
        self.avail = self.hw.sram_bytes - self.pool[index]
        if layer.kind == "gemm":
            self.gemm(index, layer)
        elif layer.kind == "concat":
            emit_concat(self, index, layer)
        elif layer.kind == "reshape" or index in self.silent or self.cascaded(index):
            pass  # a view, a layer fused into its operand's producer, or in a cascade
        elif index in self.cascades:
            emit_cascade(self, index)
        elif layer.kind in MOVES:
            emit_move(self, index, layer)
        elif any(n in self.resident for n in touched(self.p, index)):
            self.whole_height(index, layer)
        else:
            self.spatial(index, layer)
        self.flush()

    def cascaded(self, index: int) -> bool:
        """Whether layer `index` runs in the cascade of an earlier layer."""
        return any(first < index <= end for first, (end, _, _) in self.cascades.items())

    def _weight_chunk(self, channels: int, per_channel: int) -> tuple[int, int]:
        """Output channels per weight chunk and the number of weight slots. Weights that fit
        half the working SRAM load once; larger ones stream in chunks (a multiple of the MAC
        array's columns where possible), double-buffered with the `performance` preference so
        the next chunk's DMA overlaps this chunk's compute."""
        if not per_channel:
            return channels, 0
        half = self.avail // 2
        if channels * per_channel <= half:
            return channels, 1
        slots = self.buffers
        chunk = max(1, (half + half // 4) // slots // per_channel)
        if chunk >= self.hw.mac_cols:
            chunk -= chunk % self.hw.mac_cols
        return min(chunk, channels), slots

    def constants(self, layer: Layer) -> tuple[int, int, object]:
        """Bytes per output channel of weights, the table bytes, and the table (or None). A
        table per channel ([C, codes]) is loaded as weights are: the rows of a tile's
        channels, with the tile."""
        weights, table = layer.arrays.get("weights"), layer.arrays.get("table")
        if table is not None and table.ndim == 2:
            weights, table = table, None
        per_channel = 0 if weights is None else int(np.prod(weights.shape[1:])) * weights.itemsize
        return per_channel, 0 if table is None else align(table.nbytes), table

    def whole_height_bytes(self, layer: Layer) -> int:
        """SRAM the layer needs on its smallest whole-height tiles (one channel; a convolution
        one MAC array's width) with every operand staged: what it takes to touch an
        SRAM-resident tensor."""
        if layer.kind == "reshape":
            return 0
        if layer.kind in MOVES:  # moves read and write DRAM: their tensors stay there
            return self.hw.sram_bytes + 1
        out_channel = align(self.channel_bytes(layer.output))
        if layer.kind == "gemm":  # rows of a sequence stay in DRAM: their tiles are 2-D
            if gemm_rows(layer, self.p.tensors) > 1:
                return self.hw.sram_bytes + 1
            x = self.p.tensors[layer.inputs[0]]
            row = layer.arrays["weights"].shape[1] * layer.arrays["weights"].itemsize
            return align(x.nbytes) + self.buffers * (align(row) + ALIGN)
        if layer.kind == "concat":
            part = max(align(self.channel_bytes(n)) for n in layer.inputs)
            return self.buffers * (part + out_channel)
        per_channel, tables, _ = self.constants(layer)
        if layer.kind in CHANNELWISE:
            staged = sum(align(self.channel_bytes(n)) for n in layer.inputs)
            return tables + self.buffers * (align(per_channel) + staged + out_channel)
        chs = min(self.p.tensors[layer.output].shape[0], self.hw.mac_cols)  # as `whole_height`
        fixed = tables + self.buffers * align(chs * per_channel)
        whole_input = align(self.p.tensors[layer.inputs[0]].nbytes)
        operand = epilogue_operand(self.p, layer)
        staged = out_channel + (align(self.channel_bytes(operand)) if operand else 0)
        return fixed + whole_input + self.buffers * chs * staged

    def spatial(self, index: int, layer: Layer) -> None:
        """Row tiles (and output channel chunks) through staging buffers."""
        out, _ = self.tensor(layer.output)
        x, _ = self.tensor(layer.inputs[0])
        m, oh, ow = out.shape
        c, h, w = x.shape
        out_item, in_item = np.dtype(out.dtype).itemsize, np.dtype(x.dtype).itemsize
        inputs = len(layer.inputs)
        channelwise = layer.kind in CHANNELWISE  # output channel i reads input channel i only
        per_channel, tables, table = self.constants(layer)
        chunk, weight_slots = self._weight_chunk(m, per_channel)
        dest, offset = destination(self.p, layer)
        operand = epilogue_operand(self.p, layer)  # an Add epilogue's other operand
        op_item = np.dtype(self.p.tensors[operand].dtype).itemsize if operand else 0

        def sizes(rows: int, chs: int) -> tuple[int, int]:
            span = h if rows >= oh else min(h, window_span(layer, rows))
            reads = chs if channelwise else c
            return align(reads * span * w * in_item), align(chs * rows * ow * out_item)

        def slot(rows: int, chs: int) -> int:
            in_size, out_size = sizes(rows, chs)
            return inputs * in_size + out_size + align(chs * rows * ow * op_item)

        def fixed(chs: int) -> int:
            return tables + weight_slots * align(chs * per_channel)

        rows = oh
        while rows > 1 and fixed(chunk) + self.buffers * slot(rows, chunk) > self.avail:
            rows = (rows + 1) // 2
        while fixed(chunk) + self.buffers * slot(rows, chunk) > self.avail and chunk > 1:
            chunk = (chunk + 1) // 2
        while self.buffers > 1 and rows > 1 and -(-oh // rows) * -(-m // chunk) < PIPELINE_TILES:
            rows = (rows + 1) // 2  # enough tiles for DMA and compute to overlap
        in_size, _ = sizes(rows, chunk)
        base0 = fixed(chunk)
        self.use(index, base0 + self.buffers * slot(rows, chunk))
        tile = 0
        for number, ch0 in enumerate(range(0, m, chunk)):
            chs = min(chunk, m - ch0)
            w_sram = number % max(weight_slots, 1) * align(chunk * per_channel)
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                # one weight slot: the next chunk's weights overwrite the ones in use
                self.tile(barrier=r0 == 0 and weight_slots == 1 and per_channel > 0)
                if table is not None and tile == 0:
                    self.load_table(index, table)
                if per_channel and r0 == 0:
                    self.load_weights(index, ch0, chs, per_channel, w_sram)
                base = base0 + (tile % self.buffers) * slot(rows, chunk)
                i0, i1 = tile_input_rows(layer, r0, r1, h, oh)
                c0, cs = (ch0, chs) if channelwise else (0, c)
                self.load_rows(index, layer.inputs[0], i0, i1, c0, cs, base)
                if inputs == 2:
                    second = self.operand_tile(layer, layer.inputs[1], i0, i1, c0, cs)
                    self.load_rows(index, layer.inputs[1], *second, base + in_size)
                out_sram = base + inputs * in_size
                in2 = base + in_size
                if operand:
                    in2 = out_sram + sizes(rows, chunk)[1]
                    self.load_rows(index, operand, r0, r1, ch0, chs, in2)
                args = (r0, r1 - r0, ch0, chs, base, in2, w_sram, out_sram)
                self.emit(EXEC, index, *args)
                self.store_rows(index, dest, r0, r1, offset + ch0, chs, out_sram)
                tile += 1

    def whole_height(self, index: int, layer: Layer) -> None:
        """Whole-height tiles of output channels, for a layer that reads or writes an
        SRAM-resident tensor (whose channels are contiguous in SRAM): resident operands are
        used in place, the others staged (a convolution's input once, whole)."""
        out = self.p.tensors[layer.output]
        m, oh, _ = out.shape
        _, h, _ = self.p.tensors[layer.inputs[0]].shape
        channelwise = layer.kind in CHANNELWISE
        per_channel, tables, table = self.constants(layer)
        chunk, weight_slots = self._weight_chunk(m, per_channel)
        staged = [n for n in layer.inputs if n not in self.resident] if channelwise else []
        whole = layer.inputs[0]
        whole_input = (
            0 if channelwise or whole in self.resident else align(self.p.tensors[whole].nbytes)
        )
        dest, offset = destination(self.p, layer)
        out_staged = dest not in self.resident
        operand = epilogue_operand(self.p, layer)  # an Add epilogue's other operand
        if operand and operand not in self.resident:
            staged.append(operand)

        def slot(chs: int) -> int:
            return sum(align(chs * self.channel_bytes(n)) for n in staged) + (
                align(chs * self.channel_bytes(layer.output)) if out_staged else 0
            )

        def need(chunk: int, chs: int) -> int:
            fixed = tables + weight_slots * align(chunk * per_channel)
            return fixed + whole_input + self.buffers * slot(chs)

        # tiles of a convolution keep whole MAC-array columns busy where they can
        least = min(m, self.hw.mac_cols) if layer.kind == "conv" else 1
        chs = chunk
        while need(chunk, chs) > self.avail and chs > least:
            chs = max(least, (chs + 1) // 2)
        # smaller weight chunks before tiles narrower than the array (which idle its columns)
        while need(chunk, chs) > self.avail and chunk > least:
            chunk = max(least, (chunk + 1) // 2)
        chs = min(chs, chunk)
        while need(chunk, chs) > self.avail and chs > 1:
            chs = (chs + 1) // 2
        while need(chunk, chs) > self.avail and chunk > 1:
            chunk = (chunk + 1) // 2
        chs = min(chs, chunk)
        while self.buffers > 1 and chs > least and -(-m // chs) < PIPELINE_TILES:
            chs = max(least, (chs + 1) // 2)
        if layer.kind == "conv" and chs > self.hw.mac_cols:  # no partly idle array columns
            chs -= chs % self.hw.mac_cols
        # weights stream with the tiles (two slots), so compute starts after the first tile's
        # weights instead of a whole chunk's, where that wait is longer than the extra DMAs'
        # latency
        waited = (chunk - chs) * per_channel / self.hw.dram_bytes_per_cycle
        extra = (-(-m // chs) - -(-m // chunk)) * self.hw.dma_latency_cycles
        if self.buffers > 1 and weight_slots and chs < chunk and waited > extra:
            streamed = tables + 2 * align(chs * per_channel) + whole_input + 2 * slot(chs)
            if streamed <= self.avail:
                chunk, weight_slots = chs, 2
        self.use(index, need(chunk, chs))
        input_at = tables + weight_slots * align(chunk * per_channel)
        base0 = input_at + whole_input
        tile = 0
        for number, c0 in enumerate(range(0, m, chunk)):
            w_sram = number % max(weight_slots, 1) * align(chunk * per_channel)
            for t0 in range(c0, min(m, c0 + chunk), chs):
                count = min(chs, c0 + chunk - t0, m - t0)
                self.tile(barrier=t0 == c0 and weight_slots == 1 and per_channel > 0)
                if table is not None and tile == 0:
                    self.load_table(index, table)
                if per_channel and t0 == c0:
                    self.load_weights(index, c0, min(chunk, m - c0), per_channel, w_sram)
                if whole_input and tile == 0:
                    c = self.p.tensors[whole].shape[0]
                    self.load_rows(index, whole, 0, h, 0, c, input_at)
                at = base0 + (tile % self.buffers) * slot(chs)
                operands = []
                for name, extra in [*((n, False) for n in layer.inputs), (operand, True)]:
                    if name is None:
                        continue
                    box = self.operand_tile(layer, name, 0, oh if extra else h, t0, count)
                    first = box[2] if channelwise or extra else 0
                    if name in self.resident:
                        operands.append(self.resident[name] + first * self.channel_bytes(name))
                    elif channelwise or extra:
                        self.load_rows(index, name, *box, at)
                        operands.append(at)
                        at += align(chs * self.channel_bytes(name))
                    else:
                        operands.append(input_at)
                if out_staged:
                    out_at = at
                else:
                    out_at = self.resident[dest] + (offset + t0) * self.channel_bytes(dest)
                in2 = operands[1] if len(operands) > 1 else 0
                w_at = w_sram + (t0 - c0) * per_channel
                self.emit(EXEC, index, 0, oh, t0, count, operands[0], in2, w_at, out_at)
                if out_staged:
                    self.store_rows(index, dest, 0, oh, offset + t0, count, out_at)
                tile += 1

    def gemm(self, index: int, layer: Layer) -> None:
        """Row tiles of the input [M, K] (`gemm_tiles`: every row where they fit), each loaded
        once (a resident vector used in place) and run through the weights in output-channel
        chunks, which stream once per row tile; a tile's output [rows, chs] goes to DRAM by one
        2-D DMA (or in place into a resident vector)."""
        x, x_at = self.tensor(layer.inputs[0])
        out, out_dram = self.tensor(layer.output)
        in_place = layer.inputs[0] in self.resident
        out_item = np.dtype(out.dtype).itemsize
        staged = 0 if layer.output in self.resident else out_item
        tensors, buffers = self.p.tensors, self.buffers
        plan = gemm_tiles(self.hw, layer, tensors, self.avail, buffers, in_place, staged)
        m, k, n, rows, chunk = plan.m, plan.k, plan.n, plan.rows, plan.chunk
        offset, width = layer.attrs.get("ch_offset", 0), out.dims[-1]  # its columns of [M, N]
        per_row = k * layer.arrays["weights"].itemsize
        x_row = k * np.dtype(x.dtype).itemsize
        self.use(index, plan.need(self.buffers))
        tile = 0
        for r0 in range(0, m, rows):
            count = min(rows, m - r0)
            for ch0 in range(0, n, chunk):
                chs = min(chunk, n - ch0)
                # a later row tile's input overwrites the rows the previous tile still reads
                self.tile(barrier=r0 > 0 and ch0 == 0)
                if ch0 == 0 and not in_place:
                    self.emit(LOAD, index, x_at + r0 * x_row, 0, count * x_row, 1, 0, 0)
                in_at = self.resident[layer.inputs[0]] if in_place else 0
                w_sram = plan.in_bytes + (tile % self.buffers) * plan.slot
                out_at = w_sram + align(chunk * per_row)
                if not staged:
                    out_at = self.resident[layer.output] + (offset + ch0) * out_item
                self.load_weights(index, ch0, chs, per_row, w_sram)
                self.emit(EXEC, index, r0, count, ch0, chs, in_at, 0, w_sram, out_at)
                if staged:
                    dram = out_dram + (r0 * width + offset + ch0) * out_item
                    block = chs * out_item
                    self.emit(STORE, index, out_at, dram, block, count, block, width * out_item)
                tile += 1


def generate(program: Program, hw: Hardware, pref: str = "performance", meta=None) -> Module:
    if pref not in PREFERENCES:
        raise UserError(f"codegen preference '{pref}' is not one of {', '.join(PREFERENCES)}")
    program = fuse_epilogues(program)
    blob, array_at = _blob(program.layers)
    base = align(len(blob))
    emitter = Emitter(program, hw, pref, {}, array_at, base)
    budget = hw.sram_bytes // 2 if pref == "performance" else 0
    if budget:
        emitter.keep_resident(budget)
    plan_cascades(emitter, budget)
    together = {first: end for first, (end, _, _) in emitter.cascades.items()}
    dram, arena = plan_arena(program, best_fit=pref == "memory", together=together)
    emitter.dram = dram
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
