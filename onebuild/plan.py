"""A recipe file -> a `Plan`: plain data, absolute paths, one config dict per enabled step.

Reading a recipe (TOML, `extends` presets, `--set` overrides, paths made absolute) needs only
the standard library; validating it (`onebuild.recipe`) needs pydantic, whose import and schema
construction are most of a no-op build's time. So `load_plan` keeps the validated plan in the
build folder (once a build has claimed it), keyed by the merged recipe data, the import source
(the plan lists the files an ONNX model keeps its weights in) and the code that validates it
or answers for it (onebuild's, pydantic's and the installed target plugins' files by size and
modification time, as Python keys its bytecode cache, and the plugins' names and releases): an
unchanged recipe skips validation. Input files are checked for existence
and output paths against inputs either way.
"""

import contextlib
import hashlib
import json
import os
import sys
import tomllib
from dataclasses import dataclass
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import UserError
from .fileio import atomic_write_bytes
from .targets import GROUP
from .version import __version__

PLAN_FILE = "plan.json"
BUILD_MARK = ".onebuild"  # in build folders, from their first build on (engine/ownership.py)

STEP_ORDER = ("import", "optimize", "quantize", "partition", "codegen", "pack")

# Keys that hold paths, resolved relative to the file that sets them.
PATH_KEYS = {
    ("import", "source"),
    ("quantize", "calibration"),
    ("quantize", "accuracy", "data"),
    ("quantize", "accuracy", "labels"),
    ("partition", "part_file"),
    ("pack", "output"),
    ("build", "dir"),
    ("build", "cache"),
}


@dataclass(frozen=True)
class Plan:
    """A validated recipe: absolute paths and one normalized config dict per enabled step."""

    recipe: Path
    build_dir: Path
    cache_dir: Path | None
    steps: dict[str, dict[str, Any]]
    report: bool = False  # [build] report: write report.html at the end of every build
    cache_url: str | None = None  # build.cache as an fsspec URL (then cache_dir is None)


def is_url(value: str) -> bool:
    """Whether a path value is an fsspec URL (`sftp://host/path`), left as it is."""
    scheme, sep, _ = value.partition("://")
    return bool(sep) and len(scheme) > 1 and scheme.replace("+", "").isalnum()


def check_url(url: str, where: str) -> None:
    """A one-line error for a cache URL that carries a password: credentials come from the
    filesystem's own environment and config, never from a recipe."""
    if urlsplit(url).password is not None:
        raise UserError(
            f"{where}: build.cache: the URL carries a password; remove it and give credentials "
            "through the filesystem's environment or config (ssh keys, AWS_* variables, ...)"
        )


def absolute(path: str | os.PathLike) -> Path:
    return Path(os.path.normpath(Path(path).absolute()))


MAX_RECIPE_BYTES = 1 << 20
MAX_DIM = (1 << 31) - 1  # input dims set by a recipe or --input-shape: 1 ..= MAX_DIM
MAX_DEPTH = 16  # tables and arrays nested deeper than any recipe key


def real_path(path: str | os.PathLike) -> Path:
    """`path` with symlinks resolved as far as they go (a symlink loop does not raise)."""
    return Path(os.path.realpath(path))


def _read_toml(path: Path) -> dict:
    try:
        if not path.is_file():
            raise UserError(f"{path}: no such recipe file")
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise UserError(f"{path}: larger than {MAX_RECIPE_BYTES} bytes; not a recipe")
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path}: TOML syntax error: {error}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except RecursionError:
        raise UserError(f"{path}: values nested too deeply (over {MAX_DEPTH} levels)") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read the recipe ({error.strerror or error})") from None
    _check_depth(data, str(path))
    return data


def _check_depth(value: Any, where: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise UserError(f"{where}: values nested too deeply (over {MAX_DEPTH} levels)")
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list):
        for child in children:
            _check_depth(child, where, depth + 1)


def _read_with_presets(path: Path, chain: list[Path]) -> dict:
    resolved = real_path(path)
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in [*chain, resolved])
        raise UserError(f"{chain[-1]}: 'extends' forms a cycle: {cycle}")
    data = _read_toml(path)
    _absolutize(data, path.parent)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise UserError(f"{path}: extends: expected a path string, got {parent!r}")
    base_path = preset(parent, path) if _is_name(parent) else absolute(path.parent / parent)
    if not base_path.is_file():
        named = Path(parent).stem in _preset_names()
        hint = f' (the preset is extends = "{Path(parent).stem}")' if named else ""
        raise UserError(f"{path}: extends: no such recipe file {base_path}{hint}")
    return _merge(_read_with_presets(base_path, [*chain, resolved]), data)


def _is_name(text: str) -> bool:
    return "/" not in text and "\\" not in text and not text.endswith(".toml")


def preset_folders() -> list[Path]:
    """Where the presets `extends = "<name>"` finds live: `recipes/` of the source checkout
    onebuild runs from, then the copy installed with it (data files, wherever the install
    scheme put them: the distribution's file list says)."""
    from importlib.metadata import PackageNotFoundError, files

    folders = []
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        folders.append(checkout / "recipes")
    try:
        installed = files("onebuild") or []
    except PackageNotFoundError:
        installed = []
    for item in installed:
        if item.parent.name == "recipes" and item.suffix == ".toml":
            folders.append(Path(item.locate()).resolve().parent)
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def _preset_names() -> list[str]:
    return sorted({p.stem for folder in preset_folders() for p in folder.glob("*.toml")})


def preset(name: str, recipe: Path) -> Path:
    """The preset recipe `name` ships as (npu-uint8, cpu-float, ...)."""
    for folder in preset_folders():
        if (folder / f"{name}.toml").is_file():
            return folder / f"{name}.toml"
    raise UserError(
        f"{recipe}: extends: no preset named '{name}' "
        f"(presets: {', '.join(_preset_names()) or 'none'}; "
        'or give a path to a recipe file, e.g. "../base.toml")'
    )


def _absolutize(data: dict, folder: Path) -> None:
    for keys in PATH_KEYS:
        table = data
        for key in keys[:-1]:
            table = table.get(key) if isinstance(table, dict) else None
        value = table.get(keys[-1]) if isinstance(table, dict) else None
        if isinstance(value, str) and not is_url(value):
            value = _home(value, f"{folder}: {'.'.join(keys)}")
            table[keys[-1]] = str(absolute(folder / value))


def _home(value: str, where: str) -> str:
    """A path with `~` or `~user` expanded (it made a literal `./~` folder); one that cannot
    be expanded is refused."""
    if not value.startswith("~"):
        return value
    expanded = os.path.expanduser(value)
    if expanded.startswith("~"):
        raise UserError(
            f"{where} = '{value}': '~' cannot be expanded (no such user, or no HOME); write the "
            "full path"
        )
    return expanded


def _merge(base: dict, top: dict) -> dict:
    """Tables merge key by key; any other value in `top` replaces the one in `base`."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _apply_override(data: dict, override: str) -> None:
    """`a.b.c=value`: value parsed as a TOML value, else taken as a string."""
    dotted, sep, text = override.partition("=")
    keys = [k.strip() for k in dotted.split(".")]
    if not sep or not all(keys):
        raise UserError(f"--set '{override}': expected KEY.PATH=VALUE, e.g. quantize.dtype=int16")
    if keys == ["extends"]:
        raise UserError(
            f"--set '{override}': a recipe's presets are chosen in the recipe file "
            "(extends = ...); write a recipe that extends the one you want to vary"
        )
    if len(keys) > MAX_DEPTH:
        raise UserError(f"--set '{override[:80]}...': more than {MAX_DEPTH} nested keys")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        value = text
    _check_depth(value, f"--set '{override[:80]}'", len(keys))
    if tuple(keys) in PATH_KEYS and isinstance(value, str) and not is_url(value):
        value = str(absolute(_home(value, f"--set {'.'.join(keys)}")))
    table = data
    for key in keys[:-1]:
        table = table.setdefault(key, {})
        if not isinstance(table, dict):
            raise UserError(f"--set '{override}': '{key}' is not a table")
    table[keys[-1]] = value


def read_recipe_data(path: str | os.PathLike, overrides: list[str] = ()) -> dict:
    """A recipe merged over its presets, with overrides applied and paths made absolute."""
    data = _read_with_presets(absolute(path), [])
    for override in overrides:
        _apply_override(data, override)
    return data


def check_inputs(path: Path, steps: dict[str, dict[str, Any]]) -> None:
    """Every input file a step names exists."""
    for keys in sorted(PATH_KEYS):
        value = steps.get(keys[0])
        for key in keys[1:]:
            value = value.get(key) if isinstance(value, dict) else None
        if keys[0] in ("import", "quantize", "partition") and value and not Path(value).exists():
            raise UserError(f"{path}: {'.'.join(keys)}: '{value}' does not exist")


def check_output_paths(plan: Plan) -> None:
    """No output can replace what the user provides: the package may not be, or hold, the
    recipe, an input file or folder, the build folder or the step cache; the cache is a folder."""
    if plan.cache_dir is not None:
        from .engine import cache_folder

        cache_folder.check(plan.cache_dir, f"{plan.recipe}: build.cache '{plan.cache_dir}'")
    if "pack" not in plan.steps:
        return
    package = real_path(plan.steps["pack"]["output"])
    protected = {"the recipe": plan.recipe, "build.dir": plan.build_dir}
    if plan.cache_dir is not None:
        protected["build.cache"] = plan.cache_dir
    for keys in sorted(PATH_KEYS - {("pack", "output"), ("build", "dir"), ("build", "cache")}):
        value = plan.steps.get(keys[0])
        for key in keys[1:]:
            value = value.get(key) if isinstance(value, dict) else None
        if value:
            protected[".".join(keys)] = Path(value)
    for what, path in protected.items():
        resolved = real_path(path)
        if package == resolved or package in resolved.parents:
            raise UserError(
                f"{plan.recipe}: pack.output = '{plan.steps['pack']['output']}' would replace "
                f"{what} ('{path}'); choose an output path outside it"
            )


def load_plan(path: str | os.PathLike, overrides: list[str] = ()) -> Plan:
    """The plan of a recipe file, validated once per change of the recipe or of onebuild."""
    path = absolute(path)
    data = read_recipe_data(path, overrides)
    stored = _plan_file(path, data)
    key = _key(data)
    if stored is not None and key is not None:
        plan = _stored_plan(stored, key, path)
        if plan is not None:
            check_inputs(path, plan.steps)
            check_output_paths(plan)
            return plan
    from .recipe import plan_from_data  # pydantic: only when the recipe must be validated

    plan = plan_from_data(path, data)
    try:
        text = json.dumps(_to_json(plan))  # key order kept: steps run in plan order
    except (TypeError, ValueError):
        return plan
    plan = _from_json(json.loads(text), path)  # the same plan whether validated or stored
    if stored is not None and key is not None and (stored.parent / BUILD_MARK).is_file():
        with contextlib.suppress(OSError):  # a cache only: a full disk or a race costs nothing
            atomic_write_bytes(stored, json.dumps({"key": key, "plan": json.loads(text)}).encode())
    return plan


def _plan_file(path: Path, data: dict) -> Path | None:
    build = data.get("build", {})
    folder = build.get("dir") if isinstance(build, dict) else None
    if folder is not None and not isinstance(folder, str):
        return None
    return Path(folder or path.parent / "build" / path.stem) / PLAN_FILE


def _key(data: dict) -> str | None:
    try:
        recipe = json.dumps(data, sort_keys=True)
    except (TypeError, ValueError):  # TOML dates and times: validated every time
        return None
    digest = hashlib.sha256(recipe.encode())
    digest.update(f"{__version__} {sys.version}".encode())
    package = Path(__file__).parent
    sources = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".toml"))
    pydantic = find_spec("pydantic")
    if pydantic is not None and pydantic.origin:
        sources.append(Path(pydantic.origin).parent / "version.py")
    model = data.get("import", {}).get("source") if isinstance(data.get("import"), dict) else None
    if isinstance(model, str):  # the plan lists the files its weights are in
        sources.append(Path(model))
    for entry in sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value)):
        # the plan holds target plugins' answers (codegen.hw, channel dtypes, backends)
        dist = getattr(entry, "dist", None)
        release = f"{dist.name} {dist.version}" if dist is not None else ""
        digest.update(f"target {entry.name}={entry.value} {release}\n".encode())
        sources.extend(_package_files(entry.value.split(":")[0].split(".")[0]))
    try:
        for source in sources:
            stat = source.stat()
            stamp = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
            digest.update(f"{source} {stamp}\n".encode())
    except OSError:  # an installation changing under us: validate every time
        return None
    return digest.hexdigest()


def _package_files(top: str) -> list[Path]:
    """The source files of top-level package `top` (onebuild's are in the key already)."""
    spec = find_spec(top) if top != __package__ else None
    if spec is None:
        return []
    if spec.submodule_search_locations:
        folders = [Path(f) for f in spec.submodule_search_locations]
        return sorted(p for f in folders for p in f.rglob("*") if p.suffix in (".py", ".toml"))
    return [Path(spec.origin)] if spec.origin else []


def _stored_plan(stored: Path, key: str, path: Path) -> Plan | None:
    try:
        content = json.loads(stored.read_bytes())
        if content["key"] == key:
            return _from_json(content["plan"], path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # missing or damaged: validate again
    return None


def _to_json(plan: Plan) -> dict:
    cache = None if plan.cache_dir is None else str(plan.cache_dir)
    return {
        "build_dir": str(plan.build_dir),
        "cache_dir": cache,
        "cache_url": plan.cache_url,
        "steps": plan.steps,
        "report": plan.report,
    }


def _from_json(content: dict, path: Path) -> Plan:
    cache, url = content["cache_dir"], content["cache_url"]
    steps, report = dict(content["steps"]), bool(content["report"])
    return Plan(path, Path(content["build_dir"]), cache and Path(cache), steps, report, url)
