"""``AssistedRecorder``: transformers assisted generation logged round by round, on tiny random models (no network).

The target is ``tiny_llama(0)``; the assistant has the same vocabulary (a copy whose LM head carries seeded
noise, so some drafts are accepted and some rejected; an exact copy, which accepts every draft; or another
seed, which accepts almost none). The oracle for each round is independent of the streamer: the assistant's
own greedy continuation of the round's prefix (Hugging Face ``generate``) compared with the output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from tiny_models import hf_greedy

from entropy_law.decoding.assisted import AssistedRecorder
from entropy_law.decoding.replay import teacher_forced_target_stats
from entropy_law.law.atrisk import at_risk_table
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder

PROMPT = [1, 5, 9, 20, 33, 7]
DRAFT = 4

pytestmark = pytest.mark.usefixtures("single_thread")


def assistant(seed: int = 0, *, noise: float = 0.0, draft: int = DRAFT):
    model = tiny_llama(seed)
    if noise:
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            model.lm_head.weight.add_(noise * torch.randn(model.lm_head.weight.shape, generator=generator))
    model.generation_config.num_assistant_tokens = draft
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0
    return model


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@torch.inference_mode()
def record(tmp_path, target, helper, *, max_new_tokens=30, eos=None, name="run"):
    """Assisted greedy generation with an ``AssistedRecorder``: (new token ids, the streamer, the traces)."""
    ids = torch.tensor([PROMPT])
    with TraceRecorder(tmp_path / name, model_id="tiny-llama-0", drafter_id="assistant", tree_policy="chain") as rec:
        streamer = AssistedRecorder(rec, target, helper, request_id="q1", category="test",
                                    max_new_tokens=max_new_tokens, eos_token_id=eos)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=helper, streamer=streamer,
                              max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(PROMPT):].tolist(), streamer, load_traces(tmp_path / name)


def oracle_accepted(helper, output: list[int], start: int, depth: int, eos=None) -> int:
    """Drafts the assistant would propose from ``PROMPT + output[:start]`` that the output confirms."""
    if depth == 0:
        return 0
    draft = hf_greedy(helper, PROMPT + output[:start], depth, eos_token_id=eos)
    matched = 0
    for proposed, committed in zip(draft, output[start:]):
        if proposed != committed:
            break
        matched += 1
    return matched


def test_rounds_spell_the_output_and_tau_is_what_the_assistant_drafted(tmp_path, target):
    helper = assistant(noise=0.05)
    output, streamer, traces = record(tmp_path, target, helper)
    assert output == hf_greedy(target, PROMPT, 30)  # assisted greedy is lossless

    rounds = traces.rounds.sort_values("round_index")
    tokens = traces.tokens
    assert tokens["token_id"].tolist() == output  # committed tokens concatenate to the output
    assert rounds["committed"].sum() == len(output) == traces.requests["new_tokens"].item()
    assert traces.requests["stop_reason"].item() == "max_new_tokens"
    assert (rounds["accepted"] == rounds["committed"] - 1).all()  # the output ends at the budget: no cut round
    assert rounds["start_position"].tolist() == [0] + np.cumsum(rounds["committed"]).tolist()[:-1]
    assert (rounds["context_len"] == len(PROMPT) + rounds["start_position"] - 1).all()
    assert set(rounds["block_size"]) == {DRAFT + 1}

    for rnd in rounds.itertuples():  # the independent oracle: the assistant's own greedy draft
        assert rnd.accepted == oracle_accepted(helper, output, rnd.start_position, rnd.tree_depth)
        assert rnd.tree_depth == min(DRAFT, 30 - rnd.start_position - 1)  # transformers' cap at the budget
    last_roles = tokens.groupby("round_index", observed=True)["role"].last().astype(str)
    full = rounds.set_index("round_index")["accepted"] == rounds.set_index("round_index")["tree_depth"]
    assert (last_roles[full] == "bonus").all() and (last_roles[~full] == "correction").all()
    assert full.any() and (~full).any()  # both kinds of round occur, so the check means something

    expected = teacher_forced_target_stats(target, PROMPT, output)
    np.testing.assert_allclose(tokens["target_entropy_nats"], expected["target_entropy_nats"], rtol=1e-6, atol=1e-6)
    drafted = tokens["draft_prob"].notna()
    assert drafted[tokens["role"] != "bonus"].all() and not drafted[tokens["role"] == "bonus"].any()
    table = at_risk_table(traces)
    assert table["accepted"].sum() == rounds["accepted"].sum()
    assert table["rejected"].sum() == (~full).sum()
    assert [r["token_ids"] for r in streamer.rounds] == [output[s:s + c] for s, c in
                                                         zip(rounds["start_position"], rounds["committed"])]


def test_an_exact_copy_accepts_every_draft(tmp_path, target):
    output, _, traces = record(tmp_path, target, assistant(0), max_new_tokens=18)
    rounds = traces.rounds.sort_values("round_index")
    # full blocks of 4 drafts + a bonus; the last draft is capped at 18 - 15 - 1 = 2 (transformers' budget cap)
    assert rounds["committed"].tolist() == [5, 5, 5, 3] and len(output) == 18
    assert rounds["accepted"].tolist() == [4, 4, 4, 2] and rounds["tree_depth"].tolist() == [4, 4, 4, 2]
    assert (traces.tokens.groupby("round_index")["role"].last().astype(str) == "bonus").all()


def test_output_cut_at_an_accepted_eos_draft_is_a_round_that_stopped_inside(tmp_path, target):
    free = hf_greedy(target, PROMPT, 30)
    eos = free[DRAFT + 2]  # output position 6: depth 2 of the second round when every draft is accepted
    assert eos not in free[:DRAFT + 2]
    output, streamer, traces = record(tmp_path, target, assistant(0), eos=eos, name="copy")
    assert output == free[:DRAFT + 3] and traces.requests["stop_reason"].item() == "eos"
    last = traces.rounds.sort_values("round_index").iloc[-1]
    assert (last["committed"], last["accepted"], last["tree_depth"]) == (2, 2, 2)  # EOS was an accepted draft
    assert (traces.tokens["role"].astype(str).tail(2) == "accepted").all()
    assert traces.tokens["token_id"].tolist() == output

    # an assistant that drafts something else: the EOS is the target's own token, a correction
    output, streamer, traces = record(tmp_path, target, assistant(1), eos=eos, name="other")
    last = traces.rounds.sort_values("round_index").iloc[-1]
    assert output[-1] == eos and last["accepted"] == last["committed"] - 1
    assert traces.tokens["role"].astype(str).iloc[-1] == "correction"
    assert traces.rounds["committed"].sum() == len(output)


def test_a_draft_length_the_streamer_cannot_see_is_refused(target):
    helper = tiny_llama(0)  # transformers' defaults: confidence threshold 0.4, draft length unset here
    with pytest.raises(ValueError, match="assistant_confidence_threshold = None \\(set 0"):
        AssistedRecorder(None, target, helper, request_id="q", category="c", max_new_tokens=8)
    helper = assistant(0)
    helper.generation_config.num_assistant_tokens_schedule = "heuristic"
    with pytest.raises(ValueError, match="num_assistant_tokens_schedule = 'heuristic'"):
        AssistedRecorder(None, target, helper, request_id="q", category="c", max_new_tokens=8)


def test_a_recorder_records_one_generate_call(tmp_path, target):
    helper = assistant(0)
    _, streamer, _ = record(tmp_path, target, helper, max_new_tokens=5)
    with pytest.raises(RuntimeError, match="use one recorder per generate\\(\\) call"):
        streamer.put(torch.tensor([[1, 2]]))
