"""On-device quantization and codegen: the build's own steps (`onebuild.tasks`) on the
session's workspace, so their files equal what `onebuild build` makes from the same data."""

import json
from pathlib import Path

from ..errors import ModelError, UserError
from .odc import QUANT_TYPES, OdcSettings
from .workspace import Workspace


def quantize_file(ws: Workspace, settings: OdcSettings, samples: int, output: Path) -> Path:
    """The quantize step on the workspace's prepared model (and, for full quantization, its
    recorded ranges, `samples` runs of them)."""
    from ..recipe import QuantizeStep
    from ..tasks import quantize as quantize_step

    options = QUANT_TYPES[settings.quant_type]
    if options["mode"] == "full" and not samples:
        raise UserError(
            "full quantization needs recorded ranges: run the model with "
            "set_execute_config('DUMP_MINMAX') first"
        )
    config = QuantizeStep(**options, random_calibration=True).model_dump()
    inputs = [ws.model]
    if options["mode"] == "full":
        inputs.append(ws.minmax)
    quantize_step.run(quantize_step.step_config(config), inputs, [output])
    return output


def codegen_file(
    ws: Workspace | None, settings: OdcSettings, source: Path, cpath: Path | None
) -> Path:
    """The codegen step on the quantized model `source`: one .tvn (at `cpath`, else in the
    workspace, else beside `source`); in a workspace, a model the NPU cannot run whole becomes
    a package of NPU and CPU parts."""
    from ..tasks import codegen as codegen_step

    output = cpath or (ws.compiled if ws else source.with_suffix(".tvn"))
    config = {"target": settings.target, "hw": settings.hw, "pref": settings.pref}
    try:
        codegen_step.run(config, [source], [output])
    except ModelError as error:  # not all of it runs on the NPU: the NPU parts do
        if ws is None or cpath is not None:
            raise
        return partitioned_codegen(ws, source, config, error)
    return output


def partitioned_codegen(ws: Workspace, source: Path, codegen: dict, whole: ModelError) -> Path:
    """The build's partition, codegen (per NPU part) and pack steps: an nnpackage in the
    workspace with the NPU parts as .tvn binaries and the rest on the CPU."""
    from ..recipe import PartitionStep
    from ..tasks import codegen as codegen_step
    from ..tasks import pack as pack_step
    from ..tasks import partition as partition_step

    config = PartitionStep().model_dump()
    config.update(name="model", accelerator="trix", target=codegen["target"], hw=codegen["hw"])
    partition_step.run(config, [source], [ws.partition])
    connection = ws.partition / "model.conn.json"
    parts = json.loads(connection.read_text())["parts"]
    if all(part["backend"] == "cpu" for part in parts):
        raise whole
    models = []
    for part in parts:
        model = ws.partition / part["file"]
        if part["backend"] != "cpu":
            compiled = ws.partition / f"{model.stem}.tvn"
            codegen_step.run(codegen, [model], [compiled])
            model = compiled
        models.append(model)
    pack = {"output": str(ws.package), "archive": False, "config": {}}
    pack_step.run(pack, [connection, *models], [ws.package])
    return ws.package
