"""What a Session can open: an ONNX, circle, tflite or IR model (float, or already
quantized), a target's binary, or an nnpackage (one IR or circle model, which the device can
still quantize or compile, or parts it can only run)."""

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..graph_ir.ir import Model
from ..graph_ir.quant.from_qdq import graph_is_quantized
from ..graph_ir.serde import load_ir, load_onnx, read_circle
from ..graph_ir.serde.irfile import MAGIC as IR_MAGIC
from ..odc import OdcSettings, settings_from_config
from ..targets import binary_target, check_target
from .models import BinaryModel, PackageModel, load_binary
from .package import IR_TYPES, Package, load_cpu_model, load_package
from .package_files import is_package

ODC_KEYS = ("ODC_TARGET", "ODC_HW")

FLATBUFFER_IDS = (b"CIR0", b"TFL3")  # circle, tflite file identifiers


@dataclass
class Opened:
    """An IR model the session may quantize or compile (`model`, read from `source`), or one
    it only runs (`runner`, with its `inputs` and `outputs` specs)."""

    model: Model | None = None
    source: Path | None = None
    runner: BinaryModel | PackageModel | None = None
    inputs: list | None = None
    outputs: list | None = None
    settings: OdcSettings | None = None  # an nnpackage's config.cfg
    circle: bool = False  # the model is a circle: the device writes its quantized model as one
    package: Package | None = None  # (keeps a zip package's extraction alive)


def open_model(path: str | os.PathLike, input_shapes: dict | None) -> Opened:
    """The model at `path` (ONNX models are optimized with the build's default preset)."""
    path = Path(path)
    if is_package(path):
        package = load_package(path)
        settings = settings_from_config(package.config, f"{path}: config.cfg")
        check_target(settings.target, settings.hw, f"{path}: config.cfg: ", ODC_KEYS)
        if len(package.models) == 1 and package.models[0].kind in IR_TYPES:
            kind, model_file = package.models[0].kind, Path(package.root) / package.models[0].path
            model = load_cpu_model(model_file, kind)
            return Opened(
                model, model_file, settings=settings, circle=kind == "circle", package=package
            )
        runner = PackageModel(package)
        return Opened(
            None, None, runner, package.inputs, package.outputs, settings, package=package
        )
    if not path.is_file():
        if path.exists() or path.is_symlink():  # a FIFO, a device, a symlink loop
            raise UserError(f"{path}: is neither a regular file nor an nnpackage; name a model")
        raise UserError(f"{path}: no such file or nnpackage")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if binary_target(path) is not None:
        binary = load_binary(path)
        return Opened(runner=BinaryModel(binary), inputs=binary.inputs, outputs=binary.outputs)
    if head.startswith(IR_MAGIC):
        return Opened(load_ir(path), path)
    from ..compile import optimize

    if path.suffix.lower() in (".circle", ".tflite") or head[4:8] in FLATBUFFER_IDS:
        if input_shapes:
            raise UserError(f"{path}: input shapes of a circle/tflite model are fixed; omit them")
        model = read_circle(path)  # float: prepared as the build's import and optimize steps
        if not graph_is_quantized(model.main):  # quantized: kept as it is, parameters and all
            optimize(model)
        return Opened(model, path, circle=head[4:8] == FLATBUFFER_IDS[0])
    return Opened(optimize(load_onnx(path, input_shapes)))
