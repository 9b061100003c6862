"""The digest of the code that implements a step: part of every step's cache key.

A step's code is its module plus every module of the same top-level package it imports,
transitively (imports inside functions included), the package-data files (`*.toml`, `*.json`)
beside them, and the versions of Python and of the numeric libraries whose results can differ
between releases. Editing any of them changes the key, so neither doit's up-to-date check nor a
shared step cache can serve an artifact that older code made. Imports are found by scanning the
source text (an over-match only adds a file; nothing is executed or imported).
"""

import hashlib
import platform
import re
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

LIBRARIES = ("numpy", "ml_dtypes", "onnx")
DATA_SUFFIXES = (".toml", ".json")

_FROM = r"^{indent}from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)"
_IMPORT = r"^{indent}import[ \t]+([^\n]+)"
_ANY_INDENT, _NO_INDENT = "[ \t]*", ""


def step_code_digest(module: str, *target_modules: str | None) -> str:
    """Digest of module `module` (e.g. "onebuild.tasks.quantize") and everything it imports;
    `target_modules` add target plugins' modules (targets are found through entry points,
    which no import statement shows)."""
    return _digest((module, *sorted(m for m in target_modules if m)))


@cache
def _digest(roots: tuple[str, ...]) -> str:
    sha = hashlib.sha256()
    files = {}  # named from the package's folder, so that installs at other paths share keys
    for root in roots:
        base = _package_root(root.split(".")[0]).parent
        files.update((path.relative_to(base).as_posix(), path) for path in _closure(root))
    for name in sorted(files):
        sha.update(f"{name}\0{_file_digest(files[name])}\n".encode())
    for library in LIBRARIES:
        try:
            sha.update(f"{library} {version(library)}\n".encode())
        except PackageNotFoundError:
            sha.update(f"{library} absent\n".encode())
    sha.update(f"python {platform.python_version()}\n".encode())
    return sha.hexdigest()


@cache
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@cache
def _package_root(top: str) -> Path | None:
    spec = find_spec(top)  # a top-level name: finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _module_file(name: str) -> Path | None:
    top, *rest = name.split(".")
    root = _package_root(top)
    if root is None:
        return None
    base = root.joinpath(*rest)
    for candidate in (base / "__init__.py", base.with_suffix(".py") if rest else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


@cache
def _closure(root: str) -> frozenset[Path]:
    """The files of `root` and of every same-package module it imports, transitively, plus
    package-data files in their folders. Importing a module also runs its parent packages'
    `__init__`: their files count, with what they import at module level (unindented imports;
    an import inside one of their functions runs only when it is called, as by name below)."""
    top = root.split(".")[0]
    seen: set[tuple[str, bool]] = set()
    pending = [(root, False)]
    files: set[Path] = set()
    while pending:
        name, as_parent = pending.pop()
        if (name, as_parent) in seen or (name, False) in seen:
            continue
        seen.add((name, as_parent))
        path = _module_file(name)
        if path is None:
            continue
        files.add(path)
        parts = name.split(".")
        pending.extend((".".join(parts[:i]), True) for i in range(1, len(parts)))
        package = name if path.name == "__init__.py" else ".".join(parts[:-1])
        imported = _file_imports(path, package, as_parent)
        pending.extend((m, False) for m in imported if m.split(".")[0] == top)
    for folder in {p.parent for p in files}:
        files.update(_data_files(folder))
    return frozenset(files)


def _data_files(folder: Path) -> list[Path]:
    """Package data: data files in `folder` and in its subfolders that are not packages."""
    found = [p for p in folder.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file()]
    for sub in folder.iterdir():
        if sub.is_dir() and not (sub / "__init__.py").exists() and sub.name != "__pycache__":
            found.extend(_data_files(sub))
    return found


@cache
def _file_imports(path: Path, package: str, module_level: bool) -> tuple[str, ...]:
    return tuple(_imports(path.read_text(), package, module_level))


def _imports(source: str, package: str, module_level: bool = False) -> list[str]:
    """Module names an import statement in `source` may load (relative ones resolved against
    `package`); `from X import a` yields X and X.a (a may be a submodule)."""
    indent = _NO_INDENT if module_level else _ANY_INDENT
    names = []
    for match in re.finditer(_FROM.format(indent=indent), source, re.M):
        base = _absolute(match.group(1), package)
        if base is None:
            continue
        names.append(base)
        imported = match.group(2).strip("()\\ \t")
        for item in re.split(r"[,\s\\]+", imported):
            if item and item.isidentifier() and item != "as":
                names.append(f"{base}.{item}" if base else item)
    for match in re.finditer(_IMPORT.format(indent=indent), source, re.M):
        for item in match.group(1).split(","):
            name = item.split(" as ")[0].strip()
            if re.fullmatch(r"[\w.]+", name):
                names.append(name)
    return names


def _absolute(module: str, package: str) -> str | None:
    dots = len(module) - len(module.lstrip("."))
    if dots == 0:
        return module
    parts = package.split(".")
    if dots - 1 > len(parts):
        return None
    base = parts[: len(parts) - (dots - 1)]
    rest = module[dots:]
    return ".".join([*base, rest] if rest else base)
