"""The values each compile API option takes, and the checks the option dataclasses run in
`__post_init__`: one source of truth, since the recipe's Literal types are made of the same
tuples; and the data `compile.quantize` needs for the options it is given. Leaf module: it
imports nothing of onebuild but its errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import OptionError, UserError

if TYPE_CHECKING:
    from .compile import QuantizeOptions

# The values each option takes: the recipe's Literal types are made of these tuples too.
QUANT_MODES = ("full", "weight_only")
QUANT_DTYPES = ("uint8", "int8", "int16")
LAYER_DTYPES = (*QUANT_DTYPES, "float32")
IO_TYPES = ("float32", *QUANT_DTYPES)
GRANULARITIES = ("channel", "layer")
ACTIVATION_GRANULARITIES = ("tensor", "channel")
EMPIRICAL = "empirical"  # bias correction measured on samples; True/False: the weights only
BIAS_CORRECTIONS = (True, False, EMPIRICAL)
WEIGHT_ROUNDINGS = ("nearest", "adaround")
CALIBRATION_METHODS = ("minmax", "percentile", "moving_average", "mse")
MIXED_DTYPES = ("int16", "float32")
STRATEGIES = ("capability", "cost")
COMPLY = ("opcode", "opname")
CPU_PRECISIONS = ("quantized", "float")
PREFS = ("performance", "memory", "compile_time")


def check(options: object, **allowed: tuple) -> None:
    """Each named field of `options` is one of its allowed values, else a one-line
    OptionError naming the option, the value and the allowed values."""
    for name, values in allowed.items():
        value = getattr(options, name)
        if not any(value is v or (type(value) is type(v) and value == v) for v in values):
            listed = ", ".join(repr(v) for v in values)
            raise OptionError(f"{type(options).__name__}.{name}: {value!r} is not one of {listed}")


def check_layer(index: int, layer: Mapping[str, Any]) -> None:
    """One `QuantizeOptions.layers` entry: names, and a dtype and granularity it takes."""
    where = f"QuantizeOptions.layers[{index}]"
    if not isinstance(layer, Mapping) or not layer.get("names"):
        raise OptionError(f'{where}: needs {{"names": [node names], "dtype"?, "granularity"?}}')
    unknown = sorted(set(layer) - {"names", "dtype", "granularity"})
    if unknown:
        raise OptionError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key, values in (("dtype", LAYER_DTYPES), ("granularity", GRANULARITIES)):
        if layer.get(key) not in (None, *values):
            listed = ", ".join(repr(v) for v in values)
            raise OptionError(f"{where}.{key}: {layer[key]!r} is not one of {listed}")


def check_range(
    options: object,
    name: str,
    low: float,
    high: float | None = None,
    above: bool = False,
    whole: bool = False,
) -> None:
    """A numeric field (`whole`: an integer) within [low, high] (None: no upper bound; `above`:
    low excluded), finite (not NaN or infinite), else a one-line OptionError."""
    value = getattr(options, name)
    kinds = int if whole else (int, float)
    numeric = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    below = numeric and (value <= low if above else value < low)
    if not numeric or below or (high is not None and value > high):
        bound = f" {'above' if above else 'at least'} {low}" if low > float("-inf") else ""
        bound += f" and at most {high}" if high is not None else ""
        kind = "an integer" if whole else "a finite number"
        raise OptionError(f"{type(options).__name__}.{name}: {value!r} must be {kind}{bound}")


def check_stem(name: object, what: str) -> None:
    """A name onebuild makes file names from must be a plain file-name stem (no folder in it,
    so nothing is written outside the folder it is given), else a one-line OptionError."""
    plain = isinstance(name, str) and name.isprintable() and name not in ("", ".", "..")
    if not plain or "/" in name or "\\" in name:
        raise OptionError(
            f"{what} {name!r}: must be a plain file name (no folder, '/', '\\', NUL or control "
            "characters)"
        )


def check_quantize_data(options: QuantizeOptions, stats: Any, samples: Any, fit: Any) -> None:
    """Full quantization's data, present where the options need it; else a one-line UserError
    (a method asked for is refused rather than skipped, so the model is what was asked)."""
    if stats is None or not hasattr(stats, "ranges_for"):
        raise UserError(
            "quantize: full mode needs calibration statistics: pass stats=calibrate(graph, "
            'batches), or QuantizeOptions(mode="weight_only")'
        )
    if options.mixed_precision is not None and not samples:
        raise UserError(
            "quantize: mixed precision measures SQNR on samples: pass samples=[batches], or "
            "mixed_precision=None"
        )
    needs = [
        f"{key}={value!r}"
        for key, value, method in (
            ("weight_rounding", options.weight_rounding, "adaround"),
            ("bias_correction", options.bias_correction, "empirical"),
        )
        if value == method
    ]
    if needs and not fit:
        raise UserError(
            f"quantize: {' and '.join(needs)} learn(s) on samples: pass fit=[batches] (or "
            "samples), or choose another setting"
        )
