"""Progress of long steps (calibration, evaluation, runs over samples).

On a terminal: a live line with the count, rate and time left, drawn by tqdm (a well-kept
library: terminal widths, redraw rates and ETA smoothing are its job, not ours). Otherwise (a
log, a pipe): one line when the work ends. Nothing at all when the `onebuild.progress` logger
is quiet, which the CLI sets for `--json`.
"""

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger("onebuild.progress")


class Progress:
    def __init__(self, label: str, total: int | None = None, unit: str = "samples"):
        self.label, self.unit = label, unit
        self.start = time.monotonic()
        self.done = 0
        terminal = sys.__stderr__  # the process's own: a build step's output is captured
        live = log.isEnabledFor(logging.INFO) and terminal is not None and terminal.isatty()
        self.bar = tqdm(
            total=total, desc=label, unit=f" {unit}", file=terminal, disable=not live,
            mininterval=0.1, leave=False, dynamic_ncols=True,
        )  # fmt: skip

    def __call__(self, done: int) -> None:
        self.bar.update(done - self.done)
        self.done = done

    def finish(self) -> None:
        self.bar.close()
        seconds = time.monotonic() - self.start
        log.info("%s: %d %s in %.2fs", self.label, self.done, self.unit, seconds)
