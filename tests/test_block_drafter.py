"""BlockDrafter on tiny random Llama targets: train/inference parity, no leaks, protocol, checkpoints, exactness."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from entropy_law.drafters.block import BlockDrafter, default_feature_layers
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.interface import Drafter
from conftest import tiny_llama


# this module's target: 6 layers, HF's default init and special ids, tied embeddings
tiny_target = partial(tiny_llama, vocab=96, layers=6, init_std=0.02, tie_embeddings=True, bos_token_id=1,
                      eos_token_id=2)


def features_of(model, ids: list[int], layers) -> torch.Tensor:
    with torch.no_grad(), capture_features(model, layers) as cap:
        model(torch.tensor([ids]))
        return cap.features()[0]


@pytest.fixture(scope="module")
def setup():
    model = tiny_target()
    drafter = BlockDrafter(model, seed=3, block_size=5, num_layers=2).eval()
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 96, (40,), generator=gen).tolist()
    return model, drafter, ids, features_of(model, ids, drafter.feature_layers)


def test_feature_layers_follow_dflash_formula():
    assert default_feature_layers(30) == (1, 14, 27)
    assert default_feature_layers(36, 5) == (1, 9, 17, 25, 33)
    assert default_feature_layers(24, 5) == (1, 6, 11, 16, 21)
    assert default_feature_layers(30, 1) == (15,)
    model = tiny_target()
    assert BlockDrafter(model).feature_layers == default_feature_layers(6) == (1, 2, 3)


def proposals_over_rounds(drafter, ids, feats, anchors, start):
    """The live drafter's proposals at ``anchors`` (ascending, >= ``start``): the prompt ``ids[:start]``,
    then the rows since the last anchor arrive as "the accepted path of the last round" (several rounds)."""
    drafter.begin(ids[:start], feats[:start])
    prev, out = start, []
    for anchor in anchors:
        out.append(drafter.propose(ids[: anchor + 1], feats[prev:anchor] if anchor > prev else None))
        prev = anchor
    return out


def test_training_logits_equal_inference_logits_over_rounds(setup):
    model, drafter, ids, feats = setup
    anchors = [9, 12, 13, 20, 27]  # overlapping blocks (B=5) included
    train_logits = drafter.block_logits(torch.tensor([ids]), feats[None], torch.tensor([anchors]))[0]
    for a_index, proposal in enumerate(proposals_over_rounds(drafter, ids, feats, anchors, 9)):
        assert proposal.depth == drafter.block_size - 1
        torch.testing.assert_close(proposal.logits, train_logits[a_index], atol=2e-5, rtol=1e-5)
    assert drafter.context_len == anchors[-1]


def scrambled_after(ids, feats, anchor, gen):
    """``ids`` with new random tokens after ``anchor`` and ``feats`` with noise on rows at or after it: what a
    block anchored there must not see."""
    ids2 = list(ids)
    ids2[anchor + 1:] = torch.randint(3, 96, (len(ids) - anchor - 1,), generator=gen).tolist()
    feats2 = feats.clone()
    feats2[anchor:] += torch.randn(feats2[anchor:].shape, generator=gen)
    return ids2, feats2


def test_no_leak_from_positions_at_or_after_anchor(setup):
    model, drafter, ids, feats = setup
    anchors = torch.tensor([[10, 12, 14, 30]])  # overlapping: block 10 spans 10..14
    base = drafter.block_logits(torch.tensor([ids]), feats[None], anchors)
    gen = torch.Generator().manual_seed(5)
    for a_index, anchor in enumerate(anchors[0].tolist()):
        ids2, feats2 = scrambled_after(ids, feats, anchor, gen)
        out = drafter.block_logits(torch.tensor([ids2]), feats2[None], anchors)
        torch.testing.assert_close(out[0, a_index], base[0, a_index], atol=1e-5, rtol=0)
        # the check can fail: a change strictly before the anchor does move this block's logits
        feats3 = feats.clone()
        feats3[anchor - 1] += 1.0
        moved = drafter.block_logits(torch.tensor([ids]), feats3[None], anchors)
        assert (moved[0, a_index] - base[0, a_index]).abs().max() > 1e-3


def test_blocks_do_not_see_each_other(setup):
    model, drafter, ids, feats = setup
    together = drafter.block_logits(torch.tensor([ids]), feats[None], torch.tensor([[10, 11, 12, 13]]))
    for i, anchor in enumerate([10, 11, 12, 13]):
        alone = drafter.block_logits(torch.tensor([ids]), feats[None], torch.tensor([[anchor]]))
        torch.testing.assert_close(together[0, i], alone[0, 0], atol=1e-5, rtol=1e-5)


def test_anchor_token_and_invalid_padding_anchor(setup):
    model, drafter, ids, feats = setup
    ids2 = list(ids)
    ids2[10] = (ids[10] + 1) % 96
    a = torch.tensor([[10, 0]])
    valid = torch.tensor([[True, False]])
    out = drafter.block_logits(torch.tensor([ids]), feats[None], a, valid)
    out2 = drafter.block_logits(torch.tensor([ids2]), feats[None], a, valid)
    assert torch.isfinite(out).all()
    assert (out[0, 0] - out2[0, 0]).abs().max() > 1e-3  # the anchor enters through its embedding
    with pytest.raises(ValueError, match="beyond"):
        drafter.block_logits(torch.tensor([ids]), feats[None, :5], torch.tensor([[8]]))


def test_protocol_and_proposal_contents(setup):
    model, drafter, ids, feats = setup
    assert isinstance(drafter, Drafter)
    drafter.begin(ids[:12], feats[:12])
    p = drafter.propose(ids[:13], None)
    assert p.tokens.shape == (drafter.block_size - 1, min(drafter.config.top_k, 96))
    assert torch.all(p.logprobs[:, :-1] >= p.logprobs[:, 1:])
    ref = torch.log_softmax(p.logits, -1)
    torch.testing.assert_close(p.logprobs, torch.gather(ref, 1, p.tokens))
    assert torch.equal(p.tokens[:, 0], p.logits.argmax(-1))
    with pytest.raises(ValueError, match="holds context for positions 0..11"):
        drafter.propose(ids[:15], None)  # features for positions 12, 13 were never given
    with pytest.raises(ValueError, match="needs target features"):
        drafter.begin(ids[:3], None)
    with pytest.raises(ValueError, match="feature rows"):
        drafter.begin(ids[:3], feats[:2])


def test_target_tables_are_shared_not_saved_and_get_no_gradient():
    model = tiny_target()
    drafter = BlockDrafter(model, block_size=4, num_layers=1)
    keys = list(drafter.state_dict())
    assert not any("embed_tokens" in k or "lm_head" in k for k in keys), keys
    assert all(v.shape[0] != 96 for v in drafter.state_dict().values())
    ids = torch.randint(3, 96, (1, 20))
    feats = features_of(model, ids[0].tolist(), drafter.feature_layers)
    drafter.block_logits(ids, feats[None], torch.tensor([[8, 12]])).sum().backward()
    assert model.model.embed_tokens.weight.grad is None
    assert drafter.fc.weight.grad is not None and drafter.mask_embedding.grad is not None
    assert drafter._lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()


def test_save_load_roundtrip_and_mismatch_errors(tmp_path, setup):
    model, drafter, ids, feats = setup
    path = drafter.save(tmp_path / "d.safetensors", metadata={"note": "test"})
    loaded = BlockDrafter.load(path, model)
    assert loaded.info == {"note": "test"}
    assert loaded.config == drafter.config
    # reference: the same drafter with its weights rounded to fp16, as stored
    rounded = BlockDrafter(model, drafter.config, seed=None).eval()
    rounded.load_state_dict({k: v.half().float() for k, v in drafter.state_dict().items()})
    a = torch.tensor([[10, 20]])
    torch.testing.assert_close(loaded.block_logits(torch.tensor([ids]), feats[None], a),
                               rounded.block_logits(torch.tensor([ids]), feats[None], a))
    with pytest.raises(ValueError, match=r"vocabulary: drafter 96, target 80"):
        BlockDrafter.load(path, tiny_target(vocab=80))
    with pytest.raises(ValueError, match=r"width: drafter 64, target 32"):
        BlockDrafter.load(path, tiny_target(hidden=32))
    with pytest.raises(ValueError, match=r"target depth: drafter built for 6 layers, target has 3.*"
                                         r"feature layers \[1, 2, 3\]: \[3\] do not exist"):
        BlockDrafter.load(path, tiny_target(layers=3))
    with pytest.raises(ValueError, match="embedding fingerprint"):
        BlockDrafter.load(path, tiny_target(seed=1))
    with pytest.raises(FileNotFoundError):
        BlockDrafter.load(tmp_path / "missing.safetensors", model)


def test_checking_a_checkpoint_reads_its_header_only_and_finds_what_load_finds(tmp_path, setup, monkeypatch):
    """``check_checkpoint`` (the demo's arm choice) raises the mismatch errors of ``BlockDrafter.load`` without
    reading the weights (the shipped checkpoint is 16 MB and was read twice)."""
    import entropy_law.drafters.block as block

    model, drafter, _, _ = setup
    path = drafter.save(tmp_path / "d.safetensors")
    others = [tiny_target(vocab=80), tiny_target(hidden=32), tiny_target(layers=3), tiny_target(seed=1)]
    errors = []
    for other in others:
        with pytest.raises(ValueError) as err:
            BlockDrafter.load(path, other)
        errors.append(str(err.value))
    monkeypatch.setattr(block, "load_file", lambda *a, **k: pytest.fail("weights read"))
    block.check_checkpoint(path, model)  # a match: no error
    for other, error in zip(others, errors):
        with pytest.raises(ValueError) as err:
            block.check_checkpoint(path, other)
        assert str(err.value) == error
    with pytest.raises(FileNotFoundError):
        block.check_checkpoint(tmp_path / "missing.safetensors", model)


def test_trace_runs_record_which_checkpoint_was_loaded(tmp_path, setup):
    """Two checkpoints of one architecture have equal configs; the run metadata tells them apart by the file's
    SHA-256 (computed here independently), and a run recorded with one is not resumed with the other."""
    import hashlib

    from entropy_law.decoding.interface import drafter_run_config
    from entropy_law.decoding.replay import replay_run_metadata
    from entropy_law.traces.recorder import TraceRecorder

    model, drafter, _, _ = setup
    first = drafter.save(tmp_path / "a.safetensors")
    other = BlockDrafter(model, drafter.config, seed=4)
    second = other.save(tmp_path / "b.safetensors")
    a, b = BlockDrafter.load(first, model), BlockDrafter.load(second, model)
    assert a.config == b.config
    sha_a = hashlib.sha256(first.read_bytes()).hexdigest()
    assert drafter_run_config(a) == {**dict(a.config), "checkpoint": "a.safetensors", "checkpoint_sha256": sha_a}
    assert drafter_run_config(b)["checkpoint_sha256"] == hashlib.sha256(second.read_bytes()).hexdigest() != sha_a
    assert drafter_run_config(drafter) == dict(drafter.config)  # a drafter built in memory has no file
    assert drafter_run_config(None) == {}
    meta = replay_run_metadata(a, "chain", None, model_id="tiny")
    assert meta["drafter_config"]["checkpoint_sha256"] == sha_a
    with TraceRecorder(tmp_path / "run", **meta):
        pass
    with pytest.raises(ValueError, match="checkpoint_sha256"):
        TraceRecorder(tmp_path / "run", resume=True, **replay_run_metadata(b, "chain", None, model_id="tiny"))
    TraceRecorder(tmp_path / "run", resume=True, **meta).finish()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq


def chain_decode(model, drafter, prompt: list[int], max_new: int):
    """A minimal, obviously-correct chain speculative loop (full forwards, no cache): the oracle."""
    layers = drafter.feature_layers
    with torch.no_grad(), capture_features(model, layers) as cap:
        out = model(torch.tensor([prompt]))
        feats = cap.features()[0]
    seq = list(prompt) + [int(out.logits[0, -1].argmax())]
    drafter.begin(prompt, feats)
    new, taus = None, []
    while len(seq) - len(prompt) < max_new:
        drafts = drafter.propose(seq, new).tokens[:, 0].tolist()
        with torch.no_grad(), capture_features(model, layers) as cap:
            logits = model(torch.tensor([seq + drafts])).logits[0]
            feats = cap.features()[0]
        root = len(seq) - 1
        tau = 0
        while tau < len(drafts) and int(logits[root + tau].argmax()) == drafts[tau]:
            tau += 1
        new = feats[root: root + tau + 1]
        seq += drafts[:tau] + [int(logits[root + tau].argmax())]
        taus.append(tau)
    return seq, taus


def test_chain_speculative_output_equals_greedy_and_replay_matches_online():
    from entropy_law.decoding.replay import replay_chain

    model = tiny_target(seed=2)
    drafter = BlockDrafter(model, seed=0, block_size=4, num_layers=1).eval()
    prompt = [5, 17, 33, 2, 60, 41]
    # make the drafter accept something: teach it this target's greedy continuation (a few steps)
    ref = greedy(model, prompt, 48)
    _overfit(drafter, model, ref, len(prompt))
    seq, taus = chain_decode(model, drafter, prompt, 30)
    assert seq[: len(prompt) + 30] == ref[: len(prompt) + 30]
    assert sum(taus) > 0, "the overfitted drafter should accept some drafts"
    feats = features_of(model, ref, drafter.feature_layers)
    replay = replay_chain(drafter, torch.tensor(ref), feats[:-1], len(prompt))
    assert replay.round_accepted[: len(taus)] == taus


def _overfit(drafter, model, seq, prompt_len, steps=40):
    from entropy_law.drafters.training.loop import collate, forward_train

    feats = features_of(model, seq, drafter.feature_layers)
    batch = collate([{"input_ids": torch.tensor(seq), "features": feats[:-1], "prompt_len": prompt_len}])
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    drafter.train()
    for _ in range(steps):
        loss, _ = forward_train(drafter, batch, anchors_per_seq=16, gamma=4.0, generator=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()


def test_draft_vocabulary_restricts_proposals_and_survives_save_load(tmp_path, setup):
    model, _, ids, feats = setup
    vocab = list(range(0, 96, 3)) + [ids[11]]
    drafter = BlockDrafter(model, seed=3, block_size=5, num_layers=1, draft_vocab=vocab).eval()
    full = BlockDrafter(model, seed=3, block_size=5, num_layers=1).eval()  # same weights, whole vocabulary
    a = torch.tensor([[10, 15]])
    sub = drafter.block_logits(torch.tensor([ids]), feats[None], a)
    whole = full.block_logits(torch.tensor([ids]), feats[None], a)
    kept = torch.tensor(sorted(set(vocab)))
    assert sub.shape[-1] == len(kept)
    torch.testing.assert_close(sub, whole[..., kept])  # the same LM-head rows, nothing else
    drafter.begin(ids[:10], feats[:10])
    p = drafter.propose(ids[:11], None)
    assert set(p.tokens.flatten().tolist()) <= set(vocab)
    torch.testing.assert_close(p.logits[:, kept], sub[0, 0], atol=2e-5, rtol=1e-5)
    assert torch.softmax(p.logits, -1)[:, [1, 2, 4]].sum() == 0  # outside: probability exactly 0
    labels = torch.tensor([3, 4, -100, ids[11]])
    assert drafter.draft_tokens(drafter.draft_index(labels)[[0, 3]]).tolist() == [3, ids[11]]
    assert drafter.draft_index(labels)[[1, 2]].tolist() == [-100, -100]
    loaded = BlockDrafter.load(drafter.save(tmp_path / "v.safetensors"), model)
    assert loaded.draft_vocab.tolist() == kept.tolist()
    loaded.begin(ids[:10], feats[:10])
    assert torch.equal(loaded.propose(ids[:11], None).tokens[:, 0], p.tokens[:, 0])


def test_context_vocabulary_drafts_ids_seen_at_or_before_the_anchor_only(tmp_path, setup):
    model, _, ids, feats = setup
    base = list(range(0, 96, 4))
    drafter = BlockDrafter(model, seed=3, block_size=5, num_layers=1, draft_vocab=base, context_vocab=True).eval()
    full = BlockDrafter(model, seed=3, block_size=5, num_layers=1).eval()  # same weights, whole vocabulary
    anchors = [9, 14, 15, 22]
    x = torch.tensor([ids])
    vocab = drafter.sequence_vocab(x)
    assert vocab.tolist() == sorted(set(base) | set(ids))
    logits = drafter.block_logits(x, feats[None], torch.tensor([anchors]), vocab=vocab)[0]
    whole = full.block_logits(x, feats[None], torch.tensor([anchors]))[0]
    for a_index, anchor in enumerate(anchors):
        allowed = sorted(set(base) | set(ids[: anchor + 1]))
        row = drafter.to_full_vocab(logits[a_index], vocab=vocab)
        torch.testing.assert_close(row[:, allowed], whole[a_index][:, allowed])  # the same LM-head rows
        others = sorted(set(range(96)) - set(allowed))
        assert others and bool((row[:, others] == -1e4).all())  # probability 0: not drafted
    # online: the proposal at each anchor equals the one-pass row (rounds of several accepted tokens)
    for a_index, (anchor, p) in enumerate(zip(anchors, proposals_over_rounds(drafter, ids, feats, anchors, 9))):
        torch.testing.assert_close(p.logits, drafter.to_full_vocab(logits[a_index], vocab=vocab),
                                   atol=2e-5, rtol=1e-5)
        assert set(p.tokens.flatten().tolist()) <= set(base) | set(ids[: anchor + 1])
    # no leak: new ids after the anchor change neither the drafted set nor the logits at the anchor
    later = ids[:15] + [95 - (t % 5) for t in ids[15:]]
    moved = drafter.block_logits(torch.tensor([later]), feats[None], torch.tensor([[9, 14]]))[0]
    vocab2 = drafter.sequence_vocab(torch.tensor([later]))
    torch.testing.assert_close(drafter.to_full_vocab(moved, vocab=vocab2),
                               drafter.to_full_vocab(logits[:2], vocab=vocab))
    # labels over a per-sequence vocabulary; the option survives save/load
    labels = torch.tensor([ids[3], 4, -100, 1 if 1 not in ids else 95])
    index = drafter.draft_index(labels, vocab=vocab)
    assert drafter.draft_tokens(index[:2], vocab).tolist() == [ids[3], 4] and index[2] == -100
    assert (index[3] == -100) == (int(labels[3]) not in set(base) | set(ids))
    loaded = BlockDrafter.load(drafter.save(tmp_path / "c.safetensors"), model)
    assert loaded.config.context_vocab and loaded.draft_vocab.tolist() == base
    with pytest.raises(ValueError, match="context_vocab extends a draft vocabulary"):
        BlockDrafter(model, context_vocab=True)


def test_context_vocabulary_labels_first_seen_after_the_anchor_get_no_loss():
    from entropy_law.drafters.training.loop import collate, forward_train

    model = tiny_target(seed=1)
    drafter = BlockDrafter(model, seed=0, block_size=4, num_layers=1, draft_vocab=[0, 1, 2],
                           context_vocab=True)
    seq = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # every response token is new when it appears
    batch = collate([{"input_ids": torch.tensor(seq), "features": features_of(model, seq, drafter.feature_layers)[:-1],
                      "prompt_len": 4}])
    loss, metrics = forward_train(drafter, batch, anchors_per_seq=8, gamma=4.0,
                                  generator=torch.Generator().manual_seed(0))
    assert loss.item() == 0.0 and metrics["accept_proxy"] == 1.0  # nothing draftable, nothing learned
    seq2 = [10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13]  # a repeat: every label was seen before
    batch2 = collate([{"input_ids": torch.tensor(seq2),
                       "features": features_of(model, seq2, drafter.feature_layers)[:-1], "prompt_len": 4}])
    loss2, _ = forward_train(drafter, batch2, anchors_per_seq=8, gamma=4.0,
                             generator=torch.Generator().manual_seed(0))
    assert math.isfinite(loss2.item()) and loss2.item() > 0.1


# ---------------------------------------------------------------------------------------------- copy head
@pytest.fixture(scope="module", params=["full-vocab", "context-vocab", "context-vocab-match"])
def copying(request):
    """A tiny target and a copy-head drafter whose gate starts high (the pointer matters in every check);
    with exact-match features (``copy_match``) on a sequence that repeats itself, so that they fire."""
    model = tiny_target()
    kw = {"draft_vocab": list(range(0, 96, 4)), "context_vocab": True} if request.param != "full-vocab" else {}
    match = 3 if request.param.endswith("match") else 0
    drafter = BlockDrafter(model, seed=3, block_size=5, num_layers=2, copy_head=True, copy_match=match,
                           copy_distance=4 if match else 0, **kw).eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        drafter.copy_gate.bias.fill_(1.0)
        if match:
            drafter.copy_match_score.copy_(torch.randn(drafter.copy_match_score.shape, generator=gen))
            drafter.copy_match_gate.copy_(torch.randn(drafter.copy_match_gate.shape, generator=gen))
            drafter.copy_distance_score.copy_(torch.randn(drafter.copy_distance_score.shape, generator=gen))
    ids = torch.randint(3, 96, (40,), generator=gen).tolist()
    if match:
        ids = ids[:12] + ids[:12] + ids[5:21]  # suffix matches of every length up to 3 and beyond
    return model, drafter, kw, ids, features_of(model, ids, drafter.feature_layers)


def test_copy_head_training_logits_equal_inference_logits(copying):
    model, drafter, _, ids, feats = copying
    anchors = [0, 1, 9, 12, 13, 20, 27]  # 0 and 1: (almost) nothing to copy yet; overlapping blocks
    x = torch.tensor([ids])
    vocab = drafter.sequence_vocab(x)
    train_logits = drafter.block_logits(x, feats[None], torch.tensor([anchors]), vocab=vocab)[0]
    torch.testing.assert_close(torch.logsumexp(train_logits, -1), torch.zeros(len(anchors), 4), atol=1e-5, rtol=0)
    for a_index, proposal in enumerate(proposals_over_rounds(drafter, ids, feats, anchors, 0)):
        torch.testing.assert_close(proposal.logits, drafter.to_full_vocab(train_logits[a_index], vocab=vocab),
                                   atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="copy head needs the tokens"):
        drafter.draft_logits(ids[27], 27, drafter._vocab)


def test_copy_head_mixture_equals_a_loop_over_the_context(copying):
    """p(v) = (1-g) softmax(generator)(v) + g * sum_j a_j [token j+k == v], recomputed row by row (with
    ``copy_match``, the suffix-match lengths counted by hand, with ``copy_distance`` the distance buckets 1,
    2-3, 4-7, 8+); the generator is the same drafter without the copy head (its other weights are drawn
    identically)."""
    model, drafter, kw, ids, feats = copying
    plain = BlockDrafter(model, seed=3, block_size=5, num_layers=2, **kw).eval()
    n_match = drafter.config.copy_match

    def suffix_match(j: int, t: int) -> int:  # how many tokens end both at j and at t (at most n_match)
        m = 0
        while m < n_match and j - m >= 0 and ids[j - m] == ids[t - m]:
            m += 1
        return m

    for name, tensor in plain.state_dict().items():
        assert torch.equal(tensor, drafter.state_dict()[name]), name
    anchors = [2, 14, 30, 33]  # at 2, slots 3 and 4 have no token to copy
    x = torch.tensor([ids])
    vocab = drafter.sequence_vocab(x)
    states = []
    hook = drafter.norm.register_forward_hook(lambda m, i, o: states.append(o.detach()))
    mixed = drafter.block_logits(x, feats[None], torch.tensor([anchors]), vocab=vocab)[0].exp()
    hook.remove()
    gen = torch.softmax(plain.block_logits(x, feats[None], torch.tensor([anchors]), vocab=vocab)[0], -1)
    h = states[-1][0]  # [A, K, H], the copy head's input
    ctx = drafter.fuse(feats)
    cols = {int(t): i for i, t in enumerate(vocab.tolist())} if vocab is not None else {t: t for t in range(96)}
    with torch.no_grad():
        for a_index, t in enumerate(anchors):
            for k in range(1, 5):
                q = drafter.copy_q(h[a_index, k - 1])
                rows = [j for j in range(t) if j + k <= t]
                if not rows:  # nothing known to copy yet: the generator alone
                    torch.testing.assert_close(mixed[a_index, k - 1], gen[a_index, k - 1], atol=1e-6, rtol=1e-4)
                    continue
                scores = torch.stack([q @ drafter.copy_k(ctx[j]) / 8.0 for j in rows])
                z = drafter.copy_gate(h[a_index, k - 1])[0]
                if n_match:
                    lengths = [suffix_match(j, t) for j in rows]
                    scores = scores + torch.stack([drafter.copy_match_score[k - 1, :m].sum() for m in lengths])
                    z = z + drafter.copy_match_gate[k - 1, :max(lengths)].sum()
                    bucket = {1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2}
                    scores = scores + torch.stack([drafter.copy_distance_score[k - 1, bucket.get(t - j, 3)]
                                                   for j in rows])
                attn = torch.softmax(scores, 0)
                g = torch.sigmoid(z)
                expected = (1 - g) * gen[a_index, k - 1]
                for j, w in zip(rows, attn):
                    expected[cols[ids[j + k]]] += g * w
                torch.testing.assert_close(mixed[a_index, k - 1], expected, atol=1e-6, rtol=1e-4)


def test_copy_head_sees_nothing_at_or_after_the_anchor_but_copies_tokens_up_to_it(copying):
    model, drafter, _, ids, feats = copying
    anchors = torch.tensor([[10, 12, 14, 30]])
    base = drafter.block_logits(torch.tensor([ids]), feats[None], anchors)
    gen = torch.Generator().manual_seed(5)
    for a_index, anchor in enumerate(anchors[0].tolist()):
        ids2, feats2 = scrambled_after(ids, feats, anchor, gen)
        x2 = torch.tensor([ids2])
        out = drafter.block_logits(x2, feats2[None], anchors)
        # compare over token ids (a per-sequence draft vocabulary has other columns for other sequences)
        full = drafter.to_full_vocab(out[0, a_index], vocab=drafter.sequence_vocab(x2))
        ref = drafter.to_full_vocab(base[0, a_index], vocab=drafter.sequence_vocab(torch.tensor([ids])))
        torch.testing.assert_close(full, ref, atol=1e-5, rtol=0)
        # the check can fail: the token just before the anchor is a copy source, and moves the block
        ids3 = list(ids)
        ids3[anchor - 1] = 95 if ids[anchor - 1] != 95 else 94
        x3 = torch.tensor([ids3])
        moved = drafter.to_full_vocab(drafter.block_logits(x3, feats[None], anchors)[0, a_index],
                                      vocab=drafter.sequence_vocab(x3))
        assert (moved - ref).abs().max() > 1e-3


def test_copy_head_learns_to_copy_spans_the_generator_cannot_predict():
    """Sequences of random tokens whose second half repeats a span of the first: only copying can predict
    them. After the same short training on such sequences, a drafter with the copy head accepts far more on
    new ones than the same drafter without it."""
    from entropy_law.decoding.replay import replay_chain
    from entropy_law.drafters.training.loop import collate, forward_train

    model = tiny_target(seed=4)
    gen = torch.Generator().manual_seed(0)

    def sample():
        head = torch.randint(3, 96, (24,), generator=gen)
        start = int(torch.randint(0, 8, (1,), generator=gen))
        seq = torch.cat([head, head[start:start + 16]]).tolist()
        return {"input_ids": torch.tensor(seq), "prompt_len": 25}

    train_set = [sample() for _ in range(800)]  # fresh sequences every step: nothing to memorise
    test_set = [sample() for _ in range(6)]
    accepted, features = {}, {}
    for arm, copy_head, match in (("plain", False, 0), ("copy", True, 0), ("copy+match", True, 3)):
        drafter = BlockDrafter(model, seed=0, block_size=5, num_layers=1, copy_head=copy_head, copy_match=match)
        if drafter.feature_layers not in features:  # the target's features: the same for every arm's layers
            # in one forward over all the sequences (all of one length), not one forward per sequence
            with torch.no_grad(), capture_features(model, drafter.feature_layers) as cap:
                model(torch.stack([s["input_ids"] for s in train_set + test_set]))
                features[drafter.feature_layers] = cap.features()[:, :-1].unbind(0)
        for s, f in zip(train_set + test_set, features[drafter.feature_layers]):
            s["features"] = f
        opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(1)
        drafter.train()
        for step in range(200):
            batch = collate(train_set[4 * step: 4 * step + 4])
            loss, _ = forward_train(drafter, batch, anchors_per_seq=12, gamma=4.0, generator=g)
            opt.zero_grad()
            loss.backward()
            opt.step()
        drafter.eval()
        with torch.no_grad():
            taus = [t for s in test_set
                    for t in replay_chain(drafter, s["input_ids"], s["features"], s["prompt_len"]).round_accepted]
        accepted[arm] = sum(taus) / len(taus)
    # measured: 3.09 of at most 4 drafts per round with the copy head, 0.02 without; exact-match features
    # make the pointer's job easy (4.0 after 100 steps)
    assert accepted["copy"] > 2.0 and accepted["plain"] < 0.3, accepted
    assert accepted["copy+match"] > 3.5, accepted


def test_copy_head_survives_save_load_and_init_from_checks_the_shape(tmp_path):
    from entropy_law.drafters.training.loop import init_from_checkpoint

    model = tiny_target()
    ids = torch.randint(3, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    plain = BlockDrafter(model, seed=1, block_size=5, num_layers=1, draft_vocab=range(0, 96, 2), context_vocab=True)
    path = plain.save(tmp_path / "plain.safetensors")
    fresh = BlockDrafter(model, seed=9, block_size=5, num_layers=1, draft_vocab=range(0, 96, 2), context_vocab=True,
                         copy_head=True)
    gate_before = fresh.copy_gate.bias.clone()
    info = init_from_checkpoint(fresh, path)
    assert info["fresh_weights"] == ["copy_gate.bias", "copy_gate.weight", "copy_k.weight", "copy_q.weight"]
    assert torch.equal(fresh.copy_gate.bias, gate_before)
    for name, tensor in plain.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor.half().float()), name
    saved = BlockDrafter.load(fresh.save(tmp_path / "copy.safetensors"), model)
    assert saved.config.copy_head and saved.config == fresh.config
    feats = features_of(model, ids[0].tolist(), saved.feature_layers)
    a = torch.tensor([[10, 20]])
    rounded = BlockDrafter(model, fresh.config, seed=None).eval()
    rounded.load_state_dict({k: v.half().float() if v.is_floating_point() else v
                             for k, v in fresh.state_dict().items()})
    rounded.refresh_vocab_map()
    torch.testing.assert_close(saved.block_logits(ids, feats[None], a), rounded.block_logits(ids, feats[None], a))
    with pytest.raises(ValueError, match="has a copy head, this run does not"):
        init_from_checkpoint(BlockDrafter(model, seed=1, block_size=5, num_layers=1, draft_vocab=range(0, 96, 2),
                                          context_vocab=True), tmp_path / "copy.safetensors")
    with pytest.raises(ValueError, match="num_layers: checkpoint 1, this run 2"):
        init_from_checkpoint(BlockDrafter(model, seed=1, block_size=5, num_layers=2, draft_vocab=range(0, 96, 2),
                                          context_vocab=True, copy_head=True), path)
    with pytest.raises(ValueError, match="draft vocabulary: the checkpoint's fixed ids differ"):
        init_from_checkpoint(BlockDrafter(model, seed=1, block_size=5, num_layers=1, draft_vocab=range(1, 96, 2),
                                          context_vocab=True, copy_head=True), path)
    with pytest.raises(ValueError, match="copy_head copies tokens of the context"):
        BlockDrafter(model, draft_vocab=range(0, 96, 2), copy_head=True)


def test_bfloat16_compute_keeps_the_output_greedy_the_target_fp32_and_is_recorded(tmp_path, copying):
    """``set_compute_dtype("bfloat16")`` runs the drafter's layers, fc and head rows in bf16: the decoder's
    output stays the target's greedy output, no parameter of the target changes dtype, the proposals stay
    close to the fp32 ones (log-probabilities within bf16 rounding), the dtype goes into the trace run's
    drafter config (so runs in two dtypes are never pooled), and a bad dtype is refused."""
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.interface import drafter_run_config

    model, drafter, kw, ids, feats = copying
    path = drafter.save(tmp_path / "d.safetensors", dtype=torch.float32)
    fp32 = BlockDrafter.load(path, model)
    bf16 = BlockDrafter.load(path, model, compute_dtype="bfloat16")
    target_dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert set(target_dtypes.values()) == {torch.float32}
    assert bf16.layers[0].q_proj.weight.dtype == torch.bfloat16 and bf16.fc.weight.dtype == torch.bfloat16
    assert bf16.norm.weight.dtype == torch.float32  # norms, copy head and logits stay fp32
    n = 20
    for d in (fp32, bf16):
        d.begin(ids[:n], feats[:n])
    a, b = fp32.propose(ids[:n + 1], None), bf16.propose(ids[:n + 1], None)
    assert a.logprobs.dtype == b.logprobs.dtype == torch.float32
    assert torch.allclose(a.logprobs[:, 0], b.logprobs[:, 0], atol=0.1), (a.logprobs[:, 0], b.logprobs[:, 0])
    assert not torch.equal(a.logprobs, b.logprobs)  # it did run in another precision
    assert "compute_dtype" not in drafter_run_config(fp32)
    assert drafter_run_config(bf16)["compute_dtype"] == "bfloat16"
    prompt = ids[:12]
    want = greedy(model, prompt, 24)[len(prompt):]
    for tree, budget in (("chain", None), ("ddtree", 8)):
        out = SpeculativeDecoder(model, bf16, tree=tree, budget=budget,
                                 policy=RatioGate(min_expected_accepted=0.0)).generate(prompt, max_new_tokens=24)
        assert out.token_ids == want
    assert {n: p.dtype for n, p in model.named_parameters()} == target_dtypes
    bf16.set_compute_dtype("float32")
    assert "compute_dtype" not in drafter_run_config(bf16) and bf16.layers[0].q_proj.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        bf16.set_compute_dtype("float16")
