"""Harness of the hostile-input corpus: every case runs the real CLI in a subprocess with an
address-space limit and a timeout, and must fail cleanly.

A clean failure exits 1 or 2 (never a signal, never another code), prints exactly one line on
stderr of the form "onebuild: error: ..." (besides `[step] ...` progress lines), no traceback;
that line names where the problem is (a file, a recipe key path or a node: the case's
`mentions`), and every file that was in the case folder before is still there, unchanged.
Test modules build `Case`s deterministically and parametrize over them
(`tests/test_hostile_*.py`).
"""

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ADDRESS_SPACE = 3 << 30  # bytes: numpy, onnx and doit start in ~1 GiB of address space
TIMEOUT = 60  # seconds


@dataclass
class Case:
    """One hostile input: files to create (relative path -> bytes or text), the CLI arguments
    (`{tmp}` is replaced by the case folder) and what the error line must name."""

    id: str
    argv: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    mentions: str = ""
    codes: tuple[int, ...] = (1, 2)
    setup: Callable[[Path], None] | None = None  # builds what `files` cannot (links, folders)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_cli(argv: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`onebuild ARGV` in a fresh interpreter under the address-space limit."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "onebuild.cli", *argv],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT,
        preexec_fn=_limit,
        env=env,
    )


def materialize(case: Case, folder: Path) -> list[str]:
    """Create the case's files in `folder`; returns its argv with `{tmp}` filled in."""
    for relative, content in case.files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
    if case.setup is not None:
        case.setup(folder)
    return [a.replace("{tmp}", str(folder)) for a in case.argv]


def check_clean_failure(case: Case, folder: Path) -> str:
    """Run the case; assert it failed cleanly; returns the error line."""
    argv = materialize(case, folder)
    before = _snapshot(folder)
    result = run_cli(argv, folder)
    stderr = result.stderr.decode(errors="replace")
    context = f"{case.id}: onebuild {' '.join(argv)} -> exit {result.returncode}\n{stderr}"
    assert result.returncode in case.codes, context
    assert "Traceback" not in stderr, context
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("onebuild: error: ")]
    assert len(errors) == 1, context
    assert all(line.startswith(("onebuild: ", "[")) for line in lines), context  # or progress
    mentions = case.mentions.replace("{tmp}", str(folder))
    assert mentions in errors[0], f"{context}\n(expected the error to name {mentions!r})"
    lost = [p for p, data in before.items() if _read(folder / p) != data]
    assert not lost, f"{context}\nfiles changed or lost: {lost}"
    return errors[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` (symlinks not followed): nothing may be lost."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(folder))] = path.read_bytes()
    return found


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
