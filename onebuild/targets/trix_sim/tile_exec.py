"""What one EXEC computes, by layer kind (data moves aside: moves.py): `TILE_KINDS` maps each
kind to the method computing its tile. A mixin of `Simulator`, whose SRAM, caches and
whole-layer results (wholes.py) it uses; each method returns the tile's codes, its
multiply-accumulates and, for a tile that took its slice of a whole-layer result, the views
to take it by again (else None)."""

import math
from dataclasses import dataclass

import numpy as np

from ...graph_ir.ops.quantized_softmax import integer_softmax
from .convolve import requant_channels
from .exact import exact_dot, product_bound, same_values
from .lower import Layer
from .windows import pool

_NOTHING = np.zeros(0, np.uint8)  # the weights of a layer that has none (a pool's tile)


@dataclass(slots=True)
class Tile:
    """One EXEC's operands: output rows [r0, r0 + rows) of channels [ch0, ch0 + chs); `held`
    the input rows [t0, t1) in SRAM at in_at, `x` those the tile reads (from i0); `reads` the
    SRAM ranges it reads (each kind adds or replaces its own)."""

    index: int
    layer: Layer
    key: tuple
    r0: int
    rows: int
    ch0: int
    chs: int
    in_at: int
    in2_at: int
    w_at: int
    held: np.ndarray
    x: np.ndarray
    t0: int
    t1: int
    i0: int
    reads: list


class TileKinds:
    def _conv_tile(self, t: Tile):
        layer, held, key = t.layer, t.held, t.key
        out_t = self.module.tensors[layer.output]
        weights = layer.arrays["weights"]
        shape = (t.chs, *weights.shape[1:])
        wq = self._sram_view(t.w_at, weights.dtype, shape)
        t.reads.append((t.w_at, t.w_at + wq.nbytes))
        in_box = np.s_[:, t.t0 : t.t1]
        whole = self._whole_conv(t.index, layer, held, t.in_at, in_box)
        if whole is not None and self._labels is not None:
            self._prove(key, in_box, weights)
        after, taken = "epilogue" in layer.attrs, None
        if whole is not None and (
            key in self._proven
            or (
                same_values(held, whole[0][in_box])
                and same_values(wq, weights[t.ch0 : t.ch0 + t.chs])
            )
        ):
            box = np.s_[t.ch0 : t.ch0 + t.chs, t.r0 : t.r0 + t.rows]
            y, after = whole[1][box], after and not whole[2]
            if len(layer.inputs) == 1:  # the views below (and an epilogue's) are all it reads
                taken = (held, in_box, wq, weights[t.ch0 : t.ch0 + t.chs], box)
        else:
            w = held.shape[2]
            tile = (t.r0, t.rows, t.ch0, t.chs, t.i0, w, out_t.shape[2], out_t.dtype)
            y = self._convolve(layer, t.x, wq, *tile)
        macs = y.size * math.prod(weights.shape[1:])
        if after:
            y = self._epilogue(layer, y, t.in2_at, t.reads)
        return y, macs, taken

    def _gemm_tile(self, t: Tile):
        """Rows [r0, r0 + rows) of the input ([rows, K] at in_at) times the chunk's weights:
        the output tile [rows, chs]."""
        layer, chs = t.layer, t.chs
        tensors = self.module.tensors
        weights = layer.arrays["weights"]
        k = weights.shape[1]
        xq = self._sram_view(t.in_at, tensors[layer.inputs[0]].dtype, (t.rows, k))
        xv = xq.astype(np.int64) - layer.attrs["x_zero_point"]
        wq = self._sram_view(t.w_at, weights.dtype, (chs, k))
        t.reads[:] = [(t.in_at, t.in_at + xq.nbytes), (t.w_at, t.w_at + wq.nbytes)]
        bound = product_bound(xq.dtype, wq.dtype)
        acc = exact_dot(wq, xv.T, bound)  # [chs, rows]
        out_dtype = tensors[layer.output].dtype
        y = requant_channels(
            layer, acc[:, :, None], t.ch0, chs, k * bound, out_dtype, self._scalings
        )
        return np.ascontiguousarray(y[:, :, 0].T), chs * k * t.rows, None

    def _pair_tile(self, t: Tile):
        """Add or Mul: with a constant operand per channel (or per row), else of two tensors
        (the second one a per-channel vector where `vector_index` says so)."""
        layer, x, ch0, chs = t.layer, t.x, t.ch0, t.chs
        if "operand" in layer.arrays:  # one code per channel, or per row (`const_axis`)
            const = layer.arrays["operand"][ch0 : ch0 + chs, None, None]
            if layer.attrs.get("const_axis"):
                const = layer.arrays["operand"][None, t.r0 : t.r0 + t.rows, None]
            pair = (const, x) if layer.attrs["const_index"] == 0 else (x, const)
            return self._codes.pairwise(layer, *pair), 0, None
        b_t, vector = self.module.tensors[layer.inputs[1]], layer.attrs.get("vector_index")
        shape = x.shape if vector is None else (chs if b_t.shape[0] > 1 else 1, 1, 1)
        b = self._sram_view(t.in2_at, b_t.dtype, shape)
        t.reads.append((t.in2_at, t.in2_at + b.nbytes))
        whole = self._whole_pair(t.index, layer, (x, b), (t.in_at, t.in2_at), ch0, t.r0)
        if whole is not None:
            return whole[ch0 : ch0 + chs, t.r0 : t.r0 + t.rows], 0, None
        return self._codes.pairwise(layer, *((b, x) if vector == 0 else (x, b))), 0, None

    def _pool_tile(self, t: Tile):
        layer, held, key = t.layer, t.held, t.key
        in_box = np.s_[t.ch0 : t.ch0 + t.chs, t.t0 : t.t1]  # the tile holds its channels only
        whole = self._whole_pooling(t.index, layer, held, t.in_at, in_box)
        if whole is not None and self._labels is not None:
            self._prove(key, in_box, None)
        if whole is not None and (key in self._proven or same_values(held, whole[0][in_box])):
            box = np.s_[t.ch0 : t.ch0 + t.chs, t.r0 : t.r0 + t.rows]
            return whole[1][box], 0, (held, in_box, _NOTHING, _NOTHING, box)
        h, w = self.module.tensors[layer.inputs[0]].shape[1:]
        ow = self.module.tensors[layer.output].shape[2]
        maximum = layer.kind == "maxpool"
        return pool(layer, t.x, t.r0, t.rows, t.i0, h, w, ow, maximum=maximum), 0, None

    def _lookup_tile(self, t: Tile):
        table, x, chs = t.layer.arrays["table"], t.x, t.chs
        rank = x.astype(np.int64) - np.iinfo(x.dtype).min  # each code's row in the table
        if table.ndim == 2:  # one table per channel: the tile's rows, at w_at
            codes = self._sram_view(t.w_at, table.dtype.name, (chs, table.shape[1]))
            t.reads.append((t.w_at, t.w_at + codes.nbytes))
            return codes[np.arange(chs)[:, None, None], rank], 0, None
        codes = self._sram_view(0, table.dtype.name, table.shape)
        t.reads.append((0, table.nbytes))
        return codes[rank], 0, None

    def _softmax_tile(self, t: Tile):
        table = self._sram_view(0, "int32", t.layer.arrays["table"].shape)
        t.reads.append((0, table.nbytes))
        y = integer_softmax(t.x, table, 0, t.layer.attrs)[t.ch0 : t.ch0 + t.chs]  # over channels
        return y, 0, None

    def _requant_tile(self, t: Tile):
        a = t.layer.attrs
        y = self._codes.rescaled(t.layer, t.x, 0, a["x_zero_point"], a["multiplier"], a["shift"])
        return y, 0, None

    def _concat_tile(self, t: Tile):
        """One part of a concat (`in2_at` holds its input's index): that input's tile at in_at
        requantized to the output's codes."""
        layer, a, part = t.layer, t.layer.attrs, t.in2_at
        w = t.held.shape[2]
        x = self._sram_view(
            t.in_at, self.module.tensors[layer.inputs[part]].dtype, (t.chs, t.rows, w)
        )
        t.reads[:] = [(t.in_at, t.in_at + x.nbytes)]
        zp, m, r = a["x_zero_points"][part], a["multiplier"][part], a["shift"][part]
        return self._codes.rescaled(layer, x, part, zp, m, r), 0, None


TILE_KINDS = {
    "conv": TileKinds._conv_tile,
    "gemm": TileKinds._gemm_tile,
    "add": TileKinds._pair_tile,
    "mul": TileKinds._pair_tile,
    "maxpool": TileKinds._pool_tile,
    "avgpool": TileKinds._pool_tile,
    "lookup": TileKinds._lookup_tile,
    "softmax": TileKinds._softmax_tile,
    "requant": TileKinds._requant_tile,
    "concat": TileKinds._concat_tile,
}
