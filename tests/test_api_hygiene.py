"""Bad input to the Python API fails early and clearly, and a failing request never corrupts its run (#16)."""

import json
import os

import pytest

from conftest import tiny_llama
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.loading import default_gguf_path, load_target
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder

PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(3, vocab=48, init_std=0.05)


def test_argument_types_are_checked_at_construction(model):
    with pytest.raises(TypeError, match="budget must be an int"):
        SpeculativeDecoder(model, NgramDrafter(), tree="ddtree", budget="16")
    with pytest.raises(TypeError, match="tree must be one of"):
        SpeculativeDecoder(model, NgramDrafter(), tree=None)
    with pytest.raises(TypeError, match="verify_cost_ratio must be a number"):
        SpeculativeDecoder(model, NgramDrafter(), policy=RatioGate("2"))
    decoder = SpeculativeDecoder(model, NgramDrafter())
    with pytest.raises(TypeError, match="max_new_tokens must be an int"):
        decoder.generate(PROMPT, max_new_tokens=2.5)
    assert decoder.generate(PROMPT, max_new_tokens=4).new_tokens == 4  # a valid call still decodes


class FailingDrafter(NgramDrafter):
    """Raises on its ``fail_at``-th proposal of the request whose prompt starts with ``fail_prompt``."""

    def __init__(self, fail_prompt, fail_at=3):
        super().__init__(block_size=4)
        self.fail_prompt, self.fail_at, self.calls = fail_prompt, fail_at, 0

    def begin(self, prompt_ids, prompt_features):
        super().begin(prompt_ids, prompt_features)
        self.failing, self.calls = list(prompt_ids[:2]) == self.fail_prompt, 0

    def propose(self, tokens, new_features=None):
        self.calls += 1
        if self.failing and self.calls == self.fail_at:
            raise RuntimeError("drafter broke")
        return super().propose(tokens, new_features)


def test_a_failing_request_is_ended_with_error_and_the_run_completes(tmp_path, model):
    prompts = {"a": [9, 10] + PROMPT, "b": [11, 12] + PROMPT, "c": [13, 14] + PROMPT}
    with TraceRecorder(tmp_path / "run", model_id="tiny", drafter_id="ngram") as recorder:
        decoder = SpeculativeDecoder(model, FailingDrafter([11, 12]), observers=[RecorderObserver(recorder)],
                                     eos_token_ids=[], policy=RatioGate(min_expected_accepted=0.0))
        for request_id, prompt in prompts.items():
            try:
                decoder.generate(prompt, max_new_tokens=12, category="qa", request_id=request_id)
            except RuntimeError as err:
                assert str(err) == "drafter broke" and request_id == "b"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "complete"
    traces = load_traces(tmp_path / "run")
    requests = traces.requests.set_index(traces.requests["request_id"].astype(str))
    assert sorted(requests.index) == ["a", "b", "c"]
    assert requests.loc["b", "stop_reason"] == "error" and requests.loc["a", "stop_reason"] == "max_new_tokens"
    assert requests.loc["a", "new_tokens"] == requests.loc["c", "new_tokens"] == 12
    # the failed request keeps exactly the tokens of the rounds it logged (the prefill and one drafting round)
    tokens_b = traces.tokens[traces.tokens["request_id"].astype(str) == "b"]
    assert 1 < len(tokens_b) == requests.loc["b", "new_tokens"] < 12


@pytest.mark.real_model
def test_a_truncated_model_file_is_named_in_the_error(tmp_path):
    source = default_gguf_path()
    truncated = tmp_path / "truncated.gguf"
    with open(source, "rb") as f:
        truncated.write_bytes(f.read(os.path.getsize(source) // 2))
    with pytest.raises((ValueError, OSError), match=f"could not load the target from {truncated}"):
        load_target(truncated)

