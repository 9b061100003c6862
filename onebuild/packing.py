"""Writing nnpackages: model file(s) -> a package folder (MANIFEST v1.3, config files).

The package is assembled in a temporary sibling folder and swapped in, so a killed build never
leaves a half-written package under the final name. The pack step and the on-device Session
both write packages with `write_package`.
"""

import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

from .fileio import atomic_folder, atomic_write_bytes
from .nnpackage import Manifest, Ref, config_text, manifest_json, parse_config, parse_ref


def _model_io(source: Path) -> tuple[str, str, list[str], list[str]]:
    """Model type, backend and I/O names of an IR file or of a target's binary."""
    from .targets import binary_target

    target = binary_target(source)
    if target is not None:
        binary = target.load(source)
        names = [[t.name for t in ts] for ts in (binary.inputs, binary.outputs)]
        return target.model_type, target.backend, *names
    from .graph_ir.serde import load_ir

    graph = load_ir(source).main
    return "obir", "cpu", [v.name for v in graph.inputs], [v.name for v in graph.outputs]


def _single(source: Path, stem: str) -> tuple[Manifest, dict[str, Path], dict[str, bytes]]:
    """A one-model package: package I/O are the model's own, in order."""
    kind, backend, inputs, outputs = _model_io(source)
    name = f"{stem}.{kind}"
    meta = Manifest(
        models=[name],
        model_types=[kind],
        configs=["config.cfg"],
        model_configs=[""],
        pkg_inputs=[Ref(0, 0, i) for i in range(len(inputs))],
        pkg_outputs=[Ref(0, 0, i) for i in range(len(outputs))],
        connect=[],
    )
    return meta, {name: source}, {"config.cfg": config_text({"BACKENDS": backend})}


def _partitioned(connection: Path, models: list[Path]):
    """A multi-model package from a partition's connection JSON and the parts' model files
    (NPU parts compiled, in the connection's order); one config per model."""
    info = json.loads(connection.read_text())
    parts = info["parts"]
    configs = {}
    for model, part in zip(models, parts):
        configs[f"{model.stem}.cfg"] = config_text({"BACKENDS": part["backend"]})
    backends = list(dict.fromkeys(p["backend"] for p in parts))
    configs["config.cfg"] = config_text({"BACKENDS": ";".join(backends)})
    meta = Manifest(
        models=[m.name for m in models],
        model_types=[m.suffix.lstrip(".") for m in models],
        configs=["config.cfg"],
        model_configs=[f"{m.stem}.cfg" for m in models],
        pkg_inputs=[parse_ref(r, str(connection)) for r in info["source"]["inputs"]],
        pkg_outputs=[parse_ref(r, str(connection)) for r in info["source"]["outputs"]],
        connect=[
            (
                parse_ref(e["from"], str(connection)),
                [parse_ref(t, str(connection)) for t in e["to"]],
            )
            for e in info["conn"]
        ],
    )
    return meta, {m.name: m for m in models}, configs


def write_package(
    package: Path,
    models: list[Path],
    connection: Path | None = None,
    config: dict[str, Any] | None = None,
    archive: Path | None = None,
) -> None:
    """An nnpackage at `package` of one model, or of the parts a partition's `connection`
    JSON lists (`models` in its order, NPU parts compiled); `config` adds config.cfg keys;
    `archive` also writes a deterministic zip of it."""
    if connection is not None:
        meta, files, configs = _partitioned(connection, models)
    else:
        meta, files, configs = _single(models[0], package.stem)
    if config:
        extra = {key: _config_value(value) for key, value in config.items()}
        current = parse_config(configs["config.cfg"].decode(), "config.cfg")
        configs["config.cfg"] = config_text({**current, **extra})
    with atomic_folder(package) as staging:
        for name, source in files.items():
            shutil.copyfile(source, staging / name)
        atomic_write_bytes(staging / "metadata" / "MANIFEST", manifest_json(meta))
        for name, text in configs.items():
            atomic_write_bytes(staging / "metadata" / name, text)
        if archive is not None:
            atomic_write_bytes(archive, zip_bytes(staging, package.name))


def _config_value(value) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def archive_path(package: Path) -> Path:
    return package.with_name(package.name + ".zip")


def zip_bytes(folder: Path, root: str) -> bytes:
    """A deterministic zip of `folder` under `root/`: sorted names, fixed times and modes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = f"{root}/{path.relative_to(folder).as_posix()}"
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()
