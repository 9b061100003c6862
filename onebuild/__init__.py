"""onebuild: a declarative, cached build-graph compiler driver for on-device NN deployment."""

__version__ = "0.1.0"
