"""On-device quantization and codegen: the compile API (`onebuild.compile`) on the session's
workspace, with the build's own file conventions, so its files equal what `onebuild build`
makes from the same data. No recipe, pydantic or doit on this path."""

import logging
import tempfile
from pathlib import Path

from ..compile import (
    CodegenOptions,
    PartitionOptions,
    QuantizeOptions,
    compile_file,
    partition,
    quantize,
)
from ..errors import ModelError, UserError
from ..fileio import atomic_write_bytes
from ..graph_ir.ir import Model
from ..graph_ir.serde import load_ir, load_model, save_ir
from ..graph_ir.serde.calibration_file import load_calibration
from ..graph_ir.serde.circle_exact import exact_circle
from ..odc import QUANT_TYPES, OdcSettings
from ..packing import write_package
from ..progress import Progress
from ..targets import binary_suffix, channel_dtypes
from .outputs import writable
from .workspace import Workspace, naming

log = logging.getLogger("onebuild")


def quantize_file(
    ws: Workspace, settings: OdcSettings, samples: int, output: Path, source: Path
) -> Path:
    """Quantize the workspace's prepared model (for full quantization with its recorded
    ranges, `samples` runs of them); the other options are the compile API's defaults. An
    `output` ending in .circle gets a circle when the circle is exact, else an IR file beside
    it, `<output>.obir` (the workspace's quantized.obir for its own quantized.circle; returned);
    never over `source`, the model the session opened."""
    options = QuantizeOptions(
        **QUANT_TYPES[settings.quant_type],
        activation_granularity=settings.activation_granularity,
        channel_dtypes=channel_dtypes(settings.target),  # the dtypes its codegen lowers
    )
    full = options.mode == "full"
    if full and not samples:
        raise UserError(
            "full quantization needs recorded ranges: run the model with "
            "set_execute_config('DUMP_MINMAX') first"
        )
    stats = load_calibration(ws.minmax) if full else None
    model = quantize(load_ir(ws.model), options, stats)
    if output.suffix == ".circle":
        data, reason = exact_circle(model)
        if data is not None:
            path = _checked(ws, output, "circle", "the quantized model path", source)
            with naming(path):
                atomic_write_bytes(path, data)
            return output
        own = ws.quantized.with_suffix(".circle")  # the workspace's default: quantized.obir
        output = ws.quantized if output == own else output.with_name(f"{output.name}.obir")
        log.warning("the quantized model is written as %s, not circle: %s", output.name, reason)
    with naming(output):
        save_ir(model, _checked(ws, output, "obir", "the quantized model path", source))
    return output


def codegen_file(ws: Workspace, settings: OdcSettings, source: Path, cpath: Path | None) -> Path:
    """Compile the quantized model `source`: one binary (at `cpath`, else in the workspace); a
    model the NPU cannot run whole becomes a package of NPU and CPU parts in the workspace."""
    options = CodegenOptions(settings.target, settings.hw, settings.pref)
    output = cpath or ws.compiled
    try:
        with naming(output):
            compile_file(source, _checked(ws, output, "binary", "the codegen model path"), options)
    except ModelError as error:  # not all of it runs on the NPU: the NPU parts do
        if cpath is not None:
            raise
        return partitioned_codegen(ws, source, options, error)
    return output


def codegen_model(
    model: Model, source: Path | None, settings: OdcSettings, cpath: Path | None, paths: tuple
) -> Path:
    """Compile a model that came quantized (`model`, read from `source`; a pre-quantized ONNX
    model, as imported and optimized, has no file of its own). `paths`: the file the session
    opened and its workspace folder. One binary at `cpath`, else beside the opened file; a
    model the NPU cannot run whole becomes a package of NPU and CPU parts in the workspace, as
    for a model the session quantized (None: the session has no workspace)."""
    options = CodegenOptions(settings.target, settings.hw, settings.pref)
    opened, folder = paths
    output = cpath or opened.with_suffix(f".{binary_suffix(options.target)}")
    with tempfile.TemporaryDirectory() as scratch:  # compile_file reads what it compiles
        if source is None:
            source = Path(scratch) / "model.obir"
            save_ir(model, source)
        try:
            target = _checked(None, output, "binary", "the codegen model path")
            compile_file(source, target, options)
        except ModelError as error:  # not all of it runs on the NPU: the NPU parts do
            if cpath is not None:
                raise
            if folder is None:  # Session(workspace=False)
                raise UserError(
                    f"{error}; the session would put its NPU and CPU parts in its workspace "
                    "and has none (workspace=False): give it one (workspace=DIR)"
                ) from None
            return partitioned_codegen(Workspace(folder), source, options, error)
    return output


def partitioned_codegen(
    ws: Workspace, source: Path, codegen: CodegenOptions, whole: ModelError
) -> Path:
    """As the build's partition, codegen (per NPU part) and pack steps: an nnpackage in the
    workspace with the NPU parts as binaries and the rest on the CPU."""
    result = partition(load_model(source).main, "model", PartitionOptions(), codegen)
    if all(backend == "cpu" for backend in result.backends):
        raise whole
    with naming(ws.package):
        return _write_parts(ws, result, codegen)


def _write_parts(ws: Workspace, result, codegen: CodegenOptions) -> Path:
    """The parts in `ws.partition` (NPU parts compiled) and their package `ws.package`."""
    connection = result.save(ws.partition)
    models = []
    npu_parts = sum(backend != "cpu" for backend in result.backends)
    progress = Progress("on-device codegen", npu_parts, "parts")
    for file, backend in zip(result.files, result.backends):
        model = ws.partition / file
        if backend != "cpu":
            compiled = ws.partition / f"{model.stem}.{binary_suffix(codegen.target)}"
            compile_file(model, compiled, codegen)
            model = compiled
            progress(progress.done + 1)
        models.append(model)
    progress.finish()
    for note in write_package(ws.package, models, connection):
        log.warning("on-device codegen: %s", note)
    return ws.package


def _checked(
    ws: Workspace | None, path: Path, kind: str, option: str, source: Path | None = None
) -> Path:
    """`path`; outside the workspace only where onebuild may write (`outputs.writable`), and
    never the session's own model `source`."""
    if ws is None or ws.folder.resolve() not in path.resolve().parents:
        writable(path, [kind], option, [source] if source else [])
    return path
