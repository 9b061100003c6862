"""The recipe commands of the CLI: build, status, dag, clean, list, schema, report, convert-cfg
(printing, exit codes); `onebuild.cli` parses the arguments and dispatches here."""

import contextlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

from .errors import UserError
from .plan import PLAN_FILE, load_plan, real_path


def cmd_convert_cfg(args) -> int:
    """A onecc .cfg as a recipe beside it (or at -o); replaces only a recipe it wrote itself
    and nobody edited since."""
    from .fileio import atomic_write_bytes, read_regular
    from .onecc_cfg import convert_cfg, unchanged_translation

    cfg = Path(args.cfg)
    target = Path(args.output) if args.output else cfg.with_suffix(".toml")
    if not target.parent.is_dir():
        raise UserError(
            f"{target}: folder {target.parent} does not exist; onebuild creates no folders: "
            "create it or choose another path"
        )
    if target.exists() or target.is_symlink():
        try:
            text = read_regular(target, 1 << 20).decode("utf-8", "replace")
        except (OSError, UserError):  # a FIFO, a device, a large file: not a translation
            text = ""
        if not unchanged_translation(text):
            raise UserError(
                f"{target}: exists and is not an unedited convert-cfg translation; choose -o PATH"
            )
    converted = convert_cfg(cfg, target)
    atomic_write_bytes(target, converted.text.encode())
    for note in converted.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{target}: build it with `onebuild build {target}`")
    return 0


def cmd_schema(args) -> int:
    from .recipe import json_schema  # pydantic

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_list(args) -> int:
    plans = _plans(args)
    if args.json:
        listing = [
            {"recipe": str(p.recipe), "build_dir": str(p.build_dir), "steps": p.steps}
            for p in plans
        ]
        print(json.dumps(listing, indent=2, sort_keys=True))
        return 0
    for plan in plans:
        print(f"{plan.recipe} (build dir {plan.build_dir})")
        for step, config in plan.steps.items():
            options = ", ".join(
                f"{k}={v!r}" for k, v in sorted(config.items()) if v not in (None, [], {})
            )
            print(f"  {step:<10} {options}")
    return 0


def cmd_build(args) -> int:
    from .engine.dag import build
    from .engine.dask_executor import DaskExecutor, parse_executor

    address, plans = parse_executor(args.executor), _plans(args)
    if any(plan.report for plan in plans):
        from .report.figure import pyplot

        pyplot()  # a missing matplotlib is said before the build, not after it
    executor = None if address is None else DaskExecutor(address, args.jobs)
    streams = sys.stdout, sys.stderr
    try:
        results = build(plans, jobs=args.jobs, executor=executor, wait=args.wait)
    finally:
        if executor is not None:  # on Ctrl-C: doit's threads, cut short, may swap the streams
            executor.close()
            sys.stdout, sys.stderr = streams
    reports = [str(_report(plan, results)) for plan in plans if plan.report]
    packed = [r.outputs for r in results if r.step == "pack" and r.status != "failed"]
    packages = sorted({outputs[0] for outputs in packed})
    archives = sorted({outputs[1] for outputs in packed if len(outputs) > 1})  # pack.archive
    failed = [r for r in results if r.status == "failed"]
    causes = [result for result in failed if not result.blocked]
    code = 0 if not failed else 2 if causes and all(r.user_error for r in causes) else 1
    if args.json:
        steps = [
            {
                "recipe": r.recipe,
                "step": r.step,
                "part": r.part,
                "status": r.status,
                "seconds": round(r.seconds, 4),
                "outputs": r.outputs,
                "error": r.error,
                "warnings": r.warnings,
            }
            for r in results
        ]
        document = {
            "steps": steps,
            "packages": packages,
            **({"reports": reports} if reports else {}),
            **({"archives": archives} if archives else {}),
            "counts": dict(Counter("not run" if r.blocked else r.status for r in results)),
            "exit_code": code,  # 2: bad input, 1: other failure
        }
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        counts = Counter(r.status for r in results)
        summary = f"{counts['run']} step(s) run, {counts['up-to-date']} up to date"
        if counts["restored"]:
            summary += f", {counts['restored']} restored from the step cache"
        blocked = sum(r.blocked for r in failed)
        if len(failed) > blocked:
            summary += f", {len(failed) - blocked} failed"
        if blocked:
            summary += f", {blocked} not run (after a failed step)"
        print(summary)
        for package in packages:
            print(f"package: {package}")
        for archive in archives:
            print(f"archive: {archive}")
        for report in reports:
            print(f"report: {report}")
    for result in causes:
        where = f"{result.step} {result.part}".strip()  # a fan-out names its part
        print(f"onebuild: error: {result.recipe} [{where}]: {result.error}", file=sys.stderr)
    return code  # 2: bad input, 1: other failure


def _report(plan, results=None, overrides=()) -> Path:
    from .report import write_report  # matplotlib

    return write_report(plan, results, overrides)


def cmd_report(args) -> int:
    from .engine.build_folder import locked

    for plan in _plans(args):
        if not plan.build_dir.is_dir():
            raise UserError(f"{plan.recipe}: not built yet; run 'onebuild build {plan.recipe}'")
        with locked(plan.build_dir, plan.recipe):  # not while a build changes what it reads
            print(_report(plan, overrides=args.set or []))
    return 0


def _plans(args):
    """The recipes' plans, each recipe file once however often it is named."""
    unique: dict[Path, str] = {}
    for path in args.recipes:
        unique.setdefault(real_path(path), path)
    return [load_plan(path, args.set or []) for path in unique.values()]


def cmd_status(args) -> int:
    from .engine.status import status

    results = status(_plans(args))
    stale = any(r.status != "up-to-date" for r in results)
    code = 1 if args.check and stale else 0  # --check: CI's "out of date"
    if args.json:
        steps = [vars(r) for r in results]
        packages = sorted({r.outputs[0] for r in results if r.step == "pack" and r.outputs})
        document = {"steps": steps, "packages": packages, "up_to_date": not stale}
        print(json.dumps({**document, "exit_code": code}, indent=2, sort_keys=True))
        return code
    for r in results:
        why = f": {'; '.join(r.reasons)}" if r.reasons else ""
        print(f"{Path(r.recipe).name} [{f'{r.step} {r.part}'.strip()}] {r.status}{why}")
    return code


def cmd_dag(args) -> int:
    from .engine.tasks_plan import FanOut, known_tasks

    tasks = [t for plan in _plans(args) for t in known_tasks(plan)]
    made_by = {o: t for t in tasks if not isinstance(t, FanOut) for o in t.outputs}

    def producer(source: Path):
        """The task whose output is `source` or a folder holding it (a partition's parts)."""
        return next((made_by[p] for p in (source, *source.parents) if p in made_by), None)

    if args.dot:
        print("digraph onebuild {\n  rankdir=LR;")
        for t in tasks:
            print(f'  "{t.name}" [label="{t.recipe.stem}\\n{_title(t)}"];')
            if isinstance(t, FanOut):
                print(f'  "{t.after}" -> "{t.name}";')
                continue
            for source in t.inputs:
                parent = producer(source)
                origin = parent.name if parent else source.name
                if not parent:
                    print(f'  "{origin}" [shape=note];')
                print(f'  "{origin}" -> "{t.name}";')
        print("}")
        return 0
    for t in tasks:
        if isinstance(t, FanOut):
            if t.outputs:  # the pack: its package is known, its parts not yet
                made, sources = ", ".join(map(str, t.outputs)), "partition, codegen"
            else:
                made, sources = "one task per NPU part, known once partition has run", "partition"
            print(f"{t.recipe.name} [{t.step}] <- {sources} -> {made}")
            continue
        sources = list(dict.fromkeys(producer(s).step if producer(s) else str(s) for s in t.inputs))
        outputs = ", ".join(map(str, t.outputs))
        print(f"{t.recipe.name} [{_title(t)}] <- {', '.join(sources)} -> {outputs}")
    return 0


def _title(task) -> str:
    """A task's step, with the partition it works on for fan-out tasks."""
    return f"{task.step} {getattr(task, 'label', '')}".strip()


def cmd_clean(args) -> int:
    from .engine.build_folder import locked
    from .engine.dag import DB_NAME
    from .engine.ownership import STALE_PLAN_SECONDS, refuse_foreign, remove, sweep
    from .engine.tasks_plan import StepTask, known_tasks

    for plan in _plans(args):
        tasks = [t for t in known_tasks(plan) if isinstance(t, StepTask)]
        for task in tasks:
            refuse_foreign(task.outputs, f"{plan.recipe}: [{task.step}]", "remove")
        if not plan.build_dir.is_dir():
            print(f"cleaned {plan.recipe.name} (nothing was built)")
            continue
        with locked(plan.build_dir, plan.recipe):
            tasks = [t for t in known_tasks(plan) if isinstance(t, StepTask)]
            for task in tasks:
                refuse_foreign(task.outputs, f"{plan.recipe}: [{task.step}]", "remove")
            for task in tasks:
                remove(task.outputs)
            folders = {p.parent for t in tasks for p in t.outputs if plan.build_dir in p.parents}
            for folder in sorted(folders - {plan.build_dir}, reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # the folders steps wrote into (codegen/), when empty
            (plan.build_dir / PLAN_FILE).unlink(missing_ok=True)
            (plan.build_dir / DB_NAME).unlink(missing_ok=True)
            sweep([plan.build_dir / DB_NAME])
            sweep([plan.build_dir / PLAN_FILE], older_than=STALE_PLAN_SECONDS)
            if args.cache and plan.cache_dir is None:
                shutil.rmtree(plan.build_dir / "cache", ignore_errors=True)
        print(f"cleaned {plan.recipe.name}")
        shared = plan.cache_dir or plan.cache_url
        if args.cache and shared:
            print(f"kept the shared step cache {shared} (build.cache): trim it with `cache gc`")
    return 0


def cmd_cache_gc(args) -> int:
    from .engine.cache_gc import collect, parse_size

    result = collect(args.cache, parse_size(args.max_size))
    if args.json:
        print(json.dumps(vars(result), sort_keys=True))
    else:
        print(
            f"{result.removed} entr(ies) removed ({result.freed} bytes), "
            f"{result.kept} kept ({result.size} bytes)"
        )
    return 0
