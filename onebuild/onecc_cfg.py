"""ONE's onecc configuration files (`.cfg`) as onebuild recipes.

A onecc user's `model.cfg` (an INI file: `[onecc]` switches the `one-*` steps on, one section
per step holds its options) becomes a recipe with the same steps and settings, written beside
it. Paths in the cfg are relative to the folder onecc runs in (the cfg's own, by convention);
in the recipe they are relative to the recipe. ONE's defaults are written out where onebuild's
differ (granularity `layer`, the percentile calibration at 1 / 99, model I/O in the quantized
type), so the recipe builds what onecc would have.

Every key is either translated, known to be irrelevant here (the intermediate `output_path`s
onecc chains its tools with, logging), or an error naming the section and key and what to do:
nothing is dropped silently. The file is parsed as data (configparser, no interpolation).
"""

import configparser
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import toml_text
from .errors import UserError
from .fileio import read_regular

IMPORTS = {"one-import-onnx": "ONNX", "one-import-tflite": "tflite"}
ELSEWHERE = {  # onecc steps onebuild does not run, and what to do instead
    "one-import-tf": "convert the TensorFlow model to ONNX or tflite first",
    "one-import-bcq": "convert the BCQ model to ONNX or tflite first",
    "one-import-pytorch": "export the PyTorch model with torch.onnx.export first",
    "one-profile": "time the package with `onebuild run` / `onebuild inspect` instead",
    "one-infer": "run the package with `onebuild run` instead",
}
STEPS = {*IMPORTS, *ELSEWHERE, "one-optimize", "one-quantize", "one-partition", "one-codegen",
         "one-pack"}  # fmt: skip
IGNORED = {"input_path", "output_path", "verbose", "save_intermediate", "generate_profile_data"}
PARTITION_IGNORED = {"input_file", "work_path"}  # the model and folder onecc chains through
IMPORT_KEYS = {"keep_io_order", "unroll_rnn", "unroll_lstm", "dynamic_batch_to_single_batch",
               "experimental_disable_batchmatmul_unfold"}  # fmt: skip
QUANTIZE_KEYS = {
    "quantized_dtype", "granularity", "input_type", "output_type", "input_dtype",
    "input_model_dtype", "input_data",
    "input_data_format", "mode", "min_percentile", "max_percentile", "moving_avg_batch",
    "moving_avg_const",
}  # fmt: skip
EVALUATION_KEYS = {  # one-quantize's comparison of the quantized model with the float one
    "evaluate_result", "test_data", "print_mae", "print_mape", "print_mpeir", "print_mse",
    "print_top1_match", "print_top5_match",
}  # fmt: skip
CODEGEN_TARGETS = {"trix": "trix_sim", "trix_sim": "trix_sim"}
MODE_OPTIONS = {  # one-quantize's calibration modes and their options, with ONE's defaults
    "percentile": {"min_percentile": 1.0, "max_percentile": 99.0},
    "moving_average": {"moving_avg_batch": 16, "moving_avg_const": 0.1},
}
HEADER = "# Translated from a onecc configuration by onebuild convert-cfg"


@dataclass
class Converted:
    """The recipe text, and notes for the user (settings kept as comments, not translated)."""

    text: str
    notes: list[str] = field(default_factory=list)


CFG_LIMIT = 1 << 20  # a onecc configuration is a few hundred bytes


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive in onecc
    try:
        parser.read_string(read_regular(path, CFG_LIMIT).decode("utf-8"), str(path))
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror})") from None
    except (configparser.Error, UnicodeDecodeError) as error:
        first = str(error).splitlines()[0]
        raise UserError(f"{path}: not a onecc configuration ({first})") from None
    return parser


INTEGER_TYPES = ("int32", "int64")  # an integer input's or output's own type in io lists


def _flag(path: Path, section: str, key: str, text: str) -> bool:
    """A boolean as onecc reads it (configparser's getboolean: 1/yes/true/on, 0/no/false/off)."""
    state = configparser.ConfigParser.BOOLEAN_STATES.get(text.strip().lower())
    if state is None:
        raise UserError(f"{path}: [{section}] {key} = {text!r} is not a boolean (True or False)")
    return state


class _Converter:
    def __init__(self, path: Path, recipe: Path):
        self.path, self.recipe = path, recipe
        self.cfg = _read(path)
        self.data: dict = {}
        self.comments: dict[str, list[str]] = {}
        self.notes: list[str] = []

    def fail(self, section: str, key: str, why: str) -> UserError:
        return UserError(f"{self.path}: [{section}] {key}: {why}")

    def options(self, section: str, known: set[str]) -> dict[str, str]:
        """The section's keys (an error names the first one not in `known` or IGNORED)."""
        if not self.cfg.has_section(section):
            raise UserError(f"{self.path}: [onecc] turns {section} on but there is no [{section}]")
        values = dict(self.cfg.items(section))
        for key in values:
            if key not in known | IGNORED:
                accepted = ", ".join(sorted(known))
                raise self.fail(section, key, f"not translated (onebuild reads: {accepted})")
        return values

    def relative(self, section: str, key: str, text: str, exists: bool = True) -> str:
        """A cfg path (relative to the cfg's folder) relative to the recipe's folder; with
        `exists`, the file must be there."""
        try:
            target = (self.path.parent / text.strip()).resolve()
            found = target.exists()
        except (OSError, ValueError) as error:
            raise self.fail(section, key, f"not a usable path ({error})") from None
        if exists and not found:
            raise self.fail(section, key, f"{target} does not exist")
        return Path(os.path.relpath(target, self.recipe.parent.resolve())).as_posix()

    def steps(self) -> list[str]:
        section = next((s for s in ("onecc", "one-build") if self.cfg.has_section(s)), None)
        if section is None:
            raise UserError(f"{self.path}: no [onecc] section (which steps run)")
        enabled, include = [], None
        for key, text in self.cfg.items(section):
            if key == "include":
                include = text
                continue
            if key not in STEPS:
                raise self.fail(section, key, f"unknown step (known: {', '.join(sorted(STEPS))})")
            if _flag(self.path, section, key, text):
                if key in ELSEWHERE:
                    raise self.fail(section, key, f"onebuild has no such step: {ELSEWHERE[key]}")
                enabled.append(key)
        if include is not None:
            if "one-optimize" not in enabled:
                raise self.fail(
                    section, "include", "names optimization options: turn on one-optimize"
                )
            self.comments.setdefault("optimize", []).append(f"onecc include = {include}")
        imports = [step for step in enabled if step in IMPORTS]
        if len(imports) != 1:
            raise UserError(
                f"{self.path}: [onecc] must turn on exactly one of {', '.join(IMPORTS)} "
                f"(it turns on {', '.join(imports) or 'none'})"
            )
        return enabled

    def backend(self) -> None:
        if self.cfg.has_section("backend"):
            for key in self.cfg.options("backend"):
                if key != "target":
                    raise self.fail("backend", key, "not translated (onebuild reads: target)")
            target = self.cfg.get("backend", "target", fallback="").strip()
            if target and target.lower() not in CODEGEN_TARGETS:
                raise self.fail("backend", "target", f"'{target}' is not a TRIX target here")

    def import_step(self, section: str) -> None:
        values = self.options(section, IMPORT_KEYS if section == "one-import-onnx" else set())
        if "input_path" not in values:
            raise self.fail(section, "input_path", "missing (the model to import)")
        self.data["import"] = {"source": self.relative(section, "input_path", values["input_path"])}
        kept = ", ".join(f"{k}={v}" for k, v in values.items() if k in IMPORT_KEYS)
        if kept:
            self.comments["import"] = [
                "onebuild imports a dynamic batch as 1 and keeps the I/O order and recurrent",
                f"layers as they are; onecc options: {kept}",
            ]

    def optimize_step(self) -> None:
        if not self.cfg.has_section("one-optimize"):
            raise UserError(f"{self.path}: [onecc] turns one-optimize on but there is no section")
        values = dict(self.cfg.items("one-optimize"))
        flags = sorted(
            k
            for k, v in values.items()
            if k not in IGNORED and _flag(self.path, "one-optimize", k, v)
        )
        off = sorted(k for k in values if k not in IGNORED and k not in flags)
        self.data["optimize"] = {"preset": "O1"}
        self.comments.setdefault("optimize", []).append(
            "onebuild's O1 (docs: README, 'O1 passes') stands for one-optimize's passes"
            + (f": {', '.join(flags)}" if flags else "")
        )
        if off:
            self.comments["optimize"].append(f"turned off in the cfg: {', '.join(off)}")
            self.notes.append(
                f"one-optimize flags set False ({', '.join(off)}) are not honoured: onebuild's "
                "O1 runs its own set of passes"
            )

    def quantize_step(self) -> None:
        values = self.options("one-quantize", QUANTIZE_KEYS | EVALUATION_KEYS)
        dtype = values.get("quantized_dtype", "uint8").strip()
        if dtype not in ("uint8", "int16"):
            raise self.fail("one-quantize", "quantized_dtype", f"'{dtype}': use uint8 or int16")
        for key in ("input_dtype", "input_model_dtype"):
            if values.get(key, "float32").strip() != "float32":
                raise self.fail("one-quantize", key, "only float32 models are quantized")
        step = {
            "dtype": dtype,
            "granularity": values.get("granularity", "layer").strip(),
            "input_type": self.io_type(values, "input_type", dtype),
            "output_type": self.io_type(values, "output_type", dtype),
        }
        for key in ("granularity", "input_type", "output_type"):
            allowed = (
                ("layer", "channel") if key == "granularity" else ("float32", "uint8", "int16")
            )
            if step[key] not in allowed:
                raise self.fail("one-quantize", key, f"'{step[key]}': use {' or '.join(allowed)}")
        mode = values.get("mode", "percentile").strip()
        if mode not in MODE_OPTIONS:
            raise self.fail("one-quantize", "mode", f"'{mode}': use percentile or moving_average")
        step["method"] = mode
        for key, default in MODE_OPTIONS[mode].items():
            text = values.get(key, str(default)).strip()
            try:
                step[key] = type(default)(text)
            except (ValueError, OverflowError):
                kind = "an integer" if isinstance(default, int) else "a number"
                raise self.fail("one-quantize", key, f"'{text}' is not {kind}") from None
        other = [k for options in MODE_OPTIONS.values() for k in options if k in values]
        unused = [k for k in other if k not in MODE_OPTIONS[mode]]
        if unused:
            raise self.fail("one-quantize", unused[0], f"has no effect with mode = {mode}")
        self.calibration(values, step)
        self.evaluation(values, step)
        self.data["quantize"] = step

    def io_type(self, values: dict[str, str], key: str, dtype: str) -> str:
        """input_type / output_type: one type, or onecc's comma-separated list of one type per
        model input (output), which onebuild accepts when the float tensors' entries agree;
        int32 / int64 entries are integer tensors' own types, which onebuild leaves as is (the
        cfg cannot say which tensors are integer: the build checks the model)."""
        entries = {t.strip() for t in values.get(key, dtype).split(",")}
        types = entries - set(INTEGER_TYPES) or {dtype}
        if len(types) != 1:
            listed = ", ".join(sorted(types))
            raise self.fail(
                "one-quantize",
                key,
                f"types differ per tensor ({listed}): onebuild sets one type "
                "for all; quantize the model I/O in one type or keep it float32",
            )
        return types.pop()

    def evaluation(self, values: dict[str, str], step: dict) -> None:
        """evaluate_result with test_data: the accuracy step, which reports every metric
        (quantize.accuracy.json) whichever print_* onecc was asked for."""
        switches = {k: _flag(self.path, "one-quantize", k, v) for k, v in values.items()
                    if k in EVALUATION_KEYS - {"test_data"}}  # fmt: skip
        printed = sorted(
            k.removeprefix("print_") for k, on in switches.items() if on and k != "evaluate_result"
        )
        data = values.get("test_data", "").strip()
        if not switches.get("evaluate_result"):
            if data or printed:
                self.notes.append(
                    "one-quantize's test_data / print_* have no effect without evaluate_result; "
                    "not translated"
                )
            return
        if not data:
            self.notes.append(
                "one-quantize evaluates on random data without test_data; onebuild needs real "
                "samples: add [quantize.accuracy] data to compare the quantized model"
            )
            return
        step["accuracy"] = {"data": self.relative("one-quantize", "test_data", data)}
        self.comments["quantize"] = [
            "onecc's evaluate_result: the accuracy step writes every metric (SQNR, MAE, MSE,",
            f"MAPE, MPEIR, top-1/top-5 match) to quantize.accuracy.json; onecc printed: "
            f"{', '.join(printed) or 'none'}",
        ]

    def calibration(self, values: dict[str, str], step: dict) -> None:
        data = values.get("input_data", "").strip()
        if not data:
            step["random_calibration"] = True
            self.notes.append(
                "one-quantize has no input_data: calibrating on random data as onecc does, which "
                "calibrates badly; set quantize.calibration to real samples"
            )
            return
        layout = values.get("input_data_format", "h5").strip().lower()
        if layout not in ("h5", "hdf5"):
            raise self.fail(
                "one-quantize",
                "input_data_format",
                f"'{layout}' (raw files without shapes): save the samples as .h5 (rawdata2hdf5) "
                "or as .npz keyed by input name",
            )
        step["calibration"] = self.relative("one-quantize", "input_data", data)

    def partition_step(self) -> None:
        values = self.options(
            "one-partition", {"backends", "default", "part_file"} | PARTITION_IGNORED
        )
        step = {}
        if "backends" in values:
            step["backends"] = [b.strip() for b in values["backends"].split(",") if b.strip()]
        if "default" in values:
            step["default"] = values["default"].strip()
        if values.get("part_file", "").strip():
            step["part_file"] = self.relative("one-partition", "part_file", values["part_file"])
        self.data["partition"] = step

    def codegen_step(self) -> None:
        values = self.options("one-codegen", {"backend", "command"})
        backend = values.get("backend", "").strip()
        if backend.lower() not in CODEGEN_TARGETS:
            raise self.fail("one-codegen", "backend", f"'{backend}': onebuild compiles for trix")
        self.data["codegen"] = {"target": CODEGEN_TARGETS[backend.lower()]}
        if values.get("command", "").strip():
            self.comments["codegen"] = [
                f"one-codegen command (not translated): {values['command']}"
            ]
            self.notes.append(
                "one-codegen's command line is not translated; choose the hardware with "
                "codegen.hw (onebuild targets lists the presets)"
            )

    def pack_step(self) -> None:
        values = self.options("one-pack", set())
        output = values.get("output_path", "").strip()
        if not output:
            raise self.fail("one-pack", "output_path", "missing (the nnpackage to write)")
        folder = self.relative("one-pack", "output_path", output, False)
        model = values.get("input_path", "").strip() or self.data["import"]["source"]
        name = Path(model).stem  # model2nnpkg names the package after its model file
        self.data["pack"] = {"output": f"{folder}/{name}"}
        self.comments["pack"] = [f"one-pack writes the nnpackage '{name}' inside {output}"]

    def run(self) -> Converted:
        self.backend()
        steps = self.steps()
        for step in steps:
            if step in IMPORTS:
                self.import_step(step)
            else:
                getattr(self, step.removeprefix("one-") + "_step")()
        sections = []
        for name in ("import", "optimize", "quantize", "partition", "codegen", "pack"):
            if name not in self.data:
                continue
            comments = "".join(f"# {line}\n" for line in self.comments.get(name, []))
            sections.append(comments + toml_text.table(name, self.data[name]))
        body = f"# From {self.path.name}; ONE's defaults are spelled out.\n" + "\n".join(sections)
        return Converted(f"{HEADER}, sha256 {_digest(body)}\n{body}", self.notes)


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def unchanged_translation(text: str) -> bool:
    """Whether a recipe's text is a translation this module wrote, not edited since: its
    first line records the digest of the rest."""
    first, _, body = text.partition("\n")
    return first == f"{HEADER}, sha256 {_digest(body)}"


def convert_cfg(path: str | os.PathLike, recipe: str | os.PathLike) -> Converted:
    """The recipe (to be written at `recipe`) that builds what onecc builds from `path`."""
    return _Converter(Path(path), Path(recipe)).run()
