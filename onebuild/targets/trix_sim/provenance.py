"""Where the bytes of SRAM and DRAM came from during a run of a TRIX program, to prove
operand equalities once instead of comparing values on every run.

Every byte carries a label: DRAM byte a starts as a (the constant blob keeps it: no program
may store into it), SRAM byte s as -1 - s, and each byte an EXEC writes gets a fresh label.
DMA transfers copy labels as they copy bytes. Two regions with equal labels hold equal bytes,
whatever the data: labels follow only from the instruction stream, which is the same on every
run. So an EXEC whose operands carry the labels of what the simulator's whole-layer result was
computed from (`Simulator._whole_conv`) takes its slice of that result on later runs without
comparing them.
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

    def _dram(self, index: np.ndarray) -> np.ndarray:
        inside = index >= self.blob
        labels = index.copy()
        labels[inside] = self.arena[index[inside] - self.blob]
        return labels

    def load(self, dram: int, sram: int, block: int, count: int, dram_stride: int, sram_stride):
        """A LOAD of `count` blocks of `block` bytes (a checked, in-range transfer)."""
        self.sram[_spans(sram, block, count, sram_stride)] = self._dram(
            _spans(dram, block, count, dram_stride)
        )

    def store(self, sram: int, dram: int, block: int, count: int, sram_stride, dram_stride):
        """A STORE of `count` blocks of `block` bytes (a checked, in-range transfer)."""
        index = _spans(dram, block, count, dram_stride)
        if index.size and int(index.min()) < self.blob:
            self.valid = False
            return
        self.arena[index - self.blob] = self.sram[_spans(sram, block, count, sram_stride)]

    def wrote(self, lo: int, hi: int) -> None:
        """An EXEC wrote SRAM bytes [lo, hi)."""
        self.sram[lo:hi] = np.arange(self.fresh, self.fresh + hi - lo)
        self.fresh += hi - lo

    def of_sram(self, at: int, nbytes: int) -> np.ndarray:
        return self.sram[at : at + nbytes].copy()

    def of_dram(self, at: int, nbytes: int) -> np.ndarray:
        return self._dram(np.arange(at, at + nbytes, dtype=np.int64))

    def holds(self, at: int, labels: np.ndarray) -> bool:
        """Whether SRAM from `at` holds bytes with these labels (in C order)."""
        return self.valid and bool(np.array_equal(self.sram[at : at + labels.size], labels.ravel()))

    def holds_blob(self, at: int, nbytes: int, blob_at: int) -> bool:
        """Whether SRAM [at, at + nbytes) holds the constant bytes from blob offset `blob_at`."""
        expected = np.arange(blob_at, blob_at + nbytes, dtype=np.int64)
        return blob_at + nbytes <= self.blob and self.holds(at, expected)


def _spans(at: int, block: int, count: int, stride: int) -> np.ndarray:
    """Byte addresses of `count` blocks of `block` bytes `stride` apart, in order."""
    return (at + stride * np.arange(count, dtype=np.int64)[:, None] + np.arange(block)).ravel()
