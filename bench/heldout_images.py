"""The layout detector like for like beside onnxruntime on images the bench does not evaluate.

`quantize_vs_ort.py` evaluates the layout detector on 4 images, and its total is decided by the
one with the largest signal (the clock). Here both quantizers (calibrated on the same 6 images,
settings as its `onebuild_plain` entry) run on 12 other images bundled with scikit-image,
preprocessed alike: each image's SQNR (all outputs), the mean of those, and the total. With
`--jitter K`, K more runs of each with every activation scale perturbed as in
`quantize_vs_ort.py` (paired: one factor per tensor name and seed). Prints JSON.

    python bench/heldout_images.py [--jitter 3]
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
from ort_variants import jitter_qdq
from quantize_vs_ort import _onebuild, _run, _session, _session_run, _sqnr, ort_quantize
from real_models import MODELS, _whole_images, fixed_export, samples

IMAGES = [
    "brick",
    "cell",
    "colorwheel",
    "grass",
    "gravel",
    "horse",
    "hubble_deep_field",
    "logo",
    "moon",
    "retina",
    "shepp_logan_phantom",
    "cat",
]


def _summary(reference, outputs) -> dict:
    each = [_sqnr([r], [o]) for r, o in zip(reference, outputs)]
    mean = round(float(np.mean(each)), 2)
    return {"total": _sqnr(reference, outputs), "mean": mean, "each": each}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jitter", type=int, default=0, help="perturbed runs (noise estimate)")
    args = parser.parse_args()
    spec = next(m for m in MODELS if m.name == "layout_cdla")
    calib, _ = samples(spec, 16)
    _, _, height, width = spec.input_shape
    images = _whole_images(IMAGES, height, width, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    runs = {"onebuild_plain": [], "onnxruntime": []}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        path = fixed_export(spec, work)
        graph, quantized, _ = _onebuild(path, None, calib, work, bias_correction=False)
        x, names = graph.inputs[0].name, [v.name for v in graph.outputs]
        reference = _run(graph, x, names, images)
        ort_quantize(path, work / "qdq.onnx", x, calib)
        qdq = onnx.load(work / "qdq.onnx")
        for seed in range(args.jitter + 1):
            if seed:
                _, quantized, _ = _onebuild(
                    path, None, calib, work, jitter=seed, bias_correction=False
                )
            ours = _run(quantized, x, names, images)
            model = jitter_qdq(qdq, seed) if seed else qdq
            theirs = _session_run(_session(model.SerializeToString()), x, names, images)
            runs["onebuild_plain"].append(_summary(reference, ours))
            runs["onnxruntime"].append(_summary(reference, theirs))
    result = {"images": IMAGES, "runs": runs}
    for key in ("total", "mean"):
        gaps = [a[key] - b[key] for a, b in zip(runs["onebuild_plain"], runs["onnxruntime"])]
        result[f"{key}_minus_ort"] = {
            "mean": round(float(np.mean(gaps)), 2),
            "std": round(float(np.std(gaps)), 2),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
