"""One error hierarchy for onebuild.

User errors (bad input: files, models, options) exit with code 2 and print one line; the CLI
catches `OneBuildError` and prints `str(error)` without a traceback. A build folder in use by
another onebuild process exits with 3 (`FolderBusy`), other failures with 1.
"""

# Control characters (which names read from model files may contain) are shown escaped, so
# every message stays on one line.
_ESCAPES = {code: repr(chr(code))[1:-1] for code in [*range(32), 127]}


class OneBuildError(Exception):
    """Base class of every error onebuild reports to users."""

    exit_code = 1

    def __init__(self, message: str = ""):
        super().__init__(str(message).translate(_ESCAPES))


class UserError(OneBuildError):
    """The input is wrong: a file, a model, an option. Fixable by the user."""

    exit_code = 2


class ModelError(UserError):
    """An input model is malformed, unsupported or has shapes onebuild cannot resolve."""


class UnsupportedOpsError(ModelError):
    """The model uses operators onebuild does not implement (all of them are listed)."""

    def __init__(self, source: str, unsupported: list[tuple[str, ...]], hint: str = ""):
        """`unsupported`: (op, node name) or (op, node name, where) with `where` the path of
        the subgraph holding the node (e.g. "If 'cond'.then_branch"); `hint`: what to do."""
        self.unsupported = unsupported
        listing = ", ".join(
            f"{op} (node '{name}'{f' in {where[0]}' if where and where[0] else ''})"
            for op, name, *where in unsupported
        )
        kinds = sorted({op for op, *_ in unsupported})
        super().__init__(
            f"{source}: {len(unsupported)} node(s) use unsupported operators "
            f"{', '.join(kinds)}: {listing}" + (f"; {hint}" if hint else "")
        )


class DynamicValueError(ModelError):
    """A value that must be known at compile time depends on run-time inputs."""

    def __init__(self, message: str, graph_inputs: list[str]):
        self.graph_inputs = graph_inputs
        super().__init__(message)


class InputValueError(UserError):
    """A run's input data gives an operator a value outside what it accepts (an index out of
    range, a sequence length beyond the sequence): the data is wrong, not onebuild."""


class FormatError(UserError):
    """A file onebuild reads (IR file, npz, .tvn, nnpackage) is corrupt or not of its format."""


class FolderBusy(OneBuildError):
    """Another onebuild process holds a build folder's lock: exit code 3 (the input is fine:
    build again once it finished, or with --wait)."""

    exit_code = 3


class GateFailed(OneBuildError):
    """A build check failed on good input (the accuracy gate): exit code 1, like a failed test."""


class IRError(OneBuildError):
    """The graph violates an IR invariant (a bug in a pass or importer, not user input)."""


class ExecutionError(OneBuildError):
    """A kernel failed while executing a node."""


class PassError(OneBuildError):
    """An optimization pass failed; the message names the passes that ran before it."""


class OptionError(UserError, ValueError):
    """An option of the compile API has a value it does not take (the message names the
    option, the value and the allowed values)."""
