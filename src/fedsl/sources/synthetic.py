"""Font-rendered characters: an offline, deterministic stand-in for EMNIST.

The FSL paper ("Federated Learning with Server Learning") gives the server a small
synthetic EMNIST set: characters drawn with a font at rotations -20..20 degrees and
3 font sizes, resized to 28x28 grey. Two generators live here:

- ``fslsyn_chars``: that recipe exactly, no randomness (15 images per class).
- ``make_font_chars``: the same idea with more variety (several fonts, random
  rotation, size, shift, stroke thickness and an elastic warp), to stand in for
  real EMNIST when it cannot be downloaded.

Only fonts that ship with matplotlib are used, so the output is the same on every
machine that has the same matplotlib (the fonts are its package data). Images are
uint8, white glyph on black, upright (as EMNIST/MNIST look after transposition).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

from fedsl.core.errors import DataError
from fedsl.core.rng import FONT_SERVER, FONT_TEST, font_images, offset_seed
from fedsl.sources.arrays import ArrayDataset, ImageSet, cached_arrays

# EMNIST Balanced label order: digits, upper case, then the 11 lower-case letters whose
# shape differs from their capital (c, i, j, k, l, m, o, p, s, u, v, w, x, y, z are merged).
EMNIST_BALANCED_CHARS: str = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabdefghnqrt"
DIGITS: str = "0123456789"

FONT_DIR: str = os.path.join(matplotlib.get_data_path(), "fonts", "ttf")

# Eight bundled fonts that all draw the 47 classes, chosen for diverse shapes:
# sans / serif / typewriter, regular / bold, upright / slanted, and three families
# (DejaVu, STIX = Times-like, Computer Modern). Left out: DejaVuSansMono (its zero has
# a dot in it, which no handwritten zero has), cmmi10 (old-style digits), cmr10/cmb10
# (near-duplicates of STIXGeneral / DejaVuSerif-Bold), STIX*Bol* (near-duplicates).
DEFAULT_FONTS: tuple[str, ...] = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Italic.ttf",
    "STIXGeneralItalic.ttf",
    "cmss10.ttf",
    "cmtt10.ttf",
)
# The FSLsyn recipe needs one font; an italic serif is the closest bundled thing to a
# cursive hand (matplotlib's own 'cursive' family has no bundled font at all).
FSLSYN_FONT: str = "DejaVuSerif-Italic.ttf"

_SS = 4  # supersampling: warp at 4x the output resolution, then area-average down
_BASE_FILL = 0.8  # base glyphs fill 80% of their canvas, leaving room for the blur
_BASE_BLUR = 0.75  # base-glyph blur in output pixels; the stroke threshold acts on it
_STROKE_T0 = 0.4  # threshold at stroke_noise=0: a bit below 0.5 thickens thin fonts slightly
_STROKE_SOFT = 0.15  # width of the soft threshold ramp (keeps edges antialiased)
_STROKE_NOISE_MAX = 0.25  # keeps the lowest threshold above the ramp, so background stays 0
_CHUNK = 512  # images warped at once; bounds memory (a few 25-50 MB tensors at 28x28)


# ----------------------------------------------------------------------------------
# fonts and base glyphs


def resolve_font(font: str) -> str:
    """Absolute path of ``font``: a path to a font file, or a file name in matplotlib's font dir."""
    if not isinstance(font, str) or not font:
        raise ValueError(f"font {font!r}: expected a font file path or a file name in {FONT_DIR}")
    for path in (font, os.path.join(FONT_DIR, font)):
        if os.path.isfile(path):
            return os.path.abspath(path)
    bundled = sorted(f for f in os.listdir(FONT_DIR) if f.endswith(".ttf"))
    raise ValueError(f"unknown font {font!r}: expected an existing font file path or one of {bundled}")


@functools.lru_cache(maxsize=None)
def _codepoints(path: str) -> frozenset[int]:
    # Pillow draws a missing glyph as a box (.notdef) without complaint, so coverage
    # is read from the font's cmap; fontTools is a dependency of matplotlib.
    from fontTools.ttLib import TTFont

    try:
        with TTFont(path, fontNumber=0, lazy=True) as f:
            return frozenset(f.getBestCmap() or {})
    except Exception as e:  # not a font file, or a broken one
        raise ValueError(f"font {path!r} could not be read as a TrueType/OpenType font: {e}") from None


def _check_font_draws(path: str, chars: str) -> None:
    cmap = _codepoints(path)
    missing = [c for c in chars if ord(c) not in cmap]
    if missing:
        raise ValueError(f"font {os.path.basename(path)!r} has no glyph for {''.join(missing)!r}; "
                         f"expected every character of {chars!r} to be drawable")
    for c in chars:  # a glyph can exist and still be blank (space, control chars)
        if _ink(path, c, 64).max() == 0:
            raise ValueError(f"character {c!r} draws nothing in font {os.path.basename(path)!r}; "
                             f"expected characters with visible ink")


@functools.lru_cache(maxsize=None)
def _ink(path: str, char: str, font_px: int) -> np.ndarray:
    """uint8 image of ``char`` at ``font_px`` pixels per em, cropped to its ink box."""
    font = ImageFont.truetype(path, font_px)
    left, top, right, bottom = font.getbbox(char)
    pad = 4  # antialiasing can spill a pixel outside the layout box
    img = Image.new("L", (right - left + 2 * pad, bottom - top + 2 * pad), 0)
    ImageDraw.Draw(img).text((pad - left, pad - top), char, fill=255, font=font)
    box = img.getbbox()
    return np.asarray(img.crop(box) if box else img.crop((0, 0, 1, 1)))


def _gauss_matrix(n_out: int, sigma: float, radius: int) -> np.ndarray:
    """[n_out, n_out + 2*radius] matrix that applies a 'valid' 1-D Gaussian blur."""
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    m = np.zeros((n_out, n_out + 2 * radius))
    for i in range(n_out):
        m[i, i:i + 2 * radius + 1] = k
    return m


@functools.lru_cache(maxsize=None)
def _base_glyph(path: str, char: str, canvas: int) -> tuple[np.ndarray, int, int]:
    """float32 [canvas, canvas] glyph in [0, 1]: ink box centred, its longer side
    ``_BASE_FILL * canvas``, blurred so that thresholding it thins/thickens strokes.
    Also returns the ink box's width and height in canvas pixels."""
    ink = Image.fromarray(_ink(path, char, 2 * canvas))  # render big, then shrink: smooth edges
    scale = _BASE_FILL * canvas / max(ink.size)
    w, h = max(1, round(ink.width * scale)), max(1, round(ink.height * scale))
    small = np.asarray(ink.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float64) / 255.0
    img = np.zeros((canvas, canvas))
    x0, y0 = (canvas - w) // 2, (canvas - h) // 2
    img[y0:y0 + h, x0:x0 + w] = small
    # The blur turns each edge into a ramp, so a threshold t < 0.5 moves edges out
    # (dilation) and t > 0.5 moves them in (erosion), smoothly and in a batch.
    sigma = _BASE_BLUR * _SS  # canvas is _SS x the output size
    r = math.ceil(3 * sigma)
    # torch's matmul rather than numpy's: it keeps to fedsl's thread setting, where numpy's OpenBLAS threads
    # busy-wait and, beside other busy processes, made a first run's rendering crawl (the float32 glyphs are equal)
    g = torch.from_numpy(_gauss_matrix(canvas, sigma, r))
    img = (g @ torch.from_numpy(np.pad(img, r)) @ g.T).numpy()
    return np.clip(img, 0, 1).astype(np.float32), w, h


# ----------------------------------------------------------------------------------
# validation


def _check_chars(chars: str) -> None:
    if not isinstance(chars, str) or not chars:
        raise ValueError(f"chars {chars!r}: expected a non-empty string of characters")
    dup = sorted({c for c in chars if chars.count(c) > 1})
    if dup:
        raise ValueError(f"chars {chars!r} repeats {''.join(dup)!r}; expected each class once")


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")


def _check_num(name: str, value: object, lo: float, hi: float = math.inf, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo}, {hi}{']' if math.isfinite(hi) else ')'}"
        raise ValueError(f"{name}={value!r}: expected a number in {rng}")


# ----------------------------------------------------------------------------------
# the generators


def make_font_chars(
    chars: str = DIGITS,
    per_class: int = 200,
    seed: int = 0,
    *,
    fonts: list[str] | None = None,
    rotation: tuple[float, float] = (-20, 20),
    sizes: tuple[float, ...] = (0.60, 0.70, 0.80),
    max_shift: float = 2.0,
    stroke_noise: float = 0.15,
    elastic_alpha: float = 2.0,
    elastic_sigma: float = 4.0,
    image_size: int = 28,
) -> tuple[np.ndarray, np.ndarray]:
    """Randomly varied font-rendered characters, EMNIST-like.

    Each image draws independently: a font from ``fonts``, a rotation uniform in
    ``rotation`` (degrees, positive = counter-clockwise), a glyph size from ``sizes``
    (the longer side of the glyph's ink box as a fraction of ``image_size``; the ink
    box is centred, as EMNIST does), a shift uniform in [-max_shift, max_shift]
    pixels per axis, a stroke-thickness change (a threshold on a blurred glyph, drawn
    uniform in 0.4 +- stroke_noise: lower is bolder; 0 = fixed thickness), and an
    elastic warp (Gaussian-smoothed random displacement field, smoothness
    ``elastic_sigma`` pixels, scaled so its largest displacement is ``elastic_alpha``
    pixels; 0 = none).
    The warp is done at 4x resolution and area-averaged down, so grey levels are
    antialiased. The default sizes (0.6-0.8) keep about 99% of rotated glyphs inside
    the frame; at size 0.9 and 10-20 degrees a glyph often touches the border.

    Args:
        chars: the classes, one character each; label i is ``chars[i]``.
        per_class: images per class.
        seed: seeds a numpy Generator that makes every random choice.
        fonts: font file paths or file names in matplotlib's font dir
            (default ``DEFAULT_FONTS``); each must draw every character of ``chars``.
        image_size: output side in pixels.

    Returns:
        ``(images, labels)``: uint8 [len(chars) * per_class, image_size, image_size],
        white on black, and int64 [n]. Class-major order (all of class 0, then class
        1, ...); shuffle downstream if needed. The same arguments give byte-identical
        arrays in any process.
    """
    _check_chars(chars)
    _check_int("per_class", per_class, 1)
    _check_int("seed", seed, 0)
    _check_int("image_size", image_size, 8)
    if isinstance(fonts, str):
        raise ValueError(f"fonts={fonts!r}: expected a list of fonts, e.g. [{fonts!r}]")
    fonts = list(DEFAULT_FONTS if fonts is None else fonts)
    if not fonts:
        raise ValueError("fonts=[]: expected at least one font (or None for the default fonts)")
    paths = [resolve_font(f) for f in fonts]
    for p in paths:
        _check_font_draws(p, chars)
    if not (isinstance(rotation, (tuple, list)) and len(rotation) == 2):
        raise ValueError(f"rotation={rotation!r}: expected a (low, high) pair of degrees")
    for r in rotation:
        _check_num("rotation", r, -180, 180)
    if rotation[0] > rotation[1]:
        raise ValueError(f"rotation={rotation!r}: expected low <= high")
    if not (isinstance(sizes, (tuple, list)) and len(sizes) > 0):
        raise ValueError(f"sizes={sizes!r}: expected a non-empty tuple of fractions in (0, 1]")
    for s in sizes:
        _check_num("sizes", s, 0, 1, lo_open=True)
    _check_num("max_shift", max_shift, 0, image_size / 2)
    _check_num("stroke_noise", stroke_noise, 0, _STROKE_NOISE_MAX)
    _check_num("elastic_alpha", elastic_alpha, 0)
    _check_num("elastic_sigma", elastic_sigma, 0, image_size, lo_open=True)

    n_cls, n_fonts, n = len(chars), len(paths), len(chars) * per_class
    hi = _SS * image_size  # warp resolution
    glyphs = [_base_glyph(p, c, hi) for p in paths for c in chars]
    base = torch.from_numpy(np.stack([g[0] for g in glyphs]))[:, None]
    box = np.array([g[1:] for g in glyphs], dtype=np.float64) * image_size / hi  # ink w, h in output px

    # Per-image parameters are drawn up front, then the elastic noise chunk by chunk;
    # both in a fixed order, so the chunk size cannot change what a seed means.
    rng = font_images(seed)
    labels = np.repeat(np.arange(n_cls, dtype=np.int64), per_class)
    glyph = rng.integers(0, n_fonts, n) * n_cls + labels  # row in `base`
    angle = np.deg2rad(rng.uniform(rotation[0], rotation[1], n))
    scale = np.asarray(sizes, dtype=np.float64)[rng.integers(0, len(sizes), n)] / _BASE_FILL
    shift = rng.uniform(-1, 1, (n, 2))
    thresh = _STROKE_T0 + stroke_noise * rng.uniform(-1, 1, n)

    # Narrow the shift where a big rotated glyph would be pushed out of the frame
    # (EMNIST glyphs are never cut), keeping the full max_shift for small ones.
    ac, as_ = np.abs(np.cos(angle)), np.abs(np.sin(angle))
    w, h = box[glyph, 0] * scale, box[glyph, 1] * scale
    half = np.stack([w * ac + h * as_, w * as_ + h * ac], -1) / 2  # half the rotated ink box, x and y
    room = np.clip(image_size / 2 - 1 - half, 0, max_shift)  # 1 px for thickening + antialiasing
    shift = shift * room * 2 / image_size  # pixels -> [-1, 1] units

    # affine_grid maps output coords to input coords, so theta is the inverse of
    # "scale, rotate, then shift". Rotation matrix is for y pointing down, so a
    # positive angle turns the glyph counter-clockwise on screen.
    cos, sin = np.cos(angle), np.sin(angle)
    inv = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2) / scale[:, None, None]
    theta = np.concatenate([inv, -(inv @ shift[:, :, None])], axis=2)
    theta = torch.from_numpy(theta.astype(np.float32))

    # Elastic field: white noise on a grid padded by the kernel radius, blurred with a
    # 'valid' Gaussian (as two matrix products), so there are no border effects.
    radius = math.ceil(3 * elastic_sigma)
    gm = torch.from_numpy(_gauss_matrix(image_size, elastic_sigma, radius).astype(np.float32))

    out = np.empty((n, image_size, image_size), dtype=np.uint8)
    for i0 in range(0, n, _CHUNK):
        i1 = min(i0 + _CHUNK, n)
        grid = F.affine_grid(theta[i0:i1], [i1 - i0, 1, hi, hi], align_corners=False)
        if elastic_alpha > 0:
            m = image_size + 2 * radius
            noise = torch.from_numpy(rng.standard_normal((i1 - i0, 2, m, m), dtype=np.float32))
            field = torch.einsum("ij,bcjk,lk->bcil", gm, noise, gm)
            # Scale each field so its largest displacement is alpha pixels: a Gaussian
            # field's tail would otherwise turn a few glyphs into blobs.
            peak = field.square().sum(1).amax((1, 2)).sqrt().clamp_min(1e-12)
            field = field * (elastic_alpha * 2 / image_size / peak)[:, None, None, None]  # -> [-1, 1] units
            field = F.interpolate(field, size=(hi, hi), mode="bilinear", align_corners=False)
            # Displace output coords before the affine map: A(p + d) + t = grid + A d.
            grid = grid + torch.einsum("bij,bjhw->bhwi", theta[i0:i1, :, :2], field)
        x = F.grid_sample(base[glyph[i0:i1]], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        t = torch.from_numpy(thresh[i0:i1].astype(np.float32))[:, None, None, None]
        x = ((x - t) / _STROKE_SOFT + 0.5).clamp(0, 1)
        x = F.avg_pool2d(x, _SS)  # area average: antialiased grey levels
        out[i0:i1] = (x[:, 0] * 255).round().to(torch.uint8).numpy()
    return out, labels


def fslsyn_chars(
    chars: str = EMNIST_BALANCED_CHARS,
    font: str | None = None,
    image_size: int = 28,
) -> tuple[np.ndarray, np.ndarray]:
    """The FSL paper's synthetic server set ("FSLsyn"), deterministic.

    Per class, 15 images: font sizes 100, 110, 120 pt x rotations -20, -10, 0, 10,
    20 degrees (positive = counter-clockwise), each drawn on a 2 x 2 inch (144 pt)
    canvas with the glyph's ink box centred, then resized to ``image_size`` by area
    averaging. The glyph size is relative to the font's em, so lower-case letters
    come out smaller than capitals, unlike ``make_font_chars``.

    Args:
        chars: the classes; label i is ``chars[i]``.
        font: a font file path or a file name in matplotlib's font dir
            (default ``FSLSYN_FONT``, an italic serif).
        image_size: output side in pixels.

    Returns:
        ``(images, labels)``: uint8 [15 * len(chars), image_size, image_size], white
        on black, and int64. Order: class, then font size, then rotation.
    """
    _check_chars(chars)
    _check_int("image_size", image_size, 8)
    path = resolve_font(FSLSYN_FONT if font is None else font)
    _check_font_draws(path, chars)

    canvas = 2 * _SS * image_size  # draw big so the final resize is a clean area average
    images, labels = [], []
    for label, c in enumerate(chars):
        for pt in (100, 110, 120):
            ink = Image.fromarray(_ink(path, c, round(pt / 144 * canvas)))
            img = Image.new("L", (canvas, canvas), 0)
            img.paste(ink, ((canvas - ink.width) // 2, (canvas - ink.height) // 2))
            for deg in (-20, -10, 0, 10, 20):
                rot = img.rotate(deg, resample=Image.Resampling.BICUBIC, fillcolor=0)
                images.append(np.asarray(rot.resize((image_size, image_size), Image.Resampling.BOX)))
                labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


# --------------------------------------------------------------------------- D0 sources (data.server_dataset)

def fslsyn_server(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's D0 source ``data.server_dataset = 'fslsyn'`` (``fedsl.data.registry``): FSLsyn's 15
    images of each of the clients' classes, which must be characters; deterministic (``seed`` unused)."""
    names = train.class_names
    bad = [c for c in names if len(c) != 1]
    if bad:
        raise DataError(f"data.server_dataset = 'fslsyn' draws characters, but the classes include {bad[:3]}; "
                        "use it with emnist or synthetic_chars")
    x, y = fslsyn_chars("".join(names), image_size=train.x.shape[1])
    return ImageSet(x, y, list(names))


def chars_server(d, train: ImageSet, seed: int, root: Path | None) -> ImageSet:
    """The registry's D0 source ``data.server_dataset = 'synthetic_chars'``: ``data.server_per_class`` (default
    15) font-rendered images of each of the clients' classes, drawn from the seed's ``FONT_SERVER`` stream."""
    names = train.class_names
    x, y = make_font_chars("".join(names), per_class=d.server_per_class or 15, seed=offset_seed(seed, FONT_SERVER),
                           image_size=train.x.shape[1])
    return ImageSet(x, y, list(names))


# --------------------------------------------------------------------------- data.dataset = 'synthetic_chars'

IMAGES_MAX = 1_000_000  # len(chars) × (train + test) images of one config (~1,000/s to render)


def synthetic_chars(chars: str, train_per_class: int, test_per_class: int, seed: int = 0) -> ArrayDataset:
    """Font-rendered characters (offline EMNIST stand-in); test images drawn from the seed's
    ``FONT_TEST`` stream (``fedsl.core.rng``), so they are not the training images."""
    recipe = {"chars": chars, "train": train_per_class, "test": test_per_class, "seed": seed, "v": 2}

    def build() -> dict[str, np.ndarray]:
        xtr, ytr = make_font_chars(chars, per_class=train_per_class, seed=seed)
        xte, yte = make_font_chars(chars, per_class=test_per_class, seed=offset_seed(seed, FONT_TEST))
        return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}

    a = cached_arrays("synthetic_chars", recipe, build)
    return ArrayDataset(ImageSet(a["x_train"], a["y_train"], list(chars)),
                        ImageSet(a["x_test"], a["y_test"], list(chars)))


def load(d, root) -> ArrayDataset:
    """The registry's loader of ``data.dataset = 'synthetic_chars'`` (``fedsl.data.registry``): classes
    ``data.chars``, ``data.train_per_class`` / ``data.test_per_class`` images each; no files."""
    return synthetic_chars(d.chars, d.train_per_class, d.test_per_class)


def check_config(d) -> str | None:
    """The registry's config check of ``data.dataset = 'synthetic_chars'``: what is wrong with data config
    ``d`` for it (one line), or None."""
    n = len(d.chars) * (d.train_per_class + d.test_per_class)
    if n > IMAGES_MAX:
        return (f"data.train_per_class = {d.train_per_class}, data.test_per_class = {d.test_per_class}: "
                f"{len(d.chars)} classes × {d.train_per_class + d.test_per_class} = {n} images to render; "
                f"expected at most {IMAGES_MAX} in all")
    if d.classes_per_client > len(d.chars):
        return (f"data.classes_per_client = {d.classes_per_client}: expected at most the {len(d.chars)} classes "
                "of data.chars")
    return None
