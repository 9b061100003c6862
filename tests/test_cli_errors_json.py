"""--json gives scripts one JSON document on stdout on every exit, errors (exit 2) included; a
second build of a busy build folder stops at once, or with --wait waits for the first."""

import fcntl
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
RECIPE = """
[import]
source = "digits.onnx"
input_shapes = { input = [1, 1, 8, 8] }
[optimize]
"""


def onebuild(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "onebuild.cli", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def test_json_errors_are_a_json_object_on_stdout(tmp_path):
    (tmp_path / "r.toml").write_text('[import]\nsource = "missing.onnx"\n')
    for args in (
        ["build", "r.toml", "--json"],  # bad input found by the command
        ["build", "r.toml", "--json", "--jobs", "0"],  # bad option, found by the parser
        ["inspect", "missing.onnx", "--json"],
    ):
        done = onebuild(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        document = json.loads(done.stdout)
        assert document == {"error": document["error"], "exit_code": 2}
        assert f"onebuild: error: {document['error']}" == done.stderr.strip()  # the same line
    plain = onebuild("build", "r.toml", cwd=tmp_path)
    assert plain.returncode == 2 and plain.stdout == ""  # without --json, stderr only


def test_a_second_build_waits_for_the_first_only_when_asked(tmp_path):
    shutil.copy(DIGITS / "digits.onnx", tmp_path)
    (tmp_path / "r.toml").write_text(RECIPE)
    assert onebuild("build", "r.toml", cwd=tmp_path).returncode == 0
    with open(tmp_path / "build/r/.lock", "w") as lock:  # as a running build holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = onebuild("build", "r.toml", "--json", cwd=tmp_path)
        assert busy.returncode == 3 and "build --wait" in json.loads(busy.stdout)["error"]
        command = [sys.executable, "-m", "onebuild.cli", "build", "r.toml", "--wait"]
        waiting = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(3)
        assert waiting.poll() is None  # still waiting
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "waiting for it" in err and "2 up to date" in out
