"""The command line: parsing and dispatch (printing in cli_models.py, cli_recipes.py and here,
the only modules that print); user errors exit with code 2, no traceback."""

import argparse
import errno
import json
import logging
import os
import sys
from collections.abc import Sequence

from . import __version__
from .cli_device import ODC_QUANTIZE
from .cli_models import cmd_export, cmd_import, cmd_inspect, cmd_run, cmd_targets, cmd_verify
from .cli_recipes import (
    cmd_build,
    cmd_cache_gc,
    cmd_clean,
    cmd_convert_cfg,
    cmd_dag,
    cmd_list,
    cmd_report,
    cmd_schema,
    cmd_status,
)
from .errors import OneBuildError, UserError
from .odc import PREFS
from .plan import MAX_DIM

log = logging.getLogger("onebuild")


def _shape_option(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not NAME=D0,D1,... (e.g. input=1,3,224,224)"
        ) from None
    if not all(1 <= d <= MAX_DIM for d in shape):
        raise argparse.ArgumentTypeError(f"'{text}': every dim must be 1 to {MAX_DIM}")
    return name, shape


def _jobs_option(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= 1024:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of parallel steps (1-1024)")
    return jobs


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes as one line, like every other user error (exit code 2)."""

    def error(self, message: str):
        command = self.prog.removeprefix("onebuild").strip()  # the subcommand, if any
        where = f"{command}: " if command else ""
        raise UserError(f"{where}{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onebuild",
        description="onecc-style compiler driver: TOML recipes build ONNX, circle or tflite "
        "models into quantized, partitioned, NPU-compiled nnpackages (cached, incremental); "
        "model commands run, inspect, export and compare models. Exit codes: 0 done, 1 a "
        "build step failed, 2 bad input (one line, no traceback).",
    )
    parser.add_argument("--version", action="version", version=f"onebuild {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def shape_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--input-shape",
            action="append",
            type=_shape_option,
            metavar="NAME=DIMS",
            help="fix the dims of an ONNX input, e.g. input=1,3,224,224 (repeatable)",
        )

    def model_command(name: str, help_text: str):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "model", help="ONNX, circle, tflite or IR model (run, inspect: binary, nnpackage too)"
        )
        shape_option(p)
        return p

    p = model_command("run", "run a model on a batch of inputs")
    p.add_argument("-i", "--inputs", required=True, help="npz: one [N,*shape] array per input")
    p.add_argument("-o", "--outputs", required=True, help="npz written with one array per output")
    p.add_argument(
        "--raw",
        action="store_true",
        help="pass quantized inputs/outputs as stored (default: float, converted)",
    )
    odc = p.add_argument_group("on-device compilation (as onert_run)")
    odc.add_argument("--quantize", choices=sorted(ODC_QUANTIZE), help="quantize on the device")
    odc.add_argument("--qpath", help="where the quantized model goes (default: the workspace)")
    odc.add_argument(
        "--minmax-runs",
        type=int,
        help="recorded runs before quantizing (default: a package's ODC_MINMAX_RECORDS, else 10)",
    )
    odc.add_argument("--codegen", metavar="TARGET", help="compile the quantized model (trix_sim)")
    odc.add_argument("--cpath", help="where the binary goes (default: the workspace)")
    odc.add_argument(
        "--pref", choices=PREFS, help="codegen preference (default: a package's, else performance)"
    )
    odc.add_argument(
        "--hw", help="hardware preset of the target (default: a package's, else the target's)"
    )
    odc.add_argument(
        "--auto-compile",
        action="store_true",
        help="run every sample with auto-compilation: record, quantize, compile, switch",
    )
    odc.add_argument("--min-sqnr-db", type=float, help="accuracy gate of --auto-compile")
    odc.add_argument("--workspace", help="session workspace (default: MODEL.odc beside it)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("verify", help="compare an nnpackage with its float reference model")
    p.add_argument("package", help="nnpackage folder or zip")
    p.add_argument("--reference", required=True, help="the float model (.onnx or IR file)")
    shape_option(p)  # the reference's
    p.add_argument("-i", "--inputs", required=True, help="npz: one [N,*shape] array per input")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_verify)

    p = model_command(
        "export", "write a model (any build stage) as ONNX (quantized as QDQ), .circle or .tflite"
    )
    p.add_argument("-o", "--output", required=True, help="file to write: .onnx, .circle, .tflite")
    p.set_defaults(func=cmd_export)

    p = model_command("inspect", "print inputs, outputs, op histogram and parameter count")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = model_command(
        "import", "import an ONNX, circle or tflite model (optionally optimized) into IR"
    )
    p.add_argument("-o", "--output", required=True, help="IR file to write")
    p.add_argument(
        "-O",
        "--optimize",
        default="O1",
        help="optimization preset (default O1)",
    )
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("convert-cfg", help="translate a onecc .cfg into a recipe")
    p.add_argument("cfg", help="the onecc configuration (INI) file")
    p.add_argument("-o", "--output", help="recipe to write (default: the .cfg's name, .toml)")
    p.set_defaults(func=cmd_convert_cfg)

    p = sub.add_parser("schema", help="print the JSON Schema of recipes")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("targets", help="targets, hardware presets and supported-op constraints")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_targets)

    def recipe_command(name: str, help_text: str, func, json_flag: bool = True):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("recipes", nargs="+", help="recipe TOML files (one DAG)")
        p.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a recipe key, e.g. quantize.dtype=int16 (repeatable)",
        )
        if json_flag:
            p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=func)
        return p

    p = recipe_command("build", "build recipes (only what changed reruns)", cmd_build)
    p.add_argument("-j", "--jobs", type=_jobs_option, default=1, help="run up to N steps at once")
    p.add_argument(
        "--executor",
        default="local",
        metavar="local|dask[=ADDRESS]",
        help="run steps on Dask workers: a local cluster of -j worker processes, or the "
        "scheduler at ADDRESS (needs onebuild[dask])",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for another build of the same build folder to finish (default: stop)",
    )
    p = recipe_command("status", "what a build would rerun, and why", cmd_status)
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when the build would run or restore any step (0: all up to date)",
    )
    recipe_command("list", "validate recipes and list the steps they enable", cmd_list)
    p = recipe_command("dag", "print the step graph", cmd_dag, json_flag=False)
    p.add_argument("--dot", action="store_true", help="Graphviz dot output")
    p = recipe_command("clean", "remove artifacts, logs and task state", cmd_clean, False)
    p.add_argument(
        "--cache",
        action="store_true",
        help="also empty the build folder's step cache (a shared build.cache is kept: cache gc)",
    )
    recipe_command("report", "write the HTML build report (report.html)", cmd_report, False)

    cache = sub.add_parser("cache", help="manage a step cache")
    cache = cache.add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = cache.add_parser("gc", help="evict least recently used entries down to a size")
    p.add_argument("cache", help="the cache: a folder or an fsspec URL (build.cache)")
    p.add_argument("--max-size", required=True, help="size to keep, e.g. 500M or 2G")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_cache_gc)
    return parser


class _LowercaseLevelFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return super().format(record)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UserError as error:
        return _failed(str(error), error.exit_code, "--json" in argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowercaseLevelFormatter("onebuild: %(levelname)s: %(message)s"))
    kept = log.handlers[:], log.level  # restored on return: main may run in-process
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if args.verbose else logging.WARNING)
    quiet = getattr(args, "json", False)  # one JSON document on stdout, nothing else
    logging.getLogger("onebuild.progress").setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        return _run(args, quiet)
    finally:
        log.handlers[:], level = kept
        log.setLevel(level)


def _run(args, quiet: bool) -> int:
    """The command, its failures as one line and an exit code."""
    try:
        return args.func(args)
    except OneBuildError as error:
        return _failed(str(error), error.exit_code, quiet)
    except KeyboardInterrupt:
        print("onebuild: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`onebuild dag --dot | head`): exit quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:  # a path the user named: missing folder, permissions, full disk
        return _failed(
            _os_error_line(error), 2 if error.filename or error.errno in _USER_ERRNOS else 1, quiet
        )
    except MemoryError:
        return _failed("out of memory", 1, quiet)


# failures of the storage the user chose (full, read-only, not theirs): exit 2, like bad input
_USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def _os_error_line(error: OSError) -> str:
    """An I/O failure as one line naming the file (when the error knows it)."""
    where = f"{error.filename}: " if error.filename else ""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}no space left on its device; free space and try again"
    if error.errno == errno.EROFS:
        return f"{where}read-only file system; choose a writable path"
    return f"{where}{error.strerror or error}"


def _failed(message: str, code: int, as_json: bool) -> int:
    """An error as one line on stderr; with --json also as the JSON document on stdout
    ({"error", "exit_code"}), so a script reading stdout gets one on every exit."""
    print(f"onebuild: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": code}, sort_keys=True))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
