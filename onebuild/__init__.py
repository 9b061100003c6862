"""onebuild: a declarative, cached build-graph compiler driver for on-device NN deployment."""

from .version import __version__

__all__ = ["Session", "__version__"]


def __getattr__(name: str):
    """`from onebuild import Session` without loading numpy for every onebuild import."""
    if name == "Session":
        from .runtime.session import Session

        return Session
    raise AttributeError(f"module 'onebuild' has no attribute {name!r}")
