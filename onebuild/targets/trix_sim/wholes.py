"""Whole-layer execution of the TRIX simulator: a convolution (or an elementwise layer of two
same-shape tensors) whose EXEC tiles cover its output is computed once, and each tile takes
its slice only where its SRAM operands are proven (provenance.py) or seen to be the slices
the whole result was computed from; elsewhere it computes alone. A mixin of `Simulator`,
whose state it uses (module, memories, caches, provenance)."""

import numpy as np

from .codegen import EXEC
from .exact import all_codes, row_l1, row_norm, same_values
from .lower import Layer, input_rows
from .whole_conv import whole_convolution
from .windows import pool

WEIGHTS32_BUDGET = 1 << 29  # bytes of float32 weights a simulator keeps between runs


class WholeLayers:
    def _whole_slice(
        self, index: int, layer, key, in2_at, held, in_box, wq, w_ref, box, place, result
    ):
        """A convolution tile that took its slice of the whole layer before, by its kept views:
        the same operand checks, the same slice (through its epilogue, if fused) written to the
        same place."""
        x, y, mapped = self._whole[index]
        if key in self._proven or (same_values(held, x[in_box]) and same_values(wq, w_ref)):
            tile = y[box]
            if "epilogue" in layer.attrs and not mapped:
                tile = self._epilogue(layer, tile, in2_at, [])
            place[...] = tile
            return result
        return None

    def _proven_copies(self) -> dict[int, tuple]:
        """Position -> (box, place) of each EXEC, after a first run, that is proven to take
        slice `box` of its whole layer's result (`_prove`) and writes it to SRAM view `place`
        as it is (no epilogue, or one applied to the whole: a concat part, a max pool): a copy
        on later runs, once the layer's first tile computed the whole result (its checks are
        those of the first run: addresses and provenance do not depend on the data)."""
        copies = {}
        for position, (op, index, r0, rows, ch0, chs, in_at, _, w_at, out_at) in enumerate(
            self._code
        ):
            key = (index, r0, rows, ch0, chs, in_at, w_at, out_at)
            if op == EXEC and self._copied_box(key) is not None:
                *_, box, place, _ = self._slices[key]
                copies[position] = (box, place)
        return copies

    def _prove(self, key: tuple, in_box: tuple, weights) -> None:
        """Record EXEC `key` as proven if the labels of its SRAM operands are those of the
        input rows its layer's whole result was computed from and of its weights in the
        blob."""
        index, _, _, ch0, chs, in_at, w_at, _ = key
        snapshot = self._snapshots[index]
        if weights is None:  # a pool
            blob = True
        else:
            per_channel = weights[0].nbytes
            blob_at = self.module.arrays[(index, "weights")] + ch0 * per_channel
            blob = self._labels.holds_blob(w_at, chs * per_channel, blob_at)
        if blob and self._labels.holds(in_at, snapshot[in_box]):
            self._proven.add(key)
        else:
            self._unproven.add(key)

    def _whole_conv(self, index: int, layer: Layer, held: np.ndarray, in_at, in_box: tuple):
        """(input codes, output codes, whether those went through its epilogue) of the whole
        convolution, computed at its first tile if its tiles cover its output exactly; None
        otherwise (`_whole_input`). A concat epilogue or a max pool (which read nothing else)
        is applied to the whole output once: a pooled convolution's output codes are its
        pool's."""
        if index not in self._whole:
            return None
        if self._whole[index] is None:
            x, i0, i1 = self._whole_input(index, layer, held, in_at, in_box)
            if x is None:  # its source was not computed whole
                return None
            out_t = self.module.tensors[layer.output]
            m, oh, ow = out_t.shape
            weights = self._weights32.get(index)
            if weights is None:  # constants of the program: kept up to a memory budget
                weights = layer.arrays["weights"].astype(np.float32)
                if sum(a.nbytes for a in self._weights32.values()) < WEIGHTS32_BUDGET:
                    self._weights32[index] = weights
                    matrix = weights.reshape(m, -1)
                    self._norms[index] = (row_norm(matrix), row_l1(matrix))
            norms = self._norms.get(index)
            whole = (0, oh, 0, m, i0, x.shape[2], ow, out_t.dtype)
            if index not in self._parts:
                self._parts[index] = self._part_table(layer)
            concat, table = self._parts[index]
            if index not in self._plans and self._labels is None:  # prepared on a later run
                l1 = None if norms is None else norms[1]
                shape, codes = out_t.shape, x.dtype
                plan = whole_convolution(layer, weights, l1, codes, shape, out_t.dtype, table)
                self._plans[index] = plan
            if self._plans.get(index) is not None:
                y = self._plans[index](x[:, i0:i1])
            else:
                y = self._convolve(layer, x[:, i0:i1], weights, *whole, norms=norms, table=table)
            y = y.astype(out_t.dtype, copy=False)
            if index in self._pools:  # the max pool of its output stage, over all of it
                y, concat = self._whole_pool(self._pools[index], y), True
            self._whole[index] = (x, y, concat)
        return self._whole[index]

    def _whole_again(self, index: int):
        """On a later run, the whole result of a layer computed whole before, computed where
        its first tile would (a proven copy: where its input is, is known), or None."""
        layer = self.module.layers[index]
        if layer.kind == "conv":
            return self._whole_conv(index, layer, None, None, None)
        return self._whole_pooling(index, layer, None, None, None)

    def _whole_pooling(self, index: int, layer: Layer, held: np.ndarray, in_at, in_box: tuple):
        """(input codes, output codes, True) of a whole max or average pool whose tiles cover
        its output exactly, computed at its first tile (`_whole_input`); None otherwise."""
        if index not in self._whole:
            return None
        if self._whole[index] is None:
            x, _, _ = self._whole_input(index, layer, held, in_at, in_box)
            if x is None:  # its source was not computed whole
                return None
            y = self._whole_pool(layer, x)
            y = y.astype(self.module.tensors[layer.output].dtype, copy=False)
            self._whole[index] = (x, y, True)
        return self._whole[index]

    def _whole_input(self, index: int, layer: Layer, held, in_at, in_box: tuple | None):
        """The whole input of a windowed layer at its first tile (`held` at SRAM `in_at`: box
        `in_box` of that input, all channels or the tile's; on later runs None, as where it
        was is known), and the rows [i0, i1) its output reads: the whole result of the layer
        whose copies the tile holds (`_source`), else the tensor in SRAM (a whole-height
        tile) or in DRAM; a copy unless every tile's operands are proven to be it (`_prove`)."""
        x_t = self.module.tensors[layer.inputs[0]]
        c, h, w = x_t.shape
        i0, i1 = input_rows(layer, 0, self.module.tensors[layer.output].shape[1], h)
        if index in self._sources:
            producer = self._whole.get(self._sources[index])
            return producer[1] if producer else None, i0, i1
        nbytes = c * h * w * np.dtype(x_t.dtype).itemsize
        if index not in self._places:  # the first run
            whole_height = in_box == np.s_[:, 0:h]  # the tensor as this layer reads it, in SRAM
            if not whole_height and self._source(index, held, in_at, in_box):
                return self._whole_input(index, layer, held, in_at, in_box)
            self._places[index] = self._place(x_t.name, nbytes, in_at, in_box, whole_height)
        at, in_sram = self._places[index]
        memory = self.sram if in_sram else self.dram
        x = memory[at : at + nbytes].view(x_t.dtype).reshape(c, h, w)
        if self._labels is not None:
            labels = self._labels.of_sram if in_sram else self._labels.of_dram
            self._snapshots[index] = labels(at, nbytes).reshape(c, h, -1)
        return (x if index in self._lean else x.copy()), i0, i1

    def _place(self, name: str, nbytes: int, in_at: int, in_box: tuple, whole_height: bool):
        """(address, in SRAM) of a layer's whole input tensor `name`, from its first tile: the
        SRAM tile where it holds all of it, else the tensor in DRAM, unless the tile holds
        whole rows of some of its channels that did not come from there (the tensor stays in
        SRAM: it starts that many channels before the tile)."""
        dram_at = self.module.dram[name]
        if whole_height:
            return in_at, True
        c, h, _ = self.module.tensors[name].shape
        c0, per_channel = in_box[0].start or 0, nbytes // c
        at = in_at - c0 * per_channel
        if in_box[1] != slice(0, h) or at < 0 or at + nbytes > len(self.sram):
            return dram_at, False
        channels = len(range(c)[in_box[0]])
        loaded = self._labels.of_dram(dram_at + c0 * per_channel, channels * per_channel)
        return (dram_at, False) if self._labels.holds(in_at, loaded) else (at, True)

    def _source(self, index: int, held: np.ndarray, in_at: int, in_box: tuple) -> bool:
        """On the first run, whether a layer's first tile holds box `in_box` of another
        layer's whole result as copies of it (`_result_labels`: a cascade's intermediate,
        never in DRAM); then that layer is its source (`_sources`)."""
        shape = self.module.tensors[self.module.layers[index].inputs[0]].shape
        for producer, labels in self._results.items():
            y = self._whole[producer][1]
            if (
                y.shape == shape
                and y.dtype == held.dtype
                and self._labels.holds(in_at, labels[in_box])
            ):
                self._sources[index], self._snapshots[index] = producer, labels
                return True
        return False

    def _result_labels(self, index: int, key: tuple):
        """On the first run, the labels of the part of layer `index`'s whole result that EXEC
        `key` writes as it is (`_copied_box`; the result's labels made on first use), or
        None."""
        box = self._copied_box(key)
        if box is None:
            return None
        if index not in self._results:
            y = self._whole[index][1]
            self._results[index] = self._labels.reserve((*y.shape[:2], y.shape[2] * y.itemsize))
        return self._results[index][box]

    def _copied_box(self, key: tuple):
        """The box of its whole layer's result that EXEC `key` writes as it is, if it is
        proven to (`_prove`) and the result needs nothing more (no epilogue, or one applied
        to the whole: a concat part, a max pool); else None."""
        index = key[0]
        if key not in self._proven or key not in self._slices:
            return None
        if "epilogue" in self.module.layers[index].attrs and not self._whole[index][2]:
            return None
        return self._slices[key][4]

    def _whole_pool(self, after: Layer, y: np.ndarray) -> np.ndarray:
        """The whole output of pool `after` (max or average) from its whole input `y`."""
        _, mh, mw = y.shape
        _, oh, ow = self.module.tensors[after.output].shape
        p0, p1 = input_rows(after, 0, oh, mh)
        maximum = after.kind == "maxpool"
        return pool(after, y[:, p0:p1], 0, oh, p0, mh, mw, ow, maximum=maximum)

    def _part_table(self, layer: Layer) -> tuple[bool, np.ndarray | None]:
        """Whether a convolution's epilogue is a concat part (which reads nothing else: it
        applies to the whole output at once), and that part's codes by the bits of the
        convolution's output codes (None where every code maps to itself); not where the
        part's rescale is not one for every channel."""
        if "epilogue" not in layer.attrs:
            return False, None
        after = self.module.layers[layer.attrs["epilogue"]]
        part = after.inputs.index(layer.output) if after.kind == "concat" else None
        a = after.attrs
        if part is None or any(
            np.ndim(a[k][part]) for k in ("x_zero_points", "multiplier", "shift")
        ):
            return False, None
        codes = all_codes(self.module.tensors[layer.output].dtype)
        mapped = self._epilogue(layer, codes, 0, [])
        same = mapped.dtype == codes.dtype and np.array_equal(mapped, codes)
        return True, None if same else mapped

    def _whole_pair(self, index: int, layer: Layer, tiles, ats, ch0: int, r0: int):
        """The whole output of an elementwise layer of two same-shape tensors, if its tiles
        cover its output exactly and both operand tiles equal the slices it was computed from.
        Each operand tensor is found at the first tile: in DRAM, or (a whole-height tile) in
        SRAM where the tile's channels sit in the tensor kept there."""
        if index not in self._whole:
            return None
        if self._whole[index] is None:
            operands = [
                self._find_tensor(n, t, at, ch0, r0) for n, t, at in zip(layer.inputs, tiles, ats)
            ]
            if any(o is None for o in operands):
                self._whole[index] = False
            else:
                y = self._codes.pairwise(layer, *operands)
                self._whole[index] = (*operands, y)
        if self._whole[index] is False:
            return None
        *operands, y = self._whole[index]
        box = np.s_[ch0 : ch0 + len(tiles[0]), r0 : r0 + tiles[0].shape[1]]
        if all(same_values(t, o[box]) for t, o in zip(tiles, operands)):
            return y
        return None

    def _find_tensor(self, name: str, tile: np.ndarray, at: int, ch0: int, r0: int):
        """A copy of tensor `name` whose slice at (ch0, r0) equals `tile`: from the SRAM copy
        the tile is part of (whole-height tiles), else from DRAM; None if neither matches."""
        t = self.module.tensors[name]
        c, h, w = t.shape
        places = [(self.dram, self.module.dram[name])]
        if tile.shape[1] == h:
            places.insert(0, (self.sram, at - ch0 * tile[0].nbytes))
        for memory, base in places:
            if base >= 0 and base + t.nbytes <= len(memory):
                whole = memory[base : base + t.nbytes].view(t.dtype).reshape(c, h, w)
                if np.array_equal(whole[ch0 : ch0 + len(tile), r0 : r0 + tile.shape[1]], tile):
                    return whole.copy()
        return None
