"""The interpreter's compiled float kernels (numba, extra `fast`; in the test extra) give the same
bits as the numpy code they replace: depthwise convolution over strides, dilations and
asymmetric pads (padding products included, so signed zeros and infinities behave alike), and
HardSwish with NaN, infinities and signed zeros (NaNs in the same places; their payloads may
differ). Each test runs both paths."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from onebuild.compile import MixedPrecisionOptions, QuantizeOptions, calibrate, optimize, quantize
from onebuild.datasets import first_samples, iter_batches
from onebuild.graph_ir import compiled
from onebuild.graph_ir.ops import OPS
from onebuild.graph_ir.quant import probes, sensitivity
from onebuild.graph_ir.quant.params import _requantize_compiled, quantize_multiplier, requantize
from onebuild.graph_ir.serde import load_onnx

CASES = [  # channels, spatial, kernel, strides, dilations, pads (top, left, bottom, right)
    (3, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (4, (9, 11), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # the layout detector's layers
    (4, (12, 10), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
    (2, (9, 11), (3, 2), (2, 3), (1, 1), (0, 2, 1, 0)),
    (2, (8, 8), (3, 3), (2, 2), (2, 1), (3, 0, 0, 4)),
    (2, (5, 6), (2, 2), (1, 1), (1, 1), (4, 4, 4, 4)),  # whole windows inside the padding
    (2, (7, 9), (3, 3), (3, 1), (1, 2), (0, 1, 2, 0)),
    (1, (1, 1), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    (2, (70, 80), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # planes of several cache blocks
    (2, (200, 100), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
]


@pytest.fixture
def fast(monkeypatch):
    """The compiled kernels, loaded whatever the call size; `run(kernel, *args)` runs a kernel
    on the numpy path and on the compiled one and returns both results."""
    monkeypatch.setattr(compiled, "use", True)
    monkeypatch.setattr(compiled, "LOAD_ELEMENTS", 0)
    assert compiled.compiled(1) is not None, "numba is in the test extra: test the fast path"

    def run(op, attrs, *args):
        results = []
        for use in (False, True):
            monkeypatch.setattr(compiled, "use", use)
            results.append(OPS[op].kernel(attrs, *args)[0])
        return results

    return run


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bits but in NaNs, which must be in the same places (which NaN an operation on
    two NaNs returns depends on the order of its operands, which the compiler may swap)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    unsigned = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    numbers = ~np.isnan(a)
    np.testing.assert_array_equal(a[numbers].view(unsigned), b[numbers].view(unsigned))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("channels, spatial, kernel, strides, dilations, pads", CASES)
def test_depthwise_is_bit_identical(
    fast, rng, dtype, channels, spatial, kernel, strides, dilations, pads
):
    x = rng.standard_normal((3, channels, *spatial)).astype(dtype)
    w = rng.standard_normal((channels, 1, *kernel)).astype(dtype)
    b = rng.standard_normal(channels).astype(dtype)
    x.flat[:3] = [-0.0, np.inf, np.nan]  # specials propagate alike (a padding tap times inf)
    w.flat[0] = -0.0
    attrs = {"group": channels, "strides": list(strides), "dilations": list(dilations)}
    attrs["pads"] = list(pads)
    for bias in (None, b):
        numpy_y, fast_y = fast("Conv", attrs, x, w, *([] if bias is None else [bias]))
        _same_bits(numpy_y, fast_y)
    w[0, 0, 0, 0] = np.inf  # inf times a padding zero is NaN on both paths
    _same_bits(*fast("Conv", attrs, x, w))


def test_depthwise_of_float32_input_and_float64_weights(fast, rng):
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    w = rng.standard_normal((3, 1, 3, 3))
    attrs = {"group": 3, "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1]}
    numpy_y, fast_y = fast("Conv", attrs, x, w)
    _same_bits(numpy_y, fast_y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hard_swish_is_bit_identical(fast, rng, dtype):
    x = (rng.standard_normal((2, 5, 13, 7)) * 4).astype(dtype)
    x.flat[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -3.0, 3.0, 1e-30]
    _same_bits(*fast("HardSwish", {}, x))
    _same_bits(*fast("HardSwish", {}, np.asfortranarray(x)))  # any layout in, C order out


def test_without_numba_the_numpy_path_runs(monkeypatch, rng):
    monkeypatch.setattr(compiled, "use", True)
    monkeypatch.setattr(compiled, "_loaded", [])
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    attrs = {"group": 2, "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1]}
    (y,) = OPS["Conv"].kernel(attrs, x, rng.standard_normal((2, 1, 3, 3)).astype(np.float32))
    assert y.shape == (1, 2, 5, 5) and compiled.compiled(1 << 30) is None


def test_many_small_calls_load_the_kernels(monkeypatch):
    """No call reaches LOAD_ELEMENTS (a search's probes on small layers): the kernels load
    once the calls add up to LOAD_TOTAL outputs, not before."""
    monkeypatch.setattr(compiled, "use", True)
    monkeypatch.setattr(compiled, "_loaded", [])
    monkeypatch.setattr(compiled, "_seen", [0])
    small = compiled.LOAD_ELEMENTS // 4
    calls = 1
    while compiled.compiled(small) is None:
        calls += 1
        assert calls * small <= compiled.LOAD_TOTAL
    assert calls * small == compiled.LOAD_TOTAL


MOBILENET = Path(__file__).parent.parent / "examples" / "models"


def _mixed_precision_record(options: dict) -> dict:
    """The mixed-precision search on the tiny MobileNet and its 16 real photo crops."""
    model = optimize(load_onnx(MOBILENET / "tiny_mobilenet.onnx", {"x": [1, 3, 32, 32]}))
    specs = [(v.name, v.shape) for v in model.main.inputs]
    stats = calibrate(model.main, iter_batches(MOBILENET / "tiny_mobilenet_calib.npz", specs))
    samples = first_samples(MOBILENET / "tiny_mobilenet_calib.npz", specs, 16)
    mixed = MixedPrecisionOptions(target_sqnr_db=40)
    settings = QuantizeOptions(mixed_precision=mixed, **options)
    return json.loads(quantize(model, settings, stats, samples).metadata["mixed_precision"])


@pytest.mark.parametrize("options", [{}, {"activation_granularity": "channel"}])
def test_the_search_on_the_fast_paths_equals_the_reference_path(fast, monkeypatch, options):
    """Compiled kernels on (from the first call), sensitivity runs and probes' pieces on two
    threads against numpy and one thread: the same promoted set, SQNR, probes (where they gave
    up too) and sensitivities, bit for bit."""
    for module in (sensitivity, probes):
        monkeypatch.setattr(module, "THREADS", 1)
    monkeypatch.setattr(compiled, "use", False)
    reference = _mixed_precision_record(options)
    for module in (sensitivity, probes):
        monkeypatch.setattr(module, "THREADS", 2)
    monkeypatch.setattr(compiled, "use", True)
    calls = {}
    loaded = compiled.compiled(1)
    for name, kernel in vars(loaded).items():

        def counting(*args, _kernel=kernel, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _kernel(*args)

        monkeypatch.setattr(loaded, name, counting)
    fast_record = _mixed_precision_record(options)
    assert calls.get("depthwise2d", 0) > 10  # the float and integer depthwise layers ran on it
    assert reference["promoted"] and len(reference["steps"]) >= 3  # a search happened
    assert fast_record == reference


def _requantize_both(monkeypatch, acc, m, r) -> tuple[np.ndarray, np.ndarray]:
    results = []
    for use in (False, True):
        monkeypatch.setattr(compiled, "use", use)
        results.append(requantize(acc, m, r))
    return results[0], results[1]


def test_requantize_gives_the_same_integers(fast, monkeypatch, rng):
    """Per tensor, per channel on either axis, int32 and 48-bit accumulators (the split
    formula), and exact ties (half-way cases round to even)."""
    shape = (3, 5, 7, 11)
    reals = np.exp(rng.uniform(np.log(2.0**-30), np.log(2.0**6), 5))
    pairs = [quantize_multiplier(float(real)) for real in reals]
    m = np.array([p[0] for p in pairs], np.int64)
    r = np.array([p[1] for p in pairs], np.int64)
    for bits in (12, 31, 40, 47):
        acc = rng.integers(-(1 << bits), 1 << bits, shape, dtype=np.int64)
        acc.flat[:4] = [1 << 31, -(1 << 31), (1 << 31) + 1, -(1 << 31) - 1]  # the formulas' edge
        cases = [(m[1], r[1]), (m.reshape(1, 5, 1, 1), r.reshape(1, 5, 1, 1))]
        cases.append((m[0], r.reshape(1, 5, 1, 1)))  # one multiplier, shifts per channel
        cases.append((np.tile(m, 3)[:3].reshape(3, 1, 1, 1), np.int64(20)))  # on axis 0
        for case_m, case_r in cases:  # shifts >= 20: |acc| < 2^52 is in the exact range
            slow, quick = _requantize_both(monkeypatch, acc, case_m, case_r)
            np.testing.assert_array_equal(slow, quick)
            assert _requantize_compiled(acc, np.asarray(case_m), np.asarray(case_r)) is not None
    for offset in (0, 1 << 40):  # acc * 2^30 / 2^31 = acc / 2: every odd acc a tie
        ties = offset + np.arange(-20, 21, dtype=np.int64)
        slow, quick = _requantize_both(monkeypatch, ties, np.int64(1 << 30), np.int64(31))
        np.testing.assert_array_equal(slow, quick)
        np.testing.assert_array_equal(quick, np.round(ties / 2).astype(np.int64))  # half to even
    broadcast = rng.integers(-100, 100, (4, 6), dtype=np.int64)  # two axes per element: numpy's
    multipliers = np.full((4, 6), 1 << 30, np.int64)
    slow, quick = _requantize_both(monkeypatch, broadcast, multipliers, np.int64(31))
    np.testing.assert_array_equal(slow, quick)
    assert _requantize_compiled(broadcast, multipliers, np.asarray(np.int64(31))) is None


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("parts", ["knots", "bends", "exact"])
def test_interpolated_table_gives_the_same_codes(fast, monkeypatch, rng, rows, parts):
    """QLookupInterp's compiled pass against its numpy passes on every int16 code of every
    channel: knots alone, with bends, with exact segments (some rows without), one row or one
    per channel; full-range knots and bends, so bends reach the saturation."""
    channels = 3
    codes = np.arange(-32768, 32768, dtype=np.int16)
    q = np.stack([np.roll(codes, 977 * c) for c in range(channels)])  # every code, per channel
    q = q.reshape(channels, 2, 2, -1).transpose(1, 0, 2, 3)  # [2 samples, C, 2, 8192]
    knots = rng.integers(-32768, 32768, (rows, 513)).astype(np.int16)
    constants = [knots]
    if parts != "knots":
        constants.append(rng.integers(-32768, 32768, (rows, 512)).astype(np.int16))
    if parts == "exact":
        segments = np.full((rows, 4), -1, np.int16)
        segments[0, :3] = [0, 511, 200]  # the corners and one inside; other rows: none
        constants += [segments, rng.integers(-32768, 32768, (rows, 4, 128)).astype(np.int16)]
    numpy_y, fast_y = fast("QLookupInterp", {}, q, *constants)
    assert fast_y.dtype == np.int16 and fast_y.shape == q.shape
    np.testing.assert_array_equal(numpy_y, fast_y)
    assert parts == "knots" or ((fast_y == 32767) | (fast_y == -32768)).any()
