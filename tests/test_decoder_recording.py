"""Decoder -> RecorderObserver -> TraceRecorder -> load_traces, end to end on a tiny target.

The same requests are recorded twice: through ``RecorderObserver`` (statistics in torch) and through the
``TraceRecorder``'s own observer hooks (statistics from raw logits in numpy). Both traces must agree,
validate, and carry the AR baseline's target entropy at every output position.
"""

import numpy as np
import pytest
import torch

from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder
from tests.tiny_models import single_thread  # noqa: F401 (fixture)
from tests.tiny_models import OracleDrafter, hf_greedy, random_prompt, tiny_llama

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


def _record(path, model, prompts, references, observer_kind):
    with TraceRecorder(path, model_id="tiny", drafter_id="oracle", tree_policy="ddtree") as recorder:
        observer = RecorderObserver(recorder) if observer_kind == "torch" else recorder
        for index, (prompt, reference) in enumerate(zip(prompts, references)):
            drafter_class = LogitsOracle if index % 2 else OracleDrafter
            drafter = drafter_class(reference + [0] * 6, block_size=6, k=3, p_correct=0.7, seed=index)
            decoder = SpeculativeDecoder(model, drafter, tree="ddtree", budget=8, min_expected_accepted=0.0,
                                         observers=[observer])
            result = decoder.generate(prompt, max_new_tokens=len(reference), category="qa",
                                      request_id=f"r{index}", question_id=str(index))
            assert result.token_ids == reference
    return load_traces(path)


def test_recorded_traces_agree_with_the_recorders_own_hooks_and_with_ar(tmp_path):
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
                   "target_logit_gap", "draft_prob", "draft_rank", "draft_entropy_nats"):
        np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), atol=1e-5, rtol=0,
                                   err_msg=column)
    assert a["draft_entropy_nats"].notna().any() and a["draft_rank"].notna().any()
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
