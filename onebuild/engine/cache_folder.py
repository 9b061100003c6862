"""What in a step cache folder is onebuild's: the folder's mark, its entries, its temporaries.

A cache folder carries a mark file (a standard `CACHEDIR.TAG`, so backup tools skip it) that
onebuild writes when it creates the cache. A folder without one is used only if it is empty or
holds nothing but onebuild's entries (a cache made before marks: it is adopted and marked), so
`build.cache = "~"` cannot make onebuild write into, or `cache gc` delete from, a user's folder.
Imports nothing of onebuild but its errors and fileio.
"""

import json
import os
import re
import shutil
from pathlib import Path

from ..errors import UserError
from ..fileio import atomic_write_bytes, read_regular

MARK = "CACHEDIR.TAG"
MARK_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This is a onebuild step cache: `onebuild cache gc` removes only onebuild's entries.\n"
)
PUBLISHED = ".published"  # remote_cache's record of what it published
_SHARD = re.compile(r"[0-9a-f]{2}")
_KEY = re.compile(r"[0-9a-f]{64}")
# StepCache.store / remote pull staging (mkdtemp ".<key8>."), StepCache.drop and gc's aside.
_TEMPORARY = re.compile(r"\.(?:drop\.)?[0-9a-f]{8}(?:\.[A-Za-z0-9_]+)?")
_ENTRY_JSON_LIMIT = 1 << 20


def is_marked(folder: Path) -> bool:
    """Whether onebuild made (or adopted) the cache folder `folder`."""
    try:
        return read_regular(folder / MARK, 4096).decode(errors="replace") == MARK_TEXT
    except (OSError, UserError):
        return False


def is_entry(entry: Path) -> bool:
    """Whether `entry` is a cache entry onebuild stored: `<key[:2]>/<key>` holding onebuild's
    entry.json (its output names and digests)."""
    if not (_KEY.fullmatch(entry.name) and entry.name[:2] == entry.parent.name):
        return False
    if entry.is_symlink() or not entry.is_dir():
        return False
    try:
        record = json.loads(read_regular(entry / "entry.json", _ENTRY_JSON_LIMIT))
    except (OSError, UserError, ValueError, RecursionError):
        return False
    return (
        isinstance(record, dict)
        and isinstance(record.get("outputs"), list)
        and isinstance(record.get("digests"), list)
        and len(record["outputs"]) == len(record["digests"])
        and all(isinstance(d, str) and _KEY.fullmatch(d) for d in record["digests"])
    )


def is_temporary(item: Path) -> bool:
    """Whether `item` is a staging or dropped entry folder onebuild names in a shard folder."""
    return (
        bool(_TEMPORARY.fullmatch(item.name) and _SHARD.fullmatch(item.parent.name))
        and not item.is_symlink()
        and item.is_dir()
    )


def drop(entry: Path) -> None:
    """Remove cache entry `entry` (a local path): renamed aside first to `.drop.<key8>.<pid>`
    (no reader sees it half removed; a killed process's leftover is a temporary to sweep),
    then deleted. Only what this call renamed is deleted."""
    aside = entry.with_name(f".drop.{entry.name[:8]}.{os.getpid()}")
    try:
        os.replace(entry, aside)
    except OSError:  # gone already, or not ours to move
        return
    shutil.rmtree(aside, ignore_errors=True)


def shards(folder: Path) -> list[Path]:
    """The two-hex-digit folders of a cache folder."""
    found = (p for p in folder.iterdir() if _SHARD.fullmatch(p.name) and p.is_dir())
    return sorted(p for p in found if not p.is_symlink())


def _only_onebuilds(folder: Path) -> bool:
    """Whether an unmarked folder holds nothing but onebuild's cache entries."""
    for item in folder.iterdir():
        if item.name == PUBLISHED and item.is_dir() and not item.is_symlink():
            continue
        if not (_SHARD.fullmatch(item.name) and item.is_dir() and not item.is_symlink()):
            return False
        if not all(is_entry(e) or is_temporary(e) for e in item.iterdir()):
            return False
    return True


def check(folder: Path, what: str) -> None:
    """Refuse (one line) a cache folder that exists and is neither marked, empty nor only
    onebuild's entries. `what` names it (`r.toml: build.cache '/home/me'`)."""
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir():
        raise UserError(f"{what}: is not a folder; name a folder for the step cache")
    if is_marked(folder):
        return
    try:
        if _only_onebuilds(folder):
            return
    except OSError as error:
        raise UserError(f"{what}: cannot be read ({error.strerror})") from None
    raise UserError(
        f"{what}: holds files that are not onebuild's and has no {MARK}, so onebuild does not "
        "use it as a step cache: name a new or empty folder"
    )


def claim(folder: Path, what: str) -> None:
    """Make `folder` a marked cache folder (creating it), after `check`."""
    check(folder, what)
    if is_marked(folder):
        return
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / MARK, MARK_TEXT.encode())
