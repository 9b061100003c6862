"""Progress of long steps (calibration, evaluation, runs over samples).

On a terminal: a live line with the count, rate and time left, drawn by tqdm (a well-kept
library: terminal widths, redraw rates and ETA smoothing are its job, not ours). Otherwise (a
log, a pipe): one line when the work ends. Nothing at all when the `onebuild.progress` logger
is quiet, which the CLI sets for `--json`.

A step running on a Dask worker forwards its progress to the client (`forward_to`), which draws
it as if the step ran locally.
"""

import logging
import sys
import threading
import time
from collections.abc import Callable

from tqdm import tqdm

log = logging.getLogger("onebuild.progress")
FORWARD_SECONDS = 0.25  # the least time between two forwarded updates
_thread = threading.local()  # .forward: where this thread's progress goes instead


def forward_to(sink: Callable[[dict], None] | None) -> None:
    """Send the progress of work started on this thread to `sink` (events `{"label", "unit",
    "total", "done", "end"}`) instead of drawing it; None draws it again."""
    _thread.forward = sink


class Progress:
    def __init__(self, label: str, total: int | None = None, unit: str = "samples"):
        self.label, self.unit = label, unit
        self.start = time.monotonic()
        self.done = 0
        self.forward, self.sent = getattr(_thread, "forward", None), 0.0
        self.total = total
        terminal = sys.__stderr__  # the process's own: a build step's output is captured
        live = log.isEnabledFor(logging.INFO) and terminal is not None and terminal.isatty()
        self.bar = tqdm(
            total=total, desc=label, unit=f" {unit}", file=terminal,
            mininterval=0.1, leave=False, dynamic_ncols=True,
            disable=not live or self.forward is not None,
        )  # fmt: skip

    def __call__(self, done: int) -> None:
        self.bar.update(done - self.done)
        self.done = done
        if self.forward is not None and time.monotonic() - self.sent >= FORWARD_SECONDS:
            self._send(end=False)

    def _send(self, end: bool) -> None:
        self.sent = time.monotonic()
        event = {"label": self.label, "unit": self.unit, "total": self.total, "end": end}
        self.forward({**event, "done": self.done, "seconds": self.sent - self.start})

    def finish(self) -> None:
        self.bar.close()
        if self.forward is not None:  # the client prints the summary line
            self._send(end=True)
            return
        seconds = time.monotonic() - self.start
        summary(self.label, self.done, self.unit, seconds)


def summary(label: str, done: int, unit: str, seconds: float) -> None:
    """The line a finished piece of work leaves: `calibrate: 360 samples in 0.42s`."""
    log.info("%s: %d %s in %.2fs", label, done, unit, seconds)
