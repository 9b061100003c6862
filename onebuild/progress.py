"""Progress lines for long steps (calibration, evaluation), at most one every few seconds.

Lines go to the `onebuild.progress` logger, which the CLI shows by default.
"""

import logging
import time

log = logging.getLogger("onebuild.progress")


class Progress:
    def __init__(self, label: str, unit: str = "samples", every: float = 2.0):
        self.label, self.unit, self.every = label, unit, every
        self.start = self.last = time.monotonic()
        self.done = 0

    def __call__(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s: %d %s (%.1f/s)", self.label, done, self.unit, done / (now - self.start))

    def finish(self) -> None:
        seconds = time.monotonic() - self.start
        log.info("%s: %d %s in %.2fs", self.label, self.done, self.unit, seconds)
