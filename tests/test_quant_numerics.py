"""Quantization numerics: parameters, fixed-point requantization, observers."""

import numpy as np
import pytest

from onebuild.graph_ir.quant.observers import MinMax, MovingAverage, Percentile
from onebuild.graph_ir.quant.params import (
    activation_params,
    dequantize,
    quantize,
    quantize_multiplier,
    requantize,
    weight_params,
)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_round_trip_error_is_at_most_half_a_step(rng, dtype):
    x = rng.normal(0.5, 2.0, 10000).astype(np.float32)
    params = activation_params(x.min(), x.max(), dtype)
    q = quantize(x, params, dtype)
    error = np.abs(dequantize(q, params) - x)
    float32_rounding = 1e-6 * np.abs(x).max()
    assert error.max() <= params.scale[0] / 2 + float32_rounding
    if dtype == "uint8":
        assert 0 <= params.zero_point[0] <= 255 and q.min() == 0 and q.max() == 255
    else:
        assert params.zero_point == (0,)


@pytest.mark.parametrize("value", [0.0, 3.5, -2.0])
def test_constant_tensor_gets_a_valid_scale(value):
    for dtype in ("uint8", "int8", "int16"):
        params = activation_params(value, value, dtype)
        assert np.isfinite(params.scale[0]) and params.scale[0] > 0
        x = np.full(4, value, np.float32)
        np.testing.assert_allclose(
            dequantize(quantize(x, params, dtype), params), x, atol=params.scale[0] / 2
        )


def test_zero_is_exactly_representable(rng):
    params = activation_params(0.3, 7.9, "uint8")  # range widened to include 0
    assert dequantize(quantize(np.zeros(1), params, "uint8"), params)[0] == 0.0


def test_per_channel_weights_use_the_full_range(rng):
    w = rng.normal(0, 1, (6, 3, 3, 3)) * np.arange(1, 7)[:, None, None, None]
    w[2] = 0
    params = weight_params(w, "int8", axis=0)
    q = quantize(w, params, "int8")
    peaks = np.abs(q).reshape(6, -1).max(axis=1)
    assert list(peaks) == [127, 127, 0, 127, 127, 127]
    assert params.scale[2] == 1.0
    per_tensor = weight_params(w, "int8", axis=None)
    assert len(per_tensor.scale) == 1 and np.abs(quantize(w, per_tensor, "int8")).max() == 127


def test_quantize_multiplier_is_accurate(rng):
    for real in np.concatenate([rng.uniform(1e-6, 1, 500), [0.5, 0.999999999, 2.0**-20]]):
        m, r = quantize_multiplier(float(real))
        assert (1 << 30) <= m < (1 << 31) and r >= 1
        assert abs(m * 2.0**-r - real) <= real * 2.0**-30
    assert quantize_multiplier(1.5) == (3 << 29, 30)  # multipliers above 1 are fine too
    assert quantize_multiplier(0.0) == (0, 1)  # flushed: scales everything to 0
    for bad in (-0.5, 2.0**29):
        with pytest.raises(ValueError):
            quantize_multiplier(bad)


def _half_even(acc: int, m: int, r: int) -> int:
    """round_half_even(acc * m / 2^r) with Python integers."""
    quotient, remainder = divmod(acc * m, 1 << r)
    if 2 * remainder > 1 << r or (2 * remainder == 1 << r and quotient % 2):
        quotient += 1
    return quotient


def test_requantize_rounds_half_to_even_exactly(rng):
    m, r = 1 << 30, 31  # multiplier exactly 0.5: every odd accumulator is a tie
    acc = np.array([-5, -3, -2, -1, 0, 1, 2, 3, 5, 7], np.int32)
    assert list(requantize(acc, m, r)) == [-2, -2, -1, 0, 0, 0, 1, 2, 2, 4]
    m, r = 1 << 30, 32  # 0.25 (a 2x2 average of equal scales): ties at 2 mod 4
    acc = np.arange(-8, 9, dtype=np.int64)
    assert requantize(acc, m, r).tolist() == [_half_even(int(a), m, r) for a in acc]
    acc = rng.integers(-(2**31), 2**31 - 1, 20000).astype(np.int64)
    real = 0.0123456
    m, r = quantize_multiplier(real)
    exact = acc * (m / 2.0**r)
    assert np.abs(requantize(acc, m, r) - exact).max() <= 0.5 + 1e-6


@pytest.mark.parametrize("bits, max_real", [(32, 2.0**20), (34, 1.0), (46, 100.0)])
def test_requantize_matches_python_integers(rng, bits, max_real):
    """Exact against unbounded integers, incl. 46-bit accumulators of int16 kernels; half of
    the multipliers are powers of two, so ties are frequent on both code paths."""
    acc = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), 3000, dtype=np.int64)
    reals = np.exp(rng.uniform(np.log(2.0**-30), np.log(max_real), 3000))
    reals[::2] = 2.0 ** np.floor(np.log2(reals[::2]))
    pairs = [quantize_multiplier(float(x)) for x in reals]
    m = np.array([p[0] for p in pairs], np.int64)
    r = np.array([p[1] for p in pairs], np.int64)
    got = requantize(acc, m, r)
    want = [_half_even(int(a), int(mm), int(rr)) for a, mm, rr in zip(acc, m, r)]
    assert got.tolist() == want


def test_requantize_does_not_overflow_near_32_bits():
    """acc * m + 2^(r-1) stays below 2^63 (an accumulator just under 2^32 with a 61-bit shift
    wrapped to a negative result before)."""
    acc, m, r = 2**32 - 1, 2**31 - 1, 61
    assert requantize(np.array([acc, -acc]), m, r).tolist() == [4, -4]


def test_minmax_and_moving_average():
    observer, average = MinMax(), MovingAverage(constant=0.1)
    for batch in ([1.0, 2.0], [-3.0, 0.5], [4.0]):
        observer.update(np.array(batch))
        average.update(np.array(batch))
    assert observer.range() == (-3.0, 4.0)
    lo = 1.0 * 0.9 + -3.0 * 0.1
    assert average.range()[0] == pytest.approx(lo * 0.9 + 4.0 * 0.1)


def _nth_percentile(values: list[float], percentile: float) -> float:
    """ONE's record-minmax definition, written out: sort, then interpolate linearly between the
    two order statistics around (n - 1) * p / 100."""
    ordered = sorted(values)
    if len(ordered) == 1 or percentile == 0:
        return ordered[0]
    if percentile == 100:
        return ordered[-1]
    position = (len(ordered) - 1) * percentile / 100
    index = int(np.floor(position))
    return ordered[index] + (position - index) * (ordered[index + 1] - ordered[index])


def test_percentile_is_ones_percentile_of_per_sample_extremes(rng):
    """Not a percentile of all values (which clips every tensor's tails): of each sample's
    minimum and maximum, as ONE's record-minmax computes it; chunking does not matter."""
    samples = rng.normal(0, 1, (37, 3, 5)) * rng.uniform(0.5, 3, (37, 1, 1))
    chunked, single = Percentile(1.0, 99.0), Percentile(1.0, 99.0)
    for start in range(0, 37, 8):
        chunked.update(samples[start : start + 8])
    for sample in samples:
        single.update(sample[None])
    lo = _nth_percentile([float(s.min()) for s in samples], 1.0)
    hi = _nth_percentile([float(s.max()) for s in samples], 99.0)
    assert chunked.range() == single.range() == (pytest.approx(lo), pytest.approx(hi))
    assert hi < samples.max() and hi > np.percentile(samples, 99)  # not the values' percentile


def _digits():
    from pathlib import Path

    from onebuild.graph_ir.passes import run_preset
    from onebuild.graph_ir.serde import load_model
    from onebuild.npz import read_npz

    folder = Path(__file__).parent.parent / "examples" / "digits"
    model = load_model(folder / "digits.onnx", {"input": [1, 1, 8, 8]})
    run_preset(model)
    return model.main, read_npz(folder / "data" / "calib.npz")


def test_calibration_observes_every_float_value():
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.calibrate import calibrate

    graph, data = _digits()
    seen = []
    ranges = calibrate(graph, data, "minmax", progress=seen.append).ranges
    assert seen[-1] == 200
    expected = {v.name for v in graph.inputs} | {v.name for n in graph.nodes for v in n.outputs}
    assert set(ranges) == expected
    logits = Interpreter(graph).run_batch(data)["logits"]
    assert ranges["logits"] == (pytest.approx(logits.min()), pytest.approx(logits.max()))
    assert ranges["input"][0] >= 0 and ranges["input"][1] <= 1
    percentile = calibrate(graph, data, "percentile", {"lo_percent": 1, "hi_percent": 99}).ranges
    assert percentile["logits"][1] < ranges["logits"][1]


def test_bad_calibration_data_gives_one_line_errors():
    from onebuild.errors import UserError
    from onebuild.graph_ir.quant.calibrate import calibrate

    graph, data = _digits()
    x = data["input"]
    cases = [
        ({"image": x}, "missing input 'input'"),
        ({"input": x[:, :, :, :4]}, "has shape"),
        (
            {"input": np.where(np.arange(len(x))[:, None, None, None, None] == 7, np.nan, x)},
            "sample 7 contains NaN or Inf",
        ),
        ({"input": x[:3]}, "3 sample(s); at least 10"),
    ]
    for bad, message in cases:
        with pytest.raises(UserError) as error:
            calibrate(graph, bad, min_samples=10)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UserError, match="unknown calibration method"):
        calibrate(graph, data, "entropy")


def test_channel_sums_are_exact_layer_input_means_and_round_trip(tmp_path):
    from onebuild.errors import FormatError
    from onebuild.graph_ir.interpreter import Interpreter
    from onebuild.graph_ir.quant.calibrate import calibrate
    from onebuild.graph_ir.serde.calibration_file import load_calibration, save_calibration
    from onebuild.npz import read_npz, write_npz

    graph, data = _digits()
    stats = calibrate(graph, data)
    layer_inputs = {n.inputs[0].name for n in graph.nodes if n.op in ("Conv", "Gemm")}
    assert set(stats.channel_sums) == layer_inputs
    seen = {}
    interpreter = Interpreter(graph, lambda value, array: seen.setdefault(value.name, array))
    interpreter.run_batch(data, chunk=len(data["input"]))
    means = stats.channel_means()
    np.testing.assert_allclose(means["input"], [data["input"].mean()], rtol=1e-6)
    for name in layer_inputs - {"input"}:
        axis = 1 if seen[name].ndim == 4 else -1
        other = tuple(i for i in range(seen[name].ndim) if i != axis % seen[name].ndim)
        np.testing.assert_allclose(means[name], seen[name].mean(axis=other), rtol=1e-5)

    save_calibration(stats, tmp_path / "c.npz")
    loaded = load_calibration(tmp_path / "c.npz")
    for name, (count, total) in stats.channel_sums.items():
        assert loaded.channel_sums[name][0] == count
        np.testing.assert_array_equal(loaded.channel_sums[name][1], total)
    arrays = read_npz(tmp_path / "c.npz")
    arrays["sum_sizes"] = arrays["sum_sizes"] + 1
    write_npz(tmp_path / "bad.npz", arrays)
    with pytest.raises(FormatError, match="channel sums do not match"):
        load_calibration(tmp_path / "bad.npz")
