"""The content-addressed step cache: (step, code digest, config, input hashes) -> outputs.

doit knows only the last build; this cache remembers every result, so switching an option back
and forth, or a CI job that restores the cache folder, restores outputs instead of recomputing.
Entries are written to a temporary folder and renamed into place, so a killed build never
leaves a half-written entry; each records its outputs' digests, checked before a restore (a
corrupt entry is dropped and the step reruns). `build.cache` may also be an fsspec URL
(`remote_cache.py`): this local cache then fronts it.
"""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from doit.dependency import FileChangedChecker, get_file_md5

from ..fileio import current_umask, file_digest, stamp
from . import cache_folder


def tree_digest(path: Path, names: list[str] | None = None) -> str:
    """Digest of a file, or of a folder's relative file names and contents (only the files
    `names`, when given: a missing one raises)."""
    if path.is_file():
        return file_digest(path)
    sha = hashlib.sha256()
    if names is None:
        names = [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    for name in sorted(names):
        sha.update(f"{name}\0{file_digest(path / name)}\n".encode())
    return sha.hexdigest()


def fingerprint(path: Path) -> str:
    """A cheap change detector of a file or folder: names and stamps."""
    sha = hashlib.sha256()
    items = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for item in items:
        sha.update(f"{item.relative_to(path)}\0{stamp(item.stat())}\n".encode())
    return sha.hexdigest()


class ContentChecker(FileChangedChecker):
    """doit's file check by content: a dependency whose stamp moved is hashed. doit's default
    checker takes an unchanged modification time as an unchanged file, so a model rewritten
    with its old time (`cp -p`, `touch -d`) built nothing."""

    def check_modified(self, file_path, file_stat, state) -> bool:
        old_stamp, size, md5 = state
        if stamp(file_stat) == old_stamp:
            return False
        return file_stat.st_size != size or get_file_md5(file_path) != md5

    def get_state(self, dep, current_state):
        now = stamp(os.stat(dep))
        if current_state and current_state[0] == now:
            return None
        return now, now[0], get_file_md5(dep)


def step_key(step: str, code: str, config: dict, input_digests: list[str], base: Path) -> str:
    """The cache key of a step execution: the digest of the step's code, input contents (their
    digests), not input paths, and config paths relative to the recipe folder `base`, so another
    checkout hits the same entry."""
    description = {
        "step": step,
        "code": code,
        "config": _relative_paths(config, base),
        "inputs": input_digests,
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def _relative_paths(value, base: Path):
    if isinstance(value, dict):
        return {k: _relative_paths(v, base) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_paths(v, base) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.relpath(value, base)
    return value


class StepCache:
    def __init__(self, folder: Path):
        self.folder = folder

    def _entry(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def entry(self, key: str) -> Path | None:
        """The folder of a complete entry (outputs stored as 0, 1, ...), else None."""
        entry = self._entry(key)
        return entry if (entry / "entry.json").is_file() else None

    def located(self, key: str) -> Path | None:
        """Where an entry is, without fetching it: its folder (or None)."""
        return self.entry(key)

    def restore(self, key: str, outputs: list[Path]) -> bool:
        """Copy a cached result into place; False if there is no complete entry. An entry whose
        content does not match its recorded digests is removed (the step reruns)."""
        entry = self._entry(key)
        if not self.verify(key, len(outputs)):
            return False
        for index, output in enumerate(outputs):
            _replace(entry / str(index), output)
        with contextlib.suppress(OSError):  # last use, for `cache gc` (least recently used first)
            os.utime(entry / "entry.json")
        return True

    def verify(self, key: str, count: int) -> bool:
        """Whether the entry exists whole with the content it recorded; a corrupt one is
        dropped."""
        entry = self._entry(key)
        try:
            digests = json.loads((entry / "entry.json").read_text())["digests"]
            stored = [entry / str(i) for i in range(count)]
            if len(digests) == count and [tree_digest(p) for p in stored] == digests:
                return True
        except FileNotFoundError:
            if not entry.exists():
                return False
        except (OSError, ValueError, KeyError, TypeError):
            pass
        self.drop(key)
        return False

    def drop(self, key: str) -> None:
        """Remove an entry (`cache_folder.drop`)."""
        cache_folder.drop(self._entry(key))

    def ensure(self, key: str, outputs: list[Path], warnings: list[str] = ()) -> None:
        """Hold `outputs` (an up-to-date step's, made with `key`) if the cache lacks them: a
        cache set or cleaned after the step ran."""
        if self.entry(key) is None:
            self.store(key, outputs, warnings)

    def warnings(self, key: str) -> list[str]:
        """The warnings the step that made the entry gave (entry.json's "warnings")."""
        try:
            return list(json.loads((self._entry(key) / "entry.json").read_text())["warnings"])
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def store(self, key: str, outputs: list[Path], warnings: list[str] = ()) -> None:
        entry = self._entry(key)
        if (entry / "entry.json").is_file():
            return
        cache_folder.claim(self.folder, f"step cache {self.folder}")
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=entry.parent))
        try:
            for index, output in enumerate(outputs):
                _copy(output, staging / str(index))
            names = [str(p.name) for p in outputs]
            digests = [tree_digest(staging / str(i)) for i in range(len(outputs))]
            record = {"outputs": names, "digests": digests, "warnings": list(warnings)}
            entry_json = json.dumps(record) + "\n"
            (staging / "entry.json").write_text(entry_json)
            staging.chmod(0o777 & ~current_umask())
            os.replace(staging, entry)
        except OSError:
            pass  # another build stored the same entry first, or the cache is read-only
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)


def put_in_place(output: Path, write: Callable[[Path], None]) -> None:
    """Make `output` atomically: `write` makes it (a file or a folder) at a sibling temporary
    path, which is then renamed over it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        write(staging / "x")
        if output.is_dir():
            os.replace(output, staging / "old")
        os.replace(staging / "x", output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace(stored: Path, output: Path) -> None:
    """Put a copy of `stored` at `output` atomically."""

    def write(target: Path) -> None:
        _copy(stored, target)
        target.chmod(0o777 & ~current_umask() if stored.is_dir() else 0o666 & ~current_umask())

    put_in_place(output, write)


def open_cache(folder: Path, url: str | None = None):
    """The step cache in `folder`, fronting the fsspec cache at `url` when there is one."""
    if url is None:
        return StepCache(folder)
    from .remote_cache import RemoteStepCache

    return RemoteStepCache(folder, url)
