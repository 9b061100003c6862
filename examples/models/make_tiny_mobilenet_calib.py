"""Write tiny_mobilenet_calib.npz: 16 real photo crops as the model's calibration input.

Each sample is a 64x64 window of one of scikit-learn's two bundled photographs (a temple in
China, a flower), halved to 32x32 by 2x2 averaging and scaled to [0, 1], as
[16, 1, 3, 32, 32] float32. The windows are spread over both pictures; the tests' evaluation
crops (full-resolution 32x32 windows) are different data. Deterministic.

    python examples/models/make_tiny_mobilenet_calib.py
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_sample_images

OUT = Path(__file__).with_name("tiny_mobilenet_calib.npz")


def crops(per_picture: int = 8, window: int = 64) -> np.ndarray:
    samples = []
    for picture in load_sample_images().images:
        h, w, _ = picture.shape
        for i in range(per_picture):
            top = (h - window) * (2 * i + 1) // (2 * per_picture)
            left = (w - window) * ((5 * i) % per_picture) // per_picture
            tile = picture[top : top + window, left : left + window].astype(np.float32) / 255
            half = tile.reshape(window // 2, 2, window // 2, 2, 3).mean(axis=(1, 3))
            samples.append(half.transpose(2, 0, 1)[None])
    return np.stack(samples).astype(np.float32)


if __name__ == "__main__":
    np.savez(OUT, x=crops())
    print(f"wrote {OUT}")
