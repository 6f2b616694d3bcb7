"""Trace format v2, the one written contract between decoding and analysis: the names, Arrow types and meaning
of every column of the three tables and of the run metadata. The prose version is ``docs/trace-schema.md``; keep
both in step. Conventions:
- entropies in nats, computed in fp32 over the full vocabulary;
- ``depth`` is 1-based within a round: the token at depth d was predicted by the target at the
  node of depth d-1 on the committed path (the root, the pending token, has depth 0);
- a round commits ``accepted`` (tau) draft tokens plus one target token, ``committed = tau + 1``
  (fewer only when the request stopped inside the round);
- ``block_size`` B is the most tokens one round can commit, so ``tau <= tree_depth <= B - 1``.
"""

from __future__ import annotations

import pyarrow as pa

FORMAT_NAME = "entropy-law-trace"
FORMAT_VERSION = 2
# v2 = v1 + the top-k entropy columns (a row's entropy may be known only as bounds), which a v1 reader would
# misread, so it refuses v2. Every v1 file reads as v2 with those columns null.
READABLE_FORMAT_VERSIONS = (1, 2)

TABLES = ("tokens", "rounds", "requests")

ROLE_ACCEPTED = "accepted"  # a draft token the target confirmed
ROLE_CORRECTION = "correction"  # the target's token where a draft was rejected (at risk, failed)
ROLE_BONUS = "bonus"  # the target's token after a path with no further drafts (not at risk)
ROLES = (ROLE_ACCEPTED, ROLE_CORRECTION, ROLE_BONUS)

STOP_REASONS = ("eos", "max_new_tokens", "context_full", "error")

TOKENS_SCHEMA = pa.schema([
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("round_index", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),  # 0-based index among the request's new tokens
        pa.field("depth", pa.int16(), nullable=False),  # 1-based depth within the round
        # token_id and the target statistics: null only where a run's source does not hold them (an imported
        # GLANCE round log: no token ids, the entropy at each round's root only); recorded runs fill them all
        pa.field("token_id", pa.int32(), nullable=True),
        pa.field("role", pa.string(), nullable=False),  # one of ROLES
        pa.field("target_entropy_nats", pa.float32(), nullable=True),  # Shannon H of the target
        pa.field("target_renyi2_nats", pa.float32(), nullable=True),  # -log sum p^2
        pa.field("target_top1_prob", pa.float32(), nullable=True),
        pa.field("target_top2_prob", pa.float32(), nullable=True),
        pa.field("target_logit_gap", pa.float32(), nullable=True),  # z_(1) - z_(2)
        pa.field("draft_prob", pa.float32(), nullable=True),  # drafter prob of the committed token
        pa.field("draft_rank", pa.int32(), nullable=True),  # 0-based; -1: not among candidates
        pa.field("draft_entropy_nats", pa.float32(), nullable=True),
        # added: the drafter's probability of its own top proposal at this depth (known before verification)
        pa.field("draft_top1_prob", pa.float32(), nullable=True),
        # added: the context's copyability before this position (longest suffix of the prompt and the output
        # before it that occurred earlier in them, up to CONTEXT_MATCH_MAX; null where the prompt's ids are unknown)
        pa.field("context_match", pa.int16(), nullable=True),
        # v2: the target entropy from the top-k log-probabilities an engine returned (``traces.topk``), where the
        # exact entropy is unknown: bounds over every distribution with those top k, a point estimate between
        # them, and k (the entries read); null where the exact statistics were recorded or nothing was logged
        pa.field("target_entropy_lower_nats", pa.float32(), nullable=True),
        pa.field("target_entropy_upper_nats", pa.float32(), nullable=True),
        pa.field("target_entropy_estimate_nats", pa.float32(), nullable=True),
        pa.field("target_topk", pa.int16(), nullable=True),
])

ROUNDS_SCHEMA = pa.schema([
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("round_index", pa.int32(), nullable=False),
        pa.field("start_position", pa.int32(), nullable=False),  # output position of first committed token
        pa.field("context_len", pa.int32(), nullable=False),  # target cache length before the round
        pa.field("block_size", pa.int16(), nullable=False),  # B: most tokens a round can commit
        pa.field("tree_nodes", pa.int32(), nullable=False),  # N draft nodes (root excluded)
        pa.field("tree_depth", pa.int16(), nullable=False),  # deepest draft node (0: no draft)
        pa.field("accepted", pa.int16(), nullable=False),  # tau: accepted drafts, bonus excluded
        pa.field("committed", pa.int16(), nullable=False),  # tokens committed (tau + 1 unless stopped)
        pa.field("draft_ms", pa.float32(), nullable=False),
        pa.field("verify_ms", pa.float32(), nullable=False),
        pa.field("overhead_ms", pa.float32(), nullable=False),
        # added: the per-round policy's inputs and decision (null for rounds without a policy)
        pa.field("policy_entropy_nats", pa.float32(), nullable=True),  # target H at the last committed position
        pa.field("policy_window_entropy_nats", pa.float32(), nullable=True),  # mean H over the policy's window
        pa.field("policy_draft_confidence", pa.float32(), nullable=True),  # drafter's own E[accepted] of its tree
        pa.field("policy_expected_accepted", pa.float32(), nullable=True),  # policy's E[accepted] of verified tree
        pa.field("policy_budget", pa.int32(), nullable=True),  # draft nodes the policy chose to verify (0: none)
        pa.field("policy_drafted", pa.bool_(), nullable=True),  # False: the policy did not call the drafter
        pa.field("policy_calibration", pa.float32(), nullable=True),  # in-request factor on the law (1: none yet)
        pa.field("policy_plan_calibration", pa.float32(), nullable=True),  # the same, on the blended expectation
        pa.field("policy_context_match", pa.int32(), nullable=True),  # the context's suffix-match length (copyability)
        pa.field("policy_route", pa.string(), nullable=True),  # the hybrid drafter's drafter the policy chose
])

REQUESTS_SCHEMA = pa.schema([
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("image_tokens", pa.int32(), nullable=False),
        pa.field("new_tokens", pa.int32(), nullable=False),
        pa.field("rounds", pa.int32(), nullable=False),
        pa.field("stop_reason", pa.string(), nullable=False),  # one of STOP_REASONS
        pa.field("prefill_ms", pa.float32(), nullable=False),
        pa.field("decode_ms", pa.float32(), nullable=False),  # wall time of all rounds of the request
        pa.field("decode_cpu_ms", pa.float32(), nullable=True),  # CPU-clock time of those rounds (added; null: unknown)
])

SCHEMAS = {"tokens": TOKENS_SCHEMA, "rounds": ROUNDS_SCHEMA, "requests": REQUESTS_SCHEMA}

# The per-round policy's inputs and decision (rounds table), in the order of ROUNDS_SCHEMA.
POLICY_COLUMNS = ("policy_entropy_nats", "policy_window_entropy_nats", "policy_draft_confidence",
                  "policy_expected_accepted", "policy_budget", "policy_drafted", "policy_calibration",
                  "policy_plan_calibration", "policy_context_match", "policy_route")

# The tokens columns of the target entropy from top-k log-probabilities (v2; ``traces.topk``), in schema order.
TOPK_COLUMNS = ("target_entropy_lower_nats", "target_entropy_upper_nats", "target_entropy_estimate_nats",
                "target_topk")

# Nullable columns added after v1's first release: older files lack them and read (and resume) with them null.
# Document every entry in docs/trace-schema.md under "Added columns".
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    "tokens": ("draft_top1_prob", "context_match", *TOPK_COLUMNS),
    "rounds": POLICY_COLUMNS,
    "requests": ("decode_cpu_ms",),
}


def added_columns(table: str) -> tuple[str, ...]:
    """Names of the nullable columns added to ``table`` after the first v1 release (may be absent in files)."""
    return ADDED_COLUMNS[table]


# Run metadata (run.json). Required keys are always written by the recorder; user keys may be added.
# status: "running" | "complete"; drafter_config: a dict; start_time, end_time: ISO 8601 UTC; git_revision or null.
RUN_METADATA_KEYS = ("format", "format_version", "run_id", "status", "model_id", "drafter_id", "drafter_config",
                     "tree_policy", "dtype", "device", "package_version", "seed", "start_time", "end_time",
                     "git_revision")
