"""`build --executor dask`: a real Dask scheduler and two worker processes on loopback.

The workers run in their own folders (no shared build folder: inputs and outputs travel with
the tasks); packages must be byte-identical to a serial build, a second build runs nothing,
and a worker SIGKILLed in the middle of a step costs nothing but time.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from onebuild.engine.dask_executor import parse_executor
from onebuild.engine.step_cache import tree_digest
from onebuild.errors import UserError

DIGITS = Path(__file__).parent.parent / "examples" / "digits"
SETTINGS = {"a": ("uint8", "minmax"), "b": ("int16", "minmax"), "c": ("uint8", "percentile")}
SETTINGS["d"] = ("uint8", "mse")
RECIPE = """
[import]
source = "digits/digits.onnx"
input_shapes = {{ input = [1, 1, 8, 8] }}
[optimize]
[quantize]
dtype = "{dtype}"
method = "{method}"
calibration = "digits/data/calib.npz"
[quantize.accuracy]
data = "digits/data/test.npz"
labels = "digits/data/test_labels.npz"
[pack]
output = "out/{name}.nnpkg"
archive = true
"""
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # `steps_run` runs on the scheduler
DASK = [sys.executable, "-m", "distributed.cli.dask_{}"]


def _dask(command: str, *args: str, cwd: Path, log: Path) -> subprocess.Popen:
    handle = open(log, "wb")  # noqa: SIM115 (the process keeps it; closed with the folder)
    return subprocess.Popen(
        [DASK[0], DASK[1], DASK[2].format(command), *args],
        cwd=cwd,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and two single-threaded worker processes (no nanny: a killed worker stays
    dead), each in its own folder; all stopped at the end."""
    from distributed import Client

    scheduler_file = tmp_path / "scheduler.json"
    processes = [
        _dask(
            "scheduler",
            *("--host", "127.0.0.1", "--port", "0", "--no-dashboard"),
            *("--scheduler-file", str(scheduler_file)),
            cwd=tmp_path,
            log=tmp_path / "scheduler.log",
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for index in range(2):
            folder = tmp_path / f"worker{index}"
            folder.mkdir()
            args = ("--nthreads", "1", "--no-nanny", "--host", "127.0.0.1", "--no-dashboard")
            processes.append(
                _dask(
                    "worker",
                    *args,
                    *("--scheduler-file", str(scheduler_file), "--local-directory", str(folder)),
                    cwd=folder,
                    log=folder / "worker.log",
                )
            )
        client = Client(scheduler_file=str(scheduler_file), timeout="60s")
        client.wait_for_workers(2, timeout=120)
        yield client, json.loads(scheduler_file.read_text())["address"]
        client.close()
    finally:
        for process in processes:
            with_group = os.getpgid(process.pid) if process.poll() is None else None
            if with_group is not None:
                os.killpg(with_group, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def project(folder: Path) -> list[Path]:
    folder.mkdir()
    shutil.copytree(DIGITS, folder / "digits", ignore=shutil.ignore_patterns("*.py"))
    recipes = []
    for name, (dtype, method) in SETTINGS.items():
        recipe = folder / f"{name}.toml"
        recipe.write_text(RECIPE.format(name=name, dtype=dtype, method=method))
        recipes.append(recipe)
    return recipes


def build(recipes: list[Path], *args: str) -> dict[tuple[str, str], str]:
    command = [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes), "--json"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    return {(Path(s["recipe"]).stem, s["step"]): s["status"] for s in steps}


def packages(folder: Path) -> dict[str, tuple[str, str, str]]:
    """Each recipe's package, its archive and its calibration statistics file."""
    return {
        name: (
            tree_digest(folder / f"out/{name}.nnpkg"),
            tree_digest(folder / f"out/{name}.nnpkg.zip"),
            tree_digest(folder / f"build/{name}/calibrate.npz"),
        )
        for name in SETTINGS
    }


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serial") / "p"
    statuses = build(project(folder))
    assert set(statuses.values()) == {"run"} and len(statuses) == 28
    return packages(folder)


def test_dask_build_matches_serial_and_second_build_runs_nothing(cluster, serial, tmp_path):
    client, address = cluster
    recipes = project(tmp_path / "p")
    start = time.time()
    assert set(build(recipes, "--executor", f"dask={address}").values()) == {"run"}
    assert packages(tmp_path / "p") == serial
    ran = client.run_on_scheduler(steps_run, start)
    # Every step ran on a worker; calibration split in two (one part per worker) and merged
    # into the serial build's bytes.
    assert len(ran) == 32 and sum(k.startswith("onebuild-calibrate-") for k in ran) == 8
    start = time.time()
    assert set(build(recipes, "--executor", f"dask={address}").values()) == {"up-to-date"}
    assert client.run_on_scheduler(steps_run, start) == []
    # A failing step fails as it does locally: same message, same report left behind.
    failures, lines = {}, {}
    for where, executor in (("local", "local"), ("dask", f"dask={address}")):
        folder = tmp_path / where
        recipe = project(folder)[0]
        recipe.write_text(recipe.read_text().replace("[pack]", "min_sqnr_db = 90.0\n[pack]"))
        command = [sys.executable, "-m", "onebuild.cli", "build", str(recipe)]
        done = subprocess.run([*command, "--executor", executor], capture_output=True, text=True)
        report = (folder / "build/a/quantize.accuracy.json").read_bytes()
        errors = [e for e in done.stderr.splitlines() if e.startswith("onebuild: error:")]
        failures[where] = (done.returncode, [e.replace(str(folder), "P") for e in errors], report)
        lines[where] = done.stderr
    assert failures["local"][0] == 1 and "accuracy gate failed" in failures["local"][1][0]
    assert failures["dask"] == failures["local"]
    # The workers' progress reaches the client's terminal: each calibration part's summary.
    assert "onebuild: info: calibrate: " in lines["local"]
    for part in ("1/2", "2/2"):
        assert re.search(rf"onebuild: info: calibrate part {part}: \d+ samples in", lines["dask"])


def steps_run(start: float, dask_scheduler=None) -> list[str]:
    """On the scheduler: the onebuild tasks that finished since `start`."""
    return [
        str(t.key)
        for t in dask_scheduler.transition_log
        if t.finish == "memory" and t.timestamp >= start and str(t.key).startswith("onebuild-")
    ]


def test_worker_killed_mid_step_still_builds_identical_packages(cluster, serial, tmp_path):
    client, address = cluster
    recipes = project(tmp_path / "p")
    command = [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes), "--json"]
    process = subprocess.Popen(
        [*command, "--executor", f"dask={address}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    output = {}
    reader = threading.Thread(
        target=lambda: output.update(zip(("out", "err"), process.communicate()))
    )
    reader.start()
    pids = client.run(os.getpid)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and process.poll() is None and time.monotonic() < deadline:
        for worker, keys in client.processing().items():
            if any(str(k).startswith("onebuild-") for k in keys):
                os.kill(pids[worker], signal.SIGKILL)
                killed = (worker, [str(k) for k in keys])
                break
        time.sleep(0.02)
    reader.join(600)
    assert killed is not None, "no step was seen running on a worker"
    assert process.returncode == 0, output.get("err")
    steps = json.loads(output["out"])["steps"]
    assert {s["status"] for s in steps} == {"run"} and len(steps) == 28
    assert packages(tmp_path / "p") == serial
    assert len(client.scheduler_info()["workers"]) == 1  # the killed worker stayed dead


def test_without_distributed_the_cli_says_how_to_install_it(tmp_path):
    recipes = project(tmp_path / "p")[:1]
    block = "import sys; sys.modules['distributed'] = None; sys.modules['dask'] = None; "
    run = "from onebuild.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", block + run, "build", str(recipes[0])]
    done = subprocess.run([*command, "--executor", "dask"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'onebuild[dask]'" in done.stderr
    done = subprocess.run(command, capture_output=True, text=True)  # the local executor
    assert done.returncode == 0, done.stderr


def test_executor_option_is_checked():
    assert parse_executor("local") is None
    assert parse_executor("dask") == ""
    assert parse_executor("dask=tcp://127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    for bad in ("dask=", "ray", "local=x"):
        with pytest.raises(UserError, match="expected local, dask or dask=SCHEDULER_ADDRESS"):
            parse_executor(bad)


def test_ctrl_c_on_a_local_cluster_stops_cleanly_and_the_next_build_completes(serial, tmp_path):
    """Ctrl-C reaches the whole process group (client and the LocalCluster's workers): one
    line, exit 130, no worker left behind; the next build completes with identical packages."""
    import psutil

    recipes = project(tmp_path / "p")
    command = [sys.executable, "-m", "onebuild.cli", "build", *map(str, recipes)]
    process = subprocess.Popen(
        [*command, "--executor", "dask", "-j", "2"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as a terminal's job: a test runner started in the background ignores SIGINT, which
        # its children would inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    children, lines = [], []
    for line in process.stderr:  # the first step run on a worker has finished
        lines.append(line)
        if " run in " in line:
            children = psutil.Process(process.pid).children(recursive=True)
            os.killpg(process.pid, signal.SIGINT)
            break
    rest = process.stderr.read()
    assert process.wait(120) == 130, "".join(lines) + rest
    assert rest.strip().splitlines()[-1] == "onebuild: interrupted" and "Traceback" not in rest
    assert len(children) >= 2  # the workers (and their nannies) ...
    psutil.wait_procs(children, timeout=30)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    statuses = build(recipes, "--executor", "dask", "-j", "2")
    assert "run" in statuses.values() and packages(tmp_path / "p") == serial


def _counting_step() -> list[dict]:
    """On a worker: ten samples' progress, as a step reports it."""
    from onebuild.engine.dask_executor import _forwarding
    from onebuild.progress import Progress, forward_to

    summaries = _forwarding()
    progress = Progress("demo", 10, "things")
    for done in range(1, 11):
        time.sleep(0.1)
        progress(done)
    progress.finish()
    forward_to(None)
    return summaries


def test_live_progress_of_a_step_on_a_worker_reaches_the_client():
    from distributed import Client, LocalCluster

    from onebuild.engine.dask_executor import TOPIC, _ClientProgress

    events = []

    class Recording(_ClientProgress):
        def event(self, event):
            events.append(event[1])
            super().event(event)

    options = {"n_workers": 1, "threads_per_worker": 1, "processes": False}
    with LocalCluster(dashboard_address=None, **options) as cluster, Client(cluster) as client:
        client.subscribe_topic(TOPIC, Recording().event)
        summaries = client.submit(_counting_step, pure=False).result()
        deadline = time.time() + 10
        while len(events) < 2 and time.time() < deadline:  # events travel on their own
            time.sleep(0.05)
    assert len(events) >= 2 and all(e["label"] == "demo" and not e["end"] for e in events)
    assert [e["done"] for e in events] == sorted(e["done"] for e in events)
    assert [(s["done"], s["total"], s["end"]) for s in summaries] == [(10, 10, True)]
