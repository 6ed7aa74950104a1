"""Metrics on hand-made accuracy curves: every expected value is worked out by hand here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsl.engine.metrics import (
    WINDOW,
    final_accuracy,
    first_round_reaching,
    mean_std,
    rise_time,
    rolling,
    rounds_to_accuracy,
    summarize,
    time_resolution,
)


def test_default_window_is_the_papers_20():
    assert WINDOW == 20


# --------------------------------------------------------------------------- rolling


def test_rolling_window3_consecutive_rounds():
    # r=1: {0.1}; r=2: {0.1, 0.2}; r=3: {0.1, 0.2, 0.3}; r=4: {0.2, 0.3, 0.4}
    out = rolling([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4], window=3)
    assert isinstance(out, np.ndarray) and out.shape == (4,)
    assert out == pytest.approx([0.1, 0.15, 0.2, 0.3])


def test_rolling_window1_is_identity():
    vals = [0.3, 0.1, 0.7, 0.2]
    assert rolling([1, 2, 3, 4], vals, window=1) == pytest.approx(vals)


def test_rolling_window_longer_than_curve_is_running_mean():
    # window 20 over 4 rounds: the partial window at the start is the running mean
    out = rolling([1, 2, 3, 4], [0.0, 1.0, 0.5, 0.5], window=20)
    assert out == pytest.approx([0.0, 0.5, 0.5, 0.5])


def test_rolling_every_other_round():
    # eval_every = 2, window 4: round r averages rounds r' in (r - 4, r]
    # r=2: (-2, 2] -> {2}       -> 0.1
    # r=4: ( 0, 4] -> {2, 4}    -> 0.15
    # r=6: ( 2, 6] -> {4, 6}    -> 0.25   (round 2 is out: 2 is not > 2)
    # r=8: ( 4, 8] -> {6, 8}    -> 0.35
    out = rolling([2, 4, 6, 8], [0.1, 0.2, 0.3, 0.4], window=4)
    assert out == pytest.approx([0.1, 0.15, 0.25, 0.35])


def test_rolling_every_other_round_odd_window():
    # window 3: (r - 3, r]; r=4: (1, 4] -> {2, 4}; r=6: (3, 6] -> {4, 6}; r=8: (5, 8] -> {6, 8}
    assert rolling([2, 4, 6, 8], [0.1, 0.2, 0.3, 0.4], window=3) == pytest.approx([0.1, 0.15, 0.25, 0.35])
    # window 5: (r - 5, r]; r=6: (1, 6] -> {2, 4, 6}; r=8: (3, 8] -> {4, 6, 8}
    assert rolling([2, 4, 6, 8], [0.1, 0.2, 0.3, 0.4], window=5) == pytest.approx([0.1, 0.15, 0.2, 0.3])
    # window 1 with eval_every 2: each round alone
    assert rolling([2, 4, 6, 8], [0.1, 0.2, 0.3, 0.4], window=1) == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_rolling_irregular_rounds():
    # rounds 1, 2, 10, 11 with window 5: r=10: (5, 10] -> {10}; r=11: (6, 11] -> {10, 11}
    out = rolling([1, 2, 10, 11], [1.0, 0.0, 0.25, 0.75], window=5)
    assert out == pytest.approx([1.0, 0.5, 0.25, 0.5])


def test_rolling_single_and_empty():
    assert rolling([7], [0.42], window=3) == pytest.approx([0.42])
    assert rolling([], [], window=3).shape == (0,)


def _naive_rolling(rounds, values, window):
    out = []
    for r in rounds:
        inside = [v for rr, v in zip(rounds, values) if r - window < rr <= r]
        out.append(sum(inside) / len(inside))
    return out


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=30),
    data=st.data(),
    window=st.integers(1, 25),
)
def test_rolling_matches_a_naive_loop(gaps, data, window):
    rounds = list(np.cumsum(gaps))
    values = data.draw(st.lists(st.floats(0, 1), min_size=len(rounds), max_size=len(rounds)))
    assert rolling(rounds, values, window) == pytest.approx(_naive_rolling(rounds, values, window), abs=1e-12)


# --------------------------------------------------------------------------- final accuracy


def test_final_accuracy():
    acc = [0.5, 0.5, 1.0, 1.0]
    assert final_accuracy([1, 2, 3, 4], acc, window=2) == pytest.approx(1.0)   # {1.0, 1.0}
    assert final_accuracy([1, 2, 3, 4], acc, window=3) == pytest.approx(2.5 / 3)  # {0.5, 1.0, 1.0}
    assert final_accuracy([1, 2, 3, 4], acc) == pytest.approx(0.75)            # default window 20: all four
    assert final_accuracy([1, 2, 3, 4], acc, window=1) == pytest.approx(1.0)
    # eval_every 2, window 4: last round 8 averages rounds {6, 8}
    assert final_accuracy([2, 4, 6, 8], [0.0, 0.0, 0.5, 1.0], window=4) == pytest.approx(0.75)
    assert isinstance(final_accuracy([1], [0.3]), float)


def test_final_accuracy_last_20_rounds_of_a_long_curve():
    # 100 rounds: 0.0 for rounds 1..70, 0.5 for 71..90, 1.0 for 91..100 -> last 20 = 10×0.5 + 10×1.0
    acc = [0.0] * 70 + [0.5] * 20 + [1.0] * 10
    assert final_accuracy(range(1, 101), acc) == pytest.approx(0.75)


def test_final_accuracy_empty_is_nan():
    assert math.isnan(final_accuracy([], []))


# --------------------------------------------------------------------------- rise time


def _step(n_zero: int, n_one: int, start: int = 1, every: int = 1):
    n = n_zero + n_one
    rounds = list(range(start, start + every * n, every))
    return rounds, [0.0] * n_zero + [1.0] * n_one


def test_rise_time_step_window1():
    # zeros at rounds 1..50, ones at 51..100; final = 1, 90% level = 0.9 -> round 51
    rounds, acc = _step(50, 50)
    assert rise_time(rounds, acc, window=1) == 51


def test_rise_time_step_window20():
    # rolling at round r in 51..70 is (r - 50)/20; final = 20/20 = 1.
    # (r - 50)/20 >= 0.9  <=>  r >= 68 (r = 67 gives 0.85).
    rounds, acc = _step(50, 50)
    assert rise_time(rounds, acc, window=20) == 68
    assert rise_time(rounds, acc) == 68  # default window is 20


def test_rise_time_step_window20_short_tail():
    # zeros at 1..30, ones at 31..40; final (rounds 21..40) = 10/20 = 0.5, level 0.45:
    # rolling at r in 31..40 is (r - 30)/20 >= 0.45 <=> r >= 39
    rounds, acc = _step(30, 10)
    assert rise_time(rounds, acc, window=20) == 39


def test_rise_time_step_every_other_round():
    # eval_every 2: rounds 2, 4, ..., 100; zeros at 2..50 (25 evals), ones at 52..100.
    # window 20 at round r covers (r - 20, r]: 10 evaluations once r >= 20.
    # r = 52 + 2k (k >= 0) holds k + 1 ones out of 10 -> (k + 1)/10 >= 0.9 <=> k >= 8 -> r = 68
    rounds, acc = _step(25, 25, start=2, every=2)
    assert rise_time(rounds, acc, window=20) == 68


def test_rise_time_custom_fraction():
    rounds, acc = _step(50, 50)
    # (r - 50)/20 >= 0.5 <=> r >= 60
    assert rise_time(rounds, acc, window=20, fraction=0.5) == 60


def test_rise_time_decreasing_curve_is_the_first_round():
    # the level is 90% of the *final* (lowest) value, reached at once
    assert rise_time([1, 2, 3, 4], [1.0, 0.75, 0.5, 0.25], window=1) == 1
    # window 2: rolling = [1.0, 0.875, 0.625, 0.375]; level 0.3375 -> round 1
    assert rise_time([1, 2, 3, 4], [1.0, 0.75, 0.5, 0.25], window=2) == 1
    # returns a round, not an index
    assert rise_time([5, 6, 7], [0.75, 0.5, 0.25], window=1) == 5


def test_rise_time_flat_zero_curve_is_the_first_round():
    # final = 0, level = 0: the first evaluated round
    assert rise_time([3, 6, 9], [0.0, 0.0, 0.0], window=3) == 3


def test_rise_time_dip_then_recover():
    # window 1: final 0.5, level 0.45: round 2 (0.5) is first; the dip at 3 does not matter
    assert rise_time([1, 2, 3, 4], [0.25, 0.5, 0.0, 0.5], window=1) == 2


def test_rise_time_empty_is_none():
    assert rise_time([], []) is None


# --------------------------------------------------------------------------- T_a


def test_rounds_to_accuracy():
    rounds = [1, 2, 3, 4, 5]
    acc = [0.25, 0.5, 0.75, 1.0, 1.0]
    # window 1: first value >= 0.5 at round 2
    assert rounds_to_accuracy(rounds, acc, 0.5, window=1) == 2
    # window 2: rolling = [0.25, 0.375, 0.625, 0.875, 1.0] -> 0.5 at round 3
    assert rounds_to_accuracy(rounds, acc, 0.5, window=2) == 3
    # window 3: rolling = [0.25, 0.375, 0.5, 0.75, 0.91666] -> 0.5 at round 3 (exactly 0.5 counts)
    assert rounds_to_accuracy(rounds, acc, 0.5, window=3) == 3
    assert rounds_to_accuracy(rounds, acc, 0.9, window=2) == 5


def test_rounds_to_accuracy_never_reached_is_none():
    assert rounds_to_accuracy([1, 2, 3], [0.1, 0.4, 0.45], 0.5, window=1) is None
    # a single spike above 0.5 is smoothed away by the window: rolling max = (0.0 + 0.75)/2
    assert rounds_to_accuracy([1, 2, 3, 4], [0.0, 0.0, 0.75, 0.0], 0.5, window=2) is None
    assert rounds_to_accuracy([1, 2, 3, 4], [0.0, 0.0, 0.75, 0.0], 0.5, window=1) == 3
    assert rounds_to_accuracy([], [], 0.5) is None


def test_first_round_reaching():
    assert first_round_reaching([10, 20, 30], [0.1, 0.6, 0.2], 0.5) == 20
    assert first_round_reaching([10, 20, 30], [0.1, 0.6, 0.2], 0.6) == 20  # >= level
    assert first_round_reaching([10, 20, 30], [0.1, 0.6, 0.2], 0.7) is None
    assert isinstance(first_round_reaching([10, 20], [0.0, 1.0], 0.5), int)


# --------------------------------------------------------------------------- summarize


def test_summarize_keys_and_values():
    rounds, acc = _step(50, 50)
    s = summarize(rounds, acc)
    assert set(s) == {"final_accuracy", "rise_time", "time_resolution", "T_0.5"}
    assert s["final_accuracy"] == pytest.approx(1.0)
    assert s["rise_time"] == 68
    # (r - 50)/20 >= 0.5 <=> r >= 60
    assert s["T_0.5"] == 60


def test_summarize_several_levels():
    rounds, acc = _step(50, 50)
    s = summarize(rounds, acc, window=20, levels=(0.25, 0.5, 0.95, 1.5))
    assert set(s) == {"final_accuracy", "rise_time", "time_resolution", "T_0.25", "T_0.5", "T_0.95", "T_1.5"}
    assert s["T_0.25"] == 55   # (r - 50)/20 >= 0.25 <=> r >= 55
    assert s["T_0.5"] == 60
    assert s["T_0.95"] == 69   # 19/20
    assert s["T_1.5"] is None
    assert set(summarize(rounds, acc, levels=())) == {"final_accuracy", "rise_time", "time_resolution"}


def test_summarize_empty_curve():
    s = summarize([], [])
    assert math.isnan(s["final_accuracy"]) and s["rise_time"] is None and s["T_0.5"] is None


# --------------------------------------------------------------------------- mean_std


def test_mean_std_sample():
    m, s = mean_std([1.0, 2.0, 3.0, 4.0])
    assert m == pytest.approx(2.5)
    assert s == pytest.approx(math.sqrt(5 / 3))  # sample std: sqrt((2.25+0.25+0.25+2.25)/(4 - 1))


def test_mean_std_ignores_none():
    m, s = mean_std([1.0, None, 3.0, None])
    assert m == pytest.approx(2.0) and s == pytest.approx(math.sqrt(2))
    m, s = mean_std([None, 5])
    assert m == pytest.approx(5.0) and s == pytest.approx(0.0)
    assert all(isinstance(x, float) for x in mean_std([1, 2]))


def test_mean_std_all_none_or_empty_is_nan():
    for values in ([None, None], [None], []):
        m, s = mean_std(values)
        assert math.isnan(m) and math.isnan(s)


def test_mean_std_of_rise_times_with_a_missing_seed():
    # typical use: rise times per seed, one seed never rose (None)
    m, s = mean_std([60, 70, None])
    assert m == pytest.approx(65.0) and s == pytest.approx(math.sqrt(50))


# --------------------------------------------------------------------------- errors


FUNCS = [
    lambda r, v, w=3: rolling(r, v, w),
    lambda r, v, w=3: final_accuracy(r, v, w),
    lambda r, v, w=3: rise_time(r, v, w),
    lambda r, v, w=3: rounds_to_accuracy(r, v, 0.5, w),
    lambda r, v, w=3: summarize(r, v, w),
]
NAMES = ["rolling", "final_accuracy", "rise_time", "rounds_to_accuracy", "summarize"]


@pytest.mark.parametrize("f", FUNCS, ids=NAMES)
def test_mismatched_lengths(f):
    with pytest.raises(ValueError, match="equal length"):
        f([1, 2, 3], [0.1, 0.2])
    with pytest.raises(ValueError, match="equal length"):
        f([1, 2], [0.1, 0.2, 0.3])


@pytest.mark.parametrize("f", FUNCS, ids=NAMES)
def test_mismatched_lengths_with_empty_values(f):
    with pytest.raises(ValueError, match="equal length"):
        f([1, 2], [])


@pytest.mark.parametrize("f", FUNCS, ids=NAMES)
def test_window_below_one_on_empty_curve(f):
    with pytest.raises(ValueError, match="window"):
        f([], [], 0)


@pytest.mark.parametrize("f", FUNCS, ids=NAMES)
def test_non_increasing_rounds(f):
    with pytest.raises(ValueError, match="strictly increasing"):
        f([1, 2, 2, 3], [0.1, 0.2, 0.3, 0.4])  # repeated round
    with pytest.raises(ValueError, match="strictly increasing"):
        f([1, 3, 2], [0.1, 0.2, 0.3])  # decreasing


def test_first_round_reaching_validates_too():
    with pytest.raises(ValueError):
        first_round_reaching([1, 2], [0.1], 0.5)
    with pytest.raises(ValueError):
        first_round_reaching([2, 1], [0.1, 0.2], 0.5)


def test_two_dimensional_input_rejected():
    with pytest.raises(ValueError):
        rolling([[1, 2], [3, 4]], [[0.1, 0.2], [0.3, 0.4]], 2)


@pytest.mark.parametrize("window", [0, -1, -20])
@pytest.mark.parametrize("f", [rolling, final_accuracy, rise_time], ids=["rolling", "final_accuracy", "rise_time"])
def test_window_below_one(f, window):
    with pytest.raises(ValueError, match="window"):
        f([1, 2, 3], [0.1, 0.2, 0.3], window)


def test_window_below_one_via_t_a_and_summarize():
    with pytest.raises(ValueError, match="window"):
        rounds_to_accuracy([1, 2], [0.1, 0.2], 0.5, window=0)
    with pytest.raises(ValueError, match="window"):
        summarize([1, 2], [0.1, 0.2], window=0)


def test_a_windows_mean_depends_only_on_the_values_inside_it():
    """Sparse evaluation keeps the final accuracy exact: the last window's mean from a curve evaluated every
    round equals, bit for bit, the mean from a curve that shares only that window (a cumulative sum carries
    the round-off of the 980 values before it, and differs in the last bits)."""
    rng = np.random.default_rng(0)
    acc = rng.uniform(0.3, 0.7, 1000)
    every = list(range(1, 1001))
    sparse = list(range(10, 981, 10)) + list(range(981, 1001))
    sparse_acc = acc[np.asarray(sparse) - 1]
    assert final_accuracy(every, acc) == final_accuracy(sparse, sparse_acc) == sum(acc[-20:].tolist()) / 20
    assert rolling(every, acc)[-20:].tolist() == rolling(every[-39:], acc[-39:])[-20:].tolist()
    assert time_resolution(sparse) == 10 and time_resolution(every) == 1 and time_resolution([5]) is None
