"""The step cache behind an fsspec URL, against a real OpenSSH sftp server on loopback.

Builds run through the CLI in subprocesses, which find the client key through fsspec's own
environment variable, as a CI job would (never through the recipe).
"""

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sftp_server import SftpServer

from onebuild.engine.remote_cache import pack_entry, verified_payload
from onebuild.engine.step_cache import StepCache, tree_digest

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
RECIPE = """
[import]
source = "model.onnx"
input_shapes = {{ x = [1, 3, 32, 32] }}
[optimize]
preset = "O1"
[pack]
output = "out/m.nnpkg"
archive = true
[build]
cache = "{url}"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = SftpServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def remote(server, tmp_path):
    folder = tmp_path / "remote-cache"
    folder.mkdir()
    return folder, server.url(folder)


def checkout(root: Path, name: str, url: str) -> Path:
    folder = root / name
    folder.mkdir()
    shutil.copy(MODEL, folder / "model.onnx")
    (folder / "r.toml").write_text(RECIPE.format(url=url))
    return folder


def build(server: SftpServer, folder: Path, *args: str) -> dict[str, str]:
    command = [sys.executable, "-m", "onebuild.cli", "build", str(folder / "r.toml"), "--json"]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, env=server.env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return {s["step"]: s["status"] for s in json.loads(done.stdout)["steps"]}


def package_digest(folder: Path) -> tuple[str, str]:
    return tree_digest(folder / "out/m.nnpkg"), tree_digest(folder / "out/m.nnpkg.zip")


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("??/*.entry"))


def test_fresh_checkout_restores_everything_and_packages_match(server, remote, tmp_path):
    folder, url = remote
    first = checkout(tmp_path, "a", url)
    assert set(build(server, first).values()) == {"run"}
    assert len(entries(folder)) == 3
    assert not list(folder.glob("??/*.tmp-*"))  # every upload was renamed into place
    second = checkout(tmp_path, "b", url)
    assert build(server, second) == {
        "import": "restored",
        "optimize": "restored",
        "pack": "restored",
    }
    assert package_digest(second) == package_digest(first)
    assert set(build(server, second).values()) == {"up-to-date"}


def test_a_remote_cache_set_after_the_build_is_filled_by_the_next_one(server, remote, tmp_path):
    """A clone built without a cache publishes its up-to-date steps once the recipe names a
    remote cache (its local entries exist already: the remote is asked, once per entry)."""
    folder, url = remote
    first = checkout(tmp_path, "a", url)
    (first / "r.toml").write_text(RECIPE.format(url=url).replace(f'cache = "{url}"', ""))
    assert set(build(server, first).values()) == {"run"}
    (first / "r.toml").write_text(RECIPE.format(url=url))
    assert set(build(server, first).values()) == {"up-to-date"}
    assert len(entries(folder)) == 3
    marks = sorted((first / "build/r/cache/.published").rglob("*"))
    assert set(build(server, first).values()) == {"up-to-date"}  # marked: nothing asked again
    assert sorted((first / "build/r/cache/.published").rglob("*")) == marks
    second = checkout(tmp_path, "b", url)
    assert set(build(server, second).values()) == {"restored"}
    assert package_digest(second) == package_digest(first)


def test_status_names_remote_entries_without_downloading_them(server, remote, tmp_path):
    """`status` on a fresh checkout says import would be restored from the remote cache, and
    that what follows is judged once it has been; the local cache stays empty."""
    _, url = remote
    build(server, checkout(tmp_path, "a", url))
    second = checkout(tmp_path, "b", url)
    command = [sys.executable, "-m", "onebuild.cli", "status", str(second / "r.toml"), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=server.env, timeout=300)
    assert done.returncode == 0, done.stderr
    steps = {s["step"]: s for s in json.loads(done.stdout)["steps"]}
    assert steps["import"]["status"] == "restored"
    assert f"from the remote cache {url}" in steps["import"]["reasons"]
    assert {steps[s]["status"] for s in ("optimize", "pack")} == {"pending"}
    assert not list((second / "build").rglob("entry.json"))  # nothing was fetched
    assert build(server, second) == {
        "import": "restored",
        "optimize": "restored",
        "pack": "restored",
    }


def test_corrupt_entry_is_dropped_and_rebuilt(server, remote, tmp_path):
    folder, url = remote
    first = checkout(tmp_path, "a", url)
    build(server, first)
    pack_log = json.loads((first / "out/m.nnpkg.log").read_text())
    corrupt = folder / pack_log["cache_key"][:2] / f"{pack_log['cache_key']}.entry"
    blob = bytearray(corrupt.read_bytes())
    blob[len(blob) // 2] ^= 0x01  # one flipped bit inside the package
    corrupt.write_bytes(bytes(blob))
    second = checkout(tmp_path, "b", url)
    assert build(server, second) == {"import": "restored", "optimize": "restored", "pack": "run"}
    assert package_digest(second) == package_digest(first)
    assert verified_payload(corrupt.read_bytes()) is not None  # a good entry replaced it
    third = checkout(tmp_path, "c", url)
    assert set(build(server, third).values()) == {"restored"}


def test_truncated_entry_and_killed_upload_are_not_trusted(server, remote, tmp_path):
    folder, url = remote
    build(server, checkout(tmp_path, "a", url))
    for entry in entries(folder):  # as if a writer died mid-upload to the final name
        entry.write_bytes(entry.read_bytes()[:-10])
    stray = folder / "00" / ("0" * 64 + ".entry.tmp-dead")  # a killed writer's upload
    stray.parent.mkdir(exist_ok=True)  # a real entry may share the prefix
    stray.write_bytes(b"partial")
    assert set(build(server, checkout(tmp_path, "b", url)).values()) == {"run"}
    assert all(verified_payload(e.read_bytes()) is not None for e in entries(folder))


def test_concurrent_writers_of_the_same_keys(server, remote, tmp_path):
    folder, url = remote
    folders = [checkout(tmp_path, name, url) for name in ("a", "b", "c")]
    results = {}
    threads = [
        threading.Thread(target=lambda f=f: results.update({f.name: build(server, f)}))
        for f in folders
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert len({package_digest(f) for f in folders}) == 1
    assert len(entries(folder)) == 3 and not list(folder.glob("??/*.tmp-*"))
    assert all(verified_payload(e.read_bytes()) is not None for e in entries(folder))
    assert set(build(server, checkout(tmp_path, "d", url)).values()) == {"restored"}


def test_gc_evicts_least_recently_used_first(server, remote, tmp_path):
    folder, url = remote
    build(server, checkout(tmp_path, "a", url))
    build(server, checkout(tmp_path, "b", url), "--set", "optimize.preset=O0")
    sizes = {e.name: e.stat().st_size for e in entries(folder)}
    assert len(sizes) == 5  # import shared; optimize and pack twice
    time.sleep(1.1)  # sftp times have whole seconds
    # The O1 build is used again: its three entries become the most recent.
    assert set(build(server, checkout(tmp_path, "c", url)).values()) == {"restored"}
    recent = {
        json.loads(Path(f"{p}.log").read_text())["cache_key"] for p in _outputs(tmp_path / "c")
    }
    keep = sum(sizes[f"{k}.entry"] for k in recent)
    command = [sys.executable, "-m", "onebuild.cli", "cache", "gc", url, "--max-size", str(keep)]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=server.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "kept": 3,
        "removed": 2,
        "size": keep,
        "freed": sum(sizes.values()) - keep,
    }
    assert {e.name for e in entries(folder)} == {f"{k}.entry" for k in recent}


def _outputs(folder: Path) -> list[Path]:
    build_dir = folder / "build" / "r"
    return [build_dir / "import.obir", build_dir / "optimize.obir", folder / "out/m.nnpkg"]


def test_password_in_the_url_is_refused(tmp_path):
    folder = checkout(tmp_path, "a", "sftp://me:secret@127.0.0.1:1/cache")
    command = [sys.executable, "-m", "onebuild.cli", "build", str(folder / "r.toml")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "build.cache: the URL carries a password" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_local_cache_entry_is_verified_before_restore(tmp_path):
    output = tmp_path / "out.bin"
    output.write_bytes(b"result")
    cache = StepCache(tmp_path / "cache")
    cache.store("ab" * 32, [output])
    stored = cache.entry("ab" * 32) / "0"
    stored.write_bytes(b"resulT")  # bit rot in a shared cache folder
    assert not cache.restore("ab" * 32, [output])
    assert cache.entry("ab" * 32) is None  # dropped: the next build stores a good one
    cache.store("ab" * 32, [output])
    output.unlink()
    assert cache.restore("ab" * 32, [output]) and output.read_bytes() == b"result"


def test_entry_blob_is_deterministic_and_checked(tmp_path):
    output = tmp_path / "pkg"
    (output / "metadata").mkdir(parents=True)
    (output / "metadata" / "MANIFEST").write_text("{}")
    blobs = []
    for name in ("c1", "c2"):
        cache = StepCache(tmp_path / name)
        cache.store("cd" * 32, [output])
        blobs.append(pack_entry(cache.entry("cd" * 32)))
    assert blobs[0] == blobs[1] and verified_payload(blobs[0]) is not None
    assert verified_payload(blobs[0][:-1]) is None
    assert verified_payload(b"not an entry") is None


def test_unreachable_cache_warns_once_and_builds(server, tmp_path):
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"sftp://127.0.0.1:{sock.getsockname()[1]}/cache"
    folder = checkout(tmp_path, "a", url)
    command = [sys.executable, "-m", "onebuild.cli", "build", str(folder / "r.toml"), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=server.env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {s["status"] for s in json.loads(done.stdout)["steps"]} == {"run"}
    assert done.stderr.count(f"step cache {url} unreachable") == 1
