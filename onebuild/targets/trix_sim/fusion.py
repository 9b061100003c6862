"""Epilogue fusion: an Add or a Concat folded into the convolution that produces its operand.

A convolution whose output only one Add (of two same-shape tensors) or Concat reads gets the
attribute `epilogue` = the index of that layer: its EXEC tiles apply the consumer's integer
operation to their output codes (the Add's other operand tile is DMA'd in next to them) and
write the consumer's output, a Concat's in its channel range. The intermediate tensor never
reaches DRAM or SRAM (its bytes alias the consumer's output), a fused Add emits no
instructions, and a Concat only copies the parts not fused. Bit-exact: the epilogue is the
composition the two layers compute (docs/tvn-format.md).

In a cascade (cascade.py), a max pool that reads a convolution's output is that
convolution's epilogue too (`fuse_pools`): each EXEC computes the convolution rows one stripe
of the pool reads and writes their maxima, the pool's vector work overlapping the MAC array
(perf.conv_pool_cycles), as a pooling engine on the convolution's output stream does.
"""

from dataclasses import replace

from .lower import Layer, Program

EPILOGUE_KINDS = ("add", "concat", "maxpool")


def _pair_add(layer: Layer) -> bool:
    """An Add of two distinct same-shape tensors (not a constant or per-channel operand)."""
    return (
        layer.kind == "add"
        and "operand" not in layer.arrays
        and "vector_index" not in layer.attrs
        and len(set(layer.inputs)) == 2
    )


def fuse_epilogues(program: Program) -> Program:
    """The program with `epilogue` set on every convolution that can take its consumer (copies
    of those layers; the caller's layers are unchanged). An Add goes to the later of its
    convolution producers, so its other operand exists when the epilogue reads it."""
    produced = {layer.output: i for i, layer in enumerate(program.layers)}
    readers: dict[str, list[int]] = {}
    for index, layer in enumerate(program.layers):
        for name in layer.inputs:
            readers.setdefault(name, []).append(index)
    outputs = set(program.outputs)

    def fusable(name: str, consumer: int) -> bool:
        producer = produced.get(name)
        if producer is None or name in outputs or readers.get(name) != [consumer]:
            return False
        conv, after = program.layers[producer], program.layers[consumer]
        mid, out = program.tensors[name], program.tensors[after.output]
        return conv.kind == "conv" and mid.dtype == out.dtype and mid.shape[1:] == out.shape[1:]

    chosen: dict[int, int] = {}  # producer -> consumer
    for index, layer in enumerate(program.layers):
        if layer.kind == "concat":
            for name in layer.inputs:
                if layer.inputs.count(name) == 1 and fusable(name, index):
                    chosen[produced[name]] = index
        elif _pair_add(layer):
            first, second = (produced.get(n, -1) for n in layer.inputs)
            later = max(first, second)
            if later >= 0 and fusable(program.layers[later].output, index):
                chosen[later] = index
    layers = [
        replace(layer, attrs={**layer.attrs, "epilogue": chosen[i]}) if i in chosen else layer
        for i, layer in enumerate(program.layers)
    ]
    return replace(program, layers=layers)


def fuse_pools(program: Program, first: int, last: int) -> None:
    """Make each max pool of the cascade `first`..`last` the epilogue of the convolution
    before it (the convolution's entry in `program.layers` replaced by a copy)."""
    for index in range(first, last):
        conv, pool = program.layers[index], program.layers[index + 1]
        same = program.tensors[conv.output].dtype == program.tensors[pool.output].dtype
        fits = same and pool.kind == "maxpool" and pool.inputs == [conv.output]
        if fits and conv.kind == "conv" and "epilogue" not in conv.attrs:
            program.layers[index] = replace(conv, attrs={**conv.attrs, "epilogue": index + 1})


def pooled(program: Program, layer: Layer) -> Layer | None:
    """The max pool in `layer`'s output stage, if any: its EXEC tiles are the pool's."""
    after = consumer(program, layer)
    return after if after is not None and after.kind == "maxpool" else None


def consumer(program: Program, layer: Layer) -> Layer | None:
    """The layer fused into `layer`'s output stage, if any."""
    index = layer.attrs.get("epilogue")
    return None if index is None else program.layers[index]


def destination(program: Program, layer: Layer) -> tuple[str, int]:
    """The tensor `layer`'s tiles write and the channel its channel 0 lands on."""
    after = consumer(program, layer)
    if after is None:
        return layer.output, 0
    if after.kind in ("add", "maxpool"):
        return after.output, 0
    part = after.inputs.index(layer.output)
    return after.output, sum(program.tensors[n].shape[0] for n in after.inputs[:part])


def epilogue_operand(program: Program, layer: Layer) -> str | None:
    """The other operand an Add epilogue reads (None without one)."""
    after = consumer(program, layer)
    if after is None or after.kind != "add":
        return None
    return next(n for n in after.inputs if n != layer.output)


def fused_parts(program: Program) -> set[str]:
    """Intermediate tensors that fused convolutions never write."""
    return {layer.output for layer in program.layers if "epilogue" in layer.attrs}


def silent(program: Program) -> set[int]:
    """Consumers left without instructions: fused Adds and max pools, Concats whose every
    part is fused."""
    parts = fused_parts(program)
    return {
        index
        for index, layer in enumerate(program.layers)
        if layer.kind in EPILOGUE_KINDS
        and any(n in parts for n in layer.inputs)
        and (layer.kind != "concat" or all(n in parts for n in layer.inputs))
    }


def touched(program: Program, index: int) -> set[str]:
    """Every tensor the instructions of layer `index` read or write (none for a silent one)."""
    if index in silent(program):
        return set()
    layer = program.layers[index]
    operand = epilogue_operand(program, layer)
    names = {*layer.inputs, destination(program, layer)[0]} - fused_parts(program)
    return names | ({operand} if operand else set())
