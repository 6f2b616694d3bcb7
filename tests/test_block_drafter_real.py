"""The shipped block drafters (the default, fine-tuned on a broader corpus, and the sixth checkpoint it was fine-tuned
from, which the reference traces' block arms were recorded with) on the real
default target: each loads and checks out, its speculative output equals greedy (chain and DDTree N=16) on two
short prompts, and it gets drafts accepted. Marked ``real_model`` (one model load, a few seconds of decoding)."""

import pytest

from entropy_law.drafters.block import REFERENCE_CHECKPOINT, BlockDrafter, default_drafter_path, load_default_drafter
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate

pytestmark = pytest.mark.real_model

PROMPTS = ["Summarize: The city council voted on Monday to build three new bicycle lanes downtown. "
           "Work starts in May and should be finished by October, the mayor said.",
           "Natalie has 12 apples and gives 5 to her brother. How many apples does she have left?"]


@pytest.fixture(scope="module")
def target():
    from entropy_law.decoding.loading import load_target

    return load_target("smollm2-135m")


@pytest.fixture(scope="module")
def drafters(target):
    """Each shipped checkpoint loaded once for the module (a drafter keeps no state between requests)."""
    return {"default": load_default_drafter(target),
            "reference": BlockDrafter.load(default_drafter_path().with_name(REFERENCE_CHECKPOINT), target)}


def test_shipped_checkpoint_is_small_and_matches_the_target(drafters):
    path = default_drafter_path()
    assert path.is_file() and path.stat().st_size <= 25 * 2**20
    drafter = drafters["default"]
    assert drafter.feature_layers == (1, 14, 27) and drafter.block_size == 8
    assert drafter.config.vocab_size == 49152 and drafter.config.hidden_size == 576


def test_the_reference_checkpoint_is_small_and_has_the_default_ones_shape(drafters):
    path = default_drafter_path().with_name(REFERENCE_CHECKPOINT)
    assert path.is_file() and path.stat().st_size <= 25 * 2**20
    sixth, default = drafters["reference"], drafters["default"]
    assert sixth.config == default.config  # the default is the sixth fine-tuned: same shape, same draft vocabulary
    assert sixth.draft_vocab.tolist() == default.draft_vocab.tolist()
    assert sixth.provenance["checkpoint_sha256"] != default.provenance["checkpoint_sha256"]


@pytest.fixture(scope="module")
def greedy(target):
    """The target's greedy continuation of each prompt (deterministic: decoded once for the four checks below)."""
    return {prompt: ARDecoder(target).generate(prompt, max_new_tokens=48).token_ids for prompt in PROMPTS}


@pytest.mark.parametrize("checkpoint", ["default", "reference"])
@pytest.mark.parametrize("tree,budget", [("chain", None), ("ddtree", 16)])
def test_shipped_drafter_is_lossless_and_accepts(target, drafters, greedy, tree, budget, checkpoint):
    drafter = drafters[checkpoint]
    accepted = 0
    for prompt in PROMPTS:
        reference = greedy[prompt]
        result = SpeculativeDecoder(target, drafter, tree=tree, budget=budget,
                                    policy=RatioGate(min_expected_accepted=0.0)).generate(prompt, max_new_tokens=48)
        assert result.token_ids == reference
        accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 0
