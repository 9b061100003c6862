"""Calibration and evaluation tiles for the PP-OCR text detector (320x320, as rapidocr feeds it).

rapidocr (the wheel the model comes from) reads an image with OpenCV (BGR), scales it so its
shorter side is 736 pixels (`limit_type: min`), normalizes with mean = std = 0.5 and runs the
detector; a 320x320 input is one tile of such a page. The tiles here are:

- real text: the bundled page scan (`data.page`), scaled as rapidocr does and also at half that
  (text sizes a deployment meets); the handwritten formulae (`data.text`) in calibration only
  (the detector marks almost none of them: 0-2000 pixels of a tile above 0.3);
- rendered documents (`render_document`): lines of words in Pillow's bundled font (the same
  glyphs on every machine) at 12-44 pixels, dark on paper, light on dark, on photographs
  (scikit-image's and scikit-learn's bundled images) with and without a sign-like box, slightly
  rotated or blurred, seeded;
- photographs without text (calibration only: a deployment's calibration data has them).

Calibration and evaluation share no tile: different regions of the real images, other seeds
and other backgrounds for the renderings. Every evaluation tile holds text, so each has a
meaningful SQNR of its own (a tile without text has an all-but-zero probability map).
"""

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from skimage import color, data, transform
from sklearn.datasets import load_sample_images

SIDE = 320
LETTERS = "abcdefghijklmnopqrstuvwxyzabcdeeeeiioonnrrsstt"


def _rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        image = color.gray2rgb(image)
    return image[..., :3].astype(np.float64)


def _scaled(image: np.ndarray, scale: float) -> np.ndarray:
    height, width = round(image.shape[0] * scale), round(image.shape[1] * scale)
    return transform.resize(
        image, (height, width), order=1, preserve_range=True, anti_aliasing=True
    )


def _rapidocr_scale(image: np.ndarray) -> float:
    """rapidocr's `limit_side_len: 736, limit_type: min`: the shorter side up to 736."""
    return max(1.0, 736 / min(image.shape[:2]))


def _tiles(image: np.ndarray, scale: float, corners) -> list[np.ndarray]:
    big = _scaled(image, scale)
    return [big[y : y + SIDE, x : x + SIDE] for y, x in corners]


def _photo(name: str) -> np.ndarray:
    if name in ("china", "flower"):
        index = ["china", "flower"].index(name)
        return _rgb(load_sample_images().images[index])
    return _rgb(getattr(data, name)())


def _words(rng: np.random.Generator, count: int) -> str:
    words = []
    for _ in range(count):
        length = int(rng.integers(2, 10))
        word = "".join(rng.choice(list(LETTERS), length))
        kind = rng.random()
        if kind < 0.15:
            word = word.capitalize()
        elif kind < 0.22:
            word = str(int(rng.integers(1, 99999)))
        elif kind < 0.26:
            word = word.upper()
        words.append(word)
    return " ".join(words)


def render_document(seed: int, background: str | None, style: str) -> np.ndarray:
    """One 320x320 RGB tile of text lines. `background`: a photo name (its centre, scaled to
    cover the tile) or None for paper; `style`: "dark" (dark text), "light" (light text on a
    dark ground), "sign" (text on boxes over the photo)."""
    rng = np.random.default_rng(seed)
    if background is None:
        shade = 235 + 15 * rng.random()
        ground = np.full((SIDE, SIDE, 3), shade) + rng.normal(0, 3, (SIDE, SIDE, 1))
        if style == "light":
            ground = 255 - ground * 0.8
    else:
        photo = _photo(background)
        scale = max(SIDE / photo.shape[0], SIDE / photo.shape[1]) * (1 + rng.random())
        big = _scaled(photo, scale)
        y, x = (big.shape[0] - SIDE) // 2, (big.shape[1] - SIDE) // 2
        ground = big[y : y + SIDE, x : x + SIDE]
    canvas = Image.fromarray(np.clip(ground, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    top = int(rng.integers(4, 30))
    while top < SIDE - 12:
        size = int(rng.choice([12, 14, 16, 18, 20, 24, 28, 32, 38, 44]))
        font = ImageFont.load_default(size=size)
        left = int(rng.integers(4, 60))
        text = _words(rng, int(rng.integers(1, 8)))
        ink = (
            tuple(int(v) for v in rng.integers(0, 70, 3))
            if style != "light"
            else tuple(int(v) for v in rng.integers(190, 256, 3))
        )
        if style == "sign":
            box = draw.textbbox((left, top), text, font=font)
            fill = tuple(int(v) for v in rng.integers(200, 256, 3))
            draw.rectangle((box[0] - 4, box[1] - 3, box[2] + 4, box[3] + 3), fill=fill)
        draw.text((left, top), text, fill=ink, font=font, stroke_width=int(rng.random() < 0.2))
        top += int(size * (1.3 + rng.random()))
    angle = float(rng.uniform(-6, 6)) if rng.random() < 0.4 else 0.0
    if angle:
        canvas = canvas.rotate(angle, resample=Image.BILINEAR, fillcolor=canvas.getpixel((0, 0)))
    if rng.random() < 0.3:
        canvas = canvas.filter(ImageFilter.GaussianBlur(0.8))
    return np.asarray(canvas, dtype=np.float64)


def _normalized(tile: np.ndarray) -> np.ndarray:
    """rapidocr's det preprocessing of an RGB tile: BGR, (x / 255 - 0.5) / 0.5, CHW, batch 1."""
    return ((tile[..., ::-1] / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


CALIB_RENDERED = [
    (1, None, "dark"),
    (2, "coffee", "sign"),
    (3, None, "light"),
    (4, "camera", "dark"),
]
EVAL_RENDERED = [
    (101, None, "dark"),
    (102, None, "dark"),
    (103, None, "light"),
    (104, "astronaut", "sign"),
    (105, "rocket", "light"),
    (106, "china", "sign"),
    (107, "flower", "dark"),
    (108, "chelsea", "sign"),
    (109, "hubble_deep_field", "light"),
    (110, "immunohistochemistry", "dark"),
    (111, "retina", "sign"),
    (112, "coins", "light"),
    (113, "brick", "sign"),
    (114, "grass", "sign"),
    (115, None, "dark"),
    (116, "logo", "dark"),
    (117, "moon", "sign"),
    (118, "gravel", "sign"),
    (119, None, "light"),
    (120, "astronaut", "light"),
]


def detector_tiles() -> tuple[np.ndarray, np.ndarray]:
    """(calibration [8, 1, 3, 320, 320], evaluation [25, 1, 3, 320, 320]) float32 tiles."""
    page, text = _rgb(data.page()), _rgb(data.text())
    page_scale, text_scale = _rapidocr_scale(page), _rapidocr_scale(text)
    calib = _tiles(page, page_scale, [(0, 0), (320, 320)])
    calib += _tiles(text, text_scale, [(100, 0)])
    calib += [render_document(*spec) for spec in CALIB_RENDERED]
    calib += _tiles(_photo("chelsea"), 1.1, [(0, 0)])
    evaluation = _tiles(page, page_scale, [(0, 700), (0, 1100), (380, 700), (380, 1100)])
    evaluation += _tiles(page, page_scale / 2, [(30, 410)])
    evaluation += [render_document(*spec) for spec in EVAL_RENDERED]
    return np.stack([_normalized(t) for t in calib]), np.stack([_normalized(t) for t in evaluation])
