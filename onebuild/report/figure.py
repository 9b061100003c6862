"""Matplotlib, set up for the report: the SVG backend without a display, text kept as text,
ids and metadata fixed so the same build gives the same bytes."""

import io
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import UserError


def pyplot():
    """matplotlib.pyplot on the SVG backend; a one-line error when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "the HTML report draws its charts with matplotlib, which is not installed: "
            "pip install 'onebuild[report]'"
        ) from None
    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def figure(name: str, width: float, height: float) -> Iterator:
    """A figure whose SVG ids are salted with `name` (figures share one page)."""
    plt = pyplot()
    style = {"svg.hashsalt": f"onebuild-{name}", "svg.fonttype": "none", "font.size": 9}
    with plt.rc_context(style):
        fig = plt.figure(figsize=(width, height), layout="constrained")
        try:
            yield fig
        finally:
            plt.close(fig)


def svg_text(fig, name: str) -> str:
    """The figure as an inline `<svg>` element (no XML prolog, no date)."""
    plt = pyplot()
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": f"onebuild-{name}", "svg.fonttype": "none"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "onebuild"})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def clip(text: str, length: int) -> str:
    """`text` shortened to `length` characters, keeping its end (names end in what tells
    layers apart)."""
    return text if len(text) <= length else "…" + text[-(length - 1) :]
