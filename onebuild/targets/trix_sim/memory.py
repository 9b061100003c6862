"""Memory planning from liveness: the DRAM activation arena and the SRAM-resident tensors.

A tensor lives from the layer that produces it to its last reader; Reshape outputs alias their
input, the output of a convolution with a fused epilogue its consumer's output (one root
tensor, which lives from its first writer). Both plans place root tensors first-fit in the
space left free by the tensors already placed whose lifetimes overlap.
"""

from collections.abc import Callable
from dataclasses import dataclass

from .fusion import destination, pooled, touched
from .lower import Layer, Program
from .opcodes import align


@dataclass
class Liveness:
    root: dict[str, str]  # tensor -> the tensor whose bytes it uses (itself, or a Reshape source)
    first: dict[str, int]  # root -> producing layer (-1 for model inputs)
    last: dict[str, int]  # root -> last reading layer (len(layers) for model outputs)

    def span(self, root: str) -> tuple[int, int]:
        return self.first[root], self.last.get(root, self.first[root])


def liveness(program: Program, together: dict[int, int] | None = None) -> Liveness:
    """Lifetimes of root tensors; `together` maps a layer to the next one when the two run
    together (cascade.py): the first one's inputs live until the second's, whose output lives
    from the first's."""
    root = {name: name for name in program.inputs}
    for layer in program.layers:
        # a fused convolution's output is never stored: its bytes are its consumer's (but for
        # a pool's, which is smaller, where the output keeps bytes of its own)
        own = layer.output if pooled(program, layer) else destination(program, layer)[0]
        root[layer.output] = root[layer.inputs[0]] if layer.kind == "reshape" else own
    first = {name: -1 for name in program.inputs}
    last: dict[str, int] = {}
    for index, layer in enumerate(program.layers):
        first.setdefault(root[layer.output], index)
        for name in layer.inputs:
            last[root[name]] = index
    for name in program.outputs:
        last[root[name]] = len(program.layers)
    for one, other in (together or {}).items():
        for name in program.layers[one].inputs:
            last[root[name]] = max(last[root[name]], other)
        output = root[program.layers[other].output]
        first[output] = min(first[output], one)
    return Liveness(root, first, last)


def _first_fit(placed: list[tuple[int, int, int, int]], lo: int, hi: int, size: int) -> int:
    """The lowest offset where `size` bytes are free during layers [lo, hi]."""
    busy = sorted((o, s) for o, s, f, la in placed if not (la < lo or f > hi))
    offset = 0
    for o, s in busy:
        if offset + size <= o:
            break
        offset = max(offset, o + s)
    return offset


def plan_arena(
    program: Program, best_fit: bool, together: dict[int, int] | None = None
) -> tuple[dict[str, int], int]:
    """DRAM arena offsets of every tensor and the arena size. `best_fit` places the largest
    tensors first (smaller arena); otherwise tensors are placed in the order they appear.
    `together`: layers run with the next one (see `liveness`)."""
    live = liveness(program, together)
    sizes = {r: program.tensors[r].nbytes for r in set(live.root.values())}
    order = (
        sorted(sizes, key=lambda r: (-sizes[r], live.first[r], r))
        if best_fit
        else sorted(sizes, key=lambda r: (live.first[r], r))
    )
    placed: list[tuple[int, int, int, int]] = []  # offset, size, first, last
    offsets, total = {}, 0
    for name in order:
        (lo, hi), size = live.span(name), align(sizes[name])
        offset = _first_fit(placed, lo, hi, size)
        placed.append((offset, size, lo, hi))
        offsets[name] = offset
        total = max(total, offset + size)
    return {name: offsets[live.root[name]] for name in live.root}, total


def plan_residency(
    program: Program, budget: int, fits: Callable[[Layer], bool]
) -> tuple[dict[str, int], list[int]]:
    """Tensors kept in SRAM from producer to last reader instead of round-tripping through
    DRAM: offsets inside a pool of `budget` bytes, for every tensor (aliases included), and the
    pool bytes in use at each layer. Model inputs and outputs stay in DRAM; a tensor is kept
    only if every layer that touches it `fits` (can run on whole-height tiles)."""
    live = liveness(program)
    io = {live.root[n] for n in [*program.inputs, *program.outputs]}
    touching: dict[str, list[Layer]] = {}
    for index, layer in enumerate(program.layers):
        if layer.kind != "reshape":
            for name in touched(program, index):
                touching.setdefault(live.root[name], []).append(layer)
    candidates = [
        r
        for r in set(live.root.values()) - io
        if all(map(fits, touching.get(r, []))) and align(program.tensors[r].nbytes) <= budget
    ]

    def place(order: list[str]) -> tuple[list[tuple[int, int, int, int]], dict[str, int]]:
        placed, offsets = [], {}
        for name in order:
            (lo, hi), size = live.span(name), align(program.tensors[name].nbytes)
            offset = _first_fit(placed, lo, hi, size)
            if offset + size <= budget:
                placed.append((offset, size, lo, hi))
                offsets[name] = offset
        return placed, offsets

    # in order of appearance, and largest first (less fragmentation): the plan keeping more
    by_time = sorted(candidates, key=lambda r: (live.first[r], r))
    by_size = sorted(candidates, key=lambda r: (-program.tensors[r].nbytes, live.first[r], r))
    plans = [place(by_time), place(by_size)]
    placed, offsets = max(plans, key=lambda plan: sum(size for _, size, _, _ in plan[0]))
    used = [0] * len(program.layers)
    for offset, size, lo, hi in placed:
        for index in range(max(lo, 0), min(hi, len(used) - 1) + 1):
            used[index] = max(used[index], offset + size)
    resident = {name: offsets[r] for name, r in live.root.items() if r in offsets}
    return resident, used
