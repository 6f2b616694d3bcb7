"""Decoder -> RecorderObserver -> TraceRecorder -> load_traces, end to end on a tiny target.

The same requests are recorded twice: through ``RecorderObserver`` (statistics in torch) and through the
``TraceRecorder``'s engine API with raw logits, as another engine would log (statistics in numpy). Both
traces must agree, validate, and carry the AR baseline's target entropy at every output position.
"""

import numpy as np
import pytest
import torch

from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder
from conftest import OracleDrafter, tiny_llama
from tests.tiny_models import hf_greedy, random_prompt

VOCAB = 128

pytestmark = pytest.mark.usefixtures("single_thread")


class LogitsOracle(OracleDrafter):
    """An oracle drafter that also returns full per-depth logits (as a learned drafter would)."""

    def propose(self, tokens, new_features):
        proposal = super().propose(tokens, new_features)
        if proposal.depth == 0:
            return proposal
        logits = torch.randn(proposal.depth, self.vocab, generator=self.generator)
        return DraftProposal(tokens=proposal.tokens, logprobs=proposal.logprobs, logits=logits)


class RawLogitsLogger:
    """Logs rounds as an engine without our observers would: raw target logits and the draft's logits or
    candidates straight into ``begin_request`` / ``log_round`` / ``end_request``."""

    def __init__(self, recorder):
        self.recorder = recorder

    def on_request_start(self, request_id, info):
        self.recorder.begin_request(request_id, category=info["category"], question_id=info["question_id"],
                                    prompt_tokens=info["prompt_tokens"])

    def on_round(self, record):
        draft = {}
        if record.draft is not None and record.draft.depth > 0:
            if record.draft.logits is not None:
                draft["draft_logits"] = record.draft.logits
            else:
                draft["draft_candidates"] = record.draft.tokens
                draft["draft_logprobs"] = record.draft.logprobs
        self.recorder.log_round(
            record.request_id, round_index=record.round_index, start_position=record.start_position,
            context_len=record.context_len, block_size=record.block_size, tree_nodes=record.tree_nodes,
            tree_depth=record.tree_depth, accepted=record.accepted, token_ids=list(record.committed_ids),
            ends_at_leaf=record.ends_at_leaf, target_logits=record.target_logits, draft_ms=record.draft_ms,
            verify_ms=record.verify_ms, overhead_ms=record.overhead_ms, **draft)

    def on_request_end(self, request_id, info):
        self.recorder.end_request(request_id, new_tokens=info["new_tokens"], stop_reason=info["stop_reason"],
                                  prefill_ms=info["prefill_ms"], decode_ms=info["decode_ms"])


def _record(path, model, prompts, references, observer_kind):
    with TraceRecorder(path, model_id="tiny", drafter_id="oracle", tree_policy="ddtree") as recorder:
        observer = RecorderObserver(recorder) if observer_kind == "torch" else RawLogitsLogger(recorder)
        for index, (prompt, reference) in enumerate(zip(prompts, references)):
            drafter_class = LogitsOracle if index % 2 else OracleDrafter
            drafter = drafter_class(reference + [0] * 6, block_size=6, k=3, p_correct=0.7, seed=index)
            decoder = SpeculativeDecoder(model, drafter, tree="ddtree", budget=8, observers=[observer],
                                         policy=RatioGate(min_expected_accepted=0.0))
            result = decoder.generate(prompt, max_new_tokens=len(reference), category="qa",
                                      request_id=f"r{index}", question_id=str(index))
            assert result.token_ids == reference
    return load_traces(path)


def test_recorded_traces_agree_with_the_engine_api_and_with_ar(tmp_path):
    model = tiny_llama(21)
    generator = torch.Generator().manual_seed(21)
    prompts = [random_prompt(generator, VOCAB, 6 + i) for i in range(4)]
    references = [hf_greedy(model, prompt, 18) for prompt in prompts]
    ours = _record(tmp_path / "torch", model, prompts, references, "torch")
    theirs = _record(tmp_path / "numpy", model, prompts, references, "numpy")

    key = ["request_id", "position"]
    a = ours.tokens.sort_values(key).reset_index(drop=True)
    b = theirs.tokens.sort_values(key).reset_index(drop=True)
    assert len(a) == sum(len(r) for r in references)
    for column in ("request_id", "round_index", "position", "depth", "token_id", "role"):
        assert a[column].astype(str).tolist() == b[column].astype(str).tolist(), column
    for column in ("target_entropy_nats", "target_renyi2_nats", "target_top1_prob", "target_top2_prob",
                   "target_logit_gap", "draft_prob", "draft_rank", "draft_entropy_nats", "draft_top1_prob"):
        np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), atol=1e-5, rtol=0,
                                   err_msg=column)
    assert a["draft_entropy_nats"].notna().any() and a["draft_rank"].notna().any()
    # the drafter's confidence in its own top proposal: on every drafted depth (rejected ones too), the largest
    # probability of the row, so never below the committed token's and equal to it where that token ranked first
    drafted = a["draft_rank"].notna()
    assert (a["draft_top1_prob"].notna() == drafted).all()
    assert (drafted & (a["role"] == "correction") & (a["draft_rank"] == -1)).any()  # known where the draft failed
    both = a["draft_prob"].notna()
    assert (a.loc[both, "draft_top1_prob"] >= a.loc[both, "draft_prob"] - 1e-6).all()
    first = both & (a["draft_rank"] == 0) & a["request_id"].isin(["r0", "r2"])  # candidates, best first
    assert first.any()
    np.testing.assert_allclose(a.loc[first, "draft_top1_prob"], a.loc[first, "draft_prob"], atol=1e-6)
    rounds_a = ours.rounds.sort_values(["request_id", "round_index"]).reset_index(drop=True)
    rounds_b = theirs.rounds.sort_values(["request_id", "round_index"]).reset_index(drop=True)
    for column in ("round_index", "start_position", "context_len", "tree_nodes", "tree_depth", "accepted",
                   "committed"):
        assert rounds_a[column].tolist() == rounds_b[column].tolist(), column

    # exogeneity through the whole pipeline: the AR baseline's recorded entropy at each position
    for index, (prompt, reference) in enumerate(zip(prompts, references)):
        with TraceRecorder(tmp_path / f"ar{index}", model_id="tiny", drafter_id="none") as recorder:
            ARDecoder(model, observers=[RecorderObserver(recorder)]).generate(
                prompt, max_new_tokens=len(reference), category="qa", request_id="ar")
        ar_tokens = load_traces(tmp_path / f"ar{index}").tokens.sort_values("position")
        ours_tokens = a[a["request_id"] == f"r{index}"].sort_values("position")
        np.testing.assert_allclose(ours_tokens["target_entropy_nats"].to_numpy(float),
                                   ar_tokens["target_entropy_nats"].to_numpy(float), atol=1e-4, rtol=0)
