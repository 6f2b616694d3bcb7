"""GLANCE-style block drafter (DFlash family): a whole block drafted in one forward pass over target features.

- Context: a few target layers' outputs (``feature_layers``), fused by ``Linear(n*H -> H)`` + RMSNorm and injected
  as extra keys/values into every drafter layer. Block ``[anchor, MASK x (B-1)]``: slot ``k`` predicts the token at
  ``anchor + k`` and sees its block and the context before the anchor. Head: the target's, referenced, never saved.
- Optional: a reduced draft vocabulary (``context_vocab``) and a copy head (``copy_mix``), both reading only tokens
  at or before the anchor. Modes: ``begin``/``propose`` (the ``Drafter`` protocol) and ``block_logits`` (training
  and replay: every anchor in one pass).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from entropy_law.decoding.attention import gqa_eager_attention, text_config as _text_config
from entropy_law.decoding.interface import DraftProposal
from entropy_law.prompts.paths import data_dir
from entropy_law.traces.layout import file_sha256

FORMAT = "entropy-law-block-drafter"
FORMAT_VERSION = 1
MASKED_LOGIT = -1e4  # a draft logit meaning "not draftable here" (probability 0 in fp32)
COPY_GATE_BIAS = -2.0  # initial bias of the copy gate

# the shipped default (data/drafters/README.md says how it was made)
DEFAULT_CHECKPOINT = "smollm2-135m-block-b8-broad.safetensors"
# shipped beside it: the checkpoint some recorded arms ran with, found by its SHA-256 (jobs.arms.find_block_checkpoint)
REFERENCE_CHECKPOINT = "smollm2-135m-block-b8.safetensors"


def default_drafter_path() -> Path:
    """The shipped checkpoint a run of the default target uses when it names none (``DEFAULT_CHECKPOINT``)."""
    return data_dir() / "drafters" / DEFAULT_CHECKPOINT


def default_feature_layers(num_target_layers: int, n: int = 3) -> tuple[int, ...]:
    """Target layers the drafter reads, from the target's depth ``L``: DFlash's (``L // 2`` for one feature, else ``n``
    evenly spaced from 1 to ``L - 3``) where ``L >= n + 3``, else up to ``n`` evenly spaced over ``0 .. L - 1``."""
    if num_target_layers < 1 or n < 1:
        raise ValueError(f"need a target with layers and at least one feature (got {num_target_layers} layers, "
                         f"n={n})")
    if n == 1:
        return (num_target_layers // 2,)
    if num_target_layers >= n + 3:
        span = num_target_layers - 4
        return tuple(int(round(1 + i * span / (n - 1))) for i in range(n))
    last = num_target_layers - 1
    return tuple(sorted({int(round(i * last / (n - 1))) for i in range(n)}))


def rope_theta(config) -> float:
    """The RoPE base of a text config; where layer types differ (Gemma 3), that of the full-attention layers."""
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
    elif rope and all(isinstance(v, dict) for v in rope.values()):
        rope = next(iter(rope.values()))
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta) if theta is not None else 10000.0


def embedding_scale(embedding: nn.Module) -> float:
    """The factor a target's embedding module applies to its rows (Gemma: ``sqrt(hidden_size)``; else 1.0)."""
    scale = getattr(embedding, "embed_scale", None)
    return 1.0 if scale is None else float(scale)


@dataclass(frozen=True)
class BlockDrafterConfig:
    """Shape of a block drafter and the target it was built for (stored in every checkpoint)."""

    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    target_num_layers: int
    feature_layers: tuple[int, ...]
    block_size: int = 8
    num_layers: int = 2
    top_k: int = 32  # candidates per depth in a proposal
    draft_vocab_size: int = 0  # 0: draft over the whole vocabulary; else over ``draft_vocab`` ids only
    context_vocab: bool = False  # with a draft vocabulary: also draft every token already in the context
    copy_head: bool = False  # mix each slot's distribution with a pointer over the context (``copy_mix``)
    copy_dim: int = 64  # width of the pointer's queries and keys
    copy_match: int = 0  # with copy_head: exact suffix matches of 1..copy_match tokens as pointer/gate features
    copy_distance: int = 0  # with copy_head: a learned pointer score per log2 bucket of the distance to the anchor
    target_id: str = ""
    target_fingerprint: float = 0.0  # sum of a fixed slice of the target embedding table (identity check)

    @property
    def n_features(self) -> int:
        return len(self.feature_layers)

    def keys(self):  # read like a mapping too (``dict(drafter.config)``, as for the other drafters)
        return asdict(self).keys()

    def __getitem__(self, key: str):
        return getattr(self, key)

    def to_json(self) -> str:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> "BlockDrafterConfig":
        d = json.loads(text)
        d["feature_layers"] = tuple(d["feature_layers"])
        return BlockDrafterConfig(**d)


def _target_model(target) -> nn.Module:
    """Accept a ``LoadedTarget``, a ``TargetAdapter``-like object with ``.model``, or a HF model."""
    model = target if isinstance(target, nn.Module) else getattr(target, "model", None)
    if isinstance(model, nn.Module) and hasattr(model, "get_input_embeddings"):
        return model
    raise TypeError(f"expected a target (LoadedTarget or Hugging Face causal LM), got {type(target).__name__}")


def _lm_head(model: nn.Module) -> nn.Module | None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if head is not None else getattr(model, "lm_head", None)


def target_fingerprint(model: nn.Module) -> float:
    """A cheap identity check of a target: the sum of the first 64 rows of its embedding table (fp64)."""
    weight = model.get_input_embeddings().weight
    return float(weight[:64].detach().double().sum())


def config_for_target(target, *, feature_layers: Sequence[int] | None = None, block_size: int = 8,
                      num_layers: int = 2, top_k: int = 32, target_id: str | None = None,
                      context_vocab: bool = False, copy_head: bool = False,
                      copy_match: int = 0, copy_distance: int = 0) -> BlockDrafterConfig:
    """A drafter config matching ``target``'s width, heads, vocabulary and depth."""
    model = _target_model(target)
    cfg = _text_config(model)
    n_layers = int(cfg.num_hidden_layers)
    layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(n_layers)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    theta = rope_theta(cfg)
    return BlockDrafterConfig(
        hidden_size=int(cfg.hidden_size), vocab_size=int(model.get_input_embeddings().weight.shape[0]),
        num_heads=int(cfg.num_attention_heads), num_kv_heads=int(getattr(cfg, "num_key_value_heads", None)
                                                                 or cfg.num_attention_heads),
        head_dim=head_dim, intermediate_size=int(cfg.intermediate_size), rms_norm_eps=float(cfg.rms_norm_eps),
        rope_theta=theta, target_num_layers=n_layers, feature_layers=layers, block_size=block_size,
        num_layers=num_layers, top_k=top_k, context_vocab=context_vocab, copy_head=copy_head,
        copy_match=copy_match, copy_distance=copy_distance,
        target_id=target_id if target_id is not None else str(getattr(target, "model_id", "")),
        target_fingerprint=target_fingerprint(model),
    )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # BlockDrafter.set_compute_dtype


def _rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin ``[..., len(positions), head_dim]`` for absolute ``positions`` (Llama half-rotation layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DrafterLayer(nn.Module):
    """One Llama-style layer whose attention also reads injected context keys/values."""

    def __init__(self, cfg: BlockDrafterConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # [b, T, n*d] -> [b, n, T, d]
        b, t, _ = x.shape
        return x.view(b, t, n, self.cfg.head_dim).transpose(1, 2)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys (rotated) and values of fused context rows ``[b, C, H]`` -> ``[b, kv, C, d]`` each."""
        k = _rotate(self._heads(self.k_proj(ctx), self.cfg.num_kv_heads), cos, sin)
        v = self._heads(self.v_proj(ctx), self.cfg.num_kv_heads)
        return k, v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """``x`` ``[b, Q, H]`` block rows; ``ctx_k/ctx_v`` ``[b, kv, C, d]``; ``mask`` additive ``[b, 1, Q, C+Q]`` or None."""
        cfg = self.cfg
        h = self.input_layernorm(x)
        q = _rotate(self._heads(self.q_proj(h), cfg.num_heads), cos, sin)
        k = _rotate(self._heads(self.k_proj(h), cfg.num_kv_heads), cos, sin)
        v = self._heads(self.v_proj(h), cfg.num_kv_heads)
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        # the adapter's grouped-query kernel: each KV head read in place, not copied to its query heads
        out, _ = gqa_eager_attention(self, q, k, v, mask, 1.0 / math.sqrt(cfg.head_dim))
        x = x + self.o_proj(out.reshape(x.shape[0], x.shape[1], -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BlockDrafter(nn.Module):
    """A block drafter over a target (the ``Drafter`` protocol): ``BlockDrafter(target)`` builds a fresh one
    matching ``target``; ``BlockDrafter.load(path, target)`` loads a checkpoint and checks it against the target."""

    def __init__(self, target, config: BlockDrafterConfig | None = None, *, seed: int | None = 0,
                 draft_vocab: Sequence[int] | None = None, **overrides):
        super().__init__()
        model = _target_model(target)
        cfg = config if config is not None else config_for_target(target, **overrides)
        vocab_ids = None
        if draft_vocab is not None:
            vocab_ids = torch.tensor(sorted({int(t) for t in draft_vocab}), dtype=torch.long)
            if len(vocab_ids) == 0 or vocab_ids[0] < 0 or vocab_ids[-1] >= cfg.vocab_size:
                raise ValueError(f"draft_vocab must hold token ids in 0..{cfg.vocab_size - 1}")
            cfg = replace(cfg, draft_vocab_size=len(vocab_ids))
        if cfg.context_vocab and not cfg.draft_vocab_size:
            raise ValueError("context_vocab extends a draft vocabulary; give draft_vocab too")
        if cfg.copy_head and cfg.draft_vocab_size and not cfg.context_vocab:
            raise ValueError("copy_head copies tokens of the context, which a fixed draft vocabulary may lack; "
                             "use context_vocab=True with a draft vocabulary (or no draft vocabulary)")
        for name in ("copy_match", "copy_distance"):
            value = getattr(cfg, name)
            if value < 0 or (value and not cfg.copy_head):
                raise ValueError(f"{name} ({value}) is a feature of the copy head: a size >= 1 with "
                                 "copy_head=True, or 0")
        _check_matches(cfg, model)
        self.config = cfg
        self.provenance: dict = {}  # a loaded checkpoint's file name and SHA-256 (set by ``load``)
        self.compute_dtype = torch.float32  # of the drafter's layers at inference (``set_compute_dtype``)
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(f"num_heads {cfg.num_heads} is not a multiple of num_kv_heads {cfg.num_kv_heads}")
        if cfg.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one mask slot), got {cfg.block_size}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.n_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DrafterLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.copy_head:  # registered last: the other weights draw the same random numbers with or without it
            self.copy_q = nn.Linear(h, cfg.copy_dim, bias=False)
            self.copy_k = nn.Linear(h, cfg.copy_dim, bias=False)
            self.copy_gate = nn.Linear(h, 1)
            if cfg.copy_match:  # per slot and match length: a pointer score and a gate score
                self.copy_match_score = nn.Parameter(torch.ones(cfg.block_size - 1, cfg.copy_match))
                self.copy_match_gate = nn.Parameter(torch.zeros(cfg.block_size - 1, cfg.copy_match))
            if cfg.copy_distance:  # per slot: a score per distance bucket (1, 2-3, 4-7, ...; the last is open)
                self.copy_distance_score = nn.Parameter(torch.zeros(cfg.block_size - 1, cfg.copy_distance))
        # learned MASK embedding, initialised at the mean embedded row (Gemma scales its rows by sqrt(hidden_size))
        embedding = model.get_input_embeddings()
        self.mask_embedding = nn.Parameter(embedding.weight.detach().mean(0).float() * embedding_scale(embedding))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = 1.0 / math.sqrt(module.in_features)
                with torch.no_grad():
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
        if cfg.copy_head:
            with torch.no_grad():  # start mostly generating: copy weight sigmoid(-2) ~ 0.12
                self.copy_gate.bias.fill_(COPY_GATE_BIAS)
        # shared, frozen, unregistered: never in state_dict, never trained
        self.__dict__["_embed_tokens"] = model.get_input_embeddings()
        self.__dict__["_lm_head"] = _lm_head(model)
        # draft vocabulary (EAGLE-3-style reduced head): rows of the shared LM head the drafter scores
        if cfg.draft_vocab_size:
            self.register_buffer("draft_vocab", vocab_ids if vocab_ids is not None
                                 else torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.register_buffer("draft_vocab", torch.arange(0), persistent=False)
        self.refresh_vocab_map()
        self.drafter_id = f"block-drafter-b{cfg.block_size}-l{cfg.num_layers}" + ("-copy" if cfg.copy_head else "")
        self.feature_layers = tuple(cfg.feature_layers)
        self.block_size = cfg.block_size
        self.reset()

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., n*H]`` target features -> ``[..., H]`` context rows (fc + RMSNorm)."""
        w = self.fc.weight
        return self.hidden_norm(self.fc(features.to(w.dtype)).to(self.hidden_norm.weight.dtype))

    def _block_embeddings(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """``anchor_ids [...]`` -> ``[..., B, H]``: embedded anchor then B-1 mask vectors."""
        # the target's table and scale, detached: frozen and shared, no gradient ever flows into the target
        table = F.embedding(anchor_ids, self._embed_tokens.weight.detach())
        scale = embedding_scale(self._embed_tokens)
        anchor = (table if scale == 1.0 else table * scale).to(self.mask_embedding.dtype)
        mask = self.mask_embedding.expand(*anchor_ids.shape, self.block_size - 1, -1)
        return torch.cat([anchor.unsqueeze(-2), mask], dim=-2)

    def refresh_vocab_map(self) -> None:
        """Rebuild the token -> draft-index map (after loading a ``draft_vocab``)."""
        v = self.config.vocab_size
        if self.config.draft_vocab_size:
            index = torch.full((v,), -1, dtype=torch.long)
            index[self.draft_vocab] = torch.arange(len(self.draft_vocab))
        else:
            index = torch.arange(v)
        self.__dict__["_token_to_draft"] = index
        self.__dict__["_head_cache"] = None

    def sequence_vocab(self, token_ids: torch.Tensor) -> torch.Tensor | None:
        """The sorted ids ``block_logits`` scores for ``token_ids`` (None: all): the fixed draft vocabulary, plus with
        ``context_vocab`` every id in ``token_ids``."""
        if not self.config.draft_vocab_size:
            return None
        if not self.config.context_vocab:
            return self.draft_vocab
        ids = token_ids.flatten().long().clamp(0, self.config.vocab_size - 1)
        return torch.unique(torch.cat([self.draft_vocab, ids]))  # sorted

    def context_allowed(self, input_ids: torch.Tensor, anchors: torch.Tensor,
                        vocab: torch.Tensor) -> torch.Tensor | None:
        """``[b, A, len(vocab)]`` bool: may the block at ``anchors[b, a]`` draft ``vocab[u]``? Only with
        ``context_vocab`` (else ``None``: every column): ids of the fixed draft vocabulary, and ids that occur
        in ``input_ids[b]`` at or before the anchor (the anchor is the last token the drafter has seen)."""
        if not self.config.context_vocab:
            return None
        b, s = input_ids.shape
        u = len(vocab)
        idx = torch.searchsorted(vocab, input_ids.long()).clamp(max=u - 1)
        present = vocab[idx] == input_ids
        positions = torch.arange(s).expand(b, s)
        first = torch.full((b, u), s, dtype=torch.long)
        first.scatter_reduce_(1, idx, torch.where(present, positions, torch.full_like(positions, s)), "amin")
        base = self._token_to_draft[vocab] >= 0  # [U]
        return base[None, None, :] | (first[:, None, :] <= anchors[..., None])

    def draft_index(self, token_ids: torch.Tensor, ignore: int = -100,
                    vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids -> indices into ``block_logits``' last axis (over ``vocab``); ids outside it become ``ignore``."""
        keep = token_ids != ignore
        if vocab is None:
            mapped = self._token_to_draft[token_ids.clamp(min=0)]
        else:
            pos = torch.searchsorted(vocab, token_ids.clamp(min=0)).clamp(max=len(vocab) - 1)
            mapped = torch.where(vocab[pos] == token_ids, pos, torch.full_like(pos, -1))
        return torch.where(keep & (mapped >= 0), mapped, torch.full_like(mapped, ignore))

    def draft_tokens(self, index: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Indices into ``block_logits``' last axis (its ``vocab``; default the fixed one) -> token ids."""
        if vocab is not None:
            return vocab[index]
        return self.draft_vocab[index] if self.config.draft_vocab_size else index

    def to_full_vocab(self, logits: torch.Tensor, fill: float = MASKED_LOGIT,
                      vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` -> ``[..., V]`` with ``fill`` (probability 0 in fp32) elsewhere."""
        if vocab is None:
            if not self.config.draft_vocab_size:
                return logits
            vocab = self.draft_vocab
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), fill)
        full[..., vocab] = logits
        return full

    def _head(self, x: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm and the shared LM head over ``vocab`` (default: the fixed draft vocabulary, or all)."""
        h = self.norm(x)
        if vocab is None and self.config.draft_vocab_size:
            vocab = self.draft_vocab
        cached = self._head_cache if not torch.is_grad_enabled() else None  # inference only
        if vocab is not None and cached is not None and torch.equal(cached[0], vocab):
            weight, bias = cached[1], cached[2]
        else:
            weight = self._lm_head.weight.detach()
            bias = getattr(self._lm_head, "bias", None)
            bias = None if bias is None else bias.detach()
            if vocab is not None:
                weight = weight[vocab]
                bias = None if bias is None else bias[vocab]
                if not torch.is_grad_enabled():  # inference: the rows only change when the vocabulary grows
                    weight = weight.to(self.compute_dtype)  # a copy of the rows; the target's head is untouched
                    self.__dict__["_head_cache"] = (vocab, weight, bias)
        return F.linear(h.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype)).float()

    def copy_mix(self, logits: torch.Tensor, h: torch.Tensor, keys: torch.Tensor, src_cols: torch.Tensor,
                 valid: torch.Tensor, match: torch.Tensor | None = None,
                 distance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy head: ``p = (1 - g) softmax(logits) + g sum_j a_j [token j+k]`` per slot ``k``, with pointer
        ``a = softmax_j(q_k . key_j / sqrt(D))`` over valid rows and gate ``g = sigmoid(gate(h_k))`` (0 without one).

        ``logits [..., K, U]``, final states ``h [..., K, H]``, context keys ``keys [..., C, D]``; ``src_cols
        [..., K, C]``: the column of the token at ``j + k``; ``valid [..., K, C]``: ``j + k <= anchor``. Optional
        ``match [..., C, M]`` (``match_levels``) and ``distance [..., C]`` (``distance_buckets``) add learned
        scores to the pointer (and, for matches, the gate). Returns ``log p`` and the pointer's distribution."""
        q = self.copy_q(h)
        scores = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        z = self.copy_gate(h).float()  # [..., K, 1]
        if match is not None:
            scores = scores + torch.einsum("...cm,km->...kc", match, self.copy_match_score)
            best = (valid[..., None] & (match[..., None, :, :] > 0)).any(-2).float()  # [..., K, M]
            z = z + (best * self.copy_match_gate).sum(-1, keepdim=True)
        if distance is not None:
            scores = scores + self.copy_distance_score[:, distance].movedim(0, -2)
        scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
        attn = torch.softmax(scores, dim=-1) * valid  # a row with nothing valid: all zero
        copy = torch.zeros_like(logits).scatter_add(-1, src_cols.expand_as(attn), attn)
        none = ~valid.any(-1, keepdim=True)
        log_keep = F.logsigmoid(-z).masked_fill(none, 0.0)  # log(1 - g); g = 0 without a valid row
        log_copy = F.logsigmoid(z).masked_fill(none, float("-inf"))
        log_copied = torch.where(copy > 0, copy.clamp_min(torch.finfo(copy.dtype).tiny).log(), float("-inf"))
        return torch.logaddexp(torch.log_softmax(logits, dim=-1) + log_keep, log_copy + log_copied), copy

    def distance_buckets(self, anchors: torch.Tensor, c: int) -> torch.Tensor:
        """``[..., C]``: bucket ``min(floor(log2(anchor - j)), copy_distance - 1)`` of every row ``j`` (0 at or after
        the anchor)."""
        d = (anchors[..., None] - torch.arange(c)).clamp(min=1)
        return torch.floor(torch.log2(d.double())).long().clamp(max=self.config.copy_distance - 1)

    def match_levels(self, input_ids: torch.Tensor, anchors: torch.Tensor, c: int) -> torch.Tensor:
        """``[b, A, C, M]`` float: does the context ending at row ``j`` (tokens ``j-m+1..j``) equal the one
        ending at the anchor (tokens ``t-m+1..t``), for m = 1..``copy_match``? Reads tokens at or before
        ``max(j, t)`` only; rows at or after the anchor are never valid copy rows (``block_logits``)."""
        j = torch.arange(c)
        levels, current = [], None
        for m in range(self.config.copy_match):
            row, at = j - m, anchors - m
            at_row = input_ids[:, row.clamp(min=0)][:, None, :]  # [b, 1, C]
            at_anchor = torch.gather(input_ids, 1, at.clamp(min=0))[..., None]  # [b, A, 1]
            same = (at_row == at_anchor) & (row >= 0)[None, None, :] & (at >= 0)[..., None]
            current = same if current is None else current & same
            levels.append(current)
        return torch.stack(levels, dim=-1).float()

    def _copy_columns(self, input_ids: torch.Tensor, vocab: torch.Tensor | None) -> torch.Tensor:
        """Column of every token of ``input_ids`` in the draft logits over ``vocab`` (each must be there)."""
        if vocab is None:
            return input_ids.long()
        cols = torch.searchsorted(vocab, input_ids.long()).clamp(max=len(vocab) - 1)
        if not bool((vocab[cols] == input_ids).all()):
            raise ValueError("the copy head needs every context token in the draft vocabulary; pass "
                             "vocab=sequence_vocab(input_ids) (or None)")
        return cols

    def block_logits(self, input_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor,
                     anchor_valid: torch.Tensor | None = None, *, vocab: torch.Tensor | None = None,
                     return_copy: bool = False):
        """Draft logits ``[b, A, B-1, Vd]`` of every anchor in one forward pass (training and offline replay).

        ``input_ids [b, S]``; ``features [b, C, n*H]`` for positions ``0..C-1``; ``anchors [b, A]`` (``t <= C``:
        anchor ``t`` reads context ``< t``); ``anchor_valid [b, A]`` (padding: False). ``vocab``: default
        ``sequence_vocab(input_ids)``; ids an anchor may not draft yet get ``MASKED_LOGIT``. ``return_copy``:
        also return the copy head's pointer distribution (None without a copy head)."""
        cfg = self.config
        b, s = input_ids.shape
        c = features.shape[1]
        a = anchors.shape[1]
        bsz = cfg.block_size
        if anchor_valid is None:
            anchor_valid = torch.ones_like(anchors, dtype=torch.bool)
        if bool(((anchors > c) & anchor_valid).any()) or bool(((anchors >= s) & anchor_valid).any()):
            raise ValueError("an anchor lies beyond the given tokens/features (anchor t needs features 0..t-1)")
        safe_anchors = torch.where(anchor_valid, anchors, torch.zeros_like(anchors))
        anchor_ids = torch.gather(input_ids, 1, safe_anchors)
        x = self._block_embeddings(anchor_ids).reshape(b, a * bsz, -1)  # [b, A*B, H]
        block_pos = (safe_anchors[..., None] + torch.arange(bsz)).reshape(b, a * bsz)
        ctx = self.fuse(features)  # [b, C, H]
        ctx_pos = torch.arange(c)
        cos_b, sin_b = _rope(block_pos, cfg.head_dim, cfg.rope_theta, x.dtype)
        cos_b, sin_b = cos_b[:, None], sin_b[:, None]
        cos_c, sin_c = _rope(ctx_pos, cfg.head_dim, cfg.rope_theta, x.dtype)
        # mask by ORIGINAL position: block of anchor t sees context j < t and its own block only
        q_anchor = safe_anchors.repeat_interleave(bsz, dim=1)  # [b, A*B]
        sees_ctx = ctx_pos[None, None, :] < q_anchor[..., None]  # [b, A*B, C]
        block_id = torch.arange(a).repeat_interleave(bsz)
        sees_blk = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
        allowed = torch.cat([sees_ctx, sees_blk], dim=-1)
        mask = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
        mask = mask[:, None]
        for layer in self.layers:
            ck, cv = layer.context_kv(ctx, cos_c, sin_c)
            x = layer(x, cos_b, sin_b, ck, cv, mask)
        x = x.view(b, a, bsz, -1)[:, :, 1:]
        if vocab is None:
            vocab = self.sequence_vocab(input_ids)
        logits = self._head(x, vocab)
        allowed = self.context_allowed(input_ids, safe_anchors, vocab) if vocab is not None else None
        if allowed is not None:
            logits = logits.masked_fill(~allowed[:, :, None, :], MASKED_LOGIT)
        if cfg.copy_head:
            k = torch.arange(1, bsz)[:, None]  # slot
            src = (ctx_pos[None, :] + k).clamp(max=s - 1)  # [K, C]: position of the token slot k copies
            cols = self._copy_columns(input_ids, vocab)[:, src]  # [b, K, C]
            valid = ((ctx_pos[None, :] + k)[None, None] <= safe_anchors[..., None, None]) \
                & anchor_valid[..., None, None]  # [b, A, K, C]
            match = self.match_levels(input_ids, safe_anchors, c) if cfg.copy_match else None
            distance = self.distance_buckets(safe_anchors, c) if cfg.copy_distance else None
            logits, copy = self.copy_mix(logits, self.norm(x), self.copy_k(ctx)[:, None], cols[:, None], valid,
                                         match, distance)
            if allowed is not None:  # exactly MASKED_LOGIT again, as inference fills columns not yet seen
                logits = logits.masked_fill(~allowed[:, :, None, :], MASKED_LOGIT)
        else:
            copy = None
        return (logits, copy) if return_copy else logits

    def reset(self) -> None:
        self._ctx_k: list[torch.Tensor | None] = [None] * len(self.layers)
        self._ctx_v: list[torch.Tensor | None] = [None] * len(self.layers)
        self.context_len = 0
        self._copy_keys = None  # with copy_head: pointer keys of the context rows [C, copy_dim]
        self._seen = None  # with context_vocab: ids the drafter may draft (fixed vocabulary + ids seen so far)
        if self.config.context_vocab:
            self._seen = torch.zeros(self.config.vocab_size, dtype=torch.bool)
            self._seen[self.draft_vocab] = True
        self._seen_len = 0
        self._vocab = None  # sorted ids of _seen, recomputed only when a new id appears

    def _see(self, tokens: Sequence[int]) -> torch.Tensor | None:
        """Mark ``tokens[seen_len:]`` as seen; the current draft vocabulary (``None``: the fixed one or all)."""
        if self._seen is None:
            return None
        new = [int(t) for t in tokens[self._seen_len:]]
        if new:
            ids = torch.tensor(new, dtype=torch.long)
            if not self._seen[ids].all():
                self._seen[ids] = True
                self._vocab = None
        self._seen_len = max(self._seen_len, len(tokens))
        if self._vocab is None:
            self._vocab = self._seen.nonzero().flatten()
        return self._vocab

    @torch.no_grad()
    def inject(self, features: torch.Tensor) -> None:
        """Append context rows for positions ``context_len ..``; rows already injected are never recomputed."""
        if features is None or features.shape[0] == 0:
            return
        expected = self.config.n_features * self.config.hidden_size
        if features.dim() != 2 or features.shape[1] != expected:
            raise ValueError(f"features must be [rows, {expected}] (layers {self.feature_layers} x "
                             f"{self.config.hidden_size}); got {tuple(features.shape)}")
        cfg = self.config
        ctx = self.fuse(features)[None]  # [1, r, H]
        pos = torch.arange(self.context_len, self.context_len + features.shape[0])
        dtype = self.compute_dtype
        cos, sin = _rope(pos, cfg.head_dim, cfg.rope_theta, dtype)
        for i, layer in enumerate(self.layers):
            k, v = layer.context_kv(ctx.to(dtype), cos, sin)
            self._ctx_k[i] = k if self._ctx_k[i] is None else torch.cat([self._ctx_k[i], k], dim=2)
            self._ctx_v[i] = v if self._ctx_v[i] is None else torch.cat([self._ctx_v[i], v], dim=2)
        if cfg.copy_head:
            keys = self.copy_k(ctx[0])
            self._copy_keys = keys if self._copy_keys is None else torch.cat([self._copy_keys, keys])
        self.context_len += int(features.shape[0])

    @torch.no_grad()
    def draft_logits(self, anchor_id: int, anchor_position: int, vocab: torch.Tensor | None = None,
                     tokens: Sequence[int] | None = None) -> torch.Tensor:
        """``[B-1, Vd]`` logits over ``vocab`` for the block at ``anchor_position`` (the context must end there);
        ``tokens``: the sequence up to the anchor, which a copy head copies from."""
        if anchor_position != self.context_len:
            raise ValueError(
                f"the drafter holds context for positions 0..{self.context_len - 1} but the anchor is at "
                f"{anchor_position}; pass the features of every committed position before the anchor "
                "(begin(prompt_ids, prompt_features), then each round's accepted path) exactly once")
        cfg = self.config
        dtype = self.compute_dtype
        x = self._block_embeddings(torch.tensor([anchor_id])).to(dtype)  # [1, B, H]
        pos = torch.arange(anchor_position, anchor_position + cfg.block_size)
        cos, sin = _rope(pos, cfg.head_dim, cfg.rope_theta, dtype)
        empty = x.new_zeros((1, cfg.num_kv_heads, 0, cfg.head_dim))  # no context yet (empty prompt features)
        for layer, ck, cv in zip(self.layers, self._ctx_k, self._ctx_v):
            x = layer(x, cos, sin, empty if ck is None else ck, empty if cv is None else cv, None)
        x = x.to(self.norm.weight.dtype)  # the head, the copy head and the logits in fp32
        logits = self._head(x[:, 1:], vocab)[0]
        if cfg.copy_head:
            if tokens is None or len(tokens) != anchor_position + 1 or int(tokens[-1]) != anchor_id:
                raise ValueError("the copy head needs the tokens up to and including the anchor "
                                 f"({anchor_position + 1} tokens ending with the anchor)")
            c = self.context_len
            keys = self._copy_keys if self._copy_keys is not None else x.new_zeros((0, cfg.copy_dim))
            pos = torch.arange(c)[None, :] + torch.arange(1, cfg.block_size)[:, None]  # [K, C]
            ids = torch.as_tensor(list(tokens), dtype=torch.long)
            cols = self._copy_columns(ids, vocab)
            match = (self.match_levels(ids[None], torch.tensor([[anchor_position]]), c)[0, 0]
                     if cfg.copy_match else None)
            distance = self.distance_buckets(torch.tensor(anchor_position), c) if cfg.copy_distance else None
            logits, _ = self.copy_mix(logits, self.norm(x[0, 1:]), keys, cols[pos.clamp(max=anchor_position)],
                                      pos <= anchor_position, match, distance)
        return logits

    def begin(self, prompt_ids: Sequence[int], prompt_features: torch.Tensor | None) -> None:
        """New request: forget old context, inject the prompt's features (one row per prompt position)."""
        if prompt_features is None:
            raise ValueError("the block drafter needs target features: the decoder must capture layers "
                             f"{self.feature_layers} (drafter.feature_layers) and pass them to begin()")
        if prompt_features.shape[0] != len(prompt_ids):
            raise ValueError(f"got {prompt_features.shape[0]} feature rows for {len(prompt_ids)} prompt tokens")
        self.reset()
        self._see(prompt_ids)
        self.inject(prompt_features)

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None) -> DraftProposal:
        """Inject ``new_features`` (committed rows not yet seen), then draft B-1 tokens after ``tokens[-1]``."""
        if new_features is not None:
            self.inject(new_features)
        vocab = self._see(tokens)
        return self.proposal_from_logits(self.draft_logits(int(tokens[-1]), len(tokens) - 1, vocab, tokens), vocab)

    def proposal_from_logits(self, logits: torch.Tensor, vocab: torch.Tensor | None = None) -> DraftProposal:
        """``[B-1, Vd]`` logits over ``vocab`` -> top-k candidates per depth and full-vocabulary logits."""
        logprobs = torch.log_softmax(logits, dim=-1)
        k = min(self.config.top_k, logits.shape[-1])
        top_lp, top_index = torch.topk(logprobs, k, dim=-1)
        return DraftProposal(tokens=self.draft_tokens(top_index, vocab), logprobs=top_lp,
                             logits=self.to_full_vocab(logits, vocab=vocab))

    def save(self, path: str | Path, *, dtype: torch.dtype = torch.float16, metadata: dict | None = None) -> Path:
        """Write a safetensors checkpoint (drafter weights only, stored in ``dtype``) with the config inside."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
                   for k, v in self.state_dict().items()}
        meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "config": self.config.to_json()}
        if metadata:
            meta["info"] = json.dumps(metadata)
        save_file(tensors, str(path), metadata=meta)
        return path

    def set_compute_dtype(self, dtype: torch.dtype | str) -> "BlockDrafter":
        """Run the layers, ``fc`` and LM-head rows in ``dtype`` (``"float32"`` or ``"bfloat16"``) at inference;
        norms, copy head and logits stay fp32, the target is untouched. Only proposals change, never the output.
        Recorded as ``provenance["compute_dtype"]`` (absent for fp32). Forgets the injected context."""
        name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
        if name not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype must be one of {sorted(COMPUTE_DTYPES)}, got {dtype!r}")
        if torch.is_grad_enabled() and self.training:
            raise ValueError("set_compute_dtype is for inference; training keeps the drafter in fp32")
        self.compute_dtype = COMPUTE_DTYPES[name]
        for module in (self.fc, *self.layers):
            module.to(self.compute_dtype)
        self.__dict__["_head_cache"] = None
        if name == "float32":
            self.provenance.pop("compute_dtype", None)
        else:
            self.provenance["compute_dtype"] = name
        self.reset()
        return self

    @classmethod
    def load(cls, path: str | Path, target, *, compute_dtype: str = "float32") -> "BlockDrafter":
        """Load a checkpoint for ``target`` (``ValueError`` naming every mismatch) in ``compute_dtype``."""
        path = Path(path)
        cfg, state, meta = read_checkpoint(path)
        drafter = cls(target, cfg, seed=None)
        drafter.load_state_dict(state)
        drafter.refresh_vocab_map()
        drafter.info = json.loads(meta["info"]) if "info" in meta else {}
        # recorded with every trace run (``drafter_run_config``): two checkpoints of one architecture differ here
        drafter.provenance = {"checkpoint": path.name, "checkpoint_sha256": file_sha256(path)}
        return drafter.eval().set_compute_dtype(compute_dtype)


def read_checkpoint(path: str | Path) -> tuple[BlockDrafterConfig, dict[str, torch.Tensor], dict]:
    """A checkpoint's config, its weights (floating point upcast to fp32) and its safetensors metadata."""
    cfg, meta = read_checkpoint_config(path)
    state = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    return cfg, state, meta


def read_checkpoint_config(path: str | Path) -> tuple[BlockDrafterConfig, dict]:
    """A checkpoint's config and safetensors metadata, from its header only (no weights read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"block drafter checkpoint not found: {path}")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a block drafter checkpoint (format {meta.get('format')!r})")
    return BlockDrafterConfig.from_json(meta["config"]), meta


def check_checkpoint(path: str | Path, target) -> None:
    """``BlockDrafter.load``'s checks of the checkpoint at ``path`` against ``target``, from its header only."""
    cfg, _ = read_checkpoint_config(path)
    _check_matches(cfg, _target_model(target))


def load_default_drafter(target) -> BlockDrafter:
    """The shipped block drafter for the default target (SmolLM2-135M-Instruct), checked against ``target``."""
    path = default_drafter_path()
    if not path.is_file():
        raise FileNotFoundError(f"no shipped block drafter at {path}; train one with `entropy-law train-drafter`")
    return BlockDrafter.load(path, target)


def _check_matches(cfg: BlockDrafterConfig, model: nn.Module) -> None:
    """Every way ``cfg`` can disagree with ``model``, in one error."""
    tcfg = _text_config(model)
    problems = []
    vocab = int(model.get_input_embeddings().weight.shape[0])
    if cfg.vocab_size != vocab:
        problems.append(f"vocabulary: drafter {cfg.vocab_size}, target {vocab}")
    if cfg.hidden_size != int(tcfg.hidden_size):
        problems.append(f"width: drafter {cfg.hidden_size}, target {tcfg.hidden_size}")
    n_layers = int(tcfg.num_hidden_layers)
    if cfg.target_num_layers != n_layers:
        problems.append(f"target depth: drafter built for {cfg.target_num_layers} layers, target has {n_layers}")
    bad = [i for i in cfg.feature_layers if not 0 <= i < n_layers]
    if bad:
        problems.append(f"feature layers {list(cfg.feature_layers)}: {bad} do not exist in a {n_layers}-layer target")
    if _lm_head(model) is None:
        problems.append("the target has no output embeddings (LM head) to share")
    if cfg.target_fingerprint and not problems:
        now = target_fingerprint(model)
        if not math.isclose(now, cfg.target_fingerprint, rel_tol=1e-4, abs_tol=1e-3):
            problems.append(f"embedding fingerprint: drafter trained on {cfg.target_id or 'another target'} "
                            f"({cfg.target_fingerprint:.6g}), this target gives {now:.6g}")
    if problems:
        raise ValueError("block drafter does not match the target: " + "; ".join(problems)
                         + ". Train a drafter for this target with `entropy-law train-drafter --model ...`.")
