"""TFLite -> IR mappings of the data-movement operators (concatenation, split, reshape,
transpose, pad, slices, depth to space), for `circle_read.Reader`; arguments as in
`circle_read_ops`. Quantized tensors keep their codes and parameters (QConcat requantizes).
"""

import numpy as np

from ..quant.params import quantize_multiplier
from . import circle_read_fuse as fuse
from .circle_read_ops import NHWC, Malformed, _activation_attrs, _emit, _layout, _operand, _options
from .tflite_schema import channels_last_columns


def concatenation(r, inputs, outputs, options):
    o = _options("CONCATENATION", options)
    out = r.info(outputs[0])
    rank = len(out.shape)
    perm = _layout(r, inputs, rank)
    axis = o["axis"] % rank
    ir_axis = axis if perm is None else perm[axis]
    values = [_operand(r, i, perm, rank) for i in inputs]
    fused = None if o["activation"] else fuse.grouped_conv(r.graph, values, ir_axis)
    if fused is not None:
        r.define(outputs[0], fused, perm)
        return
    if out.quant is None or out.dtype == np.float32:
        attrs = {"axis": ir_axis, **_activation_attrs(r, outputs[0], o["activation"])}
        _emit(r, "Concat", values, attrs, outputs[0], perm)
        return
    params = [r.info(i).quant for i in inputs]
    multipliers = [quantize_multiplier(p.scale[0] / out.quant.scale[0]) for p in params]
    attrs = {
        "axis": ir_axis,
        "x_zero_points": [p.zero_point[0] for p in params],
        **_activation_attrs(r, outputs[0], o["activation"]),
        "multiplier": [m for m, _ in multipliers],
        "shift": [s for _, s in multipliers],
    }
    _emit(r, "QConcat", values, attrs, outputs[0], perm)


def split(r, inputs, outputs, options, code):
    if code == "SPLIT":
        axis_index, x_index = inputs[:2]
    else:
        x_index, sizes_index, axis_index = inputs[:3]
    axis = r.const(axis_index)
    shape = r.info(x_index).shape
    if axis is None or axis.size != 1:
        raise Malformed("the axis must be a constant scalar")
    axis = int(np.ravel(axis)[0]) % len(shape)
    if code == "SPLIT":
        sizes = [shape[axis] // len(outputs)] * len(outputs)
    else:
        given = r.const(sizes_index)
        if given is None:
            raise Malformed("the sizes must be constant")
        sizes = [int(s) for s in np.ravel(given)]
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = shape[axis] - (sum(sizes) + 1)
    perm = r.perm_of(x_index)
    attrs = {"axis": axis if perm is None else perm[axis], "split": sizes}
    node = r.graph.make_node("Split", [r.value(x_index, perm)], attrs, r.info(outputs[0]).name)
    if len(node.outputs) != len(outputs):
        raise Malformed(f"{len(outputs)} outputs for {len(sizes)} parts")
    for index, value in zip(outputs, node.outputs):
        r.define(index, value, perm)


def reshape(r, inputs, outputs, options):
    shape = list(r.info(outputs[0]).shape)
    # a graph output the writer copied for onert (`Writer._copied_outputs`): no node
    copy = ("output", 0) in r.readers.get(outputs[0], ())
    if copy and shape == list(r.info(inputs[0]).shape):
        known = r.perm_of(inputs[0])
        r.alias(outputs[0], r.value(inputs[0], known), known)
        return
    order = _flatten_order(r, inputs[0], outputs[0])
    if order is None:
        x = r.value(inputs[0])
        name = r.info(outputs[0]).name + "/op"
        # the writer's MatMul of an input of rank > 2, reduction without kept dims, and (in
        # NHWC) nearest upsampling by whole factors
        folded = fuse.matmul_rows(r.graph, x, shape, name)
        folded = folded or fuse.dropped_axes(r.graph, x, shape, name)
        if folded is not None:
            r.define(outputs[0], folded)
            return
        resized = fuse.repeated_pixels(r.graph, x, shape, name)
        if resized is not None:
            r.define(outputs[0], resized, NHWC)
            return
        _emit(r, "Reshape", [x], {"shape": shape}, outputs[0])
        return
    # the IR's own flatten; the FULLY_CONNECTED readers permute their weights by `order`
    _emit(r, "Reshape", [r.value(inputs[0], NHWC)], {"shape": shape}, outputs[0])
    r.column_order[outputs[0]] = order


def _flatten_order(r, source: int, target: int) -> np.ndarray | None:
    """For a flatten of a channels-last tensor read only as FULLY_CONNECTED inputs (how the
    writer spells an IR flatten before dense layers): the IR column of each stored column."""
    t, out = r.info(source), r.info(target)
    if r.perm_of(source) != NHWC or r.readers.get(target) != {("FULLY_CONNECTED", 0)}:
        return None
    n, h, w, c = t.shape
    if tuple(out.shape) != (n, h * w * c):
        return None
    return channels_last_columns(c, h, w)


def transpose(r, inputs, outputs, options):
    """No IR node: the output is the input's value seen through one more permutation (a
    reader needing another layout transposes once; an inverse pair cancels)."""
    order = r.const(inputs[1])
    t = r.info(inputs[0])
    rank = len(t.shape)
    if order is None or sorted(int(p) for p in np.ravel(order)) != list(range(rank)):
        raise Malformed("the permutation must be a constant permutation of the axes")
    known = r.perm_of(inputs[0])
    value = r.value(inputs[0], known)
    have = tuple(range(rank)) if known is None else known
    composed = tuple(have[int(p)] for p in np.ravel(order))
    perm = None if composed == tuple(range(rank)) else composed
    r.alias(outputs[0], value, perm)


def pad(r, inputs, outputs, options, code):
    paddings = r.const(inputs[1])
    if paddings is None:
        raise Malformed("the paddings must be constant")
    t = r.info(inputs[0])
    rank = len(t.shape)
    perm = r.perm_of(inputs[0])
    order = range(rank) if perm is None else np.argsort(perm)
    pairs = [paddings[int(i)] for i in order]
    attrs = {"pads": [int(p[0]) for p in pairs] + [int(p[1]) for p in pairs], "mode": "constant"}
    if code == "MIRROR_PAD":
        if _options(code, options)["mode"] != 0:
            raise Malformed("SYMMETRIC mirror padding is not supported")
        attrs["mode"] = "reflect"
    elif code == "PADV2" and len(inputs) > 2:
        attrs["value"] = float(np.ravel(r.const(inputs[2]))[0])
    elif t.quant is not None and t.dtype != np.float32:
        attrs["value"] = t.quant.zero_point[0]
    _emit(r, "Pad", [r.value(inputs[0], perm)], attrs, outputs[0], perm)


def slice_op(r, inputs, outputs, options):
    """SLICE by constant begins and sizes (-1: to the end) as a Slice of steps 1."""
    begin, size = (r.const(i) for i in inputs[1:3])
    if begin is None or size is None:
        raise Malformed("the begins and sizes must be constant")
    shape = r.info(inputs[0]).shape
    begin, size = (np.ravel(a).astype(np.int64) for a in (begin, size))
    size = np.where(size == -1, np.subtract(shape, begin), size)
    if len(begin) != len(shape) or min(*begin, *size) < 0 or (begin + size > shape).any():
        raise Malformed("the begins and sizes must be in the input")
    perm = r.perm_of(inputs[0])
    order = range(len(shape)) if perm is None else np.argsort(perm)
    attrs = {
        "starts": [int(begin[i]) for i in order],
        "ends": [int(begin[i] + size[i]) for i in order],
        "steps": [1] * len(shape),
    }
    _emit(r, "Slice", [r.value(inputs[0], perm)], attrs, outputs[0], perm)


def strided_slice(r, inputs, outputs, options):
    """STRIDED_SLICE by constant begins, ends and strides (begin/end masks, `offset`, axes
    shrunk away by a Reshape after it) as a Slice; ellipsis and new axes are not read."""
    o = _options("STRIDED_SLICE", options)
    if o["ellipsis_mask"] or o["new_axis_mask"]:
        raise Malformed("ellipsis_mask and new_axis_mask are not supported")
    begin, end, strides = (r.const(i) for i in inputs[1:4])
    if begin is None or end is None or strides is None:
        raise Malformed("the begins, ends and strides must be constant")
    shape = r.info(inputs[0]).shape
    begin, end, strides = (np.ravel(a).astype(np.int64) for a in (begin, end, strides))
    if not len(begin) == len(end) == len(strides) == len(shape) or not strides.all():
        raise Malformed("one nonzero stride, begin and end for each axis")
    starts, ends, steps = [], [], []
    for axis, size in enumerate(shape):
        bit = 1 << axis
        step = int(strides[axis])
        first = None if o["begin_mask"] & bit else int(begin[axis])
        last = None if o["end_mask"] & bit else int(end[axis])
        if o["offset"] and first is not None and last is not None:
            last += first
        if o["shrink_axis_mask"] & bit:
            first = first or 0
            first, last, step = first + size * (first < 0), first + size * (first < 0) + 1, 1
        start, stop, step = slice(first, last, step).indices(size)
        starts.append(start)
        ends.append(None if stop < 0 else stop)  # a negative stride down to the first element
        steps.append(step)
    perm = None if o["shrink_axis_mask"] else r.perm_of(inputs[0])
    order = range(len(shape)) if perm is None else np.argsort(perm)
    attrs = {
        "starts": [starts[i] for i in order],
        "ends": [ends[i] for i in order],
        "steps": [steps[i] for i in order],
    }
    x = r.value(inputs[0], perm)
    if not o["shrink_axis_mask"]:
        _emit(r, "Slice", [x], attrs, outputs[0], perm)
        return
    name = r.info(outputs[0]).name
    sliced = r.graph.make_node("Slice", [x], attrs, f"{name}/slice").output
    sliced.quant = x.quant
    shape = list(r.info(outputs[0]).shape)
    _emit(r, "Reshape", [sliced], {"shape": shape}, outputs[0])


def depth_to_space(r, inputs, outputs, options):
    """DepthToSpace (DCR, TFLite's order), or the ConvTranspose circle spells with it."""
    block = _options("DEPTH_TO_SPACE", options)["block_size"]
    t, out = r.info(inputs[0]), r.info(outputs[0])
    if len(t.shape) != 4 or block < 1 or t.quant != out.quant:
        raise Malformed("a 4-D input, a positive block size and the input's parameters")
    x = r.value(inputs[0], NHWC)
    fused = fuse.pixel_shuffle(r.graph, x, block)
    if fused is not None:
        r.define(outputs[0], fused, NHWC)
        return
    _emit(r, "DepthToSpace", [x], {"blocksize": block, "mode": "DCR"}, outputs[0], NHWC)
