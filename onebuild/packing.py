"""Writing nnpackages: model file(s) -> a package folder (MANIFEST v1.3, config files).

Models are written in ONE's formats: IR models (CPU parts, whole models) as `.circle` when the
circle is exact, else as `.obir` with the reason returned; parts are named as ONE's partitioner
names them (`<model>.part.NNNNN_<backend>.<type>`).

The package is assembled in a temporary sibling folder and swapped in, so a killed build never
leaves a half-written package under the final name. The pack step and the on-device Session
both write packages with `write_package`.
"""

import io
import json
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import FormatError, UserError
from .fileio import atomic_folder, atomic_write_bytes
from .nnpackage import (
    Manifest,
    Ref,
    config_text,
    config_value,
    manifest_json,
    parse_config,
    parse_manifest,
    parse_ref,
)

# a part's number and backend, as the partition step names its files (m.00002_cpu.obir)
PART = re.compile(r"\d{5}_[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class _Member:
    """A model as the package holds it: its type, backend, I/O names and, for an IR model
    shipped as circle, the circle's bytes (else the source file is copied)."""

    source: Path
    kind: str
    backend: str
    inputs: list[str]
    outputs: list[str]
    data: bytes | None = None


def _member(source: Path, notes: list[str]) -> _Member:
    """A target's binary as it is; an IR model as circle when the circle is exact (see
    `circle_exact`), else as the IR file, with the reason in `notes`."""
    from .targets import binary_target

    target = binary_target(source)
    if target is not None:
        binary = target.load(source)
        names = [[t.name for t in ts] for ts in (binary.inputs, binary.outputs)]
        return _Member(source, target.model_type, target.backend, *names)
    from .graph_ir.serde import load_ir
    from .graph_ir.serde.circle_exact import exact_circle

    model = load_ir(source)
    graph = model.main
    names = [[v.name for v in values] for values in (graph.inputs, graph.outputs)]
    data, reason = exact_circle(model)
    if data is None:
        notes.append(f"{source.name} stays an IR file (.obir), not circle: {reason}")
        return _Member(source, "obir", "cpu", *names)
    return _Member(source, "circle", "cpu", *names, data)


def _part_name(stem: str) -> str:
    """ONE's partitioner's name for a part: `m.00002_cpu` -> `m.part.00002_cpu`."""
    base, dot, part = stem.rpartition(".")
    if dot and PART.fullmatch(part):
        return f"{base}.part.{part}"
    return stem


def _single(member: _Member, stem: str) -> tuple[Manifest, dict[str, _Member], dict[str, bytes]]:
    """A one-model package: package I/O are the model's own, in order."""
    name = f"{stem}.{member.kind}"
    meta = Manifest(
        models=[name],
        model_types=[member.kind],
        configs=["config.cfg"],
        model_configs=[""],
        pkg_inputs=[Ref(0, 0, i) for i in range(len(member.inputs))],
        pkg_outputs=[Ref(0, 0, i) for i in range(len(member.outputs))],
        connect=[],
    )
    return meta, {name: member}, {"config.cfg": config_text({"BACKENDS": member.backend})}


def _partitioned(connection: Path, members: list[_Member]):
    """A multi-model package from a partition's connection JSON and the parts' models (NPU
    parts compiled, in the connection's order); one config per model."""
    info = json.loads(connection.read_text())
    parts = info["parts"]
    stems = [_part_name(m.source.stem) for m in members]
    configs = {}
    for stem, part in zip(stems, parts):
        configs[f"{stem}.cfg"] = config_text({"BACKENDS": part["backend"]})
    backends = list(dict.fromkeys(p["backend"] for p in parts))
    configs["config.cfg"] = config_text({"BACKENDS": ";".join(backends)})
    names = [f"{stem}.{m.kind}" for stem, m in zip(stems, members)]
    meta = Manifest(
        models=names,
        model_types=[m.kind for m in members],
        configs=["config.cfg"],
        model_configs=[f"{stem}.cfg" for stem in stems],
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
    return meta, dict(zip(names, members)), configs


def write_package(
    package: str | Path,
    models: list[str | Path],
    connection: str | Path | None = None,
    config: dict[str, Any] | None = None,
    archive: Path | None = None,
) -> list[str]:
    """An nnpackage at `package` of one model, or of the parts a partition's `connection`
    JSON lists (`models` in its order, NPU parts compiled); `config` adds config.cfg keys;
    `archive` also writes a deterministic zip of it. IR models go in as circle where the
    circle is exact; returns why the others stay IR files. An existing `package` is replaced
    only if it is a package onebuild wrote (`is_package_folder`), `archive` only if it is
    that package's zip; no folders are created."""
    package, models = Path(package), [Path(model) for model in models]
    connection = None if connection is None else Path(connection)
    if not models:
        raise UserError(f"{package}: write_package needs at least one model file")
    if connection is None and len(models) > 1:
        raise UserError(
            f"{package}: {len(models)} models need the partition's connection file "
            "(`connection`); a package without one holds one model"
        )
    if archive is not None:
        check_archive_output(Path(archive), package.name)
    notes: list[str] = []
    members = [_member(model, notes) for model in models]
    if connection is not None:
        meta, files, configs = _partitioned(connection, members)
    else:
        meta, files, configs = _single(members[0], package.stem)
    if config:
        extra = {key: config_value(value) for key, value in config.items()}
        current = parse_config(configs["config.cfg"].decode(), "config.cfg")
        configs["config.cfg"] = config_text({**current, **extra})
    with atomic_folder(package, is_package_folder, "an nnpackage") as staging:
        for name, member in files.items():
            if member.data is None:
                shutil.copyfile(member.source, staging / name)
            else:
                (staging / name).write_bytes(member.data)
        atomic_write_bytes(staging / "metadata" / "MANIFEST", manifest_json(meta))
        for name, text in configs.items():
            atomic_write_bytes(staging / "metadata" / name, text)
        if archive is not None:
            atomic_write_bytes(archive, zip_bytes(staging, package.name))
    return notes


def is_package_folder(folder: Path) -> bool:
    """Whether `folder` is an nnpackage as `write_package` writes it: a readable
    metadata/MANIFEST, and no files but its models and metadata/ (so a folder of the user's
    files that happens to hold a MANIFEST is not one)."""
    try:
        manifest = parse_manifest((folder / "metadata" / "MANIFEST").read_text(), str(folder))
        files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    except (OSError, UnicodeDecodeError, FormatError, ValueError):
        return False
    return all(f in manifest.models or f.startswith("metadata/") for f in files)


def check_archive_output(archive: Path, root: str) -> None:
    """Refuse to replace `archive` unless it is missing or a zip of a package named `root`
    (as `zip_bytes` writes it); its folder must exist."""
    if not archive.parent.is_dir():
        raise UserError(
            f"{archive}: folder {archive.parent} does not exist; onebuild creates no folders"
        )
    if not (archive.exists() or archive.is_symlink()):
        return
    try:
        with zipfile.ZipFile(archive) as existing:
            names = existing.namelist()
    except (OSError, zipfile.BadZipFile):
        names = []
    if not names or not all(name.startswith(f"{root}/") for name in names):
        raise UserError(
            f"{archive}: exists and is not a zip of package '{root}' onebuild wrote, so it is "
            "not replaced: move it away or choose another path"
        )


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
