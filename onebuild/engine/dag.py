"""Step tasks (`tasks_plan`) -> a doit task DAG, run with caching.

Each step task becomes a doit task with explicit `file_dep` and `targets` and a `config_changed`
check over the step's normalized config plus the digest of its code; fan-outs become doit's
delayed tasks, created once the partition has run. The file checker
(`step_cache.ContentChecker`) compares contents, so a step whose output comes out byte-identical
stops the cascade: downstream steps see an unchanged dependency and stay up to date.

The task database is doit's sqlite3 backend in the first recipe's build folder: dbm (doit's
default) corrupts when two processes touch it, sqlite3 locks and stays consistent.
"""

import io
import json
import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskFailed, UnmetDependency
from doit.task import DelayedLoader, Task, dict_to_task
from doit.tools import config_changed

from ..errors import OneBuildError, UserError
from ..fileio import atomic_write_bytes
from ..plan import PLAN_FILE, Plan, real_path
from ..tasks import STEPS
from . import step_warnings
from .build_folder import check_database, locked, os_error_line, raise_doit_error
from .ownership import (
    STALE_PLAN_SECONDS,
    claim,
    claim_in_place,
    finished_key,
    folder_files,
    log_path,
    logged_key,
    made_by,
    outputs_intact,
    refuse_foreign,
    sweep,
)
from .step_cache import ContentChecker, fingerprint, open_cache, tree_digest
from .tasks_plan import FanOut, StepTask, known_tasks, plan_tasks, task_key

log = logging.getLogger("onebuild")

DB_NAME = "tasks.sqlite3"


@dataclass
class StepResult:
    recipe: str
    step: str
    status: str = "not run"
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)
    error: str | None = None
    blocked: bool = False  # failed because a step it depends on failed
    user_error: bool = False  # failed on bad input (a file, a model, an option), not a bug
    part: str = ""  # the partition a fan-out task works on
    warnings: list[str] = field(default_factory=list)  # this run's, or the run that made it


class _Runner:
    """Executes steps inside doit and records what happened to each."""

    def __init__(self, tasks: list[StepTask | FanOut], progress):
        self.tasks: dict[str, StepTask] = {}
        self.results: dict[str, StepResult] = {}
        self.fan_outs = [t for t in tasks if isinstance(t, FanOut)]
        for task in tasks:
            if isinstance(task, StepTask):
                self.register(task)
        self.progress = progress
        self.runtime_errors: list[str] = []
        self.execute = None  # an executor's run(step name, config, inputs, outputs)

    def register(self, task: StepTask) -> None:
        self.tasks[task.name] = task
        outputs = [str(p) for p in task.outputs]
        self.results[task.name] = StepResult(
            str(task.recipe), task.step, outputs=outputs, part=task.label
        )

    def action(self, task: StepTask):
        where = f"{task.step} {task.label}".strip()

        def execute():
            result = self.results[task.name]
            start = time.perf_counter()
            step = STEPS[task.step]
            try:
                cache = open_cache(task.cache, task.remote)
                digests = [tree_digest(p) for p in task.inputs]
                key = task_key(task, digests)
                if _done_with(task, key):  # doit's database lacked it (another recipe's folder)
                    result.status = "up-to-date"
                    result.warnings = step_warnings.logged(task.outputs)
                    step_warnings.replay(result.warnings)
                    self.publish(task, key, result.warnings)
                    return True
                refuse_foreign(task.outputs, "", "replace")
                other = made_by(task.outputs)
                if other not in (None, str(task.recipe)):
                    log.warning(
                        "%s: [%s] replaces %s, which %s made (give each recipe its own output "
                        "path, or they replace each other's on every build)",
                        task.recipe,
                        where,
                        task.outputs[0],
                        other,
                    )
                claim(task.outputs, task.step)
                if cache.restore(key, task.outputs):
                    result.status = "restored"
                    result.warnings = cache.warnings(key)
                    step_warnings.replay(result.warnings)
                else:
                    self.progress(f"[{where}] {task.recipe.name}: running")
                    run = partial(self.execute, task.step) if self.execute else step.run
                    with step_warnings.recorded() as result.warnings:
                        run(task.config, task.inputs, task.outputs)
                    claim_in_place(task.outputs)
                    cache.store(key, task.outputs, result.warnings)
                    result.status = "run"
            except OneBuildError as error:
                result.status, result.error = "failed", str(error)
                result.user_error = isinstance(error, UserError)
                return TaskFailed(str(error))
            except OSError as error:
                result.status, result.error = "failed", os_error_line(error, task.outputs[0])
                result.user_error = bool(error.filename)
                return TaskFailed(result.error)
            except Exception as error:  # a bug: keep the type in the one-line report
                result.status, result.error = "failed", f"{type(error).__name__}: {error}"
                return TaskFailed(result.error)
            result.seconds = time.perf_counter() - start
            self._write_log(task, result, key, digests)
            self.progress(f"[{where}] {task.recipe.name}: {result.status} in {result.seconds:.2f}s")
            return True

        return execute

    def publish(self, task: StepTask, key: str | None, warnings: list[str] = ()) -> None:
        """Store an up-to-date step's outputs, made with cache key `key`, in a cache that lacks
        them (a cache set after the step ran, or cleaned since): other clones restore them."""
        if key is None:
            return
        try:
            open_cache(task.cache, task.remote).ensure(key, task.outputs, warnings)
        except OSError as error:  # the cache only saves time: a read-only or full one warns
            log.warning("step cache %s: [%s] not stored (%s)", task.cache, task.step, error)

    def _write_log(
        self, task: StepTask, result: StepResult, key: str, input_digests: list[str]
    ) -> None:
        log = {
            "status": result.status,
            "cache_key": key,
            "step": task.step,
            "code": STEPS[task.step].code(task.config),
            "recipe": str(task.recipe),
            "config": task.config,
            "inputs": {str(p): d for p, d in zip(task.inputs, input_digests)},
            "outputs": {str(p): tree_digest(p) for p in task.outputs},
            "fingerprints": {str(p): fingerprint(p) for p in task.outputs},
            "files": {str(p): folder_files(p) for p in task.outputs if p.is_dir()},
            "seconds": round(result.seconds, 4),
            "warnings": result.warnings,
        }
        text = json.dumps(log, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(log_path(task.outputs), text.encode())

    def delayed_task(self, fan_out: FanOut) -> Task:
        """A placeholder that doit expands into the fan-out's tasks once `after` has run."""

        def create():
            tasks = fan_out.expand() or []
            for task in tasks:
                self.register(task)
            if len(tasks) == 1 and not tasks[0].label:
                return {k: v for k, v in self.task_dict(tasks[0]).items() if k != "name"}
            return ({**self.task_dict(t), "name": t.label} for t in tasks)

        return Task(fan_out.name, None, loader=DelayedLoader(create, executed=fan_out.after))

    def task_dict(self, task: StepTask) -> dict:
        deps = [*task.inputs, *task.after]
        folders = {str(p): _folder_files(p) for p in deps if p.is_dir()}
        files = [str(f) for p in deps for f in folders.get(str(p), [p])]
        listing = {k: [f.name for f in v] for k, v in folders.items()}  # catches removed files
        code = STEPS[task.step].code(task.config)
        check = {"config": task.config, "code": code, "folders": listing}
        return {
            "name": task.name,
            "actions": [(self.action(task),)],
            "file_dep": files,
            "targets": [str(p) for p in task.targets],
            "uptodate": [
                config_changed(json.dumps(check, sort_keys=True)),
                (outputs_intact, (task.outputs, task.recipe), {"refresh": True}),
            ],
            "verbosity": 0,
        }


def _done_with(task: StepTask, key: str) -> bool:
    """Whether the step's log says it finished with cache key `key` and its outputs are as it
    left them: nothing to do, even where doit's database has no record of the task (a build of
    several recipes keeps its state in the first one's folder)."""
    return finished_key(task.outputs, task.recipe) == key


def _folder_files(folder: Path) -> list[Path]:
    """The files of a data folder input (doit tracks files, not folders)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


class _Loader(TaskLoader2):
    def __init__(self, runner: _Runner, db: Path, reporter):
        super().__init__()
        self.runner, self.db, self.reporter = runner, db, reporter

    def load_doit_config(self):
        return {
            "dep_file": str(self.db),
            "backend": "sqlite3",
            "reporter": self.reporter,
            "check_file_uptodate": ContentChecker,
        }

    def load_tasks(self, cmd, pos_args):
        tasks = [dict_to_task(self.runner.task_dict(t)) for t in self.runner.tasks.values()]
        return tasks + [self.runner.delayed_task(f) for f in self.runner.fan_outs]


def _reporter_class(runner: _Runner):
    class Reporter:
        def __init__(self, outstream, options):
            self.errors: list[str] = []

        def initialize(self, tasks, selected_tasks):
            pass

        def get_status(self, task):
            pass

        def execute_task(self, task):
            pass

        def add_failure(self, task, fail):
            result = runner.results.get(task.name)
            if result is not None:
                result.status = "failed"
                if isinstance(fail, UnmetDependency):
                    result.blocked = True
                    result.error = "not run: a step it depends on failed"
                result.error = result.error or fail.get_msg().strip().splitlines()[-1]

        def add_success(self, task):
            pass

        def skip_uptodate(self, task):
            result = runner.results.get(task.name)
            if result is not None:
                result.status = "up-to-date"
                outputs = runner.tasks[task.name].outputs  # intact: doit's uptodate checked
                result.warnings = step_warnings.logged(outputs)
                step_warnings.replay(result.warnings)
                runner.publish(runner.tasks[task.name], logged_key(outputs), result.warnings)

        def skip_ignore(self, task):
            pass

        def cleanup_error(self, exception):
            self.errors.append(exception.get_msg())

        def runtime_error(self, msg):
            runner.runtime_errors.append(msg.strip())

        def teardown_task(self, task):
            pass

        def complete_run(self):
            pass

    return Reporter


def build(
    plans: list[Plan], jobs: int = 1, progress=None, executor=None, wait: bool = False
) -> list[StepResult]:
    """Build every recipe's steps in one DAG; returns one result per step. `executor` (with
    `run` and `slots`, e.g. `DaskExecutor`) runs the steps that must run, `slots` at once;
    `wait`: wait for another build of the same build folder instead of stopping."""
    stdout, stderr = sys.stdout, sys.stderr
    progress = progress or (lambda message: print(message, file=stderr, flush=True))
    tasks = [t for plan in plans for t in plan_tasks(plan)]
    _check_outputs(tasks)
    runner = _Runner(tasks, progress)
    if executor is not None:
        runner.execute, jobs = executor.run, executor.slots
    db = plans[0].build_dir / DB_NAME
    with ExitStack() as stack:
        for folder, recipe in sorted({p.build_dir: p.recipe for p in plans}.items()):
            stack.enter_context(locked(folder, recipe, progress if wait else None))
        steps = [t for plan in plans for t in known_tasks(plan) if isinstance(t, StepTask)]
        for task in steps:  # files inside an output folder matter only to a step that runs
            refuse_foreign(task.outputs, f"{task.recipe}: [{task.step}]", "replace", inside=False)
        sweep([p for task in steps for p in task.outputs])
        sweep([p.build_dir / DB_NAME for p in plans])
        sweep([p.build_dir / PLAN_FILE for p in plans], older_than=STALE_PLAN_SECONDS)
        check_database(db, progress)
        loader = _Loader(runner, db, _reporter_class(runner))
        args = ["run", "--continue"]
        if jobs > 1:
            args += ["-n", str(jobs), "-P", "thread"]
        doit_errors = io.StringIO()  # doit prints its own failures (a traceback) to stderr
        sys.stderr = doit_errors
        try:
            code = DoitMain(loader, config_filenames=()).run(args)
        finally:  # doit's thread runner swaps the process streams and leaves them swapped
            sys.stdout, sys.stderr = stdout, stderr
    if runner.runtime_errors:
        raise OneBuildError("build error: " + " ".join(runner.runtime_errors))
    raise_doit_error(doit_errors.getvalue(), db)
    results = list(runner.results.values())
    if code != 0 and not any(r.status == "failed" for r in results):
        raise OneBuildError(f"build error: doit exited with code {code}")
    return results


def _check_outputs(tasks: list[StepTask | FanOut]) -> None:
    """No step may write a file another step or the user provides as input."""
    written = {}
    for task in (t for t in tasks if isinstance(t, StepTask)):
        for path in task.outputs:
            key = real_path(path)
            if key in written:
                raise UserError(
                    f"{task.recipe}: {task.step} writes {path}, which {written[key]} also writes"
                )
            written[key] = f"{task.recipe.name} [{task.step}]"
