"""Font-rendered character generator (offline EMNIST stand-in)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fedsl.sources.synthetic import (
    DEFAULT_FONTS,
    DIGITS,
    EMNIST_BALANCED_CHARS,
    fslsyn_chars,
    make_font_chars,
)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture(scope="module")
def digits():
    return make_font_chars(DIGITS, per_class=60, seed=0)


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()


def _class_means(x: np.ndarray, y: np.ndarray, n_cls: int) -> np.ndarray:
    f = x.reshape(len(x), -1).astype(np.float64) / 255
    return np.stack([f[y == c].mean(0) for c in range(n_cls)])


def test_charsets():
    assert DIGITS == "0123456789"
    assert len(EMNIST_BALANCED_CHARS) == 47 and len(set(EMNIST_BALANCED_CHARS)) == 47
    assert EMNIST_BALANCED_CHARS.startswith(DIGITS + "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert EMNIST_BALANCED_CHARS.endswith("abdefghnqrt")


def test_shapes_dtypes_labels(digits):
    x, y = digits
    assert x.shape == (600, 28, 28) and x.dtype == np.uint8
    assert y.shape == (600,) and y.dtype == np.int64
    assert np.array_equal(np.bincount(y), np.full(10, 60))
    assert np.all(np.diff(y) >= 0)  # class-major order
    x, y = make_font_chars("AB", per_class=3, image_size=32)
    assert x.shape == (6, 32, 32) and list(y) == [0, 0, 0, 1, 1, 1]


def test_deterministic_and_seed_matters(digits):
    x, y = make_font_chars(DIGITS, per_class=60, seed=0)
    assert np.array_equal(x, digits[0]) and np.array_equal(y, digits[1])
    x1, y1 = make_font_chars(DIGITS, per_class=60, seed=1)
    assert np.array_equal(y1, y) and not np.array_equal(x1, x)
    assert (x1 != x).mean() > 0.1


def test_deterministic_across_processes():
    # A fresh interpreter with a different thread count must give the same bytes.
    code = (
        "import hashlib, torch; torch.set_num_threads(1)\n"
        "from fedsl.sources.synthetic import make_font_chars, fslsyn_chars\n"
        "h = hashlib.sha256()\n"
        "for a in (*make_font_chars('0aZ', 40, 7), *fslsyn_chars('0aZ')): h.update(a.tobytes())\n"
        "print(h.hexdigest())\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _sha(*make_font_chars("0aZ", 40, 7), *fslsyn_chars("0aZ"))


def test_not_blank_and_centred(digits):
    x, _ = digits
    f = x.astype(np.float64)
    assert (x.max(axis=(1, 2)) >= 200).all()  # every glyph has solid strokes
    ink = (x > 127).mean(axis=(1, 2))
    assert (ink > 0.03).all() and (ink < 0.6).all()
    r = np.arange(28)
    cy = (f.sum(2) * r).sum(1) / f.sum((1, 2))
    cx = (f.sum(1) * r).sum(1) / f.sum((1, 2))
    assert abs(cy.mean() - 13.5) < 1.0 and abs(cx.mean() - 13.5) < 1.0
    assert (np.abs(cy - 13.5) < 6).all() and (np.abs(cx - 13.5) < 6).all()
    assert x[:, 0, :].mean() < 10 and x[:, :, 0].mean() < 10  # background at the border


@pytest.mark.parametrize("make", [
    lambda: make_font_chars("7F", per_class=40, seed=0),
    lambda: fslsyn_chars("7F"),
])
def test_upright_not_transposed(make):
    x, y = make()
    m = _class_means(x, y, 2).reshape(2, 28, 28)
    seven, eff = m
    assert seven[:14].sum() > 1.3 * seven[14:].sum()  # the 7's bar is at the top
    assert eff[:, :14].sum() > 1.3 * eff[:, 14:].sum()  # the F's stem is on the left


def test_positive_rotation_is_counter_clockwise():
    def tilt(img):  # x-centroid of the top half minus that of the bottom half
        f, r = img.astype(np.float64), np.arange(28)
        return (f[:14] * r).sum() / f[:14].sum() - (f[14:] * r).sum() / f[14:].sum()

    fixed = dict(fonts=["DejaVuSans.ttf"], max_shift=0, stroke_noise=0, elastic_alpha=0)
    ccw = make_font_chars("I", 1, rotation=(20, 20), **fixed)[0][0]
    cw = make_font_chars("I", 1, rotation=(-20, -20), **fixed)[0][0]
    assert tilt(ccw) < -2 and tilt(cw) > 2
    fsl = fslsyn_chars("I", font="DejaVuSans.ttf")[0]  # rotations -20, -10, 0, 10, 20
    assert tilt(fsl[4]) < -2 and tilt(fsl[0]) > 2


def test_no_randomness_when_all_variation_is_off():
    x, y = make_font_chars("0A", 5, seed=3, fonts=["DejaVuSans.ttf"], rotation=(0, 0), sizes=(0.8,),
                           max_shift=0, stroke_noise=0, elastic_alpha=0)
    assert (x[y == 0] == x[0]).all() and (x[y == 1] == x[5]).all() and not np.array_equal(x[0], x[5])


def test_classes_differ_more_than_halves_of_a_class():
    x, y = make_font_chars(DIGITS, per_class=100, seed=0)
    a = _class_means(x[0::2], y[0::2], 10)
    b = _class_means(x[1::2], y[1::2], 10)
    within = np.linalg.norm(a - b, axis=1)  # split-half distance per class
    m = (a + b) / 2
    between = np.linalg.norm(m[:, None] - m[None], axis=2)[~np.eye(10, dtype=bool)]
    assert np.linalg.norm(m[0] - m[1]) > 2 * max(within[0], within[1])
    assert between.min() > within.max()


def test_nearest_centroid_learns_but_is_not_trivial():
    xtr, ytr = make_font_chars(DIGITS, per_class=100, seed=0)
    xte, yte = make_font_chars(DIGITS, per_class=50, seed=1)
    c = _class_means(xtr, ytr, 10)
    f = xte.reshape(len(xte), -1).astype(np.float64) / 255
    pred = ((f[:, None] - c[None]) ** 2).sum(-1).argmin(1)
    acc = (pred == yte).mean()
    assert 0.5 < acc < 0.98, acc


def test_every_default_font_draws_all_47_classes():
    for font in DEFAULT_FONTS:
        x, _ = make_font_chars(EMNIST_BALANCED_CHARS, 1, fonts=[font], elastic_alpha=0)
        assert (x.max(axis=(1, 2)) >= 200).all(), font


def test_font_by_path_and_by_name_agree():
    import matplotlib

    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSerif.ttf")
    a = make_font_chars("0a", 4, fonts=["DejaVuSerif.ttf"])
    b = make_font_chars("0a", 4, fonts=[path])
    assert np.array_equal(a[0], b[0])


def test_fslsyn():
    x, y = fslsyn_chars()
    assert x.shape == (15 * 47, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.array_equal(np.bincount(y), np.full(47, 15))
    assert np.array_equal(y, np.repeat(np.arange(47), 15))
    x2, y2 = fslsyn_chars()
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert (x.max(axis=(1, 2)) >= 128).all()
    # Order within a class: font size 100, 110, 120 pt, each at 5 rotations; rotation 0
    # is index 2 of each size block. Bigger font, more ink.
    mass = x.reshape(47, 3, 5, -1).astype(np.float64).sum(-1)
    assert (mass[:, 0, 2] < mass[:, 1, 2]).all() and (mass[:, 1, 2] < mass[:, 2, 2]).all()
    # Fifteen distinct images per class.
    flat = x.reshape(47, 15, -1)
    assert all(len({im.tobytes() for im in cls}) == 15 for cls in flat)
    other = fslsyn_chars(DIGITS, font="DejaVuSans.ttf")[0]
    assert other.shape == (150, 28, 28) and not np.array_equal(other, x[:150])


@pytest.mark.parametrize("kwargs, expect", [
    (dict(per_class=0), "per_class=0"),
    (dict(per_class=2.5), "per_class=2.5"),
    (dict(chars=""), "chars ''"),
    (dict(chars="011"), "'1'"),
    (dict(chars="0\u4e2d"), "'\u4e2d'"),
    (dict(chars="0 "), "' '"),
    (dict(seed=-1), "seed=-1"),
    (dict(fonts=["NoSuchFont.ttf"]), "NoSuchFont.ttf"),
    (dict(fonts=[]), "fonts=[]"),
    (dict(fonts="DejaVuSans.ttf"), "fonts='DejaVuSans.ttf'"),
    (dict(rotation=(20, -20)), "rotation=(20, -20)"),
    (dict(rotation=(-200, 0)), "-200"),
    (dict(rotation=(5,)), "rotation=(5,)"),
    (dict(sizes=()), "sizes=()"),
    (dict(sizes=(0.8, 1.5)), "1.5"),
    (dict(max_shift=-1.0), "max_shift=-1.0"),
    (dict(stroke_noise=0.5), "stroke_noise=0.5"),
    (dict(elastic_alpha=-2.0), "elastic_alpha=-2.0"),
    (dict(elastic_sigma=0.0), "elastic_sigma=0.0"),
    (dict(elastic_alpha=float("nan")), "elastic_alpha=nan"),
    (dict(image_size=4), "image_size=4"),
])
def test_make_font_chars_rejects_bad_input(kwargs, expect):
    args = dict(chars=DIGITS, per_class=2) | kwargs
    with pytest.raises(ValueError, match=re.escape(expect)):
        make_font_chars(**args)


def test_non_font_file_is_rejected(tmp_path):
    bogus = tmp_path / "bogus.ttf"
    bogus.write_text("not a font")
    with pytest.raises(ValueError, match="bogus.ttf"):
        make_font_chars("0", 1, fonts=[str(bogus)])


@pytest.mark.parametrize("kwargs, expect", [
    (dict(font="nope.ttf"), "nope.ttf"),
    (dict(chars=""), "chars ''"),
    (dict(chars="A\u4e2d"), "'\u4e2d'"),
    (dict(image_size=0), "image_size=0"),
])
def test_fslsyn_rejects_bad_input(kwargs, expect):
    with pytest.raises(ValueError, match=re.escape(expect)):
        fslsyn_chars(**kwargs)
