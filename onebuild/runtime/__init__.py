"""The package runtime: load, validate and run nnpackages."""
