"""Vision-language targets on tiny random Qwen2-VL, Qwen2.5-VL and LLaVA models with an image in the prompt.

Oracles are independent of the code under test: plain HF ``generate`` (the model's own cache, M-RoPE
offsets and pixel handling) for tokens and logits, ``scipy.stats.entropy`` for entropies, plain
``output_hidden_states`` forwards for features, and closed-form image token counts and M-RoPE offsets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.interface import DraftProposal
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.tree import Tree
from entropy_law.decoding.vlm import (ImagePromptEncoder, LlavaTargetAdapter, Qwen2VLTargetAdapter,
                                      generate_with_image, reference_greedy, vlm_adapter)
from tests.vlm_tiny import (byte_tokenizer, llava_image_processor, qwen_image_processor, test_image,
                            tiny_llava, tiny_qwen2_vl)

MAX_NEW = 48
LOGIT_TOL = 1e-4  # fp32: tree verification vs one-token steps differ by ~1e-6 here
QUESTION = "What is written in the chart? Describe the chart."
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava")


class Case:
    """One tiny VLM with an encoded image prompt and its HF greedy reference."""

    def __init__(self, family: str):
        self.family = family
        self.tokenizer = byte_tokenizer()
        # init_std 0.1: outputs that partly repeat, so prompt lookup drafts are sometimes right, sometimes not
        if family == "llava":
            self.model = tiny_llava(9, tokenizer=self.tokenizer, init_std=0.1)
            processor = llava_image_processor()
        else:
            self.model = tiny_qwen2_vl(1, tokenizer=self.tokenizer, init_std=0.1,
                                       version="2.5" if family == "qwen2_5_vl" else "2")
            processor = qwen_image_processor()
        self.encoder = ImagePromptEncoder(self.tokenizer, processor, self.model.config)
        self.image = test_image(7)
        self.prompt = self.encoder.encode(self.image, QUESTION)
        self.reference = reference_greedy(self.model, self.prompt, max_new_tokens=MAX_NEW)


_CASES: dict[str, Case] = {}


def get_case(family: str) -> Case:
    if family not in _CASES:
        _CASES[family] = Case(family)
    return _CASES[family]


@pytest.fixture(params=FAMILIES)
def case(request) -> Case:
    return get_case(request.param)


@pytest.fixture
def qwen() -> Case:
    return get_case("qwen2_vl")


class ScriptedDrafter:
    """Knows the greedy continuation and proposes 3 candidates per depth with it at rank 0 or 1 (so the
    accepted path runs through second children, whose node index differs from their depth) and a wrong
    token at every 4th output position (so some drafts are rejected). Wide DDTrees, deep accepted paths."""

    drafter_id = "scripted"
    block_size = 6

    def __init__(self, continuation: list[int], vocab: int, feature_layers=()):
        self.continuation = list(continuation)
        self.vocab = vocab
        self.feature_layers = tuple(feature_layers)
        self.rows_seen = 0

    def begin(self, prompt_ids, prompt_features):
        self.prompt_len = len(prompt_ids)
        self.rows_seen = 0 if prompt_features is None else int(prompt_features.shape[0])

    def propose(self, tokens, new_features):
        if new_features is not None:
            self.rows_seen += int(new_features.shape[0])
        pos = len(tokens) - self.prompt_len  # output index of the next token after the pending root
        rows, logps = [], []
        for d in range(self.block_size - 1):
            k = pos + d
            if k >= len(self.continuation):
                break
            true = self.continuation[k]
            others = [(true + 17 * (j + 1) + k) % self.vocab for j in range(3)]
            others = [t for t in others if t != true][:2]
            if k % 4 == 3:
                third = next(t for t in ((true + s) % self.vocab for s in range(5, 40)) if t not in others)
                cands = others + [third]  # the continuation is missing: every draft at this depth fails
            elif k % 2:
                cands = [others[0], true, others[1]]
            else:
                cands = [true] + others
            rows.append(cands)
            logps.append([math.log(0.6), math.log(0.3), math.log(0.1)])
        if not rows:
            return DraftProposal.empty()
        return DraftProposal(tokens=torch.tensor(rows), logprobs=torch.tensor(logps))


class MemoryRecorder:
    """The three ``TraceRecorder`` methods ``RecorderObserver`` calls, kept in memory."""

    def __init__(self):
        self.requests, self.rounds, self.ends = {}, [], {}

    def begin_request(self, request_id, **info):
        self.requests[request_id] = info

    def log_round(self, request_id, **row):
        self.rounds.append(row)

    def end_request(self, request_id, **info):
        self.ends[request_id] = info


class LogitCollector:
    """Observer: the target logit row behind every committed output position, in output order."""

    def __init__(self):
        self.rows = []

    def on_request_start(self, request_id, info):
        self.rows = []

    def on_round(self, record):
        self.rows.append(record.target_logits.float())

    def on_request_end(self, request_id, info):
        pass

    def logits(self) -> torch.Tensor:
        return torch.cat(self.rows)


def exactness_error(adapter, case: Case, drafter, tree: str, budget: int | None):
    """Decode ``case`` speculatively: (tokens, max |logit - HF greedy logit| over every output position,
    the result). This is the exactness check."""
    collector = LogitCollector()
    decoder = SpeculativeDecoder(adapter, drafter, tree=tree, budget=budget, observers=[collector],
                                 policy=RatioGate(min_expected_accepted=0.0))
    result = generate_with_image(decoder, case.prompt, max_new_tokens=MAX_NEW)
    got = collector.logits()
    ref = case.reference.logits
    n = min(len(got), len(ref))
    return result.token_ids, float((got[:n] - ref[:n]).abs().max()), result


# --- prompts -----------------------------------------------------------------------------------------


def test_qwen_prompt_expands_image_tokens_from_the_grid(qwen):
    prompt = qwen.prompt
    # 48x32 image, max 32*32 pixels, patch 4: resized to 32 wide x 24 high -> grid (1, 6, 8), merge 2x2
    assert prompt.tensors["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert prompt.image_tokens == 6 * 8 // 4 == 12
    ids = np.array(prompt.input_ids)
    image_id = qwen.model.config.image_token_id
    slots = np.flatnonzero(ids == image_id)
    assert len(slots) == 12 and np.all(np.diff(slots) == 1)  # one contiguous run
    assert ids[slots[0] - 1] == qwen.model.config.vision_start_token_id
    assert ids[slots[-1] + 1] == qwen.model.config.vision_end_token_id
    assert prompt.tensors["mm_token_type_ids"][0].tolist() == (ids == image_id).astype(int).tolist()
    assert QUESTION in qwen.tokenizer.decode(prompt.input_ids)


def test_llava_prompt_expands_one_token_per_patch():
    tokenizer = byte_tokenizer()
    model = tiny_llava(0, tokenizer=tokenizer)
    encoder = ImagePromptEncoder(tokenizer, llava_image_processor(), model.config)
    prompt = encoder.encode(test_image(1), "Describe the image.")
    assert prompt.tensors["pixel_values"].shape == (1, 3, 32, 32)
    assert prompt.image_tokens == (32 // 8) ** 2 == 16  # CLIP patches; the 'default' strategy drops CLS
    assert prompt.input_ids.count(model.config.image_token_id) == 16
    assert tokenizer.decode(prompt.input_ids).startswith("USER: <image>")


def test_multi_turn_prompt_keeps_the_image_in_the_first_turn(qwen):
    prompt = qwen.encoder.encode(qwen.image, ["First question?", "Second question?"], answers=["An answer."])
    text = qwen.tokenizer.decode(prompt.input_ids)
    assert text.index("First question?") < text.index("An answer.") < text.index("Second question?")
    assert prompt.image_tokens == 12 and prompt.input_ids.count(qwen.model.config.image_token_id) == 12
    with pytest.raises(ValueError, match="need 1 assistant answers"):
        qwen.encoder.encode(qwen.image, ["a?", "b?"])


def test_text_only_prompt_through_a_vlm_adapter(qwen):
    prompt = qwen.encoder.encode(None, QUESTION)
    assert prompt.image_tokens == 0 and not prompt.tensors
    ref = reference_greedy(qwen.model, prompt, max_new_tokens=12)
    adapter = vlm_adapter(qwen.model)
    result = generate_with_image(ARDecoder(adapter), prompt, max_new_tokens=12)
    assert result.token_ids == ref.token_ids
    assert adapter.rope_delta == 0


# --- M-RoPE ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_rope_delta_closed_form_and_equal_to_hf(family):
    case = get_case(family)
    adapter = vlm_adapter(case.model)
    assert isinstance(adapter, Qwen2VLTargetAdapter)
    adapter.attach(case.prompt)
    adapter.prefill(case.prompt.input_ids)
    # grid (1, 6, 8) merged 2x2 -> llm grid (1, 3, 4): the image advances the position counter by
    # max(1, 3, 4) = 4 while it occupies 12 tokens, so every later position is 12 - 4 = 8 below its index
    assert adapter.rope_delta == 4 - 12 == -8
    reference_greedy(case.model, case.prompt, max_new_tokens=1)  # HF caches its own offset at prefill
    assert int(case.model.model.rope_deltas.reshape(-1)[0]) == adapter.rope_delta
    tree = Tree(tokens=(5, 6, 7), parents=(0, 0, 1), depths=(1, 1, 2))
    start = len(case.prompt.input_ids)
    positions = adapter.tree_position_ids(start, tree)
    assert positions.shape == (3, 1, 4)
    expected = torch.tensor([start, start + 1, start + 1, start + 2]) - 8
    for axis in range(3):
        assert positions[axis, 0].tolist() == expected.tolist()


# --- exactness ---------------------------------------------------------------------------------------


def test_ar_decoding_equals_hf_generate(case):
    ref = case.reference
    assert len(ref.token_ids) >= 16, "the reference should be long enough to test something"
    collector = LogitCollector()
    result = generate_with_image(ARDecoder(vlm_adapter(case.model), observers=[collector]), case.prompt,
                                 max_new_tokens=MAX_NEW)
    assert result.token_ids == ref.token_ids
    assert torch.allclose(collector.logits(), ref.logits, atol=LOGIT_TOL, rtol=0)


@pytest.mark.parametrize("drafter_kind, tree, budget", [
    ("ngram", "chain", None),
    ("ngram", "ddtree", 12),
    ("scripted", "chain", None),
    ("scripted", "ddtree", 10),
])
def test_speculative_equals_greedy_with_an_image(case, drafter_kind, tree, budget):
    if drafter_kind == "ngram":
        drafter = NgramDrafter(block_size=6, max_matches=3, min_path_prob=0.0)
    else:
        drafter = ScriptedDrafter(case.reference.token_ids, case.model.config.get_text_config().vocab_size)
    tokens, err, result = exactness_error(vlm_adapter(case.model), case, drafter, tree, budget)
    assert tokens == case.reference.token_ids
    assert err < LOGIT_TOL
    # the test exercised verification: drafts were verified, some accepted and some rejected
    drafted = [r for r in result.rounds if r.drafted]
    assert drafted and sum(r.accepted for r in drafted) >= 3
    assert any(r.accepted < r.tree_depth for r in drafted)
    if tree == "ddtree":
        assert any(r.tree_nodes > r.tree_depth for r in drafted), "expected branching trees"


def test_recorded_entropies_equal_ar_entropies_and_requests_carry_image_tokens(case):
    recorder = MemoryRecorder()
    drafter = ScriptedDrafter(case.reference.token_ids, case.model.config.get_text_config().vocab_size)
    decoder = SpeculativeDecoder(vlm_adapter(case.model), drafter, tree="ddtree", budget=10,
                                 observers=[RecorderObserver(recorder)], policy=RatioGate(min_expected_accepted=0.0))
    result = generate_with_image(decoder, case.prompt, max_new_tokens=MAX_NEW, request_id="img-0",
                                 category="chart", question_id="q0", dataset="tiny")
    assert result.token_ids == case.reference.token_ids
    info = recorder.requests["img-0"]
    assert info["image_tokens"] == case.prompt.image_tokens == (12 if case.family != "llava" else 16)
    assert info["prompt_tokens"] == len(case.prompt.input_ids)
    recorded = np.concatenate([row["target_stats"]["entropy_nats"] for row in recorder.rounds])
    tokens = np.concatenate([row["token_ids"] for row in recorder.rounds])
    assert tokens.tolist() == case.reference.token_ids
    probs = torch.softmax(case.reference.logits.double(), dim=-1).numpy()
    independent = scipy_entropy(probs, axis=-1)  # nats
    assert recorded.shape == independent.shape
    np.testing.assert_allclose(recorded, independent, atol=1e-4, rtol=0)


# --- the check can fail --------------------------------------------------------------------------------


class OneDimensionalQwenAdapter(Qwen2VLTargetAdapter):
    """WRONG on purpose: text-LLM tree positions ``start + depth`` (no M-RoPE offset) after a correct prefill."""

    tree_position_ids = TargetAdapter.tree_position_ids


class NodeOrderQwenAdapter(Qwen2VLTargetAdapter):
    """WRONG on purpose for trees: positions by node order (what the model infers with position_ids=None:
    ``arange(cache_len, cache_len + N + 1) + rope_delta``); right for chains only."""

    def tree_position_ids(self, start, tree):
        flat = torch.arange(tree.n_nodes + 1) + start + self.rope_delta
        return flat.view(1, 1, -1).expand(3, 1, -1)


def test_one_dimensional_positions_for_qwen_trees_are_caught(qwen):
    drafter = ScriptedDrafter(qwen.reference.token_ids, qwen.model.config.get_text_config().vocab_size)
    tokens, err, _ = exactness_error(OneDimensionalQwenAdapter(qwen.model), qwen, drafter, "ddtree", 10)
    assert err > 1e-2, f"a wrong position scheme went unnoticed (max logit error {err:.2e})"
    # the same check passes with the right scheme (so the failure is the positions, nothing else)
    drafter = ScriptedDrafter(qwen.reference.token_ids, qwen.model.config.get_text_config().vocab_size)
    tokens_ok, err_ok, _ = exactness_error(Qwen2VLTargetAdapter(qwen.model), qwen, drafter, "ddtree", 10)
    assert err_ok < LOGIT_TOL and tokens_ok == qwen.reference.token_ids


def test_node_order_positions_are_caught_on_trees_but_fine_on_chains(qwen):
    vocab = qwen.model.config.get_text_config().vocab_size
    _, err_tree, _ = exactness_error(NodeOrderQwenAdapter(qwen.model), qwen,
                                     ScriptedDrafter(qwen.reference.token_ids, vocab), "ddtree", 10)
    assert err_tree > 1e-2
    tokens, err_chain, _ = exactness_error(NodeOrderQwenAdapter(qwen.model), qwen,
                                           ScriptedDrafter(qwen.reference.token_ids, vocab), "chain", None)
    assert err_chain < LOGIT_TOL and tokens == qwen.reference.token_ids


# --- fused features ------------------------------------------------------------------------------------


@torch.inference_mode()
def test_prefill_features_are_fused_states_over_all_prompt_positions(case):
    layers = (0, 1)
    adapter = vlm_adapter(case.model, feature_layers=layers)
    adapter.attach(case.prompt)
    _, features = adapter.prefill(case.prompt.input_ids)
    n = len(case.prompt.input_ids)
    hidden = case.model.config.get_text_config().hidden_size
    assert features.shape == (n, len(layers) * hidden)
    # independent: a plain forward with output_hidden_states (index i + 1 = output of decoder layer i,
    # except the last entry, which transformers 5 replaces by the final-norm output)
    ids = torch.tensor([case.prompt.input_ids])
    out = case.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True,
                     **dict(case.prompt.tensors))
    first, last = features[:, :hidden], features[:, hidden:]
    assert torch.allclose(first, out.hidden_states[1][0], atol=1e-5, rtol=0)
    final_norm = case.model.model.language_model.norm
    assert torch.allclose(final_norm(last), out.hidden_states[-1][0], atol=1e-5, rtol=0)
    # the image is in them: another image changes the states at image rows and at the text after it
    other = case.encoder.encode(test_image(8), QUESTION)
    adapter.attach(other)
    _, features_other = adapter.prefill(other.input_ids)
    image_rows = np.flatnonzero(np.array(case.prompt.input_ids) == case.model.config.image_token_id)
    assert (features[image_rows] - features_other[image_rows]).abs().max() > 1e-3
    assert (features[-1] - features_other[-1]).abs().max() > 1e-4


def test_block_style_drafter_receives_one_feature_row_per_committed_position(qwen):
    drafter = ScriptedDrafter(qwen.reference.token_ids, qwen.model.config.get_text_config().vocab_size,
                              feature_layers=(1,))
    decoder = SpeculativeDecoder(vlm_adapter(qwen.model, feature_layers=(1,)), drafter, tree="ddtree", budget=10,
                                 policy=RatioGate(min_expected_accepted=0.0))
    result = generate_with_image(decoder, qwen.prompt, max_new_tokens=MAX_NEW)
    assert result.token_ids == qwen.reference.token_ids
    # prompt rows (image included) + one row per committed position up to the last root
    assert drafter.rows_seen >= len(qwen.prompt.input_ids) + len(result.token_ids) - drafter.block_size


# --- errors ----------------------------------------------------------------------------------------------


def test_prefill_refuses_ids_that_do_not_match_the_attached_image(qwen):
    adapter = vlm_adapter(qwen.model)
    adapter.attach(qwen.prompt)
    with pytest.raises(ValueError, match="differ from the attached image prompt"):
        adapter.prefill(qwen.prompt.input_ids[:-1])
    with pytest.raises(ValueError, match="image tokens but 0 image features"):
        adapter.prefill(qwen.prompt.input_ids)  # nothing attached any more


def test_generate_with_image_needs_a_vlm_adapter(qwen):
    with pytest.raises(TypeError, match="VLMTargetAdapter"):
        generate_with_image(ARDecoder(TargetAdapter(qwen.model)), qwen.prompt, max_new_tokens=2)


def test_llava_adapter_keeps_text_positions():
    tokenizer = byte_tokenizer()
    adapter = vlm_adapter(tiny_llava(0, tokenizer=tokenizer))
    assert isinstance(adapter, LlavaTargetAdapter)
    tree = Tree(tokens=(5, 6), parents=(0, 0), depths=(1, 1))
    assert adapter.tree_position_ids(40, tree).tolist() == [[40, 41, 41]]


def test_unsupported_model_type_is_a_clear_error():
    from conftest import tiny_llama

    with pytest.raises(ValueError, match="unsupported vision-language model type 'llama'"):
        vlm_adapter(tiny_llama(0))


# --- the block drafter over fused states -----------------------------------------------------------------


@pytest.mark.parametrize("tree, budget", [("chain", None), ("ddtree", 12)])
def test_untrained_block_drafter_over_fused_states_is_exact(case, tree, budget):
    from entropy_law.drafters.block import BlockDrafter

    drafter = BlockDrafter(case.model, feature_layers=(0, 1), block_size=6, num_layers=1, top_k=4, seed=0)
    adapter = vlm_adapter(case.model, feature_layers=drafter.feature_layers)
    tokens, err, result = exactness_error(adapter, case, drafter, tree, budget)
    assert tokens == case.reference.token_ids
    assert err < LOGIT_TOL
    drafted = [r for r in result.rounds if r.drafted]
    assert drafted and all(r.tree_nodes > 0 for r in drafted)
    if tree == "ddtree":
        assert any(r.tree_nodes > r.tree_depth for r in drafted)


# --- a recording loop over image task files ---------------------------------------------------------------


def test_recording_loop_over_shipped_image_tasks(tmp_path):
    """What ``entropy-law record`` does per image task, on a tiny Qwen2-VL saved to a local folder, with
    Parquet traces written and read back."""
    from entropy_law.decoding.vlm import ImageRequests
    from entropy_law.traces.reader import load_traces
    from entropy_law.traces.recorder import TraceRecorder
    from entropy_law.prompts.image import load_image_tasks

    tokenizer = byte_tokenizer()
    model = tiny_qwen2_vl(1, tokenizer=tokenizer, init_std=0.1)
    folder = tmp_path / "tiny-qwen2-vl"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    qwen_image_processor().save_pretrained(folder)

    tasks = load_image_tasks("vlm_tasks", limit=1)  # one per category
    requests = ImageRequests.load(folder)
    references = {}
    with TraceRecorder(tmp_path / "run", model_id="tiny-qwen2-vl", drafter_id="ngram", tree_policy="ddtree",
                       drafter_config={}, dtype="float32", device="cpu", seed=0) as recorder:
        decoder = SpeculativeDecoder(requests.adapter, NgramDrafter(block_size=6, min_path_prob=0.0), tree="ddtree",
                                     budget=8, observers=[RecorderObserver(recorder)],
                                     policy=RatioGate(min_expected_accepted=0.0))
        for task in tasks:
            prompt_ids, extra = requests.prepare(task)
            result = decoder.generate(prompt_ids, max_new_tokens=12, category=task.category,
                                      request_id=task.request_id, dataset=task.dataset,
                                      question_id=task.question_id, **extra)
            # oracle: the in-memory model, HF generate, the prompt encoded without the loaded folder
            prompt = ImagePromptEncoder(tokenizer, qwen_image_processor(), model.config).encode(task.image,
                                                                                                task.prompt)
            assert prompt.input_ids == prompt_ids
            references[task.request_id] = reference_greedy(model, prompt, max_new_tokens=12)
            assert result.token_ids == references[task.request_id].token_ids
    traces = load_traces(tmp_path / "run")
    req = traces.requests.set_index("request_id")
    assert sorted(req.index) == sorted(t.request_id for t in tasks)
    # 320x240 shipped images, max 32*32 pixels at patch 4 -> 32x24 -> grid 6x8 -> 12 merged tokens
    assert (req["image_tokens"] == 12).all()
    for task in tasks:
        assert req.loc[task.request_id, "prompt_tokens"] == len(requests.encoder.encode(task.image,
                                                                                        task.prompt).input_ids)
        tok = traces.tokens[traces.tokens.request_id == task.request_id].sort_values("position")
        assert tok.token_id.tolist() == references[task.request_id].token_ids
        probs = torch.softmax(references[task.request_id].logits.double(), dim=-1).numpy()
        np.testing.assert_allclose(tok.target_entropy_nats.to_numpy(), scipy_entropy(probs, axis=-1),
                                   atol=1e-4, rtol=0)


def test_llava_prompt_gets_exactly_one_bos_with_and_without_a_chat_template():
    from tokenizers.processors import TemplateProcessing

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    bos_id = tokenizer.convert_tokens_to_ids("<s>")
    # a tokenizer that adds BOS by itself, as Llama's does
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos_id)])
    assert tokenizer("hi")["input_ids"][0] == bos_id
    model = tiny_llava(0, tokenizer=tokenizer)
    template = ("{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %} "
                "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
    for chat_template in (None, template):  # built-in format (writes BOS) and a template without BOS
        encoder = ImagePromptEncoder(tokenizer, llava_image_processor(), model.config, chat_template=chat_template)
        ids = encoder.encode(test_image(1), "Describe the image.").input_ids
        assert ids[0] == bos_id and ids.count(bos_id) == 1
        assert tokenizer.decode(ids[1:]).startswith("USER: <image>")


def test_record_cli_over_image_task_files(tmp_path):
    """``entropy-law record --tasks vlm_tasks`` on a tiny Qwen2-VL folder: traces carry the image token
    count, and the recorded tokens equal HF greedy decoding with the image."""
    from entropy_law.cli import main
    from entropy_law.traces.reader import load_traces
    from entropy_law.prompts.image import load_image_tasks

    tokenizer = byte_tokenizer()
    model = tiny_qwen2_vl(1, tokenizer=tokenizer, init_std=0.1)
    folder = tmp_path / "tiny-qwen2-vl"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    qwen_image_processor().save_pretrained(folder)

    out = tmp_path / "run"
    code = main(["record", "--model", str(folder), "--tasks", "vlm_tasks", "--categories", "chart",
                 "--limit", "1", "--drafter", "ngram", "--tree", "ddtree", "--budget", "8",
                 "--max-new-tokens", "10", "--out", str(out), "--no-progress"])
    assert code == 0
    traces = load_traces(out)
    (task,) = load_image_tasks("vlm_tasks", categories=["chart"], limit=1)
    req = traces.requests.set_index("request_id")
    assert list(req.index) == [task.request_id]
    assert req.loc[task.request_id, "image_tokens"] == 12
    prompt = ImagePromptEncoder(tokenizer, qwen_image_processor(), model.config).encode(task.image, task.prompt)
    reference = reference_greedy(model, prompt, max_new_tokens=10)
    tokens = traces.tokens.sort_values("position")
    assert tokens.token_id.tolist() == reference.token_ids
