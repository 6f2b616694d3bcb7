"""Decoding (torch): the target, the one speculative round (``round``), online decoding, offline replay, observers.

Never imports ``entropy_law.law``, ``plots``, ``jobs`` or ``drafters``; it talks to the analysis only through
trace files (``tests/test_layers.py``).
"""

from entropy_law.decoding.adapter import TargetAdapter, UnsupportedCacheLayout
from entropy_law.decoding.assisted import AssistedRecorder
from entropy_law.decoding.decoder import ARDecoder, GenerationResult, SpeculativeDecoder, measure_draft_cost
from entropy_law.decoding.gate import CostGate, PredicateGate, RatioGate, VerifyCost, measure_verify_cost
from entropy_law.decoding.interface import DraftProposal, Drafter
from entropy_law.decoding.loading import load_target
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.replay import (PrecomputedBlockDrafter, ReplayResult, replay_chain, replay_request,
                                         replay_rounds, teacher_forced_target_stats)
from entropy_law.decoding.round import Observer, Round, RoundPolicy, RoundRules, play_round
from entropy_law.decoding.tree import Tree, build_tree

__all__ = ["ARDecoder", "AssistedRecorder", "CostGate", "DraftProposal", "Drafter", "GenerationResult", "Observer",
           "PrecomputedBlockDrafter", "PredicateGate", "RatioGate", "RecorderObserver", "ReplayResult", "Round",
           "RoundPolicy", "RoundRules", "SpeculativeDecoder", "TargetAdapter", "Tree",
           "UnsupportedCacheLayout", "VerifyCost",
           "build_tree", "load_target", "measure_draft_cost", "measure_verify_cost", "play_round", "replay_chain",
           "replay_request", "replay_rounds", "teacher_forced_target_stats"]
