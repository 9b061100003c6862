"""What the TRIX simulator knows of a program regardless of its data: the timing (engine
availability and SRAM hazards), the report, and the layers whose tiles cover their output
exactly (computed whole).

Timing depends on the program only (addresses, sizes, cycles per instruction), never on the
data: the simulator schedules the instruction stream once and reuses the report for later runs.
"""

from dataclasses import dataclass, field

import numpy as np

from .codegen import Module
from .hardware import Hardware
from .lower import WINDOWED, Program
from .opcodes import EXEC
from .perf import roofline


@dataclass
class Report:
    cycles: int = 0
    dram_bytes: int = 0
    # name -> cycles (the layer's share of the total: from the previous layer's finish to its
    # own), compute_cycles and dma_cycles (engine busy time), dram_bytes, macs
    layers: dict[str, dict] = field(default_factory=dict)

    def stats(self, name: str, kind: str) -> dict:
        """Layer `name`'s entry, made empty on first use."""
        if name not in self.layers:
            counts = ("cycles", "compute_cycles", "dma_cycles", "dram_bytes", "macs")
            self.layers[name] = {"kind": kind, **dict.fromkeys(counts, 0)}
        return self.layers[name]

    def copy(self) -> "Report":
        return Report(self.cycles, self.dram_bytes, {k: dict(v) for k, v in self.layers.items()})

    def summary(self, hw: Hardware, module: Module) -> dict:
        program = Program(module.tensors, module.layers, module.inputs, module.outputs)
        bound = roofline(program, hw)
        seconds = self.cycles / (hw.clock_mhz * 1e6)
        return {
            "hardware": hw.name,
            "cycles": self.cycles,
            "milliseconds": round(seconds * 1e3, 4),
            "macs": bound["macs"],
            "mac_utilization": round(bound["macs"] / max(self.cycles * hw.macs_per_cycle, 1), 4),
            "dram_bytes": self.dram_bytes,
            "sram_peak_bytes": module.sram_peak,
            "arena_bytes": module.arena_bytes,
            "roofline_cycles": round(bound["cycles"]),
            "roofline_ratio": round(self.cycles / max(bound["cycles"], 1), 3),
            "layers": self.layers,
        }


class Timeline:
    """Engine availability and SRAM hazards, tracked per 16-byte granule: when each granule
    was last written and last read (the cycle the access ends)."""

    GRANULE = 16

    def __init__(self, sram_bytes: int):
        self.free = {"dma": 0, "compute": 0}
        granules = -(-sram_bytes // self.GRANULE)
        self.written = np.zeros(granules, np.int64)
        self.read = np.zeros(granules, np.int64)

    def _granules(self, lo: int, hi: int) -> slice:
        return slice(lo // self.GRANULE, -(-hi // self.GRANULE))

    def schedule(
        self, engine: str, cycles: int, reads: list[tuple[int, int]], writes: list[tuple[int, int]]
    ) -> int:
        """When `cycles` of work on `engine` end, started once the engine is free and its reads
        and writes (SRAM byte ranges) no longer conflict with earlier work."""
        start = self.free[engine]
        for lo, hi in reads:
            start = max(start, int(self.written[self._granules(lo, hi)].max(initial=0)))
        for lo, hi in writes:
            span = self._granules(lo, hi)
            start = max(start, int(self.read[span].max(initial=0)))
            start = max(start, int(self.written[span].max(initial=0)))
        end = start + cycles
        self.free[engine] = end
        for lo, hi in reads:
            span = self.read[self._granules(lo, hi)]
            np.maximum(span, end, out=span)
        for lo, hi in writes:
            self.written[self._granules(lo, hi)] = end
        return end


def exactly_tiled(module: Module) -> list[int]:
    """The convolutions, pools and elementwise layers of two same-shape tensors whose EXEC
    tiles cover every output element exactly once (not a convolution with a pool epilogue:
    its tiles are the pool's)."""
    code = module.code
    execs = code[code[:, 0] == EXEC].astype(np.int64)
    tiled = []
    for index, layer in enumerate(module.layers):
        tiles = execs[execs[:, 1] == index]
        pair = layer.kind in ("add", "mul") and "operand" not in layer.arrays
        after = module.layers[layer.attrs["epilogue"]] if "epilogue" in layer.attrs else None
        if after is not None and after.kind == "maxpool":
            continue
        if not len(tiles) or not (
            layer.kind in WINDOWED or (pair and layer.attrs.get("vector_index") is None)
        ):
            continue
        m, oh, _ = module.tensors[layer.output].shape
        r0, rows, ch0, chs = tiles[:, 2:6].T
        if (r0 + rows > oh).any() or (ch0 + chs > m).any():
            continue
        covered = np.zeros((m, oh), np.int32)
        for r, n, c, k in zip(r0.tolist(), rows.tolist(), ch0.tolist(), chs.tolist()):
            covered[c : c + k, r : r + n] += 1
        if (covered == 1).all():
            tiled.append(index)
    return tiled
