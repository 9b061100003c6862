"""What a build may replace or remove: only what onebuild made itself.

A step claims its outputs before writing them: its log (`<first output>.log`) is written first,
naming every output, and rewritten with hashes and timings when the step ends. An output that
exists may be replaced (by a build) or removed (by `clean`) only when that log names it, so a
package path, a build folder or a data folder that happens to be where an output goes is never
touched; an output folder (a package) also only while it holds no file but those the log lists,
so a user's notes put inside a package are never swept with it. A build folder carries a mark
file from its first build on; an existing folder that holds other files and no mark is refused.

Temporary files that a killed build left beside its outputs (the atomic writers' `.NAME.XXXXXXXX`
siblings) are swept by the next build and by `clean`, both under the build-folder lock (the
plan file, written before the lock is taken, only when its temporaries are an hour old).
"""

import json
import os
import re
import shutil
import time
from pathlib import Path

from ..errors import UserError
from ..fileio import atomic_write_bytes, not_a_folder, read_regular
from ..plan import BUILD_MARK
from .step_cache import fingerprint, tree_digest

MARK = BUILD_MARK
# Files a build folder of an older onebuild holds (adopted: marked on the next build).
_EARLIER_MARKS = ("tasks.sqlite3", ".lock")
# mkstemp/mkdtemp names of fileio and the step cache: ".NAME." + 8 characters (+ ".tmp").
STALE_PLAN_SECONDS = 3600.0
_TEMPORARY = r"\.{name}\.(old\.)?[a-z0-9_]{{8}}(\.tmp)?"
LOG_LIMIT = 64 << 20  # a step log lists a package's files: far below this


def log_path(outputs: list[Path]) -> Path:
    return Path(f"{outputs[0]}.log")


def read_log(outputs: list[Path]) -> dict | None:
    """The step's log, or None when it is missing, not a regular file (a FIFO, a device), too
    large, not JSON (or nested too deep for it) or not a JSON object."""
    try:
        log = json.loads(read_regular(log_path(outputs), LOG_LIMIT))
    except (OSError, UserError, ValueError, RecursionError):
        return None
    return log if isinstance(log, dict) else None


def _claimed(outputs: list[Path]) -> set[str]:
    names = (read_log(outputs) or {}).get("outputs")  # a list while running, then a dict
    return {str(name) for name in names} if isinstance(names, (list, dict)) else set()


def folder_files(path: Path) -> list[str]:
    """The files and links inside an output folder, as sorted relative names."""
    found = (p for p in path.rglob("*") if p.is_symlink() or not p.is_dir())
    return sorted(p.relative_to(path).as_posix() for p in found)


def _logged_files(outputs: list[Path]) -> dict:
    files = (read_log(outputs) or {}).get("files", {})
    return files if isinstance(files, dict) else {}


def foreign(outputs: list[Path], inside: bool = True) -> list[Path]:
    """What exists where the outputs go but onebuild did not make: outputs no log of theirs
    names, and (`inside`) files inside an output folder that its log does not list."""
    present = [p for p in outputs if p.exists() or p.is_symlink()]
    if not present:
        return []
    claimed = _claimed(outputs)
    if not claimed and _damaged_log_in_build_folder(outputs):
        claimed = {str(p) for p in outputs}
    found = [p for p in present if str(p) not in claimed]
    listed = _logged_files(outputs) if inside else {}
    for path in present:
        if str(path) in claimed and str(path) in listed and path.is_dir() and not path.is_symlink():
            known = set(listed[str(path)])
            found += [path / name for name in folder_files(path) if name not in known]
    return found


def _damaged_log_in_build_folder(outputs: list[Path]) -> bool:
    """A step log that is a file but unreadable (a killed write of an older onebuild, an
    edit), beside outputs all inside a marked build folder: they are that build's own."""
    if not log_path(outputs).is_file() or read_log(outputs) is not None:
        return False
    return all((p.parent / MARK).is_file() for p in outputs)


def made_by(outputs: list[Path]) -> str | None:
    """The recipe whose step last made these outputs, as their log names it."""
    recipe = (read_log(outputs) or {}).get("recipe")
    return recipe if isinstance(recipe, str) else None


def logged_key(outputs: list[Path]) -> str | None:
    """The cache key the step's log says it finished with (None: no finished log)."""
    log = read_log(outputs) or {}
    finished = log.get("status") in ("run", "restored")
    key = log.get("cache_key") if finished else None
    return key if isinstance(key, str) else None


def finished_key(outputs: list[Path], recipe: Path) -> str | None:
    """The cache key `recipe`'s step logged finishing with, if its outputs are as it left them."""
    key = logged_key(outputs)
    return key if key is not None and outputs_intact(outputs, recipe) else None


def outputs_intact(outputs: list[Path], recipe: Path, refresh: bool = False) -> bool:
    """Whether every output is as `recipe`'s step logged it (by fingerprint, else by content):
    an output deleted or edited since, or made since by another recipe's step writing to the
    same path, is made again; a merely touched one is not, nor a package holding a file of
    someone else's besides (only its listed files count). `refresh` (a build, holding the
    lock): an output whose content is as logged but whose fingerprint moved (`cp -a`, a CI
    cache restore) gets its new fingerprint logged, so later builds do not hash it again."""
    log = read_log(outputs)
    try:
        if log is None or log["recipe"] != str(recipe):
            return False
        digests, prints = log["outputs"], log.get("fingerprints", {})
        listed = log.get("files", {})
        moved = {}
        for path in outputs:
            if not path.exists():
                return False
            now = fingerprint(path)
            if prints.get(str(path)) != now:
                names = listed.get(str(path)) if path.is_dir() else None
                if digests[str(path)] != tree_digest(path, names):
                    return False
                moved[str(path)] = now
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if refresh and moved:
        log["fingerprints"] = {**prints, **moved}
        text = json.dumps(log, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(log_path(outputs), text.encode())
    return True


def refuse_foreign(outputs: list[Path], where: str, verb: str, inside: bool = True) -> None:
    """A user error when `verb`ing `outputs` would touch something onebuild did not make
    (`inside`: a file inside an output folder that its log does not list, too)."""
    found = foreign(outputs, inside)
    if found:
        kind = "folder" if found[0].is_dir() else "file"
        prefix = f"{where}: " if where else ""  # a step's failure names its step itself
        raise UserError(
            f"{prefix}would {verb} the {kind} '{found[0]}', which onebuild did not make (no "
            f"build log names it); move it away, or choose another output path"
        )


def claim_in_place(outputs: list[Path]) -> None:
    """Record the files of the new outputs, once they are in place and before anything slow
    (storing them in the step cache): a build killed then leaves a log that lists them."""
    log = json.loads(log_path(outputs).read_bytes())
    log["files"] = {str(p): folder_files(p) for p in outputs if p.is_dir()}
    atomic_write_bytes(log_path(outputs), (json.dumps(log, indent=2) + "\n").encode())


def claim(outputs: list[Path], step: str) -> None:
    """Record, before writing them, that these outputs are onebuild's (keeping the files the
    last finished step listed, which stay in place until the new outputs replace them)."""
    record = {"status": "running", "step": step, "outputs": [str(p) for p in outputs]}
    files = _logged_files(outputs)
    if files:
        record["files"] = files
    atomic_write_bytes(log_path(outputs), (json.dumps(record, indent=2) + "\n").encode())


def remove(outputs: list[Path]) -> None:
    """Remove claimed outputs, their log and stray temporaries (checked by the caller)."""
    for path in outputs:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    log_path(outputs).unlink(missing_ok=True)
    sweep(outputs)


def sweep(paths: list[Path], older_than: float = 0.0) -> None:
    """Remove the temporary siblings a killed writer left for `paths` (and their logs);
    `older_than` (seconds) spares files that a writer outside the lock may be writing now."""
    now = time.time()
    for path in paths:
        folder = path.parent
        if not folder.is_dir():
            continue
        names = (path.name, f"{path.name}.log")
        patterns = [re.compile(_TEMPORARY.format(name=re.escape(n))) for n in names]
        for entry in os.scandir(folder):
            if any(p.fullmatch(entry.name) for p in patterns):
                if older_than and now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    Path(entry.path).unlink(missing_ok=True)


def claim_build_folder(folder: Path, where: str) -> None:
    """Create or adopt a build folder; refuse one that holds files onebuild did not make."""
    blocker = not_a_folder(folder)
    if blocker is not None:
        inside = "" if blocker == folder else f" (in build.dir '{folder}')"
        raise UserError(
            f"{where}: '{blocker}'{inside} is a file or a broken symlink, not a folder; point "
            "build.dir at a folder"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / MARK).is_file():
            return
        entries = [name for name in os.listdir(folder) if name != MARK]
        if entries and not any(name in entries for name in _EARLIER_MARKS):
            raise UserError(
                f"{where}: build.dir '{folder}' already holds files that onebuild did not make; "
                "point build.dir at a new or empty folder"
            )
        with open(folder / MARK, "a") as mark:  # no temporary: a concurrent build may look
            mark.write("" if mark.tell() else "An onebuild build folder (`onebuild clean`).\n")
    except OSError as error:
        raise UserError(
            f"{where}: build.dir '{folder}': cannot use it ({error.strerror or error})"
        ) from None
