"""Training the block drafter on self-distilled data, and its held-out chain acceptance (offline replay).

Slot ``k`` at a sampled anchor is labelled with the token at ``anchor + k``; loss: cross-entropy decayed by
``exp(-(k-1)/gamma)``, optionally mixed with KL to the target's top-k, plus a copy-pointer loss. Seeded, resumable.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from entropy_law.decoding.attention import text_config
from entropy_law.decoding.features import decoder_layers
from entropy_law.decoding.loading import load_target, model_of
from entropy_law.decoding.replay import replay_chain
from entropy_law.drafters.block import BlockDrafter, read_checkpoint
from entropy_law.drafters.training.data import load_samples
from entropy_law.traces.layout import file_sha256

IGNORE = -100


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one training run (all of them; written beside the checkpoint)."""

    seed: int = 0
    block_size: int = 8
    num_layers: int = 1
    steps: int = 1600
    minutes: float | None = None  # safety stop; the schedule follows ``steps``
    lr: float = 1e-3
    warmup_frac: float = 0.04
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    clip: float = 1.0
    batch_seqs: int = 4
    anchors_per_seq: int = 32
    gamma: float = 4.0
    heldout: int = 16
    eval_every: int = 200
    save_every: int = 50
    draft_vocab_base: int | None = 4096  # None: full vocabulary; else ids < base plus every training token
    context_vocab: bool = False  # also draft ids already in the context (copying rare words of a passage)
    kl_weight: float = 0.0  # a in (1-a)*CE + a*KL(target top-k || drafter); 0: hard labels only
    init_from_target: bool = False  # drafter layers and final norm start as the target's (``init_from_target``)
    init_fc: bool = False  # with init_from_target: fc and the context norm too
    copy_head: bool = False  # the drafter mixes each slot with a pointer over the context (``copy_mix``)
    copy_match: int = 0  # with copy_head: exact suffix-match lengths 1..M as pointer and gate features
    copy_distance: int = 0  # with copy_head: a learned pointer score per log2 distance bucket (this many)
    copy_loss_weight: float = 0.0  # c: + c * the pointer's own decayed NLL where the label can be copied
    init_from: str | None = None  # a drafter checkpoint whose weights start the run (``init_from_checkpoint``)


def run_draft_vocabulary(cfg: "TrainConfig", samples: Sequence[dict], vocab_size: int) -> list[int] | None:
    """That of the checkpoint the run fine-tunes (``cfg.init_from``), else ``draft_vocabulary`` of its samples."""
    if cfg.draft_vocab_base is None:
        return None
    if cfg.init_from:
        from safetensors import safe_open

        with safe_open(str(cfg.init_from), framework="pt") as fh:  # that one tensor, not the weights
            if "draft_vocab" in fh.keys():
                return [int(i) for i in fh.get_tensor("draft_vocab").tolist()]
    return draft_vocabulary(samples, cfg.draft_vocab_base, vocab_size)


def draft_vocabulary(samples: Sequence[dict], base: int, vocab_size: int) -> list[int]:
    """Token ids the drafter may propose: ids ``< base`` (BPE merges: the common ones) plus every token of
    the training prompts and responses (grounded answers copy from the prompt)."""
    ids = set(range(min(base, vocab_size)))
    for s in samples:
        ids.update(int(t) for t in s["input_ids"].unique().tolist())
    return sorted(ids)


def sample_anchors(prompt_len: int, seq_len: int, n: int, generator: torch.Generator):
    """``(anchors [n], valid [n])``: up to ``n`` distinct sorted anchors, uniform among response positions
    ``prompt_len .. seq_len-2``; padding anchors are 0 and invalid."""
    count = max(seq_len - 1 - prompt_len, 0)
    take = min(n, count)
    anchors = torch.zeros(n, dtype=torch.long)
    if count > 0:
        anchors[:take] = torch.randperm(count, generator=generator)[:take].sort().values + prompt_len
    return anchors, torch.arange(n) < take


def block_labels(input_ids: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor, block_size: int,
                 prompt_lens: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """``[b, A, B-1]``: ``input_ids[anchor + k]``; ``IGNORE`` at padding anchors, past the end or in the prompt."""
    k = torch.arange(1, block_size)
    pos = anchors[..., None] + k  # [b, A, B-1]
    inside = (pos < seq_lens[:, None, None]) & (pos >= prompt_lens[:, None, None]) & valid[..., None]
    safe = pos.clamp(max=input_ids.shape[1] - 1)
    labels = torch.gather(input_ids, 1, safe.flatten(1)).view_as(pos)
    return torch.where(inside, labels, torch.full_like(labels, IGNORE))


def decay_weights(block_size: int, gamma: float) -> torch.Tensor:
    """``w_k = exp(-(k-1)/gamma)`` for slots k = 1..B-1."""
    return torch.exp(-(torch.arange(1, block_size, dtype=torch.float32) - 1) / gamma)


def decayed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, gamma: float) -> torch.Tensor:
    """Position-decayed CE over ``[.., B-1, V]`` logits, normalised by the sum of the weights present."""
    ce, w = _slot_ce(logits, labels, gamma)
    return (ce * w).sum() / w.sum().clamp(min=1e-12)


def _slot_ce(logits: torch.Tensor, labels: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot cross-entropy and its decay weights (0 where the label is ``IGNORE``)."""
    w = decay_weights(logits.shape[-2] + 1, gamma).expand(labels.shape) * (labels != IGNORE)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).clamp(min=0),
                         reduction="none").view(labels.shape)
    return ce, w


def block_soft_labels(soft_ids: torch.Tensor, soft_logp: torch.Tensor, anchors: torch.Tensor,
                      block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k soft labels of every block slot: ``[b, S, K]`` rows by absolute position (``collate``)
    -> ``[b, A, B-1, K]`` ids and log-probabilities at position ``anchor + k`` (the hard label's position)."""
    b, s, kk = soft_ids.shape
    pos = (anchors[..., None] + torch.arange(1, block_size)).clamp(max=s - 1).flatten(1)  # [b, A*(B-1)]
    idx = pos[..., None].expand(-1, -1, kk)
    shape = (*anchors.shape, block_size - 1, kk)
    return torch.gather(soft_ids, 1, idx).view(shape), torch.gather(soft_logp, 1, idx).view(shape)


def renormalised_topk(soft_logp: torch.Tensor, draftable: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the target's top-k restricted to ``draftable`` entries and renormalised over them
    (``-inf`` elsewhere; all ``-inf`` where none is draftable)."""
    logp = soft_logp.masked_fill(~draftable, float("-inf"))
    norm = torch.logsumexp(logp, dim=-1, keepdim=True)
    return torch.where(torch.isfinite(norm), logp - norm, torch.full_like(logp, float("-inf")))


def slot_kl(logits: torch.Tensor, soft_cols: torch.Tensor, soft_logp: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per slot ``[..]`` (0 where p is empty): ``logits [.., Vd]`` (q = softmax), ``soft_cols
    [.., K]`` the columns of p's support, ``soft_logp [.., K]`` log p (renormalised; ``-inf``: none)."""
    logq = torch.log_softmax(logits, dim=-1)
    logq_k = torch.gather(logq, -1, soft_cols.clamp(min=0))
    p = soft_logp.exp()
    terms = torch.where(p > 0, p * (soft_logp - logq_k), torch.zeros_like(p))
    return terms.sum(-1)


def decayed_distillation_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float, kl_weight: float,
                              soft_cols: torch.Tensor, soft_logp: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``sum_k w_k [(1-a) CE_k + a KL_k] / sum_k w_k`` over labelled slots, and the CE and KL parts (floats)."""
    ce, w = _slot_ce(logits, labels, gamma)
    total = w.sum().clamp(min=1e-12)
    kl = slot_kl(logits, soft_cols, soft_logp)
    ce_mean, kl_mean = (ce * w).sum() / total, (kl * w).sum() / total
    parts = {"ce": float(ce_mean.detach()), "kl": float(kl_mean.detach())}
    return (1 - kl_weight) * ce_mean + kl_weight * kl_mean, parts


def accepted_drafts(draft_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Leading draft slots equal to their label (IGNORE stops the run): ``[..., B-1] -> [...]``."""
    hit = (draft_ids == labels) & (labels != IGNORE)
    return hit.long().cumprod(dim=-1).sum(dim=-1)


def target_source_layers(drafter: BlockDrafter, num_target_layers: int) -> list[int]:
    """The target layers ``init_from_target`` copies: those right after the deepest feature layer (they read
    its output), shifted back to the last ``num_layers`` layers where the target ends first."""
    n = len(drafter.layers)
    first = min(max(drafter.feature_layers) + 1, num_target_layers - n)
    return list(range(first, first + n))


@torch.no_grad()
def llama_shape_problem(model: torch.nn.Module) -> str | None:
    """Why the target's decoder layers cannot be copied into the Llama-shaped drafter layers (SiLU gated MLP,
    two RMSNorms ``weight * x / rms(x)``), or ``None`` when they can."""
    cfg = text_config(model)
    act = getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None)
    if act != "silu":
        return f"its MLP activation is {act!r}, not 'silu'"
    layer = decoder_layers(model)[0]
    extra = [n for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm") if hasattr(layer, n)]
    if extra:
        return f"its layers have norms the drafter's lack ({', '.join(extra)})"
    norm = layer.input_layernorm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    x = torch.linspace(-2.0, 3.0, norm.weight.shape[0])[None].to(norm.weight.dtype)
    plain = norm.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if not torch.allclose(norm(x), plain, rtol=1e-4, atol=1e-5):
        return "its RMSNorm does not compute weight * x / rms(x) (Gemma's scales by 1 + weight)"
    return None


@torch.no_grad()
def init_from_target(drafter: BlockDrafter, target, *, init_fc: bool = False,
                     source_layers: Sequence[int] | None = None) -> list[int]:
    """Copy target layer ``source_layers[i]`` (default ``target_source_layers``) into drafter layer ``i`` and
    the final norm, in place; returns the source layers. ``init_fc``: ``fc`` selects the deepest feature's slice
    and the context norm copies the first source layer's input norm."""
    model = model_of(target)
    blocks = decoder_layers(model)
    problem = llama_shape_problem(model)
    if problem:
        raise ValueError(f"cannot initialise the drafter from this target's layers: {problem}. The drafter's "
                         "layers are Llama-shaped; train this target's drafter without --init-from-target")
    source = list(source_layers) if source_layers is not None else target_source_layers(drafter, len(blocks))
    if len(source) != len(drafter.layers):
        raise ValueError(f"{len(drafter.layers)} drafter layers, {len(source)} source layers")
    names = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
             "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}

    def copy(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
        if dst.shape != src.shape:
            raise ValueError(f"cannot initialise {what} from the target: shape {tuple(src.shape)} != "
                             f"{tuple(dst.shape)}")
        dst.copy_(src.detach().to(dst.dtype))

    for layer, j in zip(drafter.layers, source):
        src = blocks[j]
        for mine, theirs in names.items():
            copy(getattr(layer, mine).weight, src.get_submodule(theirs).weight, f"layer {j} {theirs}")
    final_norm = getattr(getattr(model, "model", model), "norm", None)
    if final_norm is None:
        raise ValueError("cannot find the target's final norm (model.model.norm)")
    copy(drafter.norm.weight, final_norm.weight, "the final norm")
    if init_fc:
        h = drafter.config.hidden_size
        deepest = drafter.feature_layers.index(max(drafter.feature_layers))
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, deepest * h: (deepest + 1) * h] = torch.eye(h, dtype=drafter.fc.weight.dtype)
        copy(drafter.hidden_norm.weight, blocks[source[0]].input_layernorm.weight, "the context norm")
    return source


@torch.no_grad()
def init_from_checkpoint(drafter: BlockDrafter, path: str | Path) -> dict:
    """Start ``drafter`` in place from the checkpoint at ``path``, which must have its shape (only a copy head
    may be new, started fresh); returns the checkpoint's file name and SHA-256, to be recorded."""
    path = Path(path)
    theirs, state, _ = read_checkpoint(path)
    mine = drafter.config
    fields = ("hidden_size", "vocab_size", "target_num_layers", "feature_layers", "block_size", "num_layers",
              "draft_vocab_size", "context_vocab", "target_fingerprint")
    diff = [f"{f}: checkpoint {getattr(theirs, f)!r}, this run {getattr(mine, f)!r}"
            for f in fields if getattr(theirs, f) != getattr(mine, f)]
    if theirs.copy_head and not mine.copy_head:
        diff.append("the checkpoint has a copy head, this run does not (add --copy-head)")
    elif theirs.copy_head and theirs.copy_dim != mine.copy_dim:
        diff.append(f"copy_dim: checkpoint {theirs.copy_dim}, this run {mine.copy_dim}")
    if not diff and "draft_vocab" in state and not torch.equal(state["draft_vocab"], drafter.draft_vocab):
        diff.append("draft vocabulary: the checkpoint's fixed ids differ from this run's (other training data)")
    if diff:
        raise ValueError(f"--init-from {path} does not fit this run: " + "; ".join(diff))
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    fresh = [k for k in missing if not k.startswith("copy_")]
    if fresh or unexpected:
        raise ValueError(f"--init-from {path}: missing weights {fresh}, unexpected weights {unexpected}")
    drafter.refresh_vocab_map()
    return {"init_from": path.name, "init_from_sha256": file_sha256(path), "fresh_weights": sorted(missing)}


def collate(samples: Sequence[dict], *, soft: bool = False) -> dict:
    """Pad samples (``input_ids``, ``features`` rows ``0..len-2``, ``prompt_len``); ``soft``: also ``soft_ids``
    (-1: none) and ``soft_logp`` (-inf: none) ``[b, S, K]`` by absolute position from ``topk_ids`` / ``_logprobs``."""
    seq_lens = torch.tensor([int(s["input_ids"].shape[0]) for s in samples])
    s_max = int(seq_lens.max())
    width = samples[0]["features"].shape[1]
    ids = torch.zeros((len(samples), s_max), dtype=torch.long)
    feats = torch.zeros((len(samples), s_max - 1, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        ids[i, : seq_lens[i]] = s["input_ids"]
        n = min(int(s["features"].shape[0]), s_max - 1)
        feats[i, :n] = s["features"][:n].float()
    batch = {"input_ids": ids, "features": feats, "seq_lens": seq_lens,
             "prompt_lens": torch.tensor([int(s["prompt_len"]) for s in samples])}
    if soft:
        missing = [s.get("prompt_id", i) for i, s in enumerate(samples) if "topk_ids" not in s]
        if missing:
            raise ValueError(f"samples {missing[:3]} have no stored soft labels: generate the data with "
                             "--soft-topk K (kl_weight > 0 needs them)")
        kk = int(samples[0]["topk_ids"].shape[1])
        soft_ids = torch.full((len(samples), s_max, kk), -1, dtype=torch.long)
        soft_logp = torch.full((len(samples), s_max, kk), float("-inf"))
        for i, s in enumerate(samples):
            p, n = int(s["prompt_len"]), int(s["topk_ids"].shape[0])
            if n != int(seq_lens[i]) - p or int(s["topk_ids"].shape[1]) != kk:
                raise ValueError(f"sample {s.get('prompt_id', i)}: {tuple(s['topk_ids'].shape)} soft labels for "
                                 f"{int(seq_lens[i]) - p} response tokens (k={kk})")
            soft_ids[i, p: p + n] = s["topk_ids"].long()
            soft_logp[i, p: p + n] = s["topk_logprobs"].float()
        batch.update(soft_ids=soft_ids, soft_logp=soft_logp)
    return batch


def copy_pointer_loss(copy: torch.Tensor, labels: torch.Tensor, gamma: float) -> tuple[torch.Tensor, float]:
    """The decayed mean of ``-log sum_j a_j [token j+k == label]`` over copyable slots, and their fraction of the
    labelled ones: ``copy [b, A, K, U]`` (``block_logits(return_copy=True)``), ``labels [b, A, K]``."""
    present = labels != IGNORE
    mass = torch.gather(copy, -1, labels.clamp(min=0)[..., None])[..., 0]
    copyable = present & (mass > 0)
    w = decay_weights(copy.shape[2] + 1, gamma)[None, None, :] * copyable
    nll = -torch.where(copyable, mass.clamp_min(torch.finfo(mass.dtype).tiny), torch.ones_like(mass)).log()
    frac = float(copyable.sum()) / max(int(present.sum()), 1)
    return (w * nll).sum() / w.sum().clamp(min=1e-12), frac


def forward_train(drafter: BlockDrafter, batch: dict, *, anchors_per_seq: int, gamma: float,
                  generator: torch.Generator, kl_weight: float = 0.0,
                  copy_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """One training forward: sample anchors, draft every block in one pass; the loss (decayed CE, mixed with
    KL where ``kl_weight > 0``, plus ``copy_weight`` times ``copy_pointer_loss``) and metrics."""
    anchors, valid = zip(*(sample_anchors(int(p), int(s), anchors_per_seq, generator)
                           for p, s in zip(batch["prompt_lens"], batch["seq_lens"])))
    anchors, valid = torch.stack(anchors), torch.stack(valid)
    vocab = drafter.sequence_vocab(batch["input_ids"])
    logits, copy = drafter.block_logits(batch["input_ids"], batch["features"], anchors, valid, vocab=vocab,
                                        return_copy=True)
    if copy_weight > 0 and copy is None:
        raise ValueError("copy_loss_weight trains a copy head; this drafter has none (add --copy-head)")
    labels = block_labels(batch["input_ids"], anchors, valid, drafter.block_size,
                          batch["prompt_lens"], batch["seq_lens"])
    labels = drafter.draft_index(labels, IGNORE, vocab)
    allowed = drafter.context_allowed(batch["input_ids"], anchors, vocab) if vocab is not None else None
    if allowed is not None:  # a label the block may not draft yet (first seen after the anchor): no loss
        ok = torch.gather(allowed, 2, labels.clamp(min=0))
        labels = torch.where(ok, labels, torch.full_like(labels, IGNORE))
    parts = {}
    if kl_weight > 0:
        soft_ids, soft_logp = block_soft_labels(batch["soft_ids"], batch["soft_logp"], anchors, drafter.block_size)
        soft_cols = drafter.draft_index(soft_ids, IGNORE, vocab)  # IGNORE: not in this batch's columns
        draftable = (soft_cols != IGNORE) & (soft_ids >= 0)
        if allowed is not None:  # and not yet draftable at this anchor (context vocabulary)
            draftable &= torch.gather(allowed[:, :, None, :].expand(*soft_cols.shape[:3], -1), 3,
                                      soft_cols.clamp(min=0))
        soft_logp = renormalised_topk(soft_logp, draftable)
        loss, parts = decayed_distillation_loss(logits, labels, gamma, kl_weight, soft_cols, soft_logp)
    else:
        loss = decayed_cross_entropy(logits, labels, gamma)
    if copy_weight > 0:
        pointer, copyable = copy_pointer_loss(copy, labels, gamma)
        loss = loss + copy_weight * pointer
        parts = {**parts, "copy_nll": float(pointer.detach()), "copyable": round(copyable, 4)}
    with torch.no_grad():
        draft = logits.argmax(-1)
        acc = accepted_drafts(draft, labels)
        present = labels != IGNORE
        slot_acc = ((draft == labels) & present).sum((0, 1)).float() / present.sum((0, 1)).clamp(min=1)
        n_blocks = int(valid.sum())
        metrics = {"loss": float(loss), "accept_proxy": float((acc[valid] + 1).float().mean()) if n_blocks else 0.0,
                   "top1_slot1": float(slot_acc[0]), "blocks": n_blocks, **parts}
    return loss, metrics


def heldout_acceptance(drafter: BlockDrafter, samples: Sequence[dict]) -> dict:
    """Mean committed tokens per chain round (tau + 1) over held-out samples, overall and per source."""
    per_source: dict[str, list[int]] = {}
    anchors_mean: list[float] = []
    was_training = drafter.training
    drafter.eval()
    for sample in samples:
        r = replay_chain(drafter, sample["input_ids"], sample["features"], int(sample["prompt_len"]))
        per_source.setdefault(sample["source"], []).extend(r.round_committed)
        anchors_mean += [a + 1 for a in r.accepted_at_anchor]
    drafter.train(was_training)
    allc = [c for v in per_source.values() for c in v]
    return {"tau_plus_1": sum(allc) / max(len(allc), 1), "rounds": len(allc),
            "tau_plus_1_every_anchor": sum(anchors_mean) / max(len(anchors_mean), 1),
            "per_source": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_source.items())}}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` then cosine decay to ``min_lr_frac * lr`` at ``steps``."""
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, cfg.steps - warm))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def split_heldout(samples: Sequence[dict], n: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded split by prompt id: ``n`` held-out samples, the rest for training."""
    order = sorted(samples, key=lambda s: s["prompt_id"])
    perm = torch.randperm(len(order), generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    held = {order[i]["prompt_id"] for i in perm[:n]}
    return [s for s in order if s["prompt_id"] not in held], [s for s in order if s["prompt_id"] in held]


def _optimizer(params: list, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _resume(ckpt_path: Path, cfg: TrainConfig, data, drafter, opt, gen) -> tuple:
    """(step, history, order, cursor, seconds trained) of the checkpoint if present, refusing another
    configuration or other data folders."""
    if not ckpt_path.is_file():
        return 0, [], [], 0, 0.0
    state = torch.load(ckpt_path, weights_only=False)
    if state["config"] != asdict(cfg):
        raise ValueError(f"{ckpt_path} was written with another configuration; use a new --out or delete it")
    if data is not None and state.get("data") is not None and list(data) != state["data"]:
        raise ValueError(f"{ckpt_path} was trained on the data folders {state['data']}, not {list(data)}; "
                         f"resume with the same --extra-data, or use a new --out")
    drafter.load_state_dict(state["drafter"])
    drafter.refresh_vocab_map()
    opt.load_state_dict(state["optimizer"])
    gen.set_state(state["generator"])
    return state["step"], state["history"], state["order"], state["cursor"], state["elapsed_s"]


def train(drafter: BlockDrafter, train_samples: Sequence[dict], heldout_samples: Sequence[dict],
          cfg: TrainConfig, out_dir: str | Path, *, progress: bool = True, stop_at: int | None = None,
          data: Sequence[str] | None = None) -> dict:
    """Train ``drafter`` in place, checkpointed to ``out_dir/checkpoints/last.pt`` (resumed if present, refused for
    other ``data`` folders). ``stop_at``: stop after this step on the schedule of ``cfg.steps``."""
    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = ckpt_dir / "last.pt"
    if not train_samples:
        raise ValueError("no training samples: generate data first (entropy-law train-drafter --only data)")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = _optimizer(params, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    step, history, order, cursor, elapsed_before = _resume(ckpt_path, cfg, data, drafter, opt, gen)
    t_start = time.time()

    def save():
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"config": asdict(cfg), "drafter": drafter.state_dict(), "optimizer": opt.state_dict(),
                    "generator": gen.get_state(), "step": step, "history": history, "order": order,
                    "cursor": cursor, "elapsed_s": elapsed_before + time.time() - t_start,
                    "data": None if data is None else list(data)}, tmp)
        tmp.replace(ckpt_path)

    drafter.train()
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, dynamic_ncols=True, mininterval=5)
    running: dict[str, float] = {}
    stopped_early = False
    while step < cfg.steps:
        if (stop_at is not None and step >= stop_at) or (
                cfg.minutes is not None and elapsed_before + time.time() - t_start > 60 * cfg.minutes):
            stopped_early = True
            break
        if cursor + cfg.batch_seqs > len(order):
            order = torch.randperm(len(train_samples), generator=gen).tolist()
            cursor = 0
        batch = collate([train_samples[i] for i in order[cursor: cursor + cfg.batch_seqs]], soft=cfg.kl_weight > 0)
        cursor += cfg.batch_seqs
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, metrics = forward_train(drafter, batch, anchors_per_seq=cfg.anchors_per_seq, gamma=cfg.gamma,
                                      generator=gen, kl_weight=cfg.kl_weight, copy_weight=cfg.copy_loss_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
        opt.step()
        step += 1
        for k in ("loss", "accept_proxy", "top1_slot1"):
            running[k] = metrics[k] if k not in running else 0.95 * running[k] + 0.05 * metrics[k]
        bar.update(1)
        bar.set_postfix(loss=f"{running['loss']:.3f}", acc=f"{running['accept_proxy']:.2f}",
                        top1=f"{running['top1_slot1']:.2f}")
        record = {"step": step, "lr": lr_at(step - 1, cfg), **{k: round(v, 4) for k, v in metrics.items()}}
        if heldout_samples and (step % cfg.eval_every == 0 or step == cfg.steps):
            record["heldout"] = heldout_acceptance(drafter, heldout_samples)
            bar.write(f"step {step}: held-out chain tau+1 = {record['heldout']['tau_plus_1']:.3f} "
                      f"{record['heldout']['per_source']}")
        history.append(record)
        if step % cfg.save_every == 0 or step == cfg.steps:
            save()
    bar.close()
    save()
    last_eval = next((h["heldout"] for h in reversed(history) if "heldout" in h), None)
    if heldout_samples and (last_eval is None or not history or history[-1].get("heldout") is None):
        last_eval = heldout_acceptance(drafter, heldout_samples)
    drafter.eval()
    return {"steps": step, "stopped_early": stopped_early,
            "train_seconds": round(elapsed_before + time.time() - t_start, 1),
            "final_heldout": last_eval, "history_tail": history[-5:]}


def load_data_folders(folders: Sequence[str | Path]) -> tuple[list[dict], list[str]]:
    """The samples of several data folders of one plan (same feature layers, no prompt id twice), sorted by
    prompt id, and the prompt ids left out because their text repeats an earlier one."""
    samples: list[dict] = []
    layers_seen = None
    for folder in folders:
        folder = Path(folder)
        part = load_samples(folder)
        if not part:
            raise FileNotFoundError(f"no data shards in {folder}; run `entropy-law train-drafter --only data` first")
        plan_path = folder / "plan.json"
        layers = json.loads(plan_path.read_text())["feature_layers"] if plan_path.is_file() else None
        if layers_seen is not None and layers is not None and layers != layers_seen:
            raise ValueError(f"{folder} holds features of layers {layers}, the other data folders {layers_seen}")
        layers_seen = layers if layers is not None else layers_seen
        samples += part
    samples.sort(key=lambda s: s["prompt_id"])
    twice = sorted(i for i, n in Counter(s["prompt_id"] for s in samples).items() if n > 1)
    if twice:
        raise ValueError(f"the data folders share prompt ids {twice[:5]}: generate each with its own --data-part "
                         f"and do not pass a folder twice")
    kept, repeats, seen = [], [], set()
    for sample in samples:
        text = sample.get("text")
        if text is not None and text in seen:
            repeats.append(sample["prompt_id"])
            continue
        seen.add(text)
        kept.append(sample)
    return kept, repeats


def data_feature_layers(folders: Sequence[str | Path]) -> tuple[int, ...] | None:
    """The target layers whose features the data folders hold (their ``plan.json``), or ``None``."""
    for folder in folders:
        plan_path = Path(folder) / "plan.json"
        if plan_path.is_file():
            return tuple(int(i) for i in json.loads(plan_path.read_text())["feature_layers"])
    return None


def data_folder_paths(folders: Sequence[str | Path]) -> list[Path]:
    """The data folders as resolved absolute paths (the names a checkpoint keeps, so a resume compares them)."""
    return [Path(f).resolve() for f in folders]


def train_from_folder(model_spec: str, data_dir: str | Path, out_dir: str | Path, cfg: TrainConfig, *,
                      stop_at: int | None = None, extra_data: Sequence[str | Path] = ()) -> dict:
    """Load the target and the shards of ``data_dir`` and ``extra_data``, hold some out, train, save."""
    torch.manual_seed(cfg.seed)
    target = load_target(model_spec)
    for p in target.model.parameters():
        p.requires_grad_(False)
    folders = data_folder_paths([data_dir, *extra_data])
    folder_names = [str(f) for f in folders]
    samples, repeats = load_data_folders(folders)
    layers = data_feature_layers(folders)  # the layers the data captured (else the target's default ones)
    if repeats:
        print(f"left out {len(repeats)} samples whose prompt repeats an earlier one: {repeats}", flush=True)
    train_s, held_s = split_heldout(samples, cfg.heldout, cfg.seed)
    vocab = run_draft_vocabulary(cfg, train_s, int(target.config.vocab_size))
    drafter = BlockDrafter(target, seed=cfg.seed, block_size=cfg.block_size, num_layers=cfg.num_layers,
                           draft_vocab=vocab, context_vocab=cfg.context_vocab, copy_head=cfg.copy_head,
                           copy_match=cfg.copy_match, copy_distance=cfg.copy_distance, feature_layers=layers)
    if cfg.init_from_target and cfg.init_from:
        raise ValueError("init_from_target and init_from both set the weights; choose one")
    if cfg.init_from_target:
        init_from_target(drafter, target, init_fc=cfg.init_fc)
    elif cfg.init_fc:
        raise ValueError("init_fc needs init_from_target")
    init = init_from_checkpoint(drafter, cfg.init_from) if cfg.init_from else None
    out = Path(out_dir)
    (out / "train_config.json").write_text(json.dumps(
        {"train": asdict(cfg), "drafter": json.loads(drafter.config.to_json()),
         "data": folder_names, "repeated_prompts_left_out": repeats, "init": init,
         "train_samples": len(train_s), "heldout_ids": [s["prompt_id"] for s in held_s]}, indent=2))
    result = train(drafter, train_s, held_s, cfg, out, stop_at=stop_at, data=folder_names)
    tokens = sum(int(s["input_ids"].shape[0] - s["prompt_len"]) for s in train_s)
    result.update({"train_samples": len(train_s), "train_response_tokens": tokens, "heldout_samples": len(held_s),
                   **({"init": init} if init else {})})
    drafter.save(out / "drafter.safetensors", metadata={"train": asdict(cfg), **{
        k: v for k, v in result.items() if k != "history_tail"}})
    (out / "train_result.json").write_text(json.dumps(result, indent=2))
    return result
