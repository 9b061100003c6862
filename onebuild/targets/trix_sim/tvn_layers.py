"""What a decoded .tvn layer must hold (docs/tvn-format.md): attribute types and ranges, the
arrays each kind needs, windows that fit their tensors, epilogues that name a layer they can
run in; every violation is a one-line FormatError naming the file and the layer."""

import numpy as np

from ...errors import FormatError
from ...fields import Fields
from .lower import WINDOWED, Layer
from .moves import MOVES
from .moves import valid as valid_move


class Reader:
    def __init__(self, data: bytes, where: str):
        self.data, self.where = data, where

    def fail(self, message: str) -> FormatError:
        return FormatError(
            f"{self.where}: not a valid .tvn file: {message} (recompile the model to rewrite it)"
        )


def check(r: Reader, condition: bool, message: str) -> None:
    if not condition:
        raise r.fail(message)


def code_range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


_WINDOW = {"kernel": (1, 2), "strides": (1, 2), "dilations": (1, 2), "pads": (0, 4)}
_FLAGS = {"ceil_mode", "count_include_pad", "subtract", "const_index", "const_axis",
          "vector_index"}  # fmt: skip
_MULTIPLIER, _SHIFT = (0, (1 << 31) - 1), (1, 62)


def _codes(f: Fields, value, where: str, tensor, per_channel: bool) -> None:
    """A zero point or clamp in the code range of `tensor`: one integer, or (a convolution's,
    from version 5) one per channel of it."""
    if per_channel and isinstance(value, list):
        channels = tensor.shape[0]
        f.integers(value, where, *code_range(tensor.dtype), min_len=channels, max_len=channels)
    else:
        f.integer(value, where, *code_range(tensor.dtype))


def check_attrs(f: Fields, kind: str, attrs: dict, ins: list, out, path: str) -> None:
    """Types and ranges of a layer's attributes; zero points and clamps inside the range of
    the tensor they apply to (a convolution's may be one per channel)."""
    conv = kind == "conv"
    wide = (-(1 << 16), 1 << 16)
    for key, value in attrs.items():
        where = f"{path}.{key}"
        if key in _WINDOW:
            low, count = _WINDOW[key]
            f.integers(value, where, low, 255, min_len=count, max_len=count)
        elif key in _FLAGS:
            f.integer(value, where, 0, 1)
        elif key == "group":
            f.integer(value, where, 1, 1 << 20)
        elif key == "x_zero_point":
            _codes(f, value, where, ins[0], conv)
        elif key in ("y_zero_point", "qmin", "qmax"):
            _codes(f, value, where, out, conv)
        elif key in ("a_zero_point", "b_zero_point"):
            f.integer(value, where, *wide)
        elif key in ("a_rescale", "b_rescale"):
            f.integers(value, where, 0, (1 << 31) - 1, min_len=2, max_len=2)
            f.integer(value[1], f"{where}[1]", *_SHIFT)
        elif key in ("multiplier", "shift") and kind == "concat":
            limits = _MULTIPLIER if key == "multiplier" else _SHIFT
            f.integers(value, where, *limits, min_len=len(ins), max_len=len(ins))
        elif key in ("multiplier", "shift"):
            f.integer(value, where, *(_MULTIPLIER if key == "multiplier" else _SHIFT))
        elif key == "x_zero_points":
            f.integers(value, where, *wide, min_len=len(ins), max_len=len(ins))
            for i, (zp, t) in enumerate(zip(value, ins)):
                f.integer(zp, f"{where}[{i}]", *code_range(t.dtype))
        else:
            f.require(_small_ints(value), where, "is not an integer or a list of integers")
    outputs = [attrs[k] for k in ("y_zero_point", "qmin", "qmax") if k in attrs]
    same_form = len({isinstance(v, list) for v in outputs}) <= 1
    f.require(same_form, path, "y_zero_point, qmin and qmax: all lists or all integers")
    if "qmin" in attrs and "qmax" in attrs:
        ordered = np.less_equal(attrs["qmin"], attrs["qmax"])
        f.require(bool(np.all(ordered)), f"{path}.qmin", "is above qmax")


def per_channel_codes(layer: Layer) -> bool:
    """Whether a layer holds parameters of values quantized per channel (.tvn version 5):
    zero points or clamps per channel, or a table per channel."""
    lists = any(isinstance(v, list) for k, v in layer.attrs.items() if k in PER_CHANNEL_ATTRS)
    return lists or (layer.kind == "lookup" and layer.arrays["table"].ndim == 2)


PER_CHANNEL_ATTRS = ("x_zero_point", "y_zero_point", "qmin", "qmax")


def sequence_layer(layer: Layer, tensors) -> bool:
    """Whether a layer needs .tvn version 6: a gemm over the M > 1 rows of a sequence or over
    some of its output's channels, or a constant operand per row."""
    rows = int(np.prod(tensors[layer.output].dims[:-1]))
    gemm = layer.kind == "gemm" and (rows > 1 or "ch_offset" in layer.attrs)
    return gemm or "const_axis" in layer.attrs


def _small_ints(value) -> bool:
    """An attribute: an int or a (nested) list of ints, all of sane magnitude."""
    if isinstance(value, list):
        return len(value) <= 1024 and all(map(_small_ints, value))
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 40


REQUIRED = {
    "conv": ({"kernel", "strides", "dilations", "pads", "group", "x_zero_point"},
             {"weights", "bias", "multiplier", "shift"}),
    "gemm": ({"x_zero_point"}, {"weights", "bias", "multiplier", "shift"}),
    "add": ({"a_zero_point", "b_zero_point", "multiplier", "shift", "a_rescale", "b_rescale",
             "subtract"}, set()),
    "mul": ({"a_zero_point", "b_zero_point", "multiplier", "shift"}, set()),
    "avgpool": ({"kernel", "strides", "dilations", "pads", "count_include_pad", "x_zero_point"},
                {"ratio"}),
    "maxpool": ({"kernel", "strides", "dilations", "pads"}, set()),
    "lookup": (set(), {"table"}),
    "requant": ({"x_zero_point", "multiplier", "shift"}, set()),
    "softmax": ({"multiplier", "shift"}, {"table"}),
    "concat": ({"x_zero_points", "multiplier", "shift"}, set()),
    "reshape": (set(), set()),
    "slice": ({"starts", "ends", "steps"}, set()),
    "transpose": ({"perm"}, set()),
    "pad": ({"pads", "mode", "value"}, set()),
    "depth_to_space": ({"blocksize", "crd"}, set()),
    "resize": (set(), {"rows", "cols"}),
}  # fmt: skip
OUTPUT_ATTRS = {"y_zero_point", "qmin", "qmax"}


def check_layer(r: Reader, layer: Layer, tensors) -> None:
    attrs, arrays = REQUIRED[layer.kind]
    if layer.kind not in ("maxpool", "lookup", "reshape", *MOVES):
        attrs = attrs | OUTPUT_ATTRS
    check(r, attrs <= set(layer.attrs), f"layer '{layer.name}' misses attributes")
    check(r, arrays <= set(layer.arrays), f"layer '{layer.name}' misses arrays")
    out = tensors[layer.output].shape
    if layer.kind in MOVES:
        fits = valid_move(layer, tensors[layer.inputs[0]].shape, out)
        check(r, fits, f"layer '{layer.name}' attributes do not match its tensors")
    if layer.kind in WINDOWED:
        fits = _window_fits(layer.attrs, tensors[layer.inputs[0]].shape, out)
        check(r, fits, f"layer '{layer.name}' window attributes do not match its tensors")
    if layer.kind == "conv":
        w, a = layer.arrays["weights"], layer.attrs
        channels = tensors[layer.inputs[0]].shape[0]
        ok = w.ndim == 4 and w.shape[0] == out[0] and a["group"] >= 1
        ok = ok and w.shape[1] * a["group"] == channels and list(w.shape[2:]) == a["kernel"]
        for key in ("bias", "multiplier", "shift"):
            ok = ok and layer.arrays[key].shape == (out[0],)
        check(r, ok, f"layer '{layer.name}' weights do not match its output")
    if layer.kind == "gemm":  # [M, K] @ [K, N]: a vector (M = 1) or rows (version 6)
        w, x, y = layer.arrays["weights"], tensors[layer.inputs[0]], tensors[layer.output]
        rows, offset = int(np.prod(y.dims[:-1])), layer.attrs.get("ch_offset", 0)
        ok = w.ndim == 2 and w.shape[1] == x.dims[-1] and offset >= 0
        ok = ok and offset + w.shape[0] <= y.dims[-1]  # its output columns (version 6)
        ok = ok and rows == int(np.prod(x.dims[:-1])) and (rows == 1 or len(y.dims) == 2)
        check(r, ok, f"layer '{layer.name}' weights")
    if layer.kind == "lookup":  # one table, or one per channel
        x = tensors[layer.inputs[0]]
        size = 1 << (8 * np.dtype(x.dtype).itemsize)
        ok = layer.arrays["table"].shape in ((size,), (out[0], size))
        check(r, ok, f"layer '{layer.name}' table size")
    if layer.kind == "softmax":
        table = layer.arrays["table"]
        ok = table.shape == (512,) and table.dtype == np.int32
        check(r, ok, f"layer '{layer.name}' exponential table")
    if "operand" in layer.arrays:  # one code per channel, or per row (`const_axis`)
        ok = layer.attrs.get("const_index") in (0, 1) and len(layer.inputs) == 1
        codes = out[1] if layer.attrs.get("const_axis") else out[0]
        check(r, ok and layer.arrays["operand"].shape == (codes,), f"layer '{layer.name}'")
    elif layer.kind in ("add", "mul"):
        check(r, len(layer.inputs) == 2, f"layer '{layer.name}' needs two inputs")
        if "vector_index" in layer.attrs:  # a per-channel (or scalar) vector second
            c, h, w = tensors[layer.inputs[1]].shape
            ok = (h, w) == (1, 1) and c in (1, out[0])
            check(r, ok, f"layer '{layer.name}' vector operand does not match its output")
    if "shift" in layer.arrays:
        shifts = layer.arrays["shift"]
        check(r, bool(np.all((shifts >= 1) & (shifts <= 62))), f"layer '{layer.name}' shifts")


def check_epilogue(r: Reader, f: Fields, index: int, layers: list[Layer], tensors) -> None:
    """A convolution's `epilogue`: a later Add of two same-shape tensors or Concat that reads
    its output once, with the same dtype and height and width, or the max pool that reads only
    its output, with the same dtype (fusion.py)."""
    conv = layers[index]
    after = f.integer(conv.attrs["epilogue"], f"layers[{index}].attrs.epilogue", 0, 1 << 20)
    ok = conv.kind == "conv" and index < after < len(layers)
    if ok:
        consumer = layers[after]
        mid, out = tensors[conv.output], tensors[consumer.output]
        pair = consumer.kind == "add" and len(set(consumer.inputs)) == 2
        pair = pair and not {"vector_index", "const_index"} & set(consumer.attrs)
        ok = (pair or consumer.kind == "concat") and consumer.inputs.count(conv.output) == 1
        ok = ok and mid.dtype == out.dtype and mid.shape[1:] == out.shape[1:]
        ok = ok and (consumer.kind == "concat" or mid.shape == out.shape)
        pool = consumer.kind == "maxpool" and consumer.inputs == [conv.output]
        ok = ok or (pool and mid.dtype == out.dtype)
    check(
        r, ok, f"layer '{conv.name}' epilogue is not a later add, concat or max pool of its output"
    )


def _window_fits(attrs: dict, x: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Kernel, strides and dilations in [1, 255], pads in [0, 255], and every output row and
    column's window starting inside the padded input (so a tile's input span stays bounded)."""
    sizes = [attrs[key] for key in ("kernel", "strides", "dilations")]
    pads = attrs["pads"]

    def ints(value, count: int, low: int) -> bool:
        return (
            isinstance(value, list) and len(value) == count and all(low <= n <= 255 for n in value)
        )

    if not all(ints(v, 2, 1) for v in sizes) or not ints(pads, 4, 0):
        return False
    if len(x) != 3 or len(out) != 3:
        return False
    kernel, strides, dilations = sizes
    for axis in (0, 1):
        padded = x[1 + axis] + pads[axis] + pads[axis + 2]
        reach = (kernel[axis] - 1) * dilations[axis] + 1
        if reach > padded or (out[1 + axis] - 1) * strides[axis] >= padded:
            return False
    return True
