"""Progress on long steps: a live line with rate on a terminal (a pseudo-terminal here), one line
when the step ends otherwise, nothing with --json."""

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

from onebuild.npz import write_npz

MODEL = Path(__file__).parent.parent / "examples" / "models" / "tiny_mobilenet.onnx"
RECIPE = """
[import]
source = "m.onnx"
input_shapes = { x = [1, 3, 32, 32] }
[quantize]
calibration = "c.npz"
"""


@pytest.fixture
def project(tmp_path):
    shutil.copy(MODEL, tmp_path / "m.onnx")
    samples = np.random.default_rng(0).normal(size=(2048, 1, 3, 32, 32)).astype(np.float32)
    write_npz(tmp_path / "c.npz", {"x": samples})  # 64 passes of 32 samples: about a second
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path


def _under_a_terminal(command: list[str], cwd: Path) -> str:
    """stderr of `command` run with a pseudo-terminal (100 columns) as its stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(
        command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave
    )
    os.close(slave)
    data = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            data += chunk
        elif process.poll() is not None:
            break
    assert process.wait(timeout=120) == 0, data.decode(errors="replace")
    os.close(master)
    return data.decode(errors="replace")


def test_calibration_shows_live_progress_on_a_terminal(project):
    text = _under_a_terminal([sys.executable, "-m", "onebuild.cli", "build", "r.toml"], project)
    end = text.index("calibrate: 2048 samples in")
    redraws = [part for part in text[:end].split("\r") if part.startswith("calibrate:")]
    counts = {part.split("samples")[0] for part in redraws if "samples/s" in part}
    assert len(counts) >= 3, redraws  # at least three updates, each with its rate


def test_calibration_progress_is_one_line_without_a_terminal_and_none_with_json(project):
    command = [sys.executable, "-m", "onebuild.cli", "build", "r.toml"]
    plain = subprocess.run(command, cwd=project, capture_output=True, text=True, check=True)
    assert "\r" not in plain.stderr
    assert plain.stderr.count("calibrate: 2048 samples in") == 1
    shutil.rmtree(project / "build")
    quiet = subprocess.run([*command, "--json"], cwd=project, capture_output=True, text=True)
    assert quiet.returncode == 0 and "calibrate: 2048" not in quiet.stderr


SESSION_MODEL = MODEL.parent / "tiny_mobilenet.onnx"
SESSION_DATA = MODEL.parent / "tiny_mobilenet_calib.npz"  # 16 real samples
RUN = [sys.executable, "-m", "onebuild.cli", "run", str(SESSION_MODEL), "-i", str(SESSION_DATA)]


def test_on_device_calibration_shows_live_progress_on_a_terminal(tmp_path):
    """The Session records 1500 runs (each a float inference, cycling over the samples) before
    it quantizes and partitions for the NPU: a live count of recorded runs with its rate."""
    manual = ["-o", "y.npz", "--workspace", "ws", "--quantize", "uint8", "--minmax-runs", "1500",
              "--codegen", "trix_sim"]  # fmt: skip
    text = _under_a_terminal([*RUN, *manual], tmp_path)
    end = text.index("on-device calibration: 1500 runs in")
    redraws = [p for p in text[:end].split("\r") if p.startswith("on-device calibration:")]
    counts = {part.split("runs")[0] for part in redraws if "runs/s" in part}
    assert len(counts) >= 3, redraws
    assert re.search(r"on-device codegen: [1-9]\d* parts? in", text)  # the partitioned NPU parts


def test_session_compile_progress_is_one_line_per_stage_without_a_terminal(tmp_path):
    auto = ["-o", "z.npz", "--workspace", "auto", "--auto-compile", "--minmax-runs", "8"]
    done = subprocess.run([*RUN, *auto], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    for line in ("on-device calibration: 8 runs in", "gate quantized: 8 samples in",
                 "on-device codegen: ", "gate compiled: 8 samples in",
                 "on-device compile: 2 steps in"):  # fmt: skip
        assert done.stderr.count(line) == 1, (line, done.stderr)
    assert re.search(r"on-device codegen: [1-9]\d* parts? in", done.stderr)


def test_session_progress_is_silent_when_not_asked(tmp_path):
    """An app using the Session (no CLI, logging not configured) sees no progress."""
    script = f"""
import numpy as np
from onebuild.runtime.session import Session
session = Session({str(SESSION_MODEL)!r}, workspace="ws")
session.set_odc_param_minmax_records_count(8)  # fewer: a warning (gate on its own inputs)
x = np.load({str(SESSION_DATA)!r})["x"]
for sample in x[:10]:
    session.run_with_auto_compilation({{"x": sample}})
assert session.state == "COMPILED", session.reason
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "on-device" not in done.stderr and "gate " not in done.stderr and "\r" not in done.stderr
