"""The step cache shared through an fsspec URL (`build.cache = "sftp://host/path"`, `s3://...`).

The local cache folder (`build.dir/cache`) fronts the remote one: a step's result is stored
locally, then published; a restore pulls the remote entry into the local folder first.
A remote entry is one file, `<url>/<key[:2]>/<key>.entry`: a header line with the SHA-256 of
the rest, then a deterministic tar of the local entry (outputs `0`, `1`, ... and `entry.json`).

- Atomic publish: written under a unique temporary name, then renamed into place; a reader sees
  a whole entry or none. Writers of one key write the same bytes: the last rename wins.
- Integrity: a downloaded entry whose hash does not match its header is deleted (remote and
  local copy) and the step reruns; the local entry's own digests are checked as well.
- An unreachable cache (server down, permissions) is one warning; the build goes on with the
  local cache alone.
- Credentials: only what each filesystem reads from its standard environment and config
  (ssh keys and agent for sftp, AWS variables for s3, `FSSPEC_<PROTOCOL>_<OPTION>` variables);
  a recipe's URL may not carry a password.
"""

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path

from ..errors import OneBuildError, UserError
from .step_cache import StepCache

log = logging.getLogger("onebuild")
_UNREACHABLE: set[str] = set()  # cache URLs that failed in this process

HEADER = b"onebuild-cache-v1 "
SUFFIX = ".entry"
INSTALL = "pip install 'onebuild[remote]'"


def remote_fs(url: str):
    """(fsspec filesystem, root path) of a cache URL; options come from fsspec's environment
    variables and config files."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UserError(f"build.cache '{url}' is a URL: install fsspec ({INSTALL})") from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as error:
        raise UserError(f"build.cache '{url}': {error}") from None


REMOTE = "remote"  # an entry only the remote cache holds


class RemoteStepCache:
    """A `StepCache` in `local` that publishes to and restores from the cache at `url`."""

    def __init__(self, local: Path, url: str):
        self.local = StepCache(local)
        self.url = url
        self._remote = None

    def _connect(self) -> tuple:
        """(fsspec filesystem, root path), resolved on first use."""
        if self._remote is None:
            self._remote = remote_fs(self.url)
        return self._remote

    @property
    def fs(self):
        return self._connect()[0]

    def _path(self, key: str) -> str:
        root = self._connect()[1]
        return f"{root.rstrip('/')}/{key[:2]}/{key}{SUFFIX}"

    def entry(self, key: str) -> Path | None:
        return self.local.entry(key) or (self.local.entry(key) if self._pull(key) else None)

    def located(self, key: str) -> Path | str | None:
        """Where an entry is, without downloading it: the local folder, REMOTE when only the
        remote cache holds it, else None (what `status` asks: it must not fill the cache)."""
        if (entry := self.local.entry(key)) is not None:
            return entry
        return REMOTE if self._guarded(lambda k: self.fs.exists(self._path(k)), key) else None

    def restore(self, key: str, outputs: list[Path]) -> bool:
        if self.local.verify(key, len(outputs)):
            return self.local.restore(key, outputs)
        return self._pull(key) and self.local.restore(key, outputs)

    def warnings(self, key: str) -> list[str]:
        return self.local.warnings(key)  # a restored entry is local

    def store(self, key: str, outputs: list[Path], warnings: list[str] = ()) -> None:
        self.local.store(key, outputs, warnings)
        if self.local.entry(key) is not None:
            self._guarded(self.publish, key)

    def ensure(self, key: str, outputs: list[Path], warnings: list[str] = ()) -> None:
        """Hold an up-to-date step's outputs locally and remotely; the remote is asked once per
        entry (a local mark records what was published there)."""
        self.local.ensure(key, outputs, warnings)
        if self.local.entry(key) is not None and not self._mark(key).exists():
            self._guarded(self._publish_missing, key)

    def _publish_missing(self, key: str) -> None:
        if self.fs.exists(self._path(key)):
            self._set_mark(key)
        else:
            self.publish(key)

    def _mark(self, key: str) -> Path:
        """A local file saying the entry is in the remote cache (per URL, outside the entry)."""
        url = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        return self.local.folder / ".published" / url / key

    def _set_mark(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self._mark(key).parent.mkdir(parents=True, exist_ok=True)
            self._mark(key).touch()

    def _pull(self, key: str) -> bool:
        return bool(self._guarded(self.pull, key))

    def _guarded(self, action, key: str):
        """Run a remote action; a failure of the remote side warns once per URL and turns the
        remote cache off for the rest of the process."""
        if self.url in _UNREACHABLE:
            return None
        try:
            return action(key)
        except OneBuildError:
            raise
        except Exception as error:  # the filesystem's own errors: OSError, SSHException, ...
            _UNREACHABLE.add(self.url)
            log.warning(
                "step cache %s unreachable (%s); using the local cache only", self.url, error
            )
            return None

    def publish(self, key: str) -> None:
        """Upload the local entry under a temporary name and rename it into place."""
        blob = pack_entry(self.local.entry(key))
        path = self._path(key)
        staging = f"{path}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(staging, blob)
        try:
            self.fs.mv(staging, path)
        except OSError:  # another writer's rename won (the same bytes): drop ours
            with contextlib.suppress(OSError):
                self.fs.rm(staging)
        self._set_mark(key)

    def pull(self, key: str) -> bool:
        """Download, verify and unpack a remote entry into the local cache; False if there is
        none or it is corrupt (then it is deleted, so the next build stores a good one)."""
        path = self._path(key)
        try:
            blob = self.fs.cat_file(path)
        except FileNotFoundError:
            return False
        payload = verified_payload(blob)
        if payload is None or not self._unpack(key, payload):
            with contextlib.suppress(OSError):
                self.fs.rm(path)
            return False
        with contextlib.suppress(OSError, NotImplementedError):
            touch(self.fs, path)
        return True

    def _unpack(self, key: str, payload: bytes) -> bool:
        target = self.local._entry(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}.", dir=target.parent))
        try:
            with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
                archive.extractall(staging / "e", filter="data")
            os.replace(staging / "e", target)
        except (tarfile.TarError, OSError):  # unreadable, or another build unpacked it first
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self.local.verify(key, len(_outputs(target)))


def _outputs(entry: Path) -> list[str]:
    try:
        return json.loads((entry / "entry.json").read_text())["outputs"]
    except (OSError, ValueError, KeyError):
        return []


def pack_entry(entry: Path) -> bytes:
    """A local entry folder as header + deterministic tar (sorted names, no times or owners)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for item in sorted(entry.rglob("*")):
            info = archive.gettarinfo(item, item.relative_to(entry).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if item.is_dir() else 0o644
            if item.is_file():
                with open(item, "rb") as handle:
                    archive.addfile(info, handle)
            else:
                archive.addfile(info)
    payload = buffer.getvalue()
    return HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def verified_payload(blob: bytes) -> bytes | None:
    """The tar of a remote entry if its header's hash matches, else None."""
    head, _, payload = blob.partition(b"\n")
    if not head.startswith(HEADER):
        return None
    digest = head[len(HEADER) :].decode("ascii", "replace")
    return payload if hashlib.sha256(payload).hexdigest() == digest else None


def touch(fs, path: str) -> None:
    """Mark an entry used now (for least-recently-used eviction), where the filesystem can."""
    ftp = getattr(fs, "ftp", None)  # sftp: set the modification time
    if ftp is not None:
        ftp.utime(path, None)
    else:
        fs.touch(path, truncate=False)
