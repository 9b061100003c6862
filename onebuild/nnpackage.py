"""The nnpackage format: `metadata/MANIFEST` (JSON, v1.3) and `KEY=VALUE` config files.

MANIFEST fields: `major/minor/patch-version`, `configs` (package config files in `metadata/`),
`models` (paths relative to the package root), `model-types`, `pkg-inputs` / `pkg-outputs`
("model:subgraph:io" references) and `model-connect` (`{"from": ref, "to": [ref, ...]}`).
onebuild adds `model-configs`: one config file per model (in `metadata/`, "" for none), which
the runtime honors (ONE ignores per-model configs). Reading checks every field's type and
form; what the references point at is checked by the runtime once the models are loaded.
"""

import json
import posixpath
import re
from dataclasses import dataclass

from .errors import FormatError

VERSION = ("1", "3", "0")
MODEL_TYPES = ("obir", "tvn")
_REF = re.compile(r"^(\d+):(\d+):(\d+)$")


@dataclass(frozen=True)
class Ref:
    model: int
    subgraph: int
    io: int

    def __str__(self) -> str:
        return f"{self.model}:{self.subgraph}:{self.io}"


@dataclass
class Manifest:
    models: list[str]
    model_types: list[str]
    configs: list[str]
    model_configs: list[str]
    pkg_inputs: list[Ref]
    pkg_outputs: list[Ref]
    connect: list[tuple[Ref, list[Ref]]]


def manifest_json(manifest: Manifest) -> bytes:
    data = {
        "major-version": VERSION[0],
        "minor-version": VERSION[1],
        "patch-version": VERSION[2],
        "configs": manifest.configs,
        "models": manifest.models,
        "model-types": manifest.model_types,
        "model-configs": manifest.model_configs,
        "pkg-inputs": [str(r) for r in manifest.pkg_inputs],
        "pkg-outputs": [str(r) for r in manifest.pkg_outputs],
        "model-connect": [
            {"from": str(source), "to": [str(t) for t in targets]}
            for source, targets in manifest.connect
        ],
    }
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def config_text(values: dict[str, str]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items())).encode()


def parse_config(text: str, where: str) -> dict[str, str]:
    """`KEY=VALUE` lines; `#` starts a comment; surrounding spaces are ignored."""
    values = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise FormatError(f"{where}:{number}: expected KEY=VALUE, got {line!r}")
        values[key.strip()] = value.strip()
    return values


def parse_ref(text, where: str) -> Ref:
    match = _REF.match(text) if isinstance(text, str) else None
    if match is None:
        raise FormatError(f'{where}: {text!r} is not a "model:subgraph:io" reference')
    return Ref(*(int(g) for g in match.groups()))


def inside_package(path, where: str) -> str:
    """A relative path that stays inside the package (no `..`, not absolute)."""
    if not isinstance(path, str) or not path:
        raise FormatError(f"{where}: expected a file path, got {path!r}")
    normal = posixpath.normpath(path.replace("\\", "/"))
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../") or ":" in normal:
        raise FormatError(f"{where}: '{path}' points outside the package")
    return normal


def parse_manifest(text: str, where: str = "MANIFEST") -> Manifest:
    """A MANIFEST with every field checked for presence, type and form."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise FormatError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise FormatError(f"{where}: expected a JSON object")
    for key in ("major-version", "minor-version", "patch-version"):
        if not isinstance(data.get(key), str) or not data[key].isdigit():
            raise FormatError(f"{where}: '{key}' must be a version number string")
    version = (int(data["major-version"]), int(data["minor-version"]))
    if version[0] != 1 or version[1] > 3:
        raise FormatError(
            f"{where}: nnpackage version {data['major-version']}.{data['minor-version']} "
            "is not supported (1.0 to 1.3)"
        )
    models = _strings(data, "models", where, required=True)
    if not models:
        raise FormatError(f"{where}: 'models' is empty")
    models = [inside_package(m, f"{where}: models[{i}]") for i, m in enumerate(models)]
    types = _strings(data, "model-types", where) or [_guess_type(m) for m in models]
    if len(types) != len(models):
        raise FormatError(
            f"{where}: 'model-types' has {len(types)} entries for {len(models)} models"
        )
    for i, kind in enumerate(types):
        if kind not in MODEL_TYPES:
            raise FormatError(
                f"{where}: model-types[{i}] '{kind}' is not supported (supported: obir, tvn)"
            )
    configs = [inside_package(c, f"{where}: configs") for c in _strings(data, "configs", where)]
    model_configs = _strings(data, "model-configs", where) or [""] * len(models)
    if len(model_configs) != len(models):
        raise FormatError(f"{where}: 'model-configs' needs one entry per model")
    model_configs = [c and inside_package(c, f"{where}: model-configs") for c in model_configs]
    single = len(models) == 1 and "pkg-inputs" not in data
    refs = {}
    for key in ("pkg-inputs", "pkg-outputs"):
        entries = _strings(data, key, where, required=not single)
        refs[key] = [parse_ref(e, f"{where}: {key}[{i}]") for i, e in enumerate(entries)]
    connect = []
    edges = data.get("model-connect", [])
    if not isinstance(edges, list):
        raise FormatError(f"{where}: 'model-connect' must be a list")
    for i, edge in enumerate(edges):
        at = f"{where}: model-connect[{i}]"
        if not isinstance(edge, dict) or set(edge) != {"from", "to"}:
            raise FormatError(f'{at}: expected {{"from": ref, "to": [refs]}}')
        if not isinstance(edge["to"], list) or not edge["to"]:
            raise FormatError(f"{at}: 'to' must be a non-empty list")
        targets = [parse_ref(t, f"{at}.to") for t in edge["to"]]
        connect.append((parse_ref(edge["from"], f"{at}.from"), targets))
    return Manifest(
        models, types, configs, model_configs, refs["pkg-inputs"], refs["pkg-outputs"], connect
    )


def _guess_type(model: str) -> str:
    return posixpath.splitext(model)[1].lstrip(".")


def _strings(data: dict, key: str, where: str, required: bool = False) -> list[str]:
    if key not in data:
        if required:
            raise FormatError(f"{where}: missing '{key}'")
        return []
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FormatError(f"{where}: '{key}' must be a list of strings")
    return value
