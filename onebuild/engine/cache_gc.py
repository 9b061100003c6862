"""`onebuild cache gc`: shrink a step cache (folder or fsspec URL) to a size, least recently used
entries first. A restore marks its entry used (the entry's modification time)."""

import contextlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..plan import is_url
from . import cache_folder
from .remote_cache import SUFFIX, remote_fs

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
STALE_SECONDS = 3600  # an unfinished upload or unpack older than this is a killed writer's


@dataclass
class Entry:
    name: str
    size: int
    used: float


@dataclass
class GcResult:
    kept: int
    removed: int
    size: int  # bytes kept
    freed: int


def parse_size(text: str) -> int:
    """`500M`, `2G`, `1.5GiB`, `1000` (bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UserError(f"--max-size '{text}': expected a size such as 500M, 2G or 1000000")
    return int(float(match[1]) * UNITS[match[2].upper()])


def collect(location: str, max_size: int) -> GcResult:
    """Remove the least recently used entries until the cache holds at most `max_size` bytes."""
    store = _RemoteStore(location) if is_url(location) else _LocalStore(Path(location))
    entries = sorted(store.entries(), key=lambda e: (e.used, e.name))
    total = sum(e.size for e in entries)
    removed = freed = 0
    for entry in entries:
        if total <= max_size:
            break
        store.remove(entry.name)
        total, freed, removed = total - entry.size, freed + entry.size, removed + 1
    store.sweep()
    return GcResult(len(entries) - removed, removed, total, freed)


class _LocalStore:
    def __init__(self, folder: Path):
        if not folder.is_dir():
            raise UserError(f"{folder}: no step cache folder there")
        cache_folder.claim(folder, f"{folder}")  # only a folder of onebuild's entries (marked)
        self.folder = folder

    def entries(self) -> list[Entry]:
        found = []
        for shard in cache_folder.shards(self.folder):
            for entry in shard.iterdir():
                if cache_folder.is_entry(entry):
                    found.append(self._entry(entry))
        return found

    @staticmethod
    def _entry(entry: Path) -> Entry:
        marker = entry / "entry.json"
        size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        return Entry(str(entry), size, marker.stat().st_mtime)

    def remove(self, name: str) -> None:
        cache_folder.drop(Path(name))

    def sweep(self) -> None:
        """Staging folders of killed builds (only the names onebuild gives them)."""
        old = time.time() - STALE_SECONDS
        for item in (i for shard in cache_folder.shards(self.folder) for i in shard.iterdir()):
            if cache_folder.is_temporary(item) and item.stat().st_mtime < old:
                shutil.rmtree(item, ignore_errors=True)


class _RemoteStore:
    def __init__(self, url: str):
        self.fs, self.root = remote_fs(url)
        try:
            self.files = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            raise UserError(f"{url}: no step cache there") from None

    def entries(self) -> list[Entry]:
        return [
            Entry(name, int(info.get("size") or 0), _time(info))
            for name, info in self.files.items()
            if _remote_name(name) == "entry"
        ]

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(name)

    def sweep(self) -> None:
        """Uploads of killed writers (temporary names never renamed into place)."""
        old = time.time() - STALE_SECONDS
        for name, info in self.files.items():
            if _remote_name(name) == "upload" and _time(info) < old:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(name)


_REMOTE = re.compile(rf"([0-9a-f]{{2}})/\1[0-9a-f]{{62}}{re.escape(SUFFIX)}(\.tmp-[0-9a-f]{{32}})?")


def _remote_name(name: str) -> str | None:
    """ "entry", "upload" (a writer's temporary) or None: a file onebuild does not name."""
    match = _REMOTE.fullmatch("/".join(name.rsplit("/", 2)[-2:]))
    return None if match is None else "upload" if match[2] else "entry"


def _time(info: dict) -> float:
    """An fsspec listing's modification time in seconds (sftp: `mtime`, s3: `LastModified`)."""
    value = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    return value.timestamp() if hasattr(value, "timestamp") else float(value)
