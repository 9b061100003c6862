"""Calibration split across workers: shards recorded separately and merged give the statistics
file of one pass, byte for byte (min/max, doubling histograms, exact channel sums)."""

import hashlib
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from onebuild.errors import UserError
from onebuild.graph_ir.quant.calibrate import CHUNK, calibrate, merge_recorders, record
from onebuild.graph_ir.serde import load_onnx
from onebuild.graph_ir.serde.calibration_file import save_calibration

EXAMPLES = Path(__file__).parent.parent / "examples"
DIGITS = EXAMPLES / "digits"


@pytest.fixture(scope="module")
def digits():
    graph = load_onnx(DIGITS / "digits.onnx", {"input": [1, 1, 8, 8]}).main
    return graph, dict(np.load(DIGITS / "data" / "calib.npz"))


@pytest.fixture(scope="module")
def mobilenet():
    graph = load_onnx(EXAMPLES / "models" / "tiny_mobilenet.onnx", {"x": [1, 3, 32, 32]}).main
    return graph, dict(np.load(EXAMPLES / "models" / "tiny_mobilenet_calib.npz"))


def file_bytes(stats, path: Path) -> bytes:
    save_calibration(stats, path)
    return path.read_bytes()


def shards(data: dict, parts: int, aligned: bool) -> list[dict]:
    """`parts` contiguous shards of the samples, split at multiples of CHUNK when `aligned`."""
    count = len(next(iter(data.values())))
    bounds = np.linspace(0, count, parts + 1).astype(int)
    if aligned:
        bounds = [min(count, -(-b // CHUNK) * CHUNK) for b in bounds]
    return [{k: v[a:b] for k, v in data.items()} for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_shards_merge_into_the_one_pass_file(digits, method, tmp_path):
    graph, data = digits
    one_pass = file_bytes(calibrate(graph, data, method), tmp_path / "one.npz")
    for parts in (1, 2, 4):
        for aligned in (True, False):
            recorders = [record(graph, shard, method) for shard in shards(data, parts, aligned)]
            merged = merge_recorders(recorders)
            path = tmp_path / f"{parts}{aligned}.npz"
            assert file_bytes(merged, path) == one_pass, (method, parts, aligned)


def test_merge_doubles_histograms_of_different_ranges(digits):
    """The shards' histograms start at different ranges, so merging must double one of them."""
    graph, data = digits
    order = np.argsort(np.abs(data["input"]).reshape(len(data["input"]), -1).max(axis=1))
    small, large = ({"input": data["input"][order[:100]]}, {"input": data["input"][order[100:]]})
    first, second = record(graph, small, "mse"), record(graph, large, "mse")
    limits = {n: (first.observers[n].limit, o.limit) for n, o in second.observers.items()}
    assert any(a != b for a, b in limits.values())
    ordered = {"input": np.concatenate([small["input"], large["input"]])}
    expected = calibrate(graph, ordered, "mse")
    merged = merge_recorders([first, second])
    for name, (limit, counts) in expected.histograms.items():
        assert merged.histograms[name][0] == limit
        np.testing.assert_array_equal(merged.histograms[name][1], counts)


def test_mobilenet_channel_sums_are_exact_across_shards(mobilenet, tmp_path):
    graph, data = mobilenet
    one_pass = calibrate(graph, data, "minmax")
    assert one_pass.channel_sums  # the model's conv inputs are summed per channel
    reference = file_bytes(one_pass, tmp_path / "one.npz")
    digests = set()
    for parts in (2, 4):
        merged = merge_recorders([record(graph, s, "minmax") for s in shards(data, parts, False)])
        digests.add(hashlib.sha256(file_bytes(merged, tmp_path / f"{parts}.npz")).hexdigest())
    assert digests == {hashlib.sha256(reference).hexdigest()}


def test_channel_sums_are_correctly_rounded(digits):
    """The digits input feeds the first conv: its channel sum is the correctly rounded sum of
    all input values (math.fsum), not a float accumulation in some order."""
    graph, data = digits
    count, sums = calibrate(graph, data, "minmax").channel_sums["input"]
    values = data["input"].astype(np.float64).ravel()
    assert count == values.size and sums.tolist() == [math.fsum(values.tolist())]


def test_histogram_and_percentile_match_numpy(digits):
    """The power-of-two histogram counts what numpy.histogram counts over its range; the
    percentile range is numpy's percentiles of the samples' extremes."""
    graph, data = digits
    values = data["input"].reshape(len(data["input"]), -1)
    limit, counts = calibrate(graph, data, "mse").histograms["input"]
    assert limit == 2.0 ** (np.floor(np.log2(float(np.abs(values).max()))) + 1)  # > the peak
    expected, _ = np.histogram(values, bins=len(counts), range=(-limit, limit))
    np.testing.assert_array_equal(counts, expected)
    lo, hi = calibrate(graph, data, "percentile").ranges["input"]
    assert lo == np.percentile(values.min(axis=1).astype(np.float64), 1)
    assert hi == np.percentile(values.max(axis=1).astype(np.float64), 99)


def test_moving_average_shards_are_refused(digits):
    graph, data = digits
    parts = [record(graph, s, "moving_average") for s in shards(data, 2, True)]
    with pytest.raises(UserError, match="moving_average statistics depend on the order"):
        merge_recorders(parts)
