"""NgramDrafter: matches against a naive scan, incremental indexing, calibration counts, the protocol."""

import math

import numpy as np
import pytest
import torch

from entropy_law.decoding.interface import Drafter
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.decoding.tree import build_tree, chain_tree, expected_accepted


def naive_matches(tokens, max_ngram, min_ngram, max_matches):
    """Rescan the whole context: (best n, match ends), longest n first, most recent first."""
    ends, best = [], 0
    T = len(tokens)
    for n in range(min(max_ngram, T), min_ngram - 1, -1):
        suffix = tokens[T - n:]
        for j in range(T - 2, n - 2, -1):
            if tokens[j - n + 1:j + 1] == suffix and j not in ends:
                ends.append(j)
                best = best or n
                if len(ends) == max_matches:
                    return best, ends
    return best, ends


def naive_continuation(tokens, end, length):
    """Copy what followed ``end``, appending copied tokens as we go (handles overlap with the root)."""
    ext = list(tokens)
    root = len(tokens) - 1
    for d in range(1, length + 1):
        ext.append(ext[end + d])
    return ext[root + 1:]


def test_is_a_drafter_and_reports_config():
    drafter = NgramDrafter(max_ngram=3, block_size=6)
    assert isinstance(drafter, Drafter)
    assert drafter.feature_layers == () and drafter.block_size == 6
    assert drafter.config["max_ngram"] == 3
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="block_size"):
        NgramDrafter(block_size=1)


@pytest.mark.parametrize("seed", range(25))
def test_candidates_match_naive_scan(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 9))  # small vocabularies -> many matches and overlaps
    tokens = rng.integers(0, vocab, size=int(rng.integers(2, 60))).tolist()
    max_ngram, max_matches, block = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(2, 9))
    drafter = NgramDrafter(max_ngram=max_ngram, min_ngram=1, block_size=block, max_matches=max_matches,
                           min_path_prob=0.0)
    drafter.begin(tokens[:1], None)
    proposal = drafter.propose(tokens, None)
    best_n, ends = naive_matches(tokens, max_ngram, 1, max_matches)
    if not ends:
        assert proposal.depth == 0
        return
    conts = [naive_continuation(tokens, end, block - 1) for end in ends]
    assert proposal.depth == block - 1
    assert chain_tree(proposal).tokens == tuple(conts[0])  # the chain follows the best match
    for d in range(block - 1):
        finite = proposal.logprobs[d] > -math.inf
        row = proposal.tokens[d][finite].tolist()
        assert set(row) == {c[d] for c in conts}  # every match contributes, nothing else
        assert row[0] == conts[0][d]
        lp = proposal.logprobs[d][finite]
        assert torch.all(lp[:-1] >= lp[1:])  # sorted best first
        assert torch.all(lp <= 0)
        assert len(set(proposal.tokens[d].tolist())) == proposal.tokens.shape[1]  # padding distinct too


def test_incremental_index_equals_fresh_scan():
    rng = np.random.default_rng(3)
    sequence = rng.integers(0, 6, size=200).tolist()
    incremental = NgramDrafter(max_ngram=3, block_size=5, max_matches=3, min_path_prob=0.0)
    incremental.begin(sequence[:10], None)
    cut = 10
    while cut < len(sequence):
        got = incremental.propose(sequence[:cut], None)
        fresh = NgramDrafter(max_ngram=3, block_size=5, max_matches=3, min_path_prob=0.0)
        fresh.begin(sequence[:cut], None)
        expected = fresh.propose(sequence[:cut], None)
        assert torch.equal(got.tokens, expected.tokens)
        cut += int(rng.integers(1, 6))


def test_no_match_and_tiny_context_give_empty_proposals():
    drafter = NgramDrafter()
    drafter.begin([5], None)
    assert drafter.propose([5], None).depth == 0
    assert drafter.propose([5, 6, 7], None).depth == 0
    assert drafter.propose([], None).depth == 0


def test_context_that_is_not_a_continuation_starts_over():
    drafter = NgramDrafter(max_ngram=2, block_size=3, min_path_prob=0.0)
    drafter.begin([1, 2, 3, 1], None)
    assert drafter.propose([1, 2, 3, 1], None).tokens[:, 0].tolist() == [2, 3]
    # a different context without begin(): old n-grams must not leak into the new one
    assert drafter.propose([7, 8, 9, 7], None).tokens[:, 0].tolist() == [8, 9]


def simulate_chain_rounds(drafter, sequence, prompt_len):
    """Walk a known sequence as a decoder would with chain trees; return each round's proposal/root."""
    drafter.begin(sequence[:prompt_len], None)
    root = prompt_len - 1
    records = []
    while root < len(sequence) - 1:
        proposal = drafter.propose(sequence[:root + 1], None)
        chain = chain_tree(proposal).tokens
        accepted = 0
        while accepted < len(chain) and root + 1 + accepted < len(sequence) \
                and sequence[root + 1 + accepted] == chain[accepted]:
            accepted += 1
        records.append((root, proposal))
        root = min(root + accepted + 1, len(sequence) - 1)
    drafter.propose(sequence, None)  # lets the drafter score the last proposals
    return records


def test_calibration_counts_match_an_independent_count():
    rng = np.random.default_rng(11)
    motif = rng.integers(0, 50, size=12).tolist()
    sequence = (motif * 3 + rng.integers(0, 50, size=15).tolist()) * 3 + motif
    drafter = NgramDrafter(max_ngram=3, block_size=6, max_matches=1, min_path_prob=0.0)
    records = simulate_chain_rounds(drafter, sequence, prompt_len=8)
    trials = np.zeros((4, 5))
    hits = np.zeros((4, 5))
    for root, proposal in records:
        if proposal.depth == 0:
            continue
        match_len, _ = naive_matches(sequence[:root + 1], 3, 1, 1)
        chain = proposal.tokens[:, 0].tolist()
        for d in range(1, len(chain) + 1):
            if root + d >= len(sequence):
                break
            trials[match_len, d - 1] += 1
            if sequence[root + d] != chain[d - 1]:
                break
            hits[match_len, d - 1] += 1
    counts = drafter.calibration_counts()
    np.testing.assert_array_equal(counts["trials"], trials)
    np.testing.assert_array_equal(counts["hits"][..., 0], hits)
    assert trials.sum() > 20


def test_calibrated_probabilities_follow_the_evidence():
    rng = np.random.default_rng(5)
    repetitive = (rng.integers(0, 40, size=9).tolist()) * 30
    random_text = rng.integers(0, 4, size=270).tolist()  # tiny vocab: many spurious short matches
    good = NgramDrafter(max_ngram=3, block_size=6, max_matches=1, min_path_prob=0.0)
    bad = NgramDrafter(max_ngram=3, block_size=6, max_matches=1, min_path_prob=0.0)
    simulate_chain_rounds(good, repetitive, prompt_len=12)
    simulate_chain_rounds(bad, random_text, prompt_len=12)
    good_p = good.propose(repetitive, None)
    bad_p = bad.propose(random_text, None)
    assert good_p.logprobs[:, 0].exp().min() > 0.8  # copies of a repeated motif keep hitting
    assert bad_p.logprobs[0, 0].exp() < 0.5  # random tokens rarely continue a match
    assert expected_accepted(good_p, chain_tree(good_p)) > 3.0
    assert expected_accepted(bad_p, chain_tree(bad_p)) < 1.0
    # begin() forgets the evidence (per-request calibration) unless keep_calibration
    good.begin(repetitive[:12], None)
    assert good.calibration_counts()["trials"].sum() == 0
    keeper = NgramDrafter(max_ngram=3, block_size=6, keep_calibration=True)
    simulate_chain_rounds(keeper, repetitive, prompt_len=12)
    keeper.begin(repetitive[:12], None)
    assert keeper.calibration_counts()["trials"].sum() > 0


def test_prior_grows_with_match_length_and_min_path_prob_cuts_depths():
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 3, size=40).tolist()  # tiny vocab: the last bigram surely occurred before
    for max_ngram, expected_p0 in ((1, 0.25), (2, 1 - 0.75 * 0.6)):
        drafter = NgramDrafter(max_ngram=max_ngram, block_size=8, min_path_prob=0.1, prior_hit_rate=0.25,
                               prior_miss_decay=0.6)
        drafter.begin(tokens, None)
        proposal = drafter.propose(tokens, None)
        # no evidence yet: the rank-0 rate is the prior at every depth
        assert proposal.logprobs[0, 0].exp().item() == pytest.approx(expected_p0, rel=1e-6)
        expected_depth = max(d for d in range(1, 8) if expected_p0 ** d >= 0.1)
        assert proposal.depth == expected_depth  # n=1: 0.25 -> 1 depth; n=2: 0.55 -> 3 depths
        assert build_tree(proposal, "ddtree", 16).max_depth <= expected_depth
        if proposal.tokens.shape[1] > 1:  # alternatives start below the top candidate
            assert proposal.logprobs[0, 1].exp().item() <= min(expected_p0, 1 - expected_p0) / 2 + 1e-6
