"""The TOML recipe schema and its validation with good errors.

A recipe is read with `tomllib`, merged over its presets and overridden from the command line
(`onebuild.plan`), validated here by pydantic (unknown keys are errors, with a "did you mean"),
and converted once into a `Plan`: plain data, absolute paths, one normalized config dict per
enabled step. Nothing below this module sees pydantic. Step defaults come from the compile
API's option dataclasses (`onebuild.compile`), which the Session uses too.
"""

import difflib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from .compile import DEFAULT_PRESET
from .compile import CalibrationOptions as _C
from .compile import CodegenOptions as _G
from .compile import MixedPrecisionOptions as _M
from .compile import PartitionOptions as _P
from .compile import QuantizeOptions as _Q
from .errors import UserError
from .option_values import (
    ACTIVATION_GRANULARITIES,
    CALIBRATION_METHODS,
    COMPLY,
    CPU_PRECISIONS,
    EMPIRICAL,
    GRANULARITIES,
    IO_TYPES,
    LAYER_DTYPES,
    MIXED_DTYPES,
    PREFS,
    QUANT_DTYPES,
    QUANT_MODES,
    STRATEGIES,
    WEIGHT_ROUNDINGS,
)
from .plan import (
    MAX_DIM,
    STEP_ORDER,
    Plan,
    absolute,
    check_inputs,
    check_output_paths,
    check_url,
    is_url,
    read_recipe_data,
)
from .targets import channel_dtypes, check_target, default_hw, load_target


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ImportStep(_Section):
    """Read an ONNX model into the IR."""

    source: str = Field(description="ONNX, circle or tflite model file, relative to the recipe")
    input_shapes: dict[str, list[Annotated[int, Field(ge=1, le=MAX_DIM)]]] | None = Field(
        default=None, description="fix dynamic dims, e.g. { input = [1, 3, 224, 224] }"
    )
    constants: dict[str, float | int | bool | list] | None = Field(
        default=None,
        description="pin inputs to values, folding what depends on them (an If on a sample "
        "rate, say), e.g. { sr = 16000 }",
    )


class OptimizeStep(_Section):
    """Value-preserving graph optimizations."""

    preset: Literal["O0", "O1"] = DEFAULT_PRESET


class QuantizeLayer(_Section):
    """Settings for some layers (node names as `onebuild inspect` lists them)."""

    names: list[str] = Field(description="node names these settings apply to")
    dtype: Literal[LAYER_DTYPES] | None = None
    granularity: Literal[GRANULARITIES] | None = None


class QuantizeAccuracy(_Section):
    """Compare the quantized model with the float one; fail the build below a threshold."""

    data: str = Field(description="evaluation samples: npz, folder of npz/npy files, or .h5")
    labels: str | None = Field(default=None, description="npz with one array of class labels")
    min_sqnr_db: FiniteFloat | None = None
    min_top1_match: FiniteFloat | None = Field(default=None, ge=0, le=1)
    min_top5_match: FiniteFloat | None = Field(default=None, ge=0, le=1)
    max_mae: FiniteFloat | None = Field(default=None, ge=0)
    max_mse: FiniteFloat | None = Field(default=None, ge=0)
    max_mape: FiniteFloat | None = Field(default=None, ge=0, description="percent")
    max_mpeir: FiniteFloat | None = Field(default=None, ge=0)
    max_accuracy_drop: FiniteFloat | None = Field(
        default=None, ge=0, le=1, description="largest allowed top-1 accuracy loss (needs labels)"
    )


class QuantizeMixedPrecision(_Section):
    """Promote the fewest MACs to a higher-precision type until the outputs reach an SQNR
    (measured on the [quantize.accuracy] data, else on the calibration data)."""

    target_sqnr_db: FiniteFloat = Field(description="every output's SQNR must reach this")
    dtype: Literal[MIXED_DTYPES] = _M.dtype
    max_high_precision_mac_fraction: FiniteFloat | None = Field(
        default=_M.max_high_precision_mac_fraction, ge=0, le=1
    )
    samples: int = Field(default=_M.samples, ge=1, le=4096, description="samples measured")
    trim_probes: int | None = Field(
        default=_M.trim_probes,
        ge=0,
        le=64,
        description="promoted units tried back in the base type at the end, whatever the "
        "margin (default: 4, only when the target holds by 1 dB or more)",
    )
    promote_outputs: bool = Field(
        default=_M.promote_outputs,
        description="layers kept in the base type may write int16 (activation-only promotion)",
    )


class QuantizeStep(_Section):
    """Weight-only or full quantization with calibration data."""

    mode: Literal[QUANT_MODES] = _Q.mode
    dtype: Literal[QUANT_DTYPES] = _Q.dtype
    granularity: Literal[GRANULARITIES] = _Q.granularity
    calibration: str | None = Field(
        default=None, description="npz, folder of npz/npy files, or ONE's HDF5 input data (.h5)"
    )
    random_calibration: bool = Field(
        default=False, description="calibrate on random data when there is none (inaccurate)"
    )
    random_samples: int = Field(default=32, ge=1)
    min_samples: int = Field(
        default=_C.min_samples, ge=1, description="fewer calibration samples fail"
    )
    method: Literal[CALIBRATION_METHODS] = _C.method
    min_percentile: FiniteFloat = Field(default=_C.min_percentile, ge=0, le=100)
    max_percentile: FiniteFloat = Field(default=_C.max_percentile, ge=0, le=100)
    moving_avg_batch: int = Field(default=_C.moving_avg_batch, ge=1)
    moving_avg_const: FiniteFloat = Field(default=_C.moving_avg_const, gt=0, le=1)
    input_type: Literal[IO_TYPES] = _Q.input_type
    output_type: Literal[IO_TYPES] = _Q.output_type
    bias_correction: bool | Literal[EMPIRICAL] = Field(
        default=_Q.bias_correction,
        description="full mode: correct each layer's bias for the mean error of its rounded "
        "weights on the calibration data; empirical: also for the mean error of its quantized "
        "inputs, measured in the quantized model on real samples",
    )
    equalization: bool = Field(
        default=_Q.equalization,
        description="full mode: cross-layer equalization of Conv/Gemm -> (Relu) -> Conv/Gemm "
        "chains before calibration (float outputs unchanged)",
    )
    activation_granularity: Literal[ACTIVATION_GRANULARITIES] = Field(
        default=_Q.activation_granularity,
        description="full mode: channel = one scale and zero point per channel on the "
        "Conv -> [activation table] -> Conv edges (circle exports cannot hold them)",
    )
    weight_rounding: Literal[WEIGHT_ROUNDINGS] = Field(
        default=_Q.weight_rounding,
        description="adaround: learn each weight's rounding direction on real samples "
        "(the calibration data, else the [quantize.accuracy] data)",
    )
    layers: list[QuantizeLayer] = Field(default_factory=list)
    mixed_precision: QuantizeMixedPrecision | None = None
    accuracy: QuantizeAccuracy | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.mode == "weight_only" and self.dtype == "uint8":
            raise ValueError("weight_only quantization stores int8 or int16 weights, not uint8")
        if self.min_percentile >= self.max_percentile:
            raise ValueError("min_percentile must be below max_percentile")
        if self.mixed_precision and self.mode != "full":
            raise ValueError('mixed_precision needs mode = "full"')
        if self.mixed_precision and self.mixed_precision.dtype == self.dtype:
            raise ValueError(f"mixed_precision.dtype must differ from dtype ({self.dtype})")
        mixed = self.mixed_precision
        if mixed and mixed.promote_outputs and mixed.dtype != "int16":
            raise ValueError("mixed_precision.promote_outputs needs mixed_precision.dtype 'int16'")
        return self


class PartitionStep(_Section):
    """Split the model between the NPU and the CPU."""

    backends: list[str] | None = Field(
        default=None,
        description="the [codegen] target's backend and 'cpu' (the default; trix_sim: "
        '["trix", "cpu"])',
    )
    default: str = _P.default
    strategy: Literal[STRATEGIES] = _P.strategy
    comply: Literal[COMPLY] = _P.comply
    opcode: dict[str, str] = Field(
        default_factory=dict, description='op type -> backend pins, e.g. { Softmax = "cpu" }'
    )
    opname: dict[str, str] = Field(
        default_factory=dict, description="node name -> backend pins (`comply` says which map wins)"
    )
    part_file: str | None = None

    @field_validator("opcode")
    @classmethod
    def _known_ops(cls, opcode: dict):
        from .graph_ir.partition.op_keys import check_keys

        try:
            check_keys(opcode, "opcode")
        except UserError as error:
            raise ValueError(str(error).removeprefix("opcode: ")) from None
        return opcode

    cpu_precision: Literal[CPU_PRECISIONS] = Field(
        default=_P.cpu_precision,
        description="CPU parts run the quantized model (bit-exact with the quantized "
        "reference) or the float one, quantizing/dequantizing at their boundaries",
    )


class CodegenStep(_Section):
    """Compile NPU partitions to .tvn binaries."""

    target: str = _G.target
    hw: str | None = Field(
        default=None, description="hardware preset (default: the target's; trix_sim: trix-m)"
    )
    pref: Literal[PREFS] = _G.pref


class PackStep(_Section):
    """Write an nnpackage."""

    output: str
    archive: bool = False
    config: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="extra metadata/config.cfg keys, e.g. on-device compilation: "
        "{ ODC_AUTO_COMPILE = true, ODC_MINMAX_RECORDS = 20 }",
    )

    @field_validator("config")
    @classmethod
    def _known_keys(cls, config: dict):
        from .odc import check_config

        try:
            check_config(config)
        except UserError as error:
            raise ValueError(str(error).removeprefix("config: ")) from None
        return config


class BuildSection(_Section):
    dir: str | None = Field(default=None, description="artifacts, logs and the task database")
    cache: str | None = Field(default=None, description="shared content-addressed step cache")
    report: bool = Field(
        default=False, description="write report.html in the build folder after every build"
    )


class Recipe(_Section):
    """An onebuild recipe: tables name the steps; a table present enables its step."""

    extends: str | None = Field(default=None, description="preset recipe merged underneath")
    import_: ImportStep | None = Field(default=None, alias="import")
    optimize: OptimizeStep | None = None
    quantize: QuantizeStep | None = None
    partition: PartitionStep | None = None
    codegen: CodegenStep | None = None
    pack: PackStep | None = None
    build: BuildSection | None = None


def json_schema() -> dict:
    """The JSON Schema of recipes (editors can validate TOML files with it)."""
    return Recipe.model_json_schema(by_alias=True)


def read_recipe(path: str | os.PathLike, overrides: list[str] = ()) -> Recipe:
    """Read, merge presets, apply overrides and validate; presets validate this way too."""
    return validate(absolute(path), read_recipe_data(path, overrides))


def validate(path: Path, data: dict) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as error:
        raise UserError(f"{path}: {_describe(error)}") from None


def load_recipe(path: str | os.PathLike, overrides: list[str] = ()) -> Plan:
    """A buildable plan from a recipe file (it must import a model), validated afresh;
    `onebuild.plan.load_plan` is the cached front door."""
    return plan_from_data(absolute(path), read_recipe_data(path, overrides))


def plan_from_data(path: Path, data: dict) -> Plan:
    """The plan of merged recipe data (see `onebuild.plan.read_recipe_data`)."""
    return _plan(path, validate(path, data))


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that validates the table at `loc` (for "did you mean")."""
    model: type[BaseModel] | None = Recipe
    for key in loc:
        if isinstance(key, int) or model is None:
            continue
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        model = _submodel(fields[key].annotation) if key in fields else None
    return model


def _describe(error: ValidationError) -> str:
    """The first validation error as one line: key path, problem, value, allowed values; an
    unknown key first (a misspelt key also makes the key it meant missing)."""
    issues = sorted(error.errors(), key=lambda issue: issue["type"] != "extra_forbidden")
    first = issues[0]
    loc = tuple(first["loc"])
    dotted = ".".join(str(k) for k in loc) or "(top level)"
    more = f" (and {len(issues) - 1} more problem(s))" if len(issues) > 1 else ""
    if first["type"] == "extra_forbidden":
        model = _model_at(loc[:-1])
        known = [f.alias or n for n, f in model.model_fields.items()] if model else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        allowed = f" (known keys: {', '.join(known)})" if known else ""
        return f"{dotted}: unknown key{hint}{allowed}{more}"
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    message = first["msg"].removeprefix("Value error, ")
    return f"{dotted}: {message}{shown}{more}"


def _plan(path: Path, recipe: Recipe) -> Plan:
    dumped = recipe.model_dump(by_alias=True, exclude={"extends", "build"})
    steps = {name: dumped[name] for name in STEP_ORDER if dumped.get(name) is not None}
    if not steps:
        raise UserError(f"{path}: the recipe enables no step; add an [import] table")
    if "import" not in steps:
        raise UserError(f"{path}: every recipe needs an [import] table with 'source'")
    check_inputs(path, steps)
    steps["import"]["external_data"] = _external_data(steps["import"]["source"])
    quantize = steps.get("quantize")
    if (
        quantize
        and quantize["mode"] == "full"
        and not (quantize["calibration"] or quantize["random_calibration"])
        and not _came_quantized(steps["import"]["source"])
    ):
        raise UserError(
            f"{path}: quantize.calibration: full quantization needs calibration data (an "
            "npz file, a folder of npz/npy files or ONE's .h5 data); "
            "quantize.random_calibration = true calibrates on random data instead, which costs "
            "accuracy"
        )
    for key, wants in (
        ("mixed_precision", quantize and quantize["mixed_precision"]),
        ("weight_rounding", quantize and quantize["weight_rounding"] == "adaround"),
        ("bias_correction", quantize and quantize["bias_correction"] == "empirical"),
    ):
        if wants and not (quantize["accuracy"] or quantize["calibration"]):
            raise UserError(
                f"{path}: quantize.{key}: this needs real samples: set quantize.calibration or "
                "[quantize.accuracy] data (random data does not say what matters)"
            )
    if "codegen" in steps:  # a wrong target or preset fails before any step runs
        codegen = steps["codegen"]
        keys = ("codegen.target", "codegen.hw")
        check_target(codegen["target"], codegen["hw"], f"{path}: ", keys)
        codegen["hw"] = codegen["hw"] or default_hw(codegen["target"])
    if "partition" in steps:
        _complete_partition(path, steps)
    if quantize and "codegen" in steps:  # per-channel edges in the dtypes the target lowers
        quantize["channel_dtypes"] = list(channel_dtypes(steps["codegen"]["target"]))
    build = recipe.build or BuildSection()
    build_dir = Path(build.dir) if build.dir else path.parent / "build" / path.stem
    url = build.cache if build.cache and is_url(build.cache) else None
    cache = Path(build.cache) if build.cache and not url else None
    if url:
        check_url(url, str(path))
    plan = Plan(path, build_dir, cache, steps, build.report, url)
    check_output_paths(plan)
    return plan


def _came_quantized(source: str) -> bool:
    """A pre-quantized source (ONNX, circle or tflite) keeps its parameters: it needs no
    calibration data (the calibrate step checks the imported model again, `tasks.calibrate`)."""
    from .graph_ir.serde import quantized_source

    return quantized_source(source)


def _external_data(source: str) -> list[str]:
    """The files an ONNX source keeps its weights in, inputs of the import step too (a kept
    plan is valid while the source file is unchanged: `plan._key`)."""
    if Path(source).suffix.lower() in (".circle", ".tflite"):
        return []
    from .graph_ir.serde.onnx_wire import external_data_files

    files = external_data_files(source, existing=False)
    missing = [f for f in files if not f.is_file()]
    if missing:  # refused now, or a plan kept without it would never follow it once it appears
        raise UserError(
            f"{source}: keeps weights in '{missing[0]}', which is not a file; put it beside "
            "the model, or save the model with its weights inside"
        )
    return [str(file) for file in files]


def _complete_partition(path: Path, steps: dict[str, dict[str, Any]]) -> None:
    """The partition step decides with the [codegen] target's constraints and names its parts
    after the source model."""
    partition = steps["partition"]
    if "codegen" not in steps:
        raise UserError(
            f"{path}: [partition] needs a [codegen] table: its target's constraints decide what "
            "runs on the NPU, and it compiles the NPU parts"
        )
    backend = load_target(steps["codegen"]["target"]).backend
    backends = partition["backends"] or [backend, "cpu"]
    accelerators = [b for b in backends if b != "cpu"]
    if "cpu" not in backends or len(accelerators) != 1:
        raise UserError(
            f"{path}: partition.backends: expected one NPU backend and 'cpu', e.g. "
            f'["{backend}", "cpu"] (got {backends})'
        )
    if accelerators[0] != backend:
        raise UserError(
            f"{path}: partition.backends: target '{steps['codegen']['target']}' runs on the "
            f'backend \'{backend}\' (got {accelerators[0]!r}); e.g. ["{backend}", "cpu"]'
        )
    if partition["default"] != "cpu":
        raise UserError(
            f"{path}: partition.default: must be 'cpu', the backend that runs every op "
            f"(got {partition['default']!r}); pin nodes to the NPU with opcode/opname maps"
        )
    codegen = steps["codegen"]
    partition.update(
        name=Path(steps["import"]["source"]).stem,
        backends=backends,
        target=codegen["target"],
        hw=codegen["hw"],
    )
