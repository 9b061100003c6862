"""The on-device session resumes recording across restarts and kills (an app that runs fewer
than ODC_MINMAX_RECORDS inferences per launch still gets its model compiled)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from onebuild import Session
from onebuild.npz import read_npz, write_npz

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SHAPES = {"input": [1, 1, 8, 8]}

# One launch of an app: open the session, run `count` inferences from the stream (continuing
# where the workspace stopped), printing the recorded count after each; `count` < 0: forever.
APP = """
import sys
from onebuild import Session
from onebuild.npz import read_npz

workspace, stream, records, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
stream = read_npz(stream)["input"]
session = Session(sys.argv[5], workspace=workspace, input_shapes={"input": [1, 1, 8, 8]})
session.set_odc_param_minmax_records_count(records)
print(session.minmax_records, session.state, flush=True)
done = 0
while done != count:
    x = stream[session.minmax_records % len(stream)]
    session.run_with_auto_compilation({"input": x})
    done += 1
    print(session.minmax_records, session.state, flush=True)
"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("app")
    script, stream = folder / "app.py", folder / "stream.npz"
    script.write_text(APP)
    write_npz(stream, {"input": read_npz(DIGITS / "data" / "calib.npz")["input"]})
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

    def argv(workspace, records, count, model=DIGITS / "digits.onnx"):
        return [sys.executable, str(script), str(workspace), str(stream), str(records), str(count),
                str(model)]  # fmt: skip

    def launch(workspace, records, count, model=DIGITS / "digits.onnx") -> list[str]:
        result = subprocess.run(
            argv(workspace, records, count, model), capture_output=True, text=True, env=env
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    def popen(workspace, records):
        return subprocess.Popen(
            argv(workspace, records, -1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )

    launch.popen, launch.stream = popen, read_npz(stream)["input"]
    return launch


def single_session(workspace: Path, stream, records: int, runs: int) -> Session:
    session = Session(DIGITS / "digits.onnx", workspace=workspace, input_shapes=SHAPES)
    session.set_odc_param_minmax_records_count(records)
    for x in stream[:runs]:
        session.run_with_auto_compilation({"input": x})
    return session


def test_recording_resumes_across_launches_and_compiles_as_one_long_session(tmp_path, app):
    records = 12
    workspace = tmp_path / "ws"
    counts = []
    for runs in (5, 0, 4, 2):  # fewer than `records` per launch, clean exits in between
        lines = app(workspace, records, runs)
        counts.append(lines[-1])
    assert counts == ["5 INITIAL", "5 INITIAL", "9 INITIAL", "11 INITIAL"]
    assert app(workspace, records, 1)[-1] == "12 COMPILED"
    assert app(workspace, records, 0) == ["12 COMPILED"]  # nothing recorded or rebuilt
    whole = single_session(tmp_path / "whole", app.stream, records, records)
    assert whole.state == "COMPILED" and whole.reason is None
    for name in ("minmax.npz", "model.obir", "quantized.obir", "model.tvn", "state.json"):
        assert (workspace / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    for index in range(records):
        name = f"records/{index:06d}.npz"
        assert (workspace / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_the_workspace_names_its_model_and_a_changed_model_starts_over(tmp_path, app, rng):
    from test_session import softmax_model

    workspace = tmp_path / "ws"
    assert app(workspace, 50, 3)[-1] == "3 INITIAL"
    state = json.loads((workspace / "state.json").read_text())
    assert state["state"] == "INITIAL" and len(state["source"]) == 64
    other = tmp_path / "m.onnx"
    onnx.save(softmax_model(rng), other)
    session = Session(other, workspace=workspace)
    assert session.minmax_records == 0 and not list((workspace / "records").iterdir())
    assert json.loads((workspace / "state.json").read_text())["source"] != state["source"]
    session.close()  # one process at a time: the app's launches need the workspace
    assert app(workspace, 50, 2)[-1] == "2 INITIAL"  # back to digits: over again, then resumes
    assert app(workspace, 50, 1)[-1] == "3 INITIAL"


def test_killed_while_recording_loses_no_completed_run(tmp_path, app):
    """SIGKILL at random points of a recording loop, 20 times on one workspace: every run the
    app saw complete before the kill is still recorded, and the files equal a clean recording
    of the same number of runs."""
    workspace, gate_samples = tmp_path / "ws", 16
    reference = tmp_path / "reference"  # minmax.npz bytes after each run of a clean recording
    snapshots = [None]
    session = Session(DIGITS / "digits.onnx", workspace=reference, input_shapes=SHAPES)
    session.set_execute_config("DUMP_MINMAX")
    total = 0
    for seed in range(20):
        rng = random.Random(seed)
        wait_lines, delay = rng.randint(1, 6), rng.uniform(0, 0.02)
        child = app.popen(workspace, 10**6)
        first = int(child.stdout.readline().split()[0])  # the count when it opened
        assert first >= total, (seed, first, total)
        printed = first
        for _ in range(wait_lines):
            line = child.stdout.readline()
            assert line, child.stderr.read()
            printed = int(line.split()[0])
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        for line in rest.decode().splitlines():
            printed = int(line.split()[0])
        reopened = Session(DIGITS / "digits.onnx", workspace=workspace, input_shapes=SHAPES)
        total = reopened.minmax_records
        reopened.close()  # the next launch needs the workspace
        assert total >= printed, (seed, total, printed)
        assert total <= printed + 1  # at most the run under way when it died
        while len(snapshots) <= total:
            session.run({"input": app.stream[(len(snapshots) - 1) % len(app.stream)]})
            snapshots.append((reference / "minmax.npz").read_bytes())
        assert (workspace / "minmax.npz").read_bytes() == snapshots[total], seed
        kept = sorted(p.name for p in (workspace / "records").iterdir())
        assert kept == [f"{i:06d}.npz" for i in range(min(total, gate_samples))], seed
        swept = [p.name for p in workspace.rglob(".*")]
        assert swept == [".onebuild-workspace"], seed  # temporaries swept, the mark kept
    for index in range(min(total, gate_samples)):
        saved = read_npz(workspace / "records" / f"{index:06d}.npz")["input"]
        np.testing.assert_array_equal(saved, app.stream[index])


WRONG_TYPES = [
    ("source", 7),
    ("state", "FLYING"),
    ("state", ["INITIAL"]),
    ("done", "yes"),
    ("reason", 3),
    ("settings", "fast"),
    ("artifacts", []),
    ("artifacts", {"quantized": "quantized.obir"}),
    ("artifacts", {"compiled": {"path": 1, "sha256": "0"}}),
    ("gates", {"quantized": True}),
    ("choice", 5),
    ("qpath", 5),
    ("cpath", ["m.tvn"]),
]


@pytest.mark.parametrize(("key", "value"), WRONG_TYPES, ids=lambda v: str(v)[:20])
def test_a_hand_edited_state_of_the_wrong_types_starts_over_without_a_traceback(
    tmp_path, app, key, value, caplog
):
    workspace = tmp_path / "ws"
    done = single_session(workspace, app.stream, 4, 4)
    assert done.state == "COMPILED"
    state = json.loads((workspace / "state.json").read_text())
    state[key] = value
    (workspace / "state.json").write_text(json.dumps(state))
    session = Session(DIGITS / "digits.onnx", workspace=workspace, input_shapes=SHAPES)
    assert session.state == "INITIAL" and session.minmax_records == 0
    assert f"{key}" in caplog.text and "wrong type" in caplog.text
    session.run({"input": app.stream[0]})  # and it runs
