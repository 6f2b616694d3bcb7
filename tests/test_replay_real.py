"""Replay on the real default target: one Spec-Bench summarization prompt, n-gram drafter online vs replayed."""

import numpy as np
import pytest
import torch

from entropy_law.decoding.observers import distribution_stats
from tests.tiny_models import ListObserver

pytestmark = pytest.mark.real_model


def test_real_model_replay_equals_online_and_entropies_match():
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.decoding.replay import replay_rounds, teacher_forced_target_stats
    from entropy_law.prompts.text import load_tasks

    target = load_target("smollm2-135m")
    task = load_tasks("spec_bench", categories=["summarization"], limit=1)[0]
    for policy, budget in (("chain", None), ("ddtree", 12)):
        observer = ListObserver()
        decoder = SpeculativeDecoder(target, NgramDrafter(), tree=policy, budget=budget, observers=[observer])
        online = decoder.generate(task.messages(), max_new_tokens=48, request_id=task.request_id)
        replayed = replay_rounds(online.prompt_ids, online.token_ids, NgramDrafter(), policy, budget,
                                 eos_token_ids=sorted(decoder.eos_token_ids), max_new_tokens=48,
                                 max_context=decoder.adapter.max_context)
        assert [(r.accepted, list(r.committed_ids), r.tree_nodes) for r in replayed.rounds] == \
               [(r.accepted, r.committed_ids, r.tree_nodes) for r in observer.records]
        assert sum(r.drafted for r in replayed.rounds) >= 1  # summaries copy from the article
        frame = teacher_forced_target_stats(target, online.prompt_ids, online.token_ids)
        online_entropy = distribution_stats(torch.cat([r.target_logits for r in observer.records]))["entropy_nats"]
        np.testing.assert_allclose(frame["target_entropy_nats"].to_numpy(), online_entropy.numpy(), atol=1e-4, rtol=0)
