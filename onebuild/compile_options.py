"""The compile API's options: frozen dataclasses that carry their own defaults and check their
values when made (against `option_values`, the tuples the recipe schema takes too). The recipe
schema takes its defaults from them, so there is one place that says what "default" means;
`onebuild.compile` re-exports them beside the functions. Loads without numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import OptionError
from .option_values import (
    ACTIVATION_GRANULARITIES,
    BIAS_CORRECTIONS,
    CALIBRATION_METHODS,
    COMPLY,
    CPU_PRECISIONS,
    GRANULARITIES,
    IO_TYPES,
    MIXED_DTYPES,
    PREFS,
    QUANT_DTYPES,
    QUANT_MODES,
    STRATEGIES,
    WEIGHT_ROUNDINGS,
    check,
    check_layer,
    check_range,
)

if TYPE_CHECKING:
    from .graph_ir.quant.config import QuantConfig


OptionsT = TypeVar("OptionsT")


def options_from(cls: type[OptionsT], config: Mapping[str, Any]) -> OptionsT:
    """Options of type `cls` from a step config (plain JSON data: lists become tuples; keys
    that are not options of `cls` are ignored)."""
    known = {f.name for f in fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in known}
    return cls(**values)


@dataclass(frozen=True)
class CalibrationOptions:
    method: str = "minmax"  # "minmax" | "percentile" | "moving_average" | "mse"
    min_percentile: float = 1.0
    max_percentile: float = 99.0
    moving_avg_batch: int = 1
    moving_avg_const: float = 0.1
    min_samples: int = 1

    def __post_init__(self):
        check(self, method=CALIBRATION_METHODS)
        check_range(self, "min_percentile", 0, 100)
        check_range(self, "max_percentile", 0, 100)
        check_range(self, "moving_avg_batch", 1, whole=True)
        check_range(self, "moving_avg_const", 0, 1, above=True)
        check_range(self, "min_samples", 1, whole=True)
        if self.min_percentile >= self.max_percentile:
            raise OptionError("CalibrationOptions: min_percentile must be below max_percentile")

    def observer_options(self) -> dict[str, Any]:
        """The observer arguments of the chosen method."""
        if self.method == "percentile":
            return {"lo_percent": self.min_percentile, "hi_percent": self.max_percentile}
        if self.method == "moving_average":
            return {"batch": self.moving_avg_batch, "constant": self.moving_avg_const}
        return {}


@dataclass(frozen=True)
class MixedPrecisionOptions:
    """Promote the fewest MACs to `dtype` until every output reaches `target_sqnr_db` on
    `samples` evaluation samples (see `graph_ir.quant.mixed_precision`)."""

    target_sqnr_db: float = 30.0
    dtype: str = "int16"  # "int16" | "float32"
    max_high_precision_mac_fraction: float | None = None
    samples: int = 16
    trim_probes: int | None = None  # None: the search's default trim (`quant.mixed_precision`)
    promote_outputs: bool = False  # layers kept in the base type may write `dtype` (int16 only)

    def __post_init__(self):
        check(self, dtype=MIXED_DTYPES, promote_outputs=(False, True))
        if self.promote_outputs and self.dtype != "int16":
            raise OptionError(
                f"MixedPrecisionOptions.promote_outputs: needs dtype 'int16' (an int16 output "
                f"of a uint8 layer), not {self.dtype!r}"
            )
        check_range(self, "target_sqnr_db", float("-inf"))
        check_range(self, "samples", 1, whole=True)
        if self.max_high_precision_mac_fraction is not None:
            check_range(self, "max_high_precision_mac_fraction", 0, 1)


@dataclass(frozen=True)
class QuantizeOptions:
    mode: str = "full"  # "full" | "weight_only"
    dtype: str = "uint8"
    granularity: str = "channel"
    input_type: str = "float32"
    output_type: str = "float32"
    bias_correction: bool | str = True  # True | False | "empirical" (on the samples too)
    equalization: bool = False  # full mode: cross-layer equalization before calibration
    activation_granularity: str = "tensor"  # "tensor" | "channel" (edges into convolutions)
    # dtypes per-channel edges may take: the codegen target's (`Target.channel_dtypes`)
    channel_dtypes: tuple[str, ...] = ("uint8", "int8", "int16")
    weight_rounding: str = "nearest"  # "nearest" | "adaround"
    layers: tuple[Mapping[str, Any], ...] = ()  # {"names": [...], "dtype": ..., "granularity"}
    mixed_precision: MixedPrecisionOptions | None = None

    def __post_init__(self):
        if isinstance(self.mixed_precision, Mapping):  # from a step config
            settings = options_from(MixedPrecisionOptions, self.mixed_precision)
            object.__setattr__(self, "mixed_precision", settings)
        check(
            self,
            mode=QUANT_MODES,
            dtype=QUANT_DTYPES,
            granularity=GRANULARITIES,
            input_type=IO_TYPES,
            output_type=IO_TYPES,
            bias_correction=BIAS_CORRECTIONS,
            activation_granularity=ACTIVATION_GRANULARITIES,
            weight_rounding=WEIGHT_ROUNDINGS,
        )
        for index, layer in enumerate(self.layers):
            check_layer(index, layer)

    def quant_config(self) -> QuantConfig:
        from .graph_ir.quant.config import LayerOverride, QuantConfig

        layers = tuple(
            LayerOverride(tuple(layer["names"]), layer.get("dtype"), layer.get("granularity"))
            for layer in self.layers
        )
        return QuantConfig(
            self.dtype,
            self.granularity,
            self.input_type,
            self.output_type,
            layers,
            self.bias_correction,
            self.activation_granularity,
            tuple(self.channel_dtypes),
        )


@dataclass(frozen=True)
class CodegenOptions:
    target: str = "trix_sim"
    hw: str | None = None  # None: the target's default preset (trix_sim: trix-m)
    pref: str = "performance"  # "performance" | "memory" | "compile_time"

    def __post_init__(self):
        check(self, pref=PREFS)

    @property
    def preset(self) -> str | None:
        """`hw`, else the target's default hardware preset (`targets.default_hw`)."""
        from .targets import default_hw

        return self.hw or default_hw(self.target)


@dataclass(frozen=True)
class PartitionOptions:
    """How to split a graph; the accelerator is the codegen target's backend (`Target.backend`),
    the other backend the CPU (`default`, the only one allowed, as ONE's `.part` files say)."""

    default: str = "cpu"
    strategy: str = "capability"  # "capability" | "cost"
    comply: str = "opcode"
    opcode: Mapping[str, str] = field(default_factory=dict)
    opname: Mapping[str, str] = field(default_factory=dict)
    cpu_precision: str = "quantized"  # "quantized" | "float"

    def __post_init__(self):
        check(self, strategy=STRATEGIES, comply=COMPLY, cpu_precision=CPU_PRECISIONS)
