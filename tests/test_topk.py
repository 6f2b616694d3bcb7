"""The top-k entropy estimator against exact entropies (scipy.stats.entropy) of random distributions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy as exact_entropy

from entropy_law.traces.topk import TopkInputError, pad_topk, topk_entropy, topk_problems

TOL = 1e-9


def distribution(seed: int, vocab: int, concentration: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, concentration))
    p = np.maximum(p, 1e-300)
    return p / p.sum()


def top(p: np.ndarray, k: int) -> np.ndarray:
    return np.log(np.sort(p)[::-1][:k])


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(1, 60), concentration=st.floats(0.01, 5.0),
       k_share=st.floats(0.0, 1.0))
def test_the_exact_entropy_lies_within_the_bounds_and_they_tighten_with_k(seed, vocab, concentration, k_share):
    p = distribution(seed, vocab, concentration)
    h = exact_entropy(p)
    previous_lower, previous_upper = -np.inf, np.inf
    for k in range(1, vocab + 1):
        est = topk_entropy(top(p, k), vocab)
        lower, upper, point = est.lower_nats[0], est.upper_nats[0], est.estimate_nats[0]
        assert lower - TOL <= h <= upper + TOL, (k, lower, h, upper)
        assert lower <= point <= upper
        assert lower >= previous_lower - TOL and upper <= previous_upper + TOL  # a longer list never loosens
        previous_lower, previous_upper = lower, upper
    assert previous_lower == pytest.approx(h, abs=1e-9) and previous_upper == pytest.approx(h, abs=1e-9)  # k = V
    k = max(1, round(k_share * vocab))
    midpoint = topk_entropy(top(p, k), vocab, point="midpoint")
    assert midpoint.estimate_nats[0] == pytest.approx((midpoint.lower_nats[0] + midpoint.upper_nats[0]) / 2)


@settings(max_examples=100, deadline=None)
@given(pk=st.floats(0.01, 0.3), n_top=st.integers(1, 5), tail_tokens=st.integers(2, 40), fill=st.floats(0.05, 1.0))
def test_both_bounds_are_attained(pk, n_top, tail_tokens, fill):
    """The packed tail (as many tokens at p_k as fit, one remainder) and the uniform tail are distributions with
    the given top k: the bounds are their entropies, so no bound from the top k alone is tighter."""
    head = np.linspace(min(1.0, pk * 2), pk, n_top)
    head = head / head.sum() * min(head.sum(), 0.6)
    pk = head[-1]
    tail = min(1.0 - head.sum(), tail_tokens * pk * fill)
    head_and_rest = 1.0 - tail
    head = head / head.sum() * head_and_rest  # top k scaled so the tail is exactly `tail`
    pk = head[-1]
    if tail > tail_tokens * pk:
        return
    vocab = n_top + tail_tokens
    n, r = int(np.floor(tail / pk)), tail - np.floor(tail / pk) * pk
    packed = np.concatenate([head, np.full(n, pk), [r], np.zeros(tail_tokens - n - 1)])
    uniform = np.concatenate([head, np.full(tail_tokens, tail / tail_tokens)])
    est = topk_entropy(np.log(head), vocab)
    assert est.lower_nats[0] == pytest.approx(exact_entropy(packed), abs=1e-9)
    assert est.upper_nats[0] == pytest.approx(exact_entropy(uniform), abs=1e-9)


def test_vectorised_over_positions_with_fewer_entries_padded():
    rng = np.random.default_rng(0)
    ps = [distribution(int(s), 30, 0.3) for s in rng.integers(0, 1000, size=8)]
    ks = [1, 3, 5, 5, 2, 30, 7, 4]
    rows = [top(p, k) for p, k in zip(ps, ks)]
    together = topk_entropy(pad_topk(rows), 30)
    for i, (row, k) in enumerate(zip(rows, ks)):
        alone = topk_entropy(row[::-1], 30)  # any order
        assert together.k[i] == k
        for name in ("lower_nats", "upper_nats", "estimate_nats", "tail_mass", "top1_prob"):
            assert getattr(together, name)[i] == pytest.approx(getattr(alone, name)[0])
        assert together.lower_nats[i] - TOL <= exact_entropy(ps[i]) <= together.upper_nats[i] + TOL
    assert np.isnan(together.top2_prob[0]) and together.top2_prob[1] == pytest.approx(np.sort(ps[1])[-2])


def test_large_vocabulary_and_a_point_mass():
    est = topk_entropy([[0.0, -np.inf]], 151_936)
    assert est.lower_nats[0] == est.upper_nats[0] == est.estimate_nats[0] == 0.0
    lp = np.log([0.5, 0.2, 0.1])
    est = topk_entropy(lp, 151_936)
    t = 0.2
    assert est.upper_nats[0] == pytest.approx(exact_entropy([0.5, 0.2, 0.1]) * 0.8 + 0.8 * np.log(1 / 0.8)
                                              + t * np.log((151_936 - 3) / t))
    assert est.lower_nats[0] < est.estimate_nats[0] < est.upper_nats[0]


@pytest.mark.parametrize("row, match", [
    ([np.nan, -1.0], "NaN"), ([0.5, -1.0], "above 0"), ([np.log(0.7), np.log(0.6)], "sum to"),
    ([-np.inf, -np.inf], "no log-probability"), ([np.log(0.1), np.log(0.05)], "cannot lie on the other"),
])
def test_bad_input_names_the_position_and_the_problem(row, match):
    good = [np.log(0.5), np.log(0.25)]
    with pytest.raises(TopkInputError, match=match) as err:
        topk_entropy([good, row], 10)
    assert err.value.row == 1
    assert [r for r, _ in topk_problems([good, row, good], 10)] == [1]


def test_rounding_above_one_within_the_tolerance_is_accepted():
    est = topk_entropy(np.log([0.6, 0.4004]), 2)
    assert est.tail_mass[0] == 0 and est.lower_nats[0] == est.upper_nats[0]
