"""The simulated TRIX NPU: hardware presets, constraints, lowering, codegen, .tvn, simulator."""
