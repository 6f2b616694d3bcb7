"""bench/law.py leads: the token classes it reads off a tokenizer and the candidate covariates it adds to the
package's at-risk table (the running acceptance uses the request's EARLIER rounds only)."""

import numpy as np
import pandas as pd
import pytest

from conftest import load_bench


def _bench():
    return load_bench("law")


class _Tokenizer:
    """The two calls the bench makes of a Hugging Face tokenizer, over a fixed vocabulary of pieces."""

    pieces = ["<eos>", "Ġthe", "ation", "Ġ42", "7", ",", "Ċ", "▁Haus", "<0x0A>", "Ġ!", "é"]
    all_special_ids = [0]

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]


def test_token_classes_follow_the_pieces_of_either_bpe_convention():
    classes = _bench().token_classes(_Tokenizer())
    assert classes == ["special", "word_start", "word_cont", "digit", "digit", "punct", "newline", "word_start",
                       "newline", "punct", "word_cont"]


def test_the_running_acceptance_counts_only_earlier_rounds_of_the_same_request():
    bench = _bench()
    # request a: round 1 accepts 2 of 3 at risk, round 2 rejects its only one; request b: one round, one accept
    table = pd.DataFrame({
        "run_id": ["r"] * 5, "request_id": ["a", "a", "a", "a", "b"], "round_index": [1, 1, 1, 2, 1],
        "position": [1, 2, 3, 4, 1], "depth": [1, 2, 3, 1, 1], "accepted": [1, 1, 0, 0, 1]})
    tokens = pd.DataFrame({"run_id": ["r"] * 7, "request_id": ["a"] * 5 + ["b"] * 2,
                           "position": [0, 1, 2, 3, 4, 0, 1], "token_id": [1, 2, 3, 4, 5, 6, 1]})
    lengths = pd.DataFrame({"run_id": ["r"] * 7, "request_id": ["a"] * 5 + ["b"] * 2,
                            "position": [0, 1, 2, 3, 4, 0, 1], "context_match": [0, 1, 12, 3, 0, 0, 9]})
    out = bench.add_candidates(table, tokens, _bench().token_classes(_Tokenizer()), lengths)
    m = bench.PRIOR_TRIALS
    prior = np.log(0.5 / 0.5)
    after_round_1 = (2 + m / 2) / (3 + m)
    expected = [prior, prior, prior, np.log(after_round_1 / (1 - after_round_1)), prior]
    assert out["logit_running_acceptance"].to_numpy() == pytest.approx(expected)
    assert out["token_class"].tolist() == ["word_cont", "digit", "digit", "punct", "word_start"]
    assert out["prev_token_class"].tolist() == ["word_start", "word_cont", "digit", "digit", "newline"]
    assert out["depth_factor"].tolist() == ["1", "2", "3", "1", "1"]
    assert out["copy_level"].tolist() == ["1", "8", "3", "0", "8"]  # the length before each position, capped at 8
    with pytest.raises(ValueError, match="without a context length"):
        bench.add_candidates(table, tokens, _bench().token_classes(_Tokenizer()), lengths.iloc[:4])
    with pytest.raises(ValueError, match="without a committed token"):
        bench.add_candidates(table, tokens.iloc[:3], _bench().token_classes(_Tokenizer()))


def test_rounds_are_counted_by_the_copyability_at_their_start():
    bench = _bench()
    # request a: round 1 starts at copy level 1 and accepts 2, round 2 starts at level 8 and accepts 0; b: level 8, 1
    table = pd.DataFrame({
        "run_id": ["r"] * 5, "request_id": ["a", "a", "a", "a", "b"], "round_index": [1, 1, 1, 2, 1],
        "depth": [1, 2, 3, 1, 1], "accepted": [1, 1, 0, 0, 1], "category": ["x"] * 4 + ["y"],
        "copy_level": ["1", "3", "4", "8", "8"]})
    out = bench.copy_levels_of_rounds(table)
    assert out.loc[1, "mean_accepted"] == 2 and out.loc[1, "rounds"] == 1
    assert out.loc[8, "mean_accepted"] == 0.5 and out.loc[8, "rounds"] == 2
    assert out.loc[8, "x"] == 0 and out.loc[8, "y"] == 1


def test_given_lengths_replace_the_null_copyability_an_at_risk_table_carries():
    """at_risk_table adds a context_match column (null for runs recorded without it); the bench's lengths replace
    it rather than colliding with it in the merge (the bench failed with KeyError 'context_match' before)."""
    bench = _bench()
    table = pd.DataFrame({"run_id": ["r"] * 2, "request_id": ["a"] * 2, "round_index": [1, 1], "position": [1, 2],
                          "depth": [1, 2], "accepted": [1, 0], "context_match": [np.nan, np.nan],
                          "log1p_copy": [np.nan, np.nan], "copy_full": [np.nan, np.nan]})
    tokens = pd.DataFrame({"run_id": ["r"] * 3, "request_id": ["a"] * 3, "position": [0, 1, 2], "token_id": [1, 2, 3]})
    lengths = pd.DataFrame({"run_id": ["r"] * 3, "request_id": ["a"] * 3, "position": [0, 1, 2],
                            "context_match": [0, 2, 9]})
    out = bench.add_candidates(table, tokens, bench.token_classes(_Tokenizer()), lengths)
    assert out["context_match"].tolist() == [2, 9]
    assert out["copy_level"].tolist() == ["2", "8"]
    assert "log1p_copy" not in out and "context_match_x" not in out
