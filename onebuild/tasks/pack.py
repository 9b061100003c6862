"""The pack step: model file(s) -> nnpackage directory (MANIFEST v1.3, config.cfg).

The package is assembled in a temporary sibling folder and swapped in, so a killed build never
leaves a half-written package under the final name.
"""

import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ..fileio import atomic_write_bytes, current_umask

VERSION = 2


def manifest(models: list[str], model_types: list[str], inputs: list[str], outputs: list[str]):
    """MANIFEST of a single-model package: package I/O are the model's own, in order."""
    return {
        "major-version": "1",
        "minor-version": "3",
        "patch-version": "0",
        "configs": ["config.cfg"],
        "models": models,
        "model-types": model_types,
        "pkg-inputs": [f"0:0:{i}" for i in range(len(inputs))],
        "pkg-outputs": [f"0:0:{i}" for i in range(len(outputs))],
        "model-connect": [],
    }


def _model_io(source: Path) -> tuple[str, list[str], list[str]]:
    """Model type and I/O names of an IR file or a .tvn binary."""
    if source.suffix == ".tvn":
        from ..targets.trix_sim.tvn import load_tvn

        module = load_tvn(source)
        return "tvn", module.inputs, module.outputs
    from ..graph_ir.serde import load_ir  # onnx loads only when a step runs

    graph = load_ir(source).main
    return "obir", [v.name for v in graph.inputs], [v.name for v in graph.outputs]


def run(config: dict[str, Any], inputs: list[Path], outputs: list[Path]) -> None:
    source = inputs[0]
    package = Path(config["output"])
    kind, model_inputs, model_outputs = _model_io(source)
    name = f"{package.stem}.{kind}"
    meta = manifest([name], [kind], model_inputs, model_outputs)
    backend = "trix" if kind == "tvn" else "cpu"
    package.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{package.name}.", dir=package.parent))
    staging.chmod(0o777 & ~current_umask())
    try:
        shutil.copyfile(source, staging / name)
        text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(staging / "metadata" / "MANIFEST", text.encode())
        atomic_write_bytes(staging / "metadata" / "config.cfg", f"BACKENDS={backend}\n".encode())
        if config.get("archive"):
            atomic_write_bytes(outputs[1], zip_bytes(staging, package.name))
        _swap_in(staging, package)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def _swap_in(staging: Path, package: Path) -> None:
    if package.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{package.name}.old.", dir=package.parent))
        os.replace(package, trash / "pkg")
        os.replace(staging, package)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, package)
