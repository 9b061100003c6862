"""On-device compilation (ODC) settings: the `ODC_*` keys of an nnpackage's config.cfg.

A package enables auto-compilation from its config, so the app is just load + run:

    ODC_AUTO_COMPILE=1          run() records, quantizes, compiles and switches by itself
    ODC_MINMAX_RECORDS=10       float runs recorded before quantizing
    ODC_QUANT_TYPE=U8_ASYM      U8_ASYM | I16_SYM | WO_I8_SYM | WO_I16_SYM
    ODC_ACTIVATION_GRANULARITY=tensor   tensor | channel (the recipe's quantize key)
    ODC_TARGET=trix_sim         codegen target, ODC_HW its hardware preset (the target's default)
    ODC_CODEGEN_PREF=performance   performance | memory | compile_time
    ODC_MIN_SQNR_DB=20          accuracy gate thresholds; also ODC_MIN_TOP1_MATCH,
                                ODC_MIN_TOP5_MATCH, ODC_MAX_MAE, ODC_MAX_MSE, ODC_MAX_MAPE,
                                ODC_MAX_MPEIR (any given replace the default gate)
    ODC_GATE_SAMPLES=16         recorded inputs kept for the gate
    ODC_BACKEND=npu             npu | auto (pick float CPU, quantized CPU or NPU)
    ODC_REQUIREMENT=performance what `auto` optimizes: performance | memory

Leaf module (no numpy) beside the compile API: the recipe validates `[pack] config` with it
(`check_config`), the runtime reads packages' settings.
"""

import contextlib
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from .compile import CodegenOptions
from .errors import FormatError, OneBuildError
from .gates import THRESHOLDS
from .nnpackage import config_text, config_value, parse_config
from .targets import check_target, default_hw

# ODC quantization type -> the [quantize] options it means (the rest are the recipe defaults)
QUANT_TYPES = {
    "U8_ASYM": {"mode": "full", "dtype": "uint8"},
    "I16_SYM": {"mode": "full", "dtype": "int16"},
    "WO_I8_SYM": {"mode": "weight_only", "dtype": "int8"},
    "WO_I16_SYM": {"mode": "weight_only", "dtype": "int16"},
}
DEFAULT_GATE = (("min_sqnr_db", 20.0),)
PREFS = ("performance", "memory", "compile_time")
BACKENDS = ("npu", "auto")
REQUIREMENTS = ("performance", "memory")
GRANULARITIES = ("tensor", "channel")


@dataclass(frozen=True)
class OdcSettings:
    auto_compile: bool = False
    minmax_records: int = 10
    quant_type: str = "U8_ASYM"
    activation_granularity: str = "tensor"
    target: str = CodegenOptions.target
    hw: str | None = None  # the target's default preset (`targets.default_hw`)
    pref: str = CodegenOptions.pref
    gate: tuple[tuple[str, float], ...] = DEFAULT_GATE
    gate_samples: int = 16
    backend: str = "npu"
    requirement: str = "performance"

    def __post_init__(self):
        checks = {
            "quant_type": (self.quant_type, tuple(QUANT_TYPES)),
            "activation_granularity": (self.activation_granularity, GRANULARITIES),
            "pref": (self.pref, PREFS),
            "backend": (self.backend, BACKENDS),
            "requirement": (self.requirement, REQUIREMENTS),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"{name} '{value}' is not one of {', '.join(allowed)}")
        if self.minmax_records < 1 or self.gate_samples < 1:
            raise ValueError("minmax_records and gate_samples must be at least 1")
        for key, _ in self.gate:
            if key not in THRESHOLDS:
                raise ValueError(f"unknown gate threshold '{key}' ({', '.join(THRESHOLDS)})")

    @property
    def key(self) -> dict:
        """What the session's decision depends on (all but `auto_compile`), as JSON data:
        when it changes, auto-compilation decides again from the recorded runs."""
        key = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "auto_compile"}
        key["gate"] = [list(pair) for pair in self.gate]
        if self.hw is None:  # the preset compiled for: naming the default changes nothing
            with contextlib.suppress(OneBuildError):
                key["hw"] = default_hw(self.target)
        return key

    def with_gate(self, thresholds: dict[str, float | None]) -> "OdcSettings":
        for key in thresholds:
            if key not in THRESHOLDS:
                raise ValueError(f"unknown gate threshold '{key}' ({', '.join(THRESHOLDS)})")
        gate = tuple(sorted((k, _threshold(k, v)) for k, v in thresholds.items() if v is not None))
        return replace(self, gate=gate)


FIELDS = {
    "ODC_AUTO_COMPILE": ("auto_compile", "bool"),
    "ODC_MINMAX_RECORDS": ("minmax_records", "int"),
    "ODC_QUANT_TYPE": ("quant_type", "str"),
    "ODC_ACTIVATION_GRANULARITY": ("activation_granularity", "str"),
    "ODC_TARGET": ("target", "str"),
    "ODC_HW": ("hw", "str"),
    "ODC_CODEGEN_PREF": ("pref", "str"),
    "ODC_GATE_SAMPLES": ("gate_samples", "int"),
    "ODC_BACKEND": ("backend", "str"),
    "ODC_REQUIREMENT": ("requirement", "str"),
}
GATE_FIELDS = {f"ODC_{key.upper()}": key for key in THRESHOLDS}
KEYS = (*FIELDS, *GATE_FIELDS)


def settings_from_config(config: dict[str, str], where: str) -> OdcSettings:
    """The ODC settings of a package config (other keys, such as BACKENDS, are not ODC's)."""
    values, gate = {}, {}
    for key, text in config.items():
        if not key.startswith("ODC_"):
            continue
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (known: {', '.join(KEYS)})"
            raise FormatError(f"{where}: unknown key {key}{hint}")
        name, kind = FIELDS.get(key, (GATE_FIELDS.get(key), "number"))
        try:
            if kind == "number":
                gate[name] = float(text)
            else:
                values[name] = _parse(str(text).strip(), kind)
        except ValueError:
            raise FormatError(f"{where}: {key}={text} is not a valid {kind}") from None
    try:
        settings = OdcSettings(**values)
        return settings.with_gate(gate) if gate else settings
    except ValueError as error:
        raise FormatError(f"{where}: {error}") from None


def _threshold(key: str, value) -> float:
    """A gate threshold as a finite number, or a ValueError naming the setting."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number is None or number != number or abs(number) == math.inf:
        raise ValueError(f"{key}={value!r} is not a threshold: give a finite number, e.g. {key}=25")
    return number


def _parse(text: str, kind: str):
    if kind == "bool":
        if text.lower() not in ("0", "1", "true", "false"):
            raise ValueError(text)
        return text.lower() in ("1", "true")
    return int(text) if kind == "int" else text


def check_config(config: Mapping[str, str | int | float | bool]) -> OdcSettings:
    """The ODC settings of extra config.cfg keys (`[pack] config`) as `write_package` will
    write them: the bytes written, read back; ODC_TARGET and ODC_HW checked against the
    installed targets and their presets."""
    text = config_text({key: config_value(value) for key, value in config.items()})
    settings = settings_from_config(parse_config(text.decode(), "config"), "config")
    if "ODC_TARGET" in config or "ODC_HW" in config:
        check_target(settings.target, settings.hw, "config: ", ("ODC_TARGET", "ODC_HW"))
    return settings
