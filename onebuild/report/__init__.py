"""The HTML build report (`onebuild report`, `[build] report = true`): collect what a build left
(`collect`), draw it (`graph_svg`, `charts_quant`, `charts_npu`), write one page (`page`)."""

from .page import REPORT_FILE, write_report

__all__ = ["REPORT_FILE", "write_report"]
