"""Where the bytes of SRAM and DRAM came from during a run of a TRIX program, to prove
operand equalities once instead of comparing values on every run.

Every byte carries a label: DRAM byte a starts as a (the constant blob keeps it: no program
may store into it), SRAM byte s as -1 - s, and each byte an EXEC writes gets a fresh label.
DMA transfers copy labels as they copy bytes. Two regions with equal labels hold equal bytes,
whatever the data: labels follow only from the instruction stream, which is the same on every
run. So an EXEC whose operands carry the labels of what the simulator's whole-layer result was
computed from (`Simulator._whole_conv`) takes its slice of that result on later runs without
comparing them. An EXEC proven to copy a slice of a whole layer's result writes that slice's
labels (`reserve`), so a layer whose input is such copies (a cascade's intermediate, never in
DRAM) is computed whole from that result, its tiles proven to read it.
"""

import numpy as np


class Provenance:
    def __init__(self, blob_bytes: int, dram_bytes: int, sram_bytes: int):
        self.blob = blob_bytes
        self.arena = np.arange(
            blob_bytes, dram_bytes, dtype=np.int64
        )  # labels of DRAM past the blob
        self.sram = -1 - np.arange(sram_bytes, dtype=np.int64)
        self.fresh = dram_bytes  # the next unused label
        self.valid = True  # False once a STORE writes the blob: nothing is then proved

    def _dram(self, at: int, block: int, count: int, stride: int) -> np.ndarray:
        """Labels of a DRAM transfer's bytes: a view of the arena's, or the blob's own."""
        if at >= self.blob:
            return _region(self.arena, at - self.blob, block, count, stride)
        index = at + stride * np.arange(count, dtype=np.int64)[:, None] + np.arange(block)
        if count == 1 or block == stride:
            index = index.reshape(-1)
        if at + stride * (count - 1) + block > self.blob:  # reaching past the blob
            inside = index >= self.blob
            index[inside] = self.arena[index[inside] - self.blob]
        return index

    def load(self, dram: int, sram: int, block: int, count: int, dram_stride: int, sram_stride):
        """A LOAD of `count` blocks of `block` bytes (a checked, in-range transfer)."""
        place = _region(self.sram, sram, block, count, sram_stride)
        place[...] = self._dram(dram, block, count, dram_stride).reshape(place.shape)

    def store(self, sram: int, dram: int, block: int, count: int, sram_stride, dram_stride):
        """A STORE of `count` blocks of `block` bytes (a checked, in-range transfer)."""
        if dram < self.blob:
            self.valid = False
            return
        place = _region(self.arena, dram - self.blob, block, count, dram_stride)
        place[...] = _region(self.sram, sram, block, count, sram_stride).reshape(place.shape)

    def wrote(self, lo: int, hi: int, labels: np.ndarray | None = None) -> None:
        """An EXEC wrote SRAM bytes [lo, hi): fresh bytes, or those `labels` name (bytes of a
        whole layer's result, `reserve`, that the EXEC copies)."""
        if labels is None:
            self.sram[lo:hi] = np.arange(self.fresh, self.fresh + hi - lo)
            self.fresh += hi - lo
        else:
            self.sram[lo:hi] = labels.reshape(-1)

    def reserve(self, shape: tuple) -> np.ndarray:
        """Fresh labels for the bytes of a result the simulator keeps (a whole layer's
        output), in C order: EXECs that copy parts of it write those parts' labels."""
        labels = np.arange(self.fresh, self.fresh + int(np.prod(shape)), dtype=np.int64)
        self.fresh += labels.size
        return labels.reshape(shape)

    def of_sram(self, at: int, nbytes: int) -> np.ndarray:
        return self.sram[at : at + nbytes].copy()

    def of_dram(self, at: int, nbytes: int) -> np.ndarray:
        return self._dram(at, nbytes, 1, nbytes).copy()

    def holds(self, at: int, labels: np.ndarray) -> bool:
        """Whether SRAM from `at` holds bytes with these labels (in C order)."""
        return self.valid and bool(np.array_equal(self.sram[at : at + labels.size], labels.ravel()))

    def holds_blob(self, at: int, nbytes: int, blob_at: int) -> bool:
        """Whether SRAM [at, at + nbytes) holds the constant bytes from blob offset `blob_at`."""
        expected = np.arange(blob_at, blob_at + nbytes, dtype=np.int64)
        return blob_at + nbytes <= self.blob and self.holds(at, expected)


def _region(labels: np.ndarray, at: int, block: int, count: int, stride: int) -> np.ndarray:
    """A view of `count` blocks of `block` labels `stride` apart: one run where they are
    contiguous, else [count, block]."""
    if count == 1 or block == stride:
        return labels[at : at + count * block]
    step = labels.strides[0]
    return np.lib.stride_tricks.as_strided(labels[at:], (count, block), (stride * step, step))
