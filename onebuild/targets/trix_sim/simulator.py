"""Executes a TRIX module instruction by instruction, bit-exactly, and counts cycles.

State is a DRAM image (constant blob + activation arena) and the SRAM. LOAD/STORE copy 2-D
blocks between them; EXEC computes one tile from SRAM operands into SRAM with the integer rules
of docs/quantization.md. Timing: one DMA engine and one compute engine; an instruction starts
when its engine is free and the SRAM ranges it reads were written (and the ranges it writes were
read by earlier instructions), so double-buffered tiles overlap DMA with compute.

Speed: a convolution whose EXEC tiles cover its output exactly is computed once, as one GEMM
over the whole layer, from its input tensor (the whole-height operand of its first tile, else
the tensor in DRAM) and its weights. Every EXEC still runs: it checks its addresses, and uses
its slice of that result only if the operands it reads in SRAM equal the slices the whole-layer
result was computed from (else it computes its tile alone), so the outputs are exactly those of
tile-by-tile execution.

Addresses, sizes and cycles do not depend on the data, so the first run checks every DMA and
schedules every instruction (timeline.py), and later runs of the same simulator reuse that
report and the checked DMA views; every EXEC still checks its SRAM operands on every run. Nor
does where each byte came from: the first run follows it (provenance.py), and a tile proven to
read the bytes the whole-layer result was computed from takes its slice without comparing
them (nor is that layer's input copied), a plain copy through the views its first run checked:
wholes.py. A convolution with a max pool in its output stage, whose tiles overlap, is computed
whole (pooled once) where all its tiles are proven so; pools are computed whole as
convolutions are. A tile proven to copy a slice of a whole result writes that slice's labels,
so a layer whose input is such copies (a cascade's intermediate, never in DRAM) is computed
whole from that result. Later runs follow a plan of the instructions that do something
(`_plan_steps`). Convolutions: convolve.py, whole_conv.py; code tables of elementwise
layers, concat parts and requant layers: tables.py; compiled kernels (numba, optional, loaded
when a simulator runs again): kernels.py.
"""

import math
from functools import partial

import numpy as np

from ...errors import FormatError, UserError
from . import kernels
from .codegen import CHANNELWISE, EXEC, LOAD, STORE, Module
from .convolve import convolve
from .exact import same_values
from .hardware import Hardware
from .lower import Layer, input_rows, tile_input_rows
from .moves import MOVES, box_shape, move_tile
from .perf import conv_pool_cycles, dma_cycles, exec_cycles
from .provenance import Provenance
from .tables import CodeTables
from .tile_exec import TILE_KINDS, Tile, TileKinds
from .timeline import Report, Timeline, exactly_tiled
from .wholes import WholeLayers
from .windows import pool


class Simulator(WholeLayers, TileKinds):
    def __init__(self, module: Module, hw: Hardware):
        if hw.name != module.meta.get("hardware"):
            raise UserError(f"module was compiled for {module.meta.get('hardware')}, not {hw.name}")
        if module.sram_peak > hw.sram_bytes:
            raise FormatError(
                f"module plans {module.sram_peak} bytes of SRAM, {hw.name} has {hw.sram_bytes}"
            )
        self.module, self.hw = module, hw
        self.dram = np.zeros(module.dram_bytes, np.uint8)
        self.dram[: len(module.blob)] = np.frombuffer(module.blob, np.uint8)
        self.sram = np.zeros(hw.sram_bytes, np.uint8)
        self._whole: dict[int, tuple | None] = {}
        self._cycles: dict[tuple, int] = {}  # (layer, [row0,] rows, channels) -> EXEC cycles
        self._code = module.code.tolist()
        self._timed: Report | None = None  # the report of the first run: timing is data-free
        self._dma: dict[int, tuple] = {}  # position -> (destination, source) views, checked
        self._weights32: dict[int, np.ndarray] = {}  # layer -> its weights as float32
        self._parts: dict[int, tuple] = {}  # layer -> wholes.WholeLayers._part_table
        self._norms: dict[int, tuple] = {}  # layer -> exact.row_norm, row_l1 of those weights
        self._plans: dict[int, object] = {}  # layer -> whole_conv.whole_convolution, or None
        self._scalings: dict[tuple, tuple] = {}  # requantization constants (convolve.py)
        self._convolve = partial(convolve, scalings=self._scalings)
        self._codes = CodeTables(module)  # code tables of elementwise layers and concat parts
        self._slices: dict[tuple, tuple] = {}  # EXEC arguments -> views of a whole-layer tile
        self._labels: Provenance | None = None  # during the first run only
        self._proven: set[tuple] = set()  # EXECs whose operands are what the whole layer read
        self._unproven: set[tuple] = set()  # EXECs of whole layers whose operands may not be
        self._snapshots: dict[int, np.ndarray] = {}  # layer -> labels of what it read whole
        self._results: dict[int, np.ndarray] = {}  # layer -> labels of its whole result (1st run)
        self._sources: dict[int, int] = {}  # layer -> the layer whose whole result it reads
        self._places: dict[int, tuple] = {}  # else layer -> (address, in SRAM) of its input
        self._lean: set[int] = set()  # layers every EXEC of which is proven: no input copy
        self._plan: list[tuple] = []  # the steps of later runs (_plan_steps)
        self._pools = {  # convolution -> the max pool in its output stage
            i: module.layers[layer.attrs["epilogue"]]
            for i, layer in enumerate(module.layers)
            if "epilogue" in layer.attrs
            and module.layers[layer.attrs["epilogue"]].kind == "maxpool"
        }
        self._tiled = [*exactly_tiled(module), *self._pools]  # layers computed whole

    # -- memory ------------------------------------------------------------------------------
    def _sram_view(self, offset: int, dtype: str, shape) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if offset + nbytes > len(self.sram):
            raise FormatError(f"instruction reads SRAM [{offset}, {offset + nbytes}) out of range")
        return self.sram[offset : offset + nbytes].view(dtype).reshape(shape)

    def _write_sram(self, offset: int, array: np.ndarray) -> None:
        if offset + array.nbytes > len(self.sram):
            raise FormatError(
                f"instruction writes SRAM [{offset}, {offset + array.nbytes}) out of range"
            )
        place = self.sram[offset : offset + array.nbytes].view(array.dtype)
        place.reshape(array.shape)[...] = array

    def _copy(
        self, position, src, src_at, dst, dst_at, block, count, src_stride, dst_stride
    ) -> None:
        """`count` blocks of `block` bytes, strided on both sides (a 2-D DMA); the checked
        views are kept for later runs."""
        if not count or not block:
            self._dma[position] = None
            return
        if src_at + (count - 1) * src_stride + block > len(src) or (
            dst_at + (count - 1) * dst_stride + block > len(dst)
        ):
            raise FormatError("DMA transfer out of range")
        if count == 1 or (block == src_stride and block == dst_stride):  # one contiguous run
            views = dst[dst_at : dst_at + count * block], src[src_at : src_at + count * block]
        else:
            views = (
                _blocks(dst, dst_at, block, count, dst_stride),
                _blocks(src, src_at, block, count, src_stride),
            )
        views[0][...] = views[1]
        self._dma[position] = views

    # -- run ---------------------------------------------------------------------------------
    def run(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Report]:
        module = self.module
        for name in module.inputs:
            t = module.tensors[name]
            array = np.ascontiguousarray(np.asarray(inputs[name]).astype(t.dtype))
            if array.size * array.itemsize != t.nbytes:
                raise UserError(f"input '{name}' has {array.size} values, expected {t.shape}")
            at = module.dram[name]
            self.dram[at : at + t.nbytes] = array.view(np.uint8).reshape(-1)
        self._whole = dict.fromkeys(self._tiled)
        if self._timed is None:
            self._timed = self._run_timed()
        else:
            kernels.load()  # a simulator that runs again: worth loading them (kernels.py)
            self._run_again()
        report = self._timed.copy()
        outputs = {}
        for name in module.outputs:
            t = module.tensors[name]
            at = module.dram[name]
            outputs[name] = self.dram[at : at + t.nbytes].view(t.dtype).reshape(t.dims).copy()
        return outputs, report

    def _run_timed(self) -> Report:
        """Execute and schedule every instruction, following every byte's provenance; the
        report."""
        module = self.module
        report, timeline = Report(), Timeline(len(self.sram))
        self._labels = Provenance(len(module.blob), len(self.dram), len(self.sram))
        self._proven, self._unproven, self._snapshots, self._results = set(), set(), {}, {}
        finish: dict[str, int] = {}
        for position, (op, index, *args) in enumerate(self._code):
            try:
                end = self._step(report, timeline, position, op, index, args)
            except _INCONSISTENT as error:
                raise self._inconsistent(position, index, error) from None
            name = module.layers[index].name
            finish[name] = max(finish.get(name, 0), end)
        tried = set(self._snapshots)  # layers computed whole: each tile was proven or not
        self._lean = tried - {key[0] for key in self._unproven}
        # not computed whole again: a layer none of whose tiles reads what its whole result
        # was computed from (a cascade's intermediate is never in DRAM), and a pooled
        # convolution (overlapping tiles) unless all of them do
        useful = {key[0] for key in self._proven}
        self._tiled = [i for i in self._tiled if i in (self._lean if i in self._pools else useful)]
        self._plan = self._plan_steps(self._proven_copies())
        self._labels, self._snapshots, self._results = None, {}, {}
        done = 0
        for name, stats in report.layers.items():  # in program order
            stats["cycles"] = max(0, finish[name] - done)
            done = max(done, finish[name])
        return report

    def _run_again(self) -> None:
        """Execute every instruction of a program that ran before, by its plan (`_plan`): its
        DMA views were checked and its timeline is known (neither depends on the data); EXECs
        check their SRAM operands as always, but for those proven to copy a slice of a whole
        layer's result (`_proven_copies`), which copy it."""
        layers, whole = self.module.layers, self._whole
        position = index = 0
        try:
            for position, index, target, source, args in self._plan:  # noqa: B007 (the error names it)
                if args is None:  # a DMA: checked views
                    target[...] = source
                    continue
                result = None
                if target is not None and index in whole:  # a proven copy
                    result = whole[index] or self._whole_again(index)
                if result:
                    target[...] = result[1][source]
                else:
                    self._exec(index, layers[index], *args)
        except _INCONSISTENT as error:
            raise self._inconsistent(position, index, error) from None

    def _plan_steps(self, copies: dict[int, tuple]) -> list[tuple]:
        """The steps of later runs, one per instruction that does anything: (position, layer,
        target, source, EXEC arguments): a DMA's checked views (arguments None), an EXEC's
        place and box where it is a proven copy (`copies`; else None, None), and its
        arguments."""
        plan = []
        for position, (op, index, *args) in enumerate(self._code):
            if op == EXEC:
                place_box = copies.get(position)
                target, source = (None, None) if place_box is None else place_box[::-1]
                plan.append((position, index, target, source, tuple(args)))
            elif self._dma[position] is not None:
                plan.append((position, index, *self._dma[position], None))
        return plan

    def _inconsistent(self, position: int, index: int, error: Exception) -> FormatError:
        return FormatError(
            f"instruction {position} (layer '{self.module.layers[index].name}') is "
            f"inconsistent with the program: {error}"
        )

    def _step(
        self, report: Report, timeline: Timeline, position: int, op: int, index: int, args
    ) -> int:
        """Execute one instruction; returns the cycle it ends."""
        layer = self.module.layers[index]
        stats = report.stats(layer.name, layer.kind)
        if op == LOAD:
            dram, sram, block, count, dram_stride, sram_stride = args[:6]
            self._copy(
                position, self.dram, dram, self.sram, sram, block, count, dram_stride, sram_stride
            )
            self._labels.load(dram, sram, block, count, dram_stride, sram_stride)
            cycles = dma_cycles(self.hw, block * count)
            span = (sram, sram + sram_stride * (count - 1) + block)
            end = timeline.schedule("dma", cycles, [], [span])
            stats["dma_cycles"] += cycles
            stats["dram_bytes"] += block * count
            report.dram_bytes += block * count
        elif op == STORE:
            sram, dram, block, count, sram_stride, dram_stride = args[:6]
            self._copy(
                position, self.sram, sram, self.dram, dram, block, count, sram_stride, dram_stride
            )
            self._labels.store(sram, dram, block, count, sram_stride, dram_stride)
            cycles = dma_cycles(self.hw, block * count)
            span = (sram, sram + sram_stride * (count - 1) + block)
            end = timeline.schedule("dma", cycles, [span], [])
            stats["dma_cycles"] += cycles
            stats["dram_bytes"] += block * count
            report.dram_bytes += block * count
        elif op == EXEC:
            reads, writes, cycles, macs = self._exec(index, layer, *args)
            r0, rows, ch0, chs, in_at, _, w_at, out_at = args
            copied = self._result_labels(index, (index, r0, rows, ch0, chs, in_at, w_at, out_at))
            for lo, hi in writes:
                self._labels.wrote(lo, hi, copied)
            end = timeline.schedule("compute", cycles, reads, writes)
            stats["compute_cycles"] += cycles
            stats["macs"] += macs
        else:
            raise FormatError(f"unknown opcode {op}")
        report.cycles = max(report.cycles, end)
        return end

    def _exec(self, index: int, layer: Layer, r0, rows, ch0, chs, in_at, in2_at, w_at, out_at):
        key = (index, r0, rows, ch0, chs, in_at, w_at, out_at)
        if key in self._slices and self._whole.get(index):
            result = self._whole_slice(index, layer, key, in2_at, *self._slices[key])
            if result is not None:
                return result
        if index in self._pools:
            return self._pooled_conv(index, layer, r0, rows, ch0, chs, in_at, w_at, out_at)
        tensors = self.module.tensors
        out_t = tensors[layer.output]
        x_t = tensors[layer.inputs[0]]
        if layer.kind in MOVES:
            box = self._sram_view(in_at, x_t.dtype, box_shape(layer, x_t.shape, ch0, ch0 + chs))
            y = np.ascontiguousarray(move_tile(layer, box, ch0, ch0 + chs))
            self._write_sram(out_at, y)
            cycles = self._exec_cycles(index, rows, chs)
            return [(in_at, in_at + box.nbytes)], [(out_at, out_at + y.nbytes)], cycles, 0
        c, h, w = x_t.shape
        # channelwise ops and concat parts hold the tile's channels only
        c = chs if layer.kind in CHANNELWISE or layer.kind == "concat" else c
        t0, t1 = tile_input_rows(layer, r0, r0 + rows, h, out_t.shape[1])
        held = self._sram_view(in_at, x_t.dtype, (c, t1 - t0, w))
        reads = [(in_at, in_at + held.nbytes)]
        i0, i1 = input_rows(layer, r0, r0 + rows, h)
        x = held[:, i0 - t0 : i1 - t0]
        compute = TILE_KINDS.get(layer.kind)
        if compute is None:
            raise FormatError(f"layer '{layer.name}': unknown kind '{layer.kind}'")
        operands = (r0, rows, ch0, chs, in_at, in2_at, w_at, held, x, t0, t1, i0, reads)
        tile = Tile(index, layer, key, *operands)
        y, macs, taken = compute(self, tile)
        y = np.asarray(y).astype(out_t.dtype, copy=False)
        self._write_sram(out_at, y)
        cycles = self._exec_cycles(index, rows, chs)
        result = tile.reads, [(out_at, out_at + y.nbytes)], cycles, macs
        if taken is not None:  # the tile's views, checked, for the next time it runs
            place = self.sram[out_at : out_at + y.nbytes].view(y.dtype).reshape(y.shape)
            self._slices[key] = (*taken, place, result)
        return result

    def _pooled_conv(self, index: int, layer: Layer, r0, rows, ch0, chs, in_at, w_at, out_at):
        """A convolution tile with a max pool in its output stage: output rows [r0, r0 + rows)
        of the pool, from the convolution rows they read (never stored: computed), or taken
        from the whole layer's pooled output where its operands are those it was computed
        from."""
        after, tensors = self._pools[index], self.module.tensors
        x_t, mid_t, out_t = (tensors[n] for n in (layer.inputs[0], layer.output, after.output))
        (c, h, w), (_, mh, mw) = x_t.shape, mid_t.shape
        m0, m1 = tile_input_rows(after, r0, r0 + rows, mh, out_t.shape[1])
        t0, t1 = tile_input_rows(layer, m0, m1, h, mh)
        held = self._sram_view(in_at, x_t.dtype, (c, t1 - t0, w))
        weights = layer.arrays["weights"]
        wq = self._sram_view(w_at, weights.dtype, (chs, *weights.shape[1:]))
        key = (index, r0, rows, ch0, chs, in_at, w_at, out_at)
        in_box = np.s_[:, t0:t1]
        whole = self._whole_conv(index, layer, held, in_at, in_box)
        if whole is not None and self._labels is not None:
            self._prove(key, in_box, weights)
        taken = None
        if whole is not None and (
            key in self._proven
            or (same_values(held, whole[0][in_box]) and same_values(wq, weights[ch0 : ch0 + chs]))
        ):
            box = np.s_[ch0 : ch0 + chs, r0 : r0 + rows]
            z, taken = whole[1][box], (held, in_box, wq, weights[ch0 : ch0 + chs], box)
        else:
            i0, i1 = input_rows(layer, m0, m1, h)
            x = held[:, i0 - t0 : i1 - t0]
            y = self._convolve(layer, x, wq, m0, m1 - m0, ch0, chs, i0, w, mw, mid_t.dtype)
            y = y.astype(mid_t.dtype, copy=False)
            p0, p1 = input_rows(after, r0, r0 + rows, mh)
            z = pool(after, y[:, p0 - m0 : p1 - m0], r0, rows, p0, mh, mw, out_t.shape[2], True)
        self._write_sram(out_at, z)
        timing = (index, r0, rows, chs)
        if timing not in self._cycles:
            shapes = mid_t.shape, out_t.shape
            cycles = conv_pool_cycles(self.hw, layer, after, rows, chs, m1 - m0, shapes)
            self._cycles[timing] = cycles
        reads = [(in_at, in_at + held.nbytes), (w_at, w_at + wq.nbytes)]
        macs = chs * (m1 - m0) * mw * math.prod(weights.shape[1:])
        result = reads, [(out_at, out_at + z.nbytes)], self._cycles[timing], macs
        if taken is not None:  # the tile's views, checked, for the next time it runs
            place = self.sram[out_at : out_at + z.nbytes].view(z.dtype).reshape(z.shape)
            self._slices[key] = (*taken, place, result)
        return result

    def _epilogue(self, layer: Layer, y: np.ndarray, in2_at: int, reads: list) -> np.ndarray:
        """A convolution tile's codes through its fused consumer (fusion.py): an Add with the
        other operand's tile at `in2_at`, or a Concat's requantization of this part."""
        after = self.module.layers[layer.attrs["epilogue"]]
        part = after.inputs.index(layer.output)
        if after.kind == "concat":
            a = after.attrs
            zp, m, r = a["x_zero_points"][part], a["multiplier"][part], a["shift"][part]
            return self._codes.rescaled(after, y, part, zp, m, r)
        other = self._sram_view(in2_at, self.module.tensors[after.inputs[1 - part]].dtype, y.shape)
        reads.append((in2_at, in2_at + other.nbytes))
        return self._codes.pairwise(after, *((y, other) if part == 0 else (other, y)))

    def _exec_cycles(self, index: int, rows: int, chs: int) -> int:
        key = (index, rows, chs)
        if key not in self._cycles:
            layer = self.module.layers[index]
            out, x = (self.module.tensors[n].shape for n in (layer.output, layer.inputs[0]))
            self._cycles[key] = exec_cycles(self.hw, layer, rows, chs, out, x)
        return self._cycles[key]


_INCONSISTENT = (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError)


def _blocks(memory: np.ndarray, at: int, block: int, count: int, stride: int) -> np.ndarray:
    """[count, block] view of `count` blocks `stride` bytes apart (a reshape where the last
    stride fits the memory, which is cheaper than as_strided)."""
    if stride >= block and at + count * stride <= len(memory):
        return memory[at : at + count * stride].reshape(count, stride)[:, :block]
    return np.lib.stride_tricks.as_strided(memory[at:], (count, block), (stride, 1))
