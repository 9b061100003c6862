"""Quantization numerics: parameters, fixed-point requantization, calibration observers.

The rules are written down in docs/quantization.md; the TRIX simulator matches them bit for bit.
"""
