"""Attribute checks for IR files: the JSON type and range of every canonical IR attribute (by
name: `strides` are positive integers wherever they appear), the attributes each op requires,
and the relations between attributes and value types (zero points inside their dtype's range,
one multiplier per channel, qmin <= qmax). `load_ir` runs them before type inference, so a file
whose checksum is valid but whose attributes are not fails at load with the field's path
instead of crashing a kernel later.

Attributes whose names are not listed here are checked for their JSON shape only (null, a
boolean, a number, a string, or lists of them).
"""

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ...fields import MAX_DIM, Fields
from .. import dtypes
from ..ops import OPS
from ..ops.tflite_rounding import FLOAT32, FLOAT32_TRUNCATE, GEMMLOWP

Rule = Callable[[Fields, Any, str], None]
I64 = (-(1 << 63), (1 << 63) - 1)
I32 = (-(1 << 31), (1 << 31) - 1)
MAX_RANK = 64


def _int(lo: int, hi: int) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        f.integer(v, path, lo, hi)

    return rule


def _ints(lo: int, hi: int, count: int | None = None) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        n = {} if count is None else {"min_len": count, "max_len": count}
        f.integers(v, path, lo, hi, **n)

    return rule


def _int_or_ints(lo: int, hi: int) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        (_ints if isinstance(v, list) else _int)(lo, hi)(f, v, path)

    return rule


def _optional_int(lo: int, hi: int) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        if v is not None:
            f.integer(v, path, lo, hi)

    return rule


def _number(positive: bool = False, finite: bool = True) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        f.number(v, path, positive, finite)

    return rule


def _numbers(
    positive: bool = False, finite: bool = True, count: int | None = None, null: bool = False
) -> Rule:
    def rule(f: Fields, v, path: str) -> None:
        if null and v is None:
            return
        n = {} if count is None else {"min_len": count, "max_len": count}
        for i, x in enumerate(f.array(v, path, **n)):
            f.number(x, f"{path}[{i}]", positive, finite)

    return rule


def _text(f: Fields, v, path: str) -> None:
    f.text(v, path)


def _dtype(f: Fields, v, path: str) -> None:
    f.choice(f.text(v, path), path, sorted(dtypes.DTYPES))


def _axis(f: Fields, v, path: str) -> None:
    if v is not None:
        f.integer(v, path, -MAX_RANK, MAX_RANK)


def _rounding(f: Fields, v, path: str) -> None:
    f.choice(f.text(v, path), path, [FLOAT32, FLOAT32_TRUNCATE, GEMMLOWP])


FLAG = _int(0, 1)
RULES: dict[str, Rule] = {
    **dict.fromkeys(["strides", "dilations", "kernel_shape"], _ints(1, MAX_DIM)),
    **dict.fromkeys(["pads", "output_padding"], _ints(0, MAX_DIM)),
    **dict.fromkeys(["ceil_mode", "count_include_pad", "keepdims", "select_last_index", "transA",
                     "transB", "mask", "fmod", "detect_negative", "detect_positive", "saturate",
                     "subtract", "antialias", "exclude_outside"], FLAG),
    **dict.fromkeys(["group", "blocksize", "size", "num_groups"], _int(1, MAX_DIM)),
    "p": _int(1, 2),
    "carried": _int(0, 1 << 16),
    "axis": _axis,
    "axes": _ints(-MAX_RANK, MAX_RANK),
    "perm": _ints(0, MAX_RANK),
    **dict.fromkeys(["alpha", "beta", "bias", "gamma", "lambd", "cubic_coeff_a"], _number()),
    **dict.fromkeys(["value", "extrapolation_value"], _number(finite=False)),
    "epsilon": _number(positive=True),
    "scale_ratio": _number(positive=True),
    **dict.fromkeys(["approximate", "mode", "round_mode", "coordinate_transformation_mode",
                     "nearest_mode", "float_op"], _text),
    "rounding": _rounding,
    **dict.fromkeys(["to", "dtype"], _dtype),
    "shape": _ints(-1, MAX_DIM),
    "sizes": _ints(0, MAX_DIM),
    "scales": _numbers(positive=True),
    "roi": _numbers(null=True),
    **dict.fromkeys(["starts", "ends"], _ints(*I64)),
    "steps": _ints(*I64),
    **dict.fromkeys(["split", "repeats"], _ints(0, MAX_DIM)),
    "clip": _numbers(finite=False, count=2),
    "scale": _numbers(positive=True),
    "zero_point": _ints(*I32),
    "multiplier": _int_or_ints(0, (1 << 31) - 1),
    "shift": _int_or_ints(1, 62),
    **dict.fromkeys(["a_zero_point", "b_zero_point"], _int(*I32)),
    # one, or one per channel (QConv / QGemm with per-channel activations)
    **dict.fromkeys(["x_zero_point", "y_zero_point", "qmin", "qmax"], _int_or_ints(*I32)),
    "x_zero_points": _ints(*I32),
    **dict.fromkeys(["a_rescale", "b_rescale"], _ints(0, (1 << 31) - 1, count=2)),
    **dict.fromkeys(["x_multiplier", "h_multiplier"], _ints(0, (1 << 31) - 1)),
    **dict.fromkeys(["x_shift", "h_shift"], _ints(1, 62)),
    "functions": _ints(0, 2),
    "cell_shift": _int(0, 15),
    "gate_clip": _optional_int(0, 32767),
    "out_rescale": _ints(0, (1 << 31) - 1, count=2),
    **dict.fromkeys(["h0_rescale", "c0_rescale"], _ints(*I32, count=3)),  # zero point, m, r
}  # fmt: skip

_OUT = ["dtype", "y_zero_point", "qmin", "qmax"]
_POOL = ["ceil_mode", "dilations", "kernel_shape", "pads", "strides"]
_REDUCE = ["axes", "keepdims"]
_FLOAT_RECURRENT = ["activations", "direction", "hidden_size", "layout"]
_RECURRENT = [*_OUT, "direction", "functions", "gate_clip", "h_multiplier", "h_shift",
              "hidden_size", "layout", "out_rescale", "x_multiplier", "x_shift",
              "x_zero_point"]  # fmt: skip
REQUIRED: dict[str, list[str]] = {
    "ArgMax": [*_REDUCE, "select_last_index"],
    "ArgMin": [*_REDUCE, "select_last_index"],
    "AveragePool": [*_POOL, "count_include_pad"],
    "BatchNormalization": ["epsilon"],
    "BitShift": ["direction"],
    "Cast": ["round_mode", "saturate", "to"],
    "Concat": ["axis"],
    "Conv": ["dilations", "group", "pads", "strides"],
    "ConvInteger": ["dilations", "group", "pads", "strides"],
    "ConvTranspose": ["dilations", "group", "output_padding", "pads", "strides"],
    "CumSum": ["axis", "exclusive", "reverse"],
    "DepthToSpace": ["blocksize", "mode"],
    "DequantizeLinear": ["axis", "scale", "zero_point"],
    "Dropout": ["mask"],
    "Einsum": ["equation"],
    "Expand": ["shape"],
    "Gather": ["axis"],
    "GatherElements": ["axis"],
    "GatherND": ["batch_dims"],
    "Gemm": ["alpha", "beta", "transA", "transB"],
    "GroupNormalization": ["epsilon", "num_groups"],
    "GRU": _FLOAT_RECURRENT,
    "If": ["else_branch", "then_branch"],
    "Loop": ["body", "carried"],
    "LRN": ["alpha", "beta", "bias", "size"],
    "LSTM": _FLOAT_RECURRENT,
    "LogSoftmax": ["axis"],
    "LpNormalization": ["axis", "p"],
    "MaxPool": _POOL,
    "MeanVarianceNormalization": ["axes"],
    "Pad": ["mode", "pads", "value"],
    "QAdd": [*_OUT, "a_rescale", "a_zero_point", "b_rescale", "b_zero_point", "multiplier",
             "shift", "subtract"],
    "QAveragePool": [*_OUT, *_POOL, "count_include_pad", "scale_ratio", "x_zero_point"],
    "QConcat": [*_OUT, "axis", "multiplier", "shift", "x_zero_points"],
    "QConv": [*_OUT, "dilations", "group", "multiplier", "pads", "shift", "strides",
              "x_zero_point"],
    "QGemm": [*_OUT, "multiplier", "shift", "x_zero_point"],
    "QMul": [*_OUT, "a_zero_point", "b_zero_point", "multiplier", "shift"],
    "QSoftmax": [*_OUT, "axis", "multiplier", "shift"],
    "QLSTM": [*_RECURRENT, "cell_shift", "input_forget"],
    "QGRU": [*_RECURRENT, "linear_before_reset"],
    "QRNN": _RECURRENT,
    "QuantizeLinear": ["axis", "dtype", "scale", "zero_point"],
    "ReduceMax": _REDUCE,
    "ReduceMean": _REDUCE,
    "ReduceMin": _REDUCE,
    "ReduceProd": _REDUCE,
    "ReduceSum": _REDUCE,
    "Requantize": [*_OUT, "multiplier", "shift", "x_zero_point"],
    "Reshape": ["shape"],
    "Resize": ["scales", "sizes"],
    "RNN": _FLOAT_RECURRENT,
    "ScatterElements": ["axis", "reduction"],
    "ScatterND": ["reduction"],
    "Slice": ["ends", "starts", "steps"],
    "Softmax": ["axis"],
    "SpaceToDepth": ["blocksize"],
    "Split": ["axis", "split"],
    "Swish": ["alpha"],
    "Tile": ["repeats"],
    "TopK": ["axis", "k", "largest"],
    "Transpose": ["perm"],
    "Trilu": ["k", "upper"],
}  # fmt: skip
_INTEGER_OUTPUT = {op for op, keys in REQUIRED.items() if "dtype" in keys}  # integer ops' type


def code_range(dtype: np.dtype) -> tuple[int, int]:
    """The codes of an integer dtype (ml_dtypes' sub-byte types included); int32's otherwise."""
    try:
        info = ml_dtypes.iinfo(dtype)
    except (ValueError, TypeError):
        return I32
    return int(info.min), int(info.max)


def _is_integer(dtype: np.dtype) -> bool:
    return code_range(dtype) != I32 or dtype == np.int32


@functools.cache
def arity(op: str) -> tuple[int, int | None]:
    """How many inputs a node of `op` takes: (minimum, maximum or None), read from the
    signature of the op's kernel (the function `register` wrapped)."""
    fn = getattr(OPS[op].kernel, "__wrapped__", None)
    if fn is None:
        return 0, None
    params = list(inspect.signature(fn).parameters.values())[1:]  # after attrs
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return sum(p.default is p.empty for p in params if p.kind is not p.VAR_POSITIONAL), None
    return sum(p.default is p.empty for p in params), len(params)


def check_attributes(f: Fields, op: str, attrs: dict, inputs: Sequence, path: str) -> None:
    """Every attribute of a node of `op` whose inputs are `inputs` (Values or None)."""
    for key, value in attrs.items():
        _json_attribute(f, value, f"{path}.{key}")
    missing = [key for key in REQUIRED.get(op, ()) if key not in attrs]
    f.require(not missing, path, f"{op} needs attribute(s) {', '.join(missing)}")
    for key, value in attrs.items():
        rule = RULES.get(key)
        if rule is not None:
            rule(f, value, f"{path}.{key}")
    _relations(f, op, attrs, inputs, path)


def _relations(f: Fields, op: str, attrs: dict, inputs: Sequence, path: str) -> None:
    types = [None if v is None else v.dtype for v in inputs]

    def within(key: str, value: int | list, dtype: np.dtype | None) -> None:
        if dtype is not None and _is_integer(dtype):
            lo, hi = code_range(dtype)
            for v in value if isinstance(value, list) else [value]:
                f.require(lo <= v <= hi, f"{path}.{key}", f"{v} is outside {dtype}'s range")

    _per_channel_lists(f, op, attrs, inputs, path)
    if "float_op" in attrs:  # the float op a quantized node replaced (partition keys)
        stands = OPS[op].quantizes if op in OPS else ()
        f.require(attrs["float_op"] in stands, f"{path}.float_op", f"{op} stands for {stands}")
    if op in _INTEGER_OUTPUT:
        out = dtypes.dtype(attrs["dtype"])
        f.require(_is_integer(out), f"{path}.dtype", f"{op} produces integers, not {out}")
        for key in ("y_zero_point", "qmin", "qmax"):
            if key in attrs:
                within(key, attrs[key], out)
        if "qmin" in attrs:
            ok = _ordered(attrs["qmin"], attrs["qmax"])
            f.require(ok, f"{path}.qmin", "is above qmax")
    first = types[0] if types else None
    for key, index in (("x_zero_point", 0), ("a_zero_point", 0), ("b_zero_point", 1)):
        if key in attrs and index < len(types):
            within(key, attrs[key], types[index])
    if op == "QConcat":
        for key in ("x_zero_points", "multiplier", "shift"):
            value = attrs[key]
            ok = isinstance(value, list) and len(value) == len(inputs)
            f.require(ok, f"{path}.{key}", f"needs one entry per input ({len(inputs)})")
        for i, (zp, dtype) in enumerate(zip(attrs["x_zero_points"], types)):
            within(f"x_zero_points[{i}]", zp, dtype)
    if op in ("QConv", "QGemm") and len(inputs) > 1 and inputs[1] is not None:
        shape = inputs[1].shape
        axis = OPS[op].weights(attrs, len(shape)).out if len(shape) > 1 else 0
        channels = shape[axis] if shape else 1
        for key in ("multiplier", "shift"):
            value = attrs[key]
            ok = not isinstance(value, list) or len(value) in (1, channels)
            f.require(ok, f"{path}.{key}", f"needs one entry per output channel ({channels})")
    if op in ("QuantizeLinear", "DequantizeLinear") and first is not None:
        _qdq(f, op, attrs, inputs[0], path)
    if op == "Requantize" and first is not None:
        for key in ("multiplier", "shift"):
            f.require(not isinstance(attrs[key], list), f"{path}.{key}", "must be one integer")
    if op == "QAveragePool" and attrs.get("rounding") == GEMMLOWP:  # a circle's window sums
        for key in ("multiplier", "shift"):
            value = attrs.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool)
            f.require(ok, f"{path}.{key}", "must be one integer with rounding 'gemmlowp'")


def _ordered(qmin, qmax) -> bool:
    """qmin <= qmax, each one number or one per channel."""
    low = qmin if isinstance(qmin, list) else [qmin]
    high = qmax if isinstance(qmax, list) else [qmax]
    if len(low) == len(high):
        return all(a <= b for a, b in zip(low, high))
    return 1 in (len(low), len(high)) and all(a <= b for a in low for b in high)


def _per_channel_lists(f: Fields, op: str, attrs: dict, inputs: Sequence, path: str) -> None:
    """Zero points and bounds are lists only in QConv / QGemm, one per channel of their value
    (per-channel activations): x_zero_point per input channel, the others per output channel."""
    for key in ("x_zero_point", "y_zero_point", "qmin", "qmax"):
        value = attrs.get(key)
        if not isinstance(value, list):
            continue
        f.require(op in ("QConv", "QGemm"), f"{path}.{key}", "must be one integer")
        data = inputs[0] if inputs and inputs[0] is not None else None
        weight = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        if key == "x_zero_point" and data is not None and len(data.shape) > 1:
            channels = data.shape[1]
        elif key != "x_zero_point" and weight is not None and weight.shape:
            rank = len(weight.shape)
            channels = weight.shape[OPS[op].weights(attrs, rank).out if rank > 1 else 0]
        else:
            continue
        f.require(
            len(value) == channels, f"{path}.{key}", f"needs one entry per channel ({channels})"
        )


def _qdq(f: Fields, op: str, attrs: dict, value, path: str) -> None:
    axis = attrs["axis"]
    if axis is not None:
        f.integer(axis, f"{path}.axis", 0, max(len(value.shape) - 1, 0))
    count = 1 if axis is None or not value.shape else value.shape[axis]
    for key in ("scale", "zero_point"):
        n = len(attrs[key])
        f.require(n == count, f"{path}.{key}", f"has {n} entries, needs {count}")
    storage = dtypes.dtype(attrs["dtype"]) if op == "QuantizeLinear" else value.dtype
    lo, hi = code_range(storage)
    for i, zp in enumerate(attrs["zero_point"]):
        f.require(lo <= zp <= hi, f"{path}.zero_point[{i}]", f"{zp} is outside {storage}'s range")


def _json_attribute(f: Fields, value, path: str, depth: int = 0) -> None:
    """Null, a boolean, a number, a string or a list of them (lists nested at most twice)."""
    if isinstance(value, list):
        f.require(depth < 2, path, "lists are nested too deeply")
        for i, item in enumerate(value):
            _json_attribute(f, item, f"{path}[{i}]", depth + 1)
        return
    ok = value is None or isinstance(value, bool | int | float | str)
    f.require(ok, path, "expected null, a number, a string or a list")
    if isinstance(value, int) and not isinstance(value, bool):
        f.integer(value, path, *I64)
