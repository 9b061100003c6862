"""Optimization passes and the pass manager. `O1` is the value-preserving preset."""

from .cleanup import eliminate_dead_code, remove_identities
from .fold import fold_constants
from .fold_affine import fold_affine
from .fuse import fold_batchnorm, fuse_activations
from .manager import PRESETS, Pass, PassRecord, run_passes, run_preset
from .patterns import fuse_patterns

__all__ = [
    "PRESETS",
    "Pass",
    "PassRecord",
    "eliminate_dead_code",
    "fold_affine",
    "fold_batchnorm",
    "fold_constants",
    "fuse_activations",
    "fuse_patterns",
    "remove_identities",
    "run_passes",
    "run_preset",
]
