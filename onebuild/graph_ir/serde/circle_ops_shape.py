"""IR -> TFLite mapping of Slice, for `circle_write.Writer` (arguments as in `circle_ops`):
SLICE where every step is 1, else STRIDED_SLICE (an end past the first element of a negative
step is its `end_mask` bit), in the input's layout."""

import numpy as np


def slice_(w, node):
    x = node.inputs[0]
    perm = w.home_of(x)
    rank = len(x.shape)
    order = range(rank) if perm is None else perm  # stored axis k is IR axis order[k]
    bounds = [
        slice(*[node.attrs[key][axis] for key in ("starts", "ends", "steps")]).indices(
            x.shape[axis]
        )
        for axis in order
    ]
    source, target = w.get(x, perm), w.define(node.output, perm)
    if all(step == 1 for _, _, step in bounds):
        begin = np.asarray([start for start, _, _ in bounds], np.int32)
        size = np.asarray([max(stop - start, 0) for start, stop, _ in bounds], np.int32)
        operands = [w.constant(begin, f"{node.name}_begin"), w.constant(size, f"{node.name}_size")]
        w.op("SLICE", [source, *operands], [target])
        return
    end_mask = sum(1 << k for k, (_, stop, _) in enumerate(bounds) if stop < 0)
    columns = [[a, max(b, 0), c] for a, b, c in bounds]
    begin, end, strides = (np.asarray(c, np.int32) for c in zip(*columns))
    operands = [
        w.constant(begin, f"{node.name}_begin"),
        w.constant(end, f"{node.name}_end"),
        w.constant(strides, f"{node.name}_strides"),
    ]
    w.op("STRIDED_SLICE", [source, *operands], [target], end_mask=end_mask)
