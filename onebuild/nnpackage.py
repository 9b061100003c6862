"""The nnpackage format: `metadata/MANIFEST` (JSON, v1.3) and `KEY=VALUE` config files.

MANIFEST fields: `major/minor/patch-version`, `configs` (package config files in `metadata/`),
`models` (paths relative to the package root), `model-types`, `pkg-inputs` / `pkg-outputs`
("model:subgraph:io" references) and `model-connect` (`{"from": ref, "to": [ref, ...]}`).
onebuild adds `model-configs`: one config file per model (in `metadata/`, "" for none), which
the runtime honors (ONE ignores per-model configs). Reading checks every field's type and
form; what the references point at is checked by the runtime once the models are loaded.

Limits (hostile packages must fail in one line, in bounded time and memory): a MANIFEST of at
most `MAX_MANIFEST_BYTES`, JSON nested at most `MAX_DEPTH` deep, no duplicate keys; version
numbers and reference indices of at most 9 ASCII digits; at most `MAX_MODELS` models,
`MAX_CONFIGS` package configs and `MAX_REFS` references per list; paths of at most
`MAX_PATH_CHARS` printable characters.
"""

import json
import posixpath
import re
from dataclasses import dataclass

from .errors import FormatError

VERSION = ("1", "3", "0")
MODEL_TYPE = r"[a-z][a-z0-9_]{0,15}"  # "obir", or a target's binaries ("tvn"): the runtime checks
MAX_MANIFEST_BYTES = 1 << 20
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 32  # a valid MANIFEST nests 4 deep
MAX_MODELS = 1024
MAX_CONFIGS = 64
MAX_REFS = 65536
MAX_PATH_CHARS = 1024
_NUMBER = re.compile(r"[0-9]{1,9}")
_REF = re.compile(r"([0-9]{1,9}):([0-9]{1,9}):([0-9]{1,9})")
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')  # a string (maybe unterminated), a bracket


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


def config_value(value: str | int | float | bool) -> str:
    """A config.cfg value as written: booleans as 1 / 0, other values as their text."""
    return str(int(value)) if isinstance(value, bool) else str(value)


def config_text(values: dict[str, str]) -> bytes:
    """`KEY=VALUE` lines that `parse_config` reads back as `values`; a key or value that would
    read back as something else is refused in one line naming it."""
    for key, value in values.items():
        _check_config_entry(key, value)
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items())).encode()


def _check_config_entry(key: str, value: str) -> None:
    """Refuse what config.cfg cannot hold: a line break anywhere (it starts another key), `#`
    (a comment to the line's end), `=` in a key, spaces at either end (dropped on read)."""
    breaks = ("\n", "\r", "#")
    if not key or key != key.strip() or any(c in key for c in (*breaks, "=")):
        raise FormatError(
            f"config key {key!r}: a config.cfg key has no line break, '#', '=' or spaces at "
            "its ends: rename it (e.g. ODC_HW)"
        )
    if value != value.strip() or any(c in value for c in breaks):
        raise FormatError(
            f"config key {key}: value {value!r} would not read back from config.cfg (a line "
            "break starts another key, '#' a comment, spaces at its ends are dropped): give "
            "the value alone on one line"
        )


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
    match = _REF.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise FormatError(f'{where}: {_short(text)} is not a "model:subgraph:io" reference')
    return Ref(*(int(g) for g in match.groups()))


def _short(value, limit: int = 60) -> str:
    """repr of a value read from a file, cut to `limit` characters for an error line."""
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


def inside_package(path, where: str) -> str:
    """A relative path that stays inside the package (no `..`, not absolute)."""
    if not isinstance(path, str) or not path:
        raise FormatError(f"{where}: expected a file path, got {_short(path)}")
    if len(path) > MAX_PATH_CHARS or any(len(part) > 255 for part in path.split("/")):
        raise FormatError(f"{where}: the path {_short(path)} is too long")
    if not path.isprintable():
        raise FormatError(f"{where}: the path {_short(path)} has control characters")
    normal = posixpath.normpath(path.replace("\\", "/"))
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../") or ":" in normal:
        raise FormatError(f"{where}: '{path}' points outside the package")
    if normal == ".":
        raise FormatError(f"{where}: '{path}' is the package folder, not a file")
    return normal


def parse_manifest(text: str, where: str = "MANIFEST") -> Manifest:
    """A MANIFEST with every field checked for presence, type and form."""
    data = _json_object(text, where)
    for key in ("major-version", "minor-version", "patch-version"):
        value = data.get(key)
        if not isinstance(value, str) or not _NUMBER.fullmatch(value):
            raise FormatError(
                f"{where}: '{key}' must be a version number string (up to 9 digits), "
                f"got {_short(value)}"
            )
    version = (int(data["major-version"]), int(data["minor-version"]))
    if version[0] != 1 or version[1] > 3:
        raise FormatError(
            f"{where}: nnpackage version {data['major-version']}.{data['minor-version']} "
            "is not supported (1.0 to 1.3)"
        )
    models = _strings(data, "models", where, required=True)
    if not models:
        raise FormatError(f"{where}: 'models' is empty")
    if len(models) > MAX_MODELS:
        raise FormatError(f"{where}: {len(models)} models (at most {MAX_MODELS})")
    models = [inside_package(m, f"{where}: models[{i}]") for i, m in enumerate(models)]
    types = _strings(data, "model-types", where) or [_guess_type(m) for m in models]
    if len(types) != len(models):
        raise FormatError(
            f"{where}: 'model-types' has {len(types)} entries for {len(models)} models"
        )
    for i, kind in enumerate(types):
        if not re.fullmatch(MODEL_TYPE, kind):
            raise FormatError(
                f"{where}: model-types[{i}] {_short(kind)} is not a model type (a short "
                "lowercase name such as obir or tvn)"
            )
    configs = _strings(data, "configs", where)
    if len(configs) > MAX_CONFIGS:
        raise FormatError(f"{where}: {len(configs)} configs (at most {MAX_CONFIGS})")
    configs = [inside_package(c, f"{where}: configs[{i}]") for i, c in enumerate(configs)]
    model_configs = _strings(data, "model-configs", where) or [""] * len(models)
    if len(model_configs) != len(models):
        raise FormatError(f"{where}: 'model-configs' needs one entry per model")
    model_configs = [
        c and inside_package(c, f"{where}: model-configs[{i}]") for i, c in enumerate(model_configs)
    ]
    single = len(models) == 1 and "pkg-inputs" not in data
    refs = {}
    for key in ("pkg-inputs", "pkg-outputs"):
        entries = _strings(data, key, where, required=not single)
        refs[key] = [parse_ref(e, f"{where}: {key}[{i}]") for i, e in enumerate(entries)]
    connect = []
    edges = data.get("model-connect", [])
    if not isinstance(edges, list):
        raise FormatError(f"{where}: 'model-connect' must be a list")
    if len(edges) > MAX_REFS:
        raise FormatError(f"{where}: 'model-connect' has {len(edges)} edges (at most {MAX_REFS})")
    for i, edge in enumerate(edges):
        at = f"{where}: model-connect[{i}]"
        if not isinstance(edge, dict) or set(edge) != {"from", "to"}:
            raise FormatError(f'{at}: expected {{"from": ref, "to": [refs]}}')
        if not isinstance(edge["to"], list) or not edge["to"]:
            raise FormatError(f"{at}: 'to' must be a non-empty list")
        if len(edge["to"]) > MAX_REFS:
            raise FormatError(f"{at}: 'to' has {len(edge['to'])} references (at most {MAX_REFS})")
        targets = [parse_ref(t, f"{at}.to[{j}]") for j, t in enumerate(edge["to"])]
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
    if len(value) > MAX_REFS:
        raise FormatError(f"{where}: '{key}' has {len(value)} entries (at most {MAX_REFS})")
    return value


def _json_object(text: str, where: str) -> dict:
    """The MANIFEST's JSON object: bounded size and depth, no duplicate keys."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise FormatError(f"{where}: {len(text)} characters (at most {MAX_MANIFEST_BYTES})")
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise FormatError(f"{where}: JSON nested {depth} deep (at most {MAX_DEPTH})")

    def no_duplicates(pairs):
        data = dict(pairs)
        if len(data) != len(pairs):
            seen = set()
            duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise FormatError(f"{where}: duplicate key {_short(duplicate)}")
        return data

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise FormatError(f"{where}: not valid JSON ({str(error)[:120]})") from None
    if not isinstance(data, dict):
        raise FormatError(f"{where}: expected a JSON object")
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _max_depth(text: str) -> int:
    """The deepest bracket nesting outside strings (bounds the JSON's depth), without
    recursion."""
    depth = deepest = 0
    for token in _TOKENS.findall(text):
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest
