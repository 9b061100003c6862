"""The warnings a step gives while it runs (a low SQNR, a part kept as .obir): recorded in the
step's log and cache entry, and said again, marked as from an earlier run, when a later build
finds the step up to date or restores it (a CI job on a warm cache would hear nothing)."""

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .ownership import log_path

log = logging.getLogger("onebuild")

EARLIER = "(from an earlier run) "


class _Recorder(logging.Handler):
    """Warnings logged by one thread (steps run in threads with -j N)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.messages.append(record.getMessage())


@contextmanager
def recorded() -> Iterator[list[str]]:
    """The list the warnings logged meanwhile (by this thread) are appended to."""
    recorder = _Recorder()
    log.addHandler(recorder)
    try:
        yield recorder.messages
    finally:
        log.removeHandler(recorder)


def logged(outputs: list[Path]) -> list[str]:
    """The warnings a step's log recorded (none if it has no log, or an older one)."""
    try:
        warnings = json.loads(log_path(outputs).read_bytes()).get("warnings", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []


def replay(warnings: list[str]) -> None:
    """Say a step's recorded warnings again."""
    for message in warnings:
        log.warning("%s%s", EARLIER, message)
