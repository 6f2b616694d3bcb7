"""Trace statistics: fp32 target/draft statistics against independent float64 / scipy computations."""

import numpy as np
import pytest
import scipy.special
import scipy.stats

from entropy_law.traces.stats import draft_stats, target_stats_from_logits


def _logits(seed: int, rows: int = 6, vocab: int = 49152) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, size=(rows, vocab)).astype(np.float32)
    logits[1, 123] += 40.0  # nearly deterministic row (entropy close to 0)
    logits[2] = 0.0  # uniform row: entropy = log V
    logits[3, :10] = 25.0  # ten-way tie at the top: gap 0, top1 == top2
    logits[4, 5:] = -np.inf  # only 5 tokens allowed
    return logits


def _reference(logits: np.ndarray) -> dict[str, np.ndarray]:
    z = logits.astype(np.float64)
    p = scipy.special.softmax(z, axis=1)
    top = np.sort(z, axis=1)[:, ::-1][:, :2]
    psort = np.sort(p, axis=1)[:, ::-1]
    return {
        "entropy_nats": scipy.stats.entropy(p, axis=1),
        "renyi2_nats": -np.log(np.sum(p**2, axis=1)),
        "top1_prob": psort[:, 0],
        "top2_prob": psort[:, 1],
        "logit_gap": top[:, 0] - top[:, 1],
    }


def test_target_entropy_matches_scipy_within_1e5():
    logits = _logits(0)
    got = target_stats_from_logits(logits)
    want = _reference(logits)
    assert got["entropy_nats"].dtype == np.float32
    np.testing.assert_allclose(got["entropy_nats"], want["entropy_nats"], rtol=0, atol=1e-5)
    assert abs(got["entropy_nats"][2] - np.log(49152)) < 1e-5
    assert got["entropy_nats"][1] < 1e-3


@pytest.mark.parametrize("key", ["renyi2_nats", "top1_prob", "top2_prob", "logit_gap"])
def test_other_target_stats_match_float64(key):
    logits = _logits(1)
    got = target_stats_from_logits(logits)
    want = _reference(logits)
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)


def test_renyi_ordering_and_ties():
    got = target_stats_from_logits(_logits(2))
    assert np.all(got["renyi2_nats"] <= got["entropy_nats"] + 1e-6)  # H2 <= H1
    assert got["logit_gap"][3] == 0 and got["top1_prob"][3] == got["top2_prob"][3]
    assert abs(got["entropy_nats"][3] - np.log(10)) < 1e-3  # ten tied tokens hold nearly all mass


def test_torch_tensor_input_equals_numpy():
    import torch  # only this test needs torch (slow to import); the traces layer never imports it
    logits = _logits(3, rows=6, vocab=300)
    tensor = torch.tensor(logits, requires_grad=True)
    got = target_stats_from_logits(tensor)
    want = target_stats_from_logits(logits)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_target_stats_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        target_stats_from_logits(np.zeros(10))
    bad = np.zeros((2, 5), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN.*row 1"):
        target_stats_from_logits(bad)
    with pytest.raises(ValueError, match="entirely -inf"):
        target_stats_from_logits(np.full((1, 4), -np.inf))


def test_draft_stats_full_logits_match_float64():
    rng = np.random.default_rng(4)
    draft = rng.normal(0, 2, size=(3, 500)).astype(np.float32)
    committed = np.array([7, 499, 0, 42])  # 4 tokens, draft has 3 rows: the last is beyond the draft
    got = draft_stats(draft, committed)
    p = scipy.special.softmax(draft.astype(np.float64), axis=1)
    for d in range(3):
        tok = committed[d]
        assert abs(got["prob"][d] - p[d, tok]) < 1e-6
        assert got["rank"][d] == np.sum(p[d] > p[d, tok])  # independent: count of more likely tokens
        assert abs(got["entropy_nats"][d] - scipy.stats.entropy(p[d])) < 1e-5
        assert abs(got["top1_prob"][d] - p[d].max()) < 1e-6
    assert np.isnan(got["prob"][3]) and np.isnan(got["rank"][3]) and np.isnan(got["entropy_nats"][3])
    assert np.isnan(got["top1_prob"][3])


def test_draft_stats_candidates():
    cands = np.array([[5, 9, 0], [3, 4, 0]])
    logprobs = np.array([[-0.1, -2.5, -np.inf], [-0.7, -0.9, -np.inf]])
    got = draft_stats(committed_ids=[9, 0, 11], candidates=cands, candidate_logprobs=logprobs)
    assert got["rank"][0] == 1 and abs(got["prob"][0] - np.exp(-2.5)) < 1e-6
    # token 0 sits only in a padded (-inf) slot: not among the candidates
    assert got["rank"][1] == -1 and np.isnan(got["prob"][1])
    assert np.isnan(got["rank"][2])  # beyond the draft's depth: null
    assert np.all(np.isnan(got["entropy_nats"]))
    # the top proposal's probability is known whatever was committed: rows 0 and 1 of the draft, null beyond
    np.testing.assert_allclose(got["top1_prob"][:2], np.exp([-0.1, -0.7]), rtol=1e-6)
    assert np.isnan(got["top1_prob"][2])
    no_lp = draft_stats(committed_ids=[5, 4], candidates=cands)
    assert no_lp["rank"].tolist() == [0, 1] and np.all(np.isnan(no_lp["prob"])) and np.all(np.isnan(no_lp["top1_prob"]))
    none = draft_stats(committed_ids=[1, 2])
    assert np.all(np.isnan(none["rank"]))
    with pytest.raises(ValueError, match="shape"):
        draft_stats(committed_ids=[1], candidates=cands, candidate_logprobs=logprobs[:, :2])
