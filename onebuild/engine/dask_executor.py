"""`build --executor dask[=ADDRESS]`: doit decides what is out of date; the steps that must run go
to Dask workers (`distributed`, the optional extra `dask`).

No shared filesystem is needed: a step's input files travel with the task (tar bytes), the
worker runs the step in a private temporary folder that mirrors their absolute paths (so the
step's config, which names the same paths, and files that refer to each other stay valid) and
sends back its outputs, which the client puts in place atomically. Progress lines of a step on
a worker are drawn on the client's terminal (live updates as Dask events, the summary lines with
the result), and its warnings are logged there with the result. A worker killed mid-step leaves
nothing behind: the scheduler runs the task again on another worker. Cache restores stay on the
client (the step cache, local or remote, is consulted before a step is submitted).
"""

import contextlib
import io
import logging
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import uuid
from importlib import import_module
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import OneBuildError, UserError
from ..progress import Progress, forward_to, summary
from ..tasks import STEPS
from .step_cache import put_in_place
from .step_warnings import recorded

INSTALL = "pip install 'onebuild[dask]'"
log = logging.getLogger("onebuild")
TOPIC = "onebuild-progress"  # the Dask event topic of steps' live progress


def parse_executor(text: str) -> str | None:
    """`local` -> None; `dask` -> "" (a LocalCluster); `dask=ADDRESS` -> ADDRESS."""
    kind, sep, address = text.partition("=")
    if kind == "local" and not sep:
        return None
    if kind != "dask" or (sep and not address):
        raise UserError(f"--executor '{text}': expected local, dask or dask=SCHEDULER_ADDRESS")
    return address


class DaskExecutor:
    """Runs steps on a Dask cluster: an existing scheduler at `address`, else a LocalCluster of
    `workers` single-threaded worker processes on loopback, started when a step must run."""

    def __init__(self, address: str, workers: int):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise UserError(f"--executor dask needs Dask's distributed: {INSTALL}") from None
        self.address, self.workers, self.cluster, self.client = address, workers, None, None
        self.progress = _ClientProgress()
        self._classes, self._lock = (Client, LocalCluster), threading.Lock()
        self.slots = workers
        if address:
            self.slots = max(1, sum(self._connect().nthreads().values()))

    def _connect(self):
        Client, LocalCluster = self._classes
        with self._lock:
            if self.client is not None:
                return self.client
            try:
                if self.address:
                    self.client = Client(self.address, timeout="20s")
                else:
                    self.cluster = LocalCluster(
                        n_workers=self.workers,
                        threads_per_worker=1,
                        processes=True,
                        host="127.0.0.1",
                        dashboard_address=None,
                        silence_logs=logging.ERROR,  # a stop's warnings are expected
                        preload=[__name__],  # dask_setup below
                    )
                    self.client = Client(self.cluster)
                self.client.subscribe_topic(TOPIC, self.progress.event)
            except OSError as error:
                where = f"dask={self.address}" if self.address else "dask"
                raise UserError(f"--executor {where}: cannot start or reach ({error})") from None
            return self.client

    def run(self, step: str, config: dict, inputs: list[Path], outputs: list[Path]) -> None:
        """Run one step on a worker and put its outputs in place (those it wrote before
        failing too, as a local run leaves them: an accuracy report)."""
        shipped = {str(p): pack_tree(p) for p in dict.fromkeys(inputs)}
        module = import_module(STEPS[step].module)
        count = module.shards(config, self.slots) if hasattr(module, "run_shard") else 1
        if count > 1:
            self._run_sharded(step, module, config, shipped, outputs, count)
            return
        key = f"onebuild-{step}-{uuid.uuid4().hex}"
        future = self._connect().submit(
            run_step, step, config, shipped, [str(p) for p in outputs], key=key, pure=False
        )
        summaries = []
        try:
            blobs, error, summaries, warnings = future.result()
        finally:
            future.release()
            self.progress.finished(key, summaries)  # a failed task's live line closes too
        _say(warnings)
        for output, blob in zip(outputs, blobs):
            if blob is not None:
                put_in_place(output, lambda target, blob=blob: unpack_tree(blob, target))
        if error is not None:
            raise _rebuilt(error)

    def _run_sharded(self, step, module, config, shipped, outputs, count: int) -> None:
        """A step that splits (calibration): its parts on the workers, merged here."""
        client, name = self._connect(), uuid.uuid4().hex
        # Inputs travel with each part, not scattered: a killed worker's part can run elsewhere.
        futures = [
            client.submit(
                run_shard, step, config, shipped, i, count, key=f"onebuild-{step}-{i}-{name}"
            )
            for i in range(count)
        ]
        parts = []
        try:
            parts = client.gather(futures)
        finally:
            client.cancel(futures)
            for future, part in zip(futures, parts or [(None, None, [], [])] * count):
                self.progress.finished(future.key, part[2])
        for part in parts:
            _say(part[3])
        failures = [part[1] for part in parts if part[1] is not None]
        if failures:
            raise _rebuilt(failures[0])
        module.merge(config, [part[0] for part in parts], outputs)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a cluster that lost workers
            if self.client is not None:
                self.client.close()
            if self.cluster is not None:
                self.cluster.close()


class _ClientProgress:
    """The client's lines for the progress that steps on the workers forward: one live line per
    running task, and each task's summary lines once its result is in (late events dropped)."""

    def __init__(self) -> None:
        self.live: dict[str, Progress] = {}
        self.over: set[str] = set()
        self.lock = threading.Lock()

    def event(self, event: tuple[float, dict]) -> None:
        """A live update, as `Client.subscribe_topic` delivers it."""
        message = event[1]
        with self.lock:
            if message["task"] in self.over:
                return
            line = self.live.get(message["task"])
            if line is None or line.label != message["label"]:
                if line is not None:
                    line.bar.close()
                line = Progress(message["label"], message["total"], message["unit"])
                self.live[message["task"]] = line
            line(message["done"])

    def finished(self, task: str, summaries: list[dict]) -> None:
        with self.lock:
            self.over.add(task)
            line = self.live.pop(task, None)
            if line is not None:
                line.bar.close()
        for event in summaries:
            summary(event["label"], event["done"], event["unit"], event["seconds"])


def _forwarding() -> list[dict]:
    """On a worker: this task's progress goes to the client (live updates as events); returns
    the list its summaries are collected in, to travel back with the result."""
    from distributed import get_worker

    worker, summaries = get_worker(), []
    task = str(worker.get_current_task())

    def sink(event: dict) -> None:
        if event["end"]:
            summaries.append(event)
        else:
            worker.log_event(TOPIC, {**event, "task": task})

    forward_to(sink)
    return summaries


def dask_setup(worker) -> None:
    """Preload of the LocalCluster's workers: Ctrl-C reaches the whole process group, but it
    is the client's to handle (it closes the cluster), so the workers ignore SIGINT."""
    with contextlib.suppress(ValueError):  # not the main thread: nothing to change
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _on_worker(prefix: str, inputs: dict[str, bytes]):
    """A task's private root holding its input files at the client's paths, with its progress
    going to the client; yields (root, the progress summaries list); removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        summaries = _forwarding()
        for path, blob in inputs.items():
            unpack_tree(blob, _inside(root, path))
        yield root, summaries
    finally:
        forward_to(None)
        shutil.rmtree(root, ignore_errors=True)


def run_step(
    step: str, config: dict, inputs: dict[str, bytes], outputs: list[str]
) -> tuple[list[bytes | None], tuple[str, str] | None, list[dict], list[str]]:
    """On a worker: the step in a private root that mirrors the client's paths; returns the
    outputs it wrote, its error message (naming the client's paths) if it failed, its progress
    summaries and the warnings it logged."""
    with _on_worker("onebuild-step-", inputs) as (root, summaries), recorded() as warnings:
        local = [_inside(root, p) for p in outputs]
        for path in local:
            path.parent.mkdir(parents=True, exist_ok=True)
        error = None
        try:
            STEPS[step].run(_relocated(config, root), [_inside(root, p) for p in inputs], local)
        except OneBuildError as failure:
            error = _shipped(failure, root)
        blobs = [pack_tree(p) if p.exists() else None for p in local]
        return blobs, error, summaries, _unrooted(warnings, root)


def run_shard(
    step: str, config: dict, inputs: dict[str, bytes], index: int, count: int
) -> tuple[Any, tuple[str, str] | None, list[dict], list[str]]:
    """On a worker: part `index` of `count` of a step that splits; (part, error message,
    progress summaries, warnings)."""
    module = import_module(STEPS[step].module)
    with _on_worker("onebuild-shard-", inputs) as (root, summaries), recorded() as warnings:
        local = [_inside(root, p) for p in inputs]
        part, error = None, None
        try:
            part = module.run_shard(_relocated(config, root), local, index, count)
        except OneBuildError as failure:
            error = _shipped(failure, root)
        return part, error, summaries, _unrooted(warnings, root)


def _unrooted(warnings: list[str], root: Path) -> list[str]:
    """A worker's warnings naming the client's paths."""
    return [message.replace(str(root), "") for message in warnings]


def _say(warnings: list[str]) -> None:
    """Log a worker's warnings on the client, where the step's recorder hears them."""
    for message in warnings:
        log.warning("%s", message)


def _shipped(failure: OneBuildError, root: Path) -> tuple[str, str]:
    """A worker's error for the client: its class name and its message with client paths."""
    return type(failure).__name__, str(failure).replace(str(root), "")


def _rebuilt(error: tuple[str, str]) -> OneBuildError:
    """The worker's error as the client raises it: of the same class (so the same exit code),
    with the worker's message."""
    name, message = error
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, OneBuildError)):
        kind = UserError
    rebuilt = kind.__new__(kind)
    OneBuildError.__init__(rebuilt, message)
    return rebuilt


def _inside(root: Path, path: str | os.PathLike) -> Path:
    return root / Path(path).relative_to("/")


def _relocated(value: Any, root: Path) -> Any:
    """The config with every absolute path moved under `root`."""
    if isinstance(value, dict):
        return {k: _relocated(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, root) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return str(_inside(root, value))
    return value


def pack_tree(path: Path) -> bytes:
    """A file or folder as tar bytes (member `x`)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(path, "x")
    return buffer.getvalue()


def unpack_tree(blob: bytes, target: Path) -> None:
    """Write what `pack_tree` packed at `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
            archive.extractall(staging, filter="data")
        os.replace(Path(staging) / "x", target)
