"""Is a per-image difference between onebuild and onnxruntime a property of the image or chance?

Both quantizers (like for like, as `quant_layers.py` runs them) on each evaluation image of a real
model and on K copies of it with independent sensor noise (standard deviation `--level` gray
levels of 255, added before normalization: the input codes and every rounding after them
change, the image does not). For each image: both tools' SQNR (all outputs) on every copy, the
unperturbed one first, and the paired difference over the noisy copies (mean, standard
deviation, how many onebuild wins). A difference that keeps its sign on every copy belongs to
the image; `quantize_vs_ort.py --jitter` (0.3 % on every activation scale, zero points kept)
moves the codes of a tensor's small-valued channels even less, so neither estimate of noise
covers how a result varies from image to image.

    python bench/dithered_images.py layout_cdla [--copies 8] [--level 1.0]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from quant_layers import both_quantized
from quantize_vs_ort import _run, _session, _session_run, _sqnr

# the normalization's standard deviation per input channel, as `real_models` preprocesses
STD = {"layout_cdla": [0.229, 0.224, 0.225]}
DEFAULT_STD = [0.5, 0.5, 0.5]  # the PP-OCR models: (x / 255 - 0.5) / 0.5


def noisy_copies(image: np.ndarray, copies: int, sigma: np.ndarray, seed: int) -> np.ndarray:
    """`image` ([1, C, H, W]) followed by `copies` copies with Gaussian noise of per-channel
    standard deviation `sigma` (in the model's input units)."""
    rng = np.random.default_rng(seed)
    shape = (copies, *image.shape)
    noise = rng.standard_normal(shape) * sigma.reshape(1, 1, -1, 1, 1)
    return np.concatenate([image[None], (image + noise).astype(np.float32)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--level", type=float, default=1.0, help="noise, gray levels of 255")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        proto, _, evaluation, qdq, graph, quantized = both_quantized(
            args.model, Path(folder), bias_correction=False
        )
    session = _session(qdq.SerializeToString())
    x = proto.graph.input[0].name
    names = [v.name for v in graph.outputs]
    sigma = args.level / 255 / np.asarray(STD.get(args.model, DEFAULT_STD))
    for index, image in enumerate(evaluation):
        batch = noisy_copies(image, args.copies, sigma, seed=index)
        reference = _run(graph, x, names, batch)
        ours = [_sqnr([r], [o]) for r, o in zip(reference, _run(quantized, x, names, batch))]
        outputs = _session_run(session, x, names, batch)
        theirs = [_sqnr([r], [o]) for r, o in zip(reference, outputs)]
        difference = np.subtract(ours, theirs)[1:]
        row = {"image": index, "onebuild": ours, "onnxruntime": theirs}
        row["difference"] = {
            "mean": round(float(difference.mean()), 2),
            "std": round(float(difference.std()), 2),
            "onebuild_ahead": int((difference > 0).sum()),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
