"""Replayed proposals (issue #18, leak-free depths): the drafter's proposal at every output position, stored
beside a run, and the law's DP over them (``depths="replayed"``): what is replayed, what the file accepts, and
that the prediction reads the proposals and nothing of the held-out rounds."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from entropy_law.decoding.replay import replay_proposals, replay_rounds
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.law.fit import fit_law, get_family
from entropy_law.payoff.predict import loco_predictions
from entropy_law.analysis.simulate import simulate_traces
from entropy_law.law.transfer import (
    block_prediction,
    entropy_sequences,
    loco_transfer,
    predict_requests,
    proposal_arrays,
)
from entropy_law.traces.proposals import PROPOSALS_FILE, read_proposals, write_proposals
from entropy_law.traces.recorder import TraceRecorder
from entropy_law.traces.validation import TraceValidationError

B = 8
DRAFTS = B - 1


# --- the replay -------------------------------------------------------------------------------------


class _GuessDrafter:
    """Context-only: after context length n, proposes ``guess[n - 1 + d]`` at depth d (4 deep), top-1 prob 0.6."""

    block_size = 5
    feature_layers = ()

    def __init__(self, guess):
        self.guess = list(guess)

    def begin(self, prompt_ids, prompt_features=None):
        pass

    def propose(self, tokens, new_features=None):
        import torch

        from entropy_law.decoding.interface import DraftProposal

        n = len(tokens)
        row = self.guess[n: n + 4]
        if not row:
            return DraftProposal.empty()
        tokens_ = torch.tensor([[t, t + 1000] for t in row])
        logprobs = torch.log(torch.tensor([[0.6, 0.3]] * len(row)))
        return DraftProposal(tokens=tokens_, logprobs=logprobs)


def test_replay_proposals_rows_follow_the_context_and_the_budget():
    prompt, output = [1, 2, 3], [10, 11, 12, 13, 14, 15]
    guess = prompt + output + [99] * 10  # the guess spells the whole sequence
    frame = replay_proposals(prompt, output, _GuessDrafter(guess), "chain", max_new_tokens=6)
    starts = frame.drop_duplicates("start_position")
    assert starts["start_position"].tolist() == [1, 2, 3, 4, 5]
    # usable depth = remaining tokens - 1 = 6 - s - 1, capped by the drafter's 4
    assert starts["proposal_depth"].tolist() == [4, 3, 2, 1, 0]
    assert frame.loc[frame["depth"] > 0, "top1_prob"].tolist() == pytest.approx([0.6] * 10)
    assert np.isnan(frame.loc[frame["depth"] == 0, "top1_prob"]).all()


def test_replay_proposals_refuse_an_output_that_goes_on_after_eos():
    prompt, output = [1, 2, 3], [10, 11, 12]
    frame = replay_proposals(prompt, output, _GuessDrafter(prompt + output + [5] * 9), "chain", eos_token_ids=[12])
    assert frame["start_position"].max() == 2
    with pytest.raises(ValueError, match="EOS at position 1"):
        replay_proposals(prompt, output, _GuessDrafter(prompt + output), "chain", eos_token_ids=[11])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replayed_depths_equal_the_rounds_of_a_replay_at_their_starts(seed):
    """With no probability cut (min_path_prob 0) the n-gram drafter's depth depends on the context only, so at
    every start of ``replay_rounds`` (the decoder's rounds) the replayed proposal depth is the round's."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(5, 25, size=6)
    prompt = [int(t) for t in rng.choice(vocab, size=30)]
    output = [int(t) for t in rng.choice(vocab, size=60)]
    config = dict(max_ngram=3, block_size=6, max_matches=1, min_path_prob=0.0)
    frame = replay_proposals(prompt, output, NgramDrafter(**config), "chain")
    rounds = replay_rounds(prompt, output, NgramDrafter(**config), "chain", min_expected_accepted=0.0).rounds
    depth_at = frame.drop_duplicates("start_position").set_index("start_position")["proposal_depth"]
    decoded = [(r.start_position, r.tree_depth) for r in rounds if r.round_index > 0]
    assert len(decoded) > 5
    assert all(int(depth_at[s]) == d for s, d in decoded)
    assert sum(d > 0 for _, d in decoded) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gated_replay_declines_where_the_gated_decoder_declines(seed):
    """``min_expected_accepted`` (the ratio gate's threshold, ``run_gate_threshold`` of a run): at every start of
    a gated ``replay_rounds`` (the decoder's rounds under that gate) the gated replayed proposal drafts what the
    round drafted, nothing where the gate declined; ungated it drafts there."""
    from entropy_law.decoding.replay import run_gate_threshold

    rng = np.random.default_rng(seed)
    vocab = rng.integers(5, 25, size=6)
    prompt = [int(t) for t in rng.choice(vocab, size=30)]
    output = [int(t) for t in rng.choice(vocab, size=60)]
    config = dict(max_ngram=3, block_size=6, max_matches=1, min_path_prob=0.0)
    gated = replay_proposals(prompt, output, NgramDrafter(**config), "chain", min_expected_accepted=1.0)
    open_ = replay_proposals(prompt, output, NgramDrafter(**config), "chain")
    rounds = replay_rounds(prompt, output, NgramDrafter(**config), "chain", min_expected_accepted=1.0).rounds
    depth_at = gated.drop_duplicates("start_position").set_index("start_position")["proposal_depth"]
    decoded = [(r.start_position, r.tree_depth) for r in rounds if r.round_index > 0]
    assert all(int(depth_at[s]) == d for s, d in decoded)
    assert (depth_at > 0).sum() < (open_.drop_duplicates("start_position")["proposal_depth"] > 0).sum()
    assert run_gate_threshold({"verify_cost_ratio": 1.0}) == 0.0
    assert run_gate_threshold({}) == 1.0  # recorded before the ratio was written down: the default, 2
    assert run_gate_threshold({"min_expected_accepted": 0.4, "verify_cost_ratio": 3.0}) == 0.4
    assert run_gate_threshold({"gate": "cost"}) is None and run_gate_threshold({"verify_cost": {"sizes": [1]}}) is None


# --- the file beside a run ------------------------------------------------------------------------


def _run_dir(tmp_path):
    rec = TraceRecorder(tmp_path / "run", model_id="m", drafter_id="d")
    rec.finish()
    return tmp_path / "run", rec.run_id


def _frame(run_id, rows):
    return pd.DataFrame(rows, columns=["request_id", "start_position", "proposal_depth", "depth", "top1_prob"]).assign(
        run_id=run_id)


def test_proposals_file_round_trip_and_rules(tmp_path):
    run, run_id = _run_dir(tmp_path)
    good = _frame(run_id, [("r", 1, 2, 1, 0.9), ("r", 1, 2, 2, 0.5), ("r", 2, 0, 0, np.nan)])
    write_proposals(run, good, {"by": "test"})
    back = read_proposals(tmp_path)
    assert back[["start_position", "proposal_depth", "depth"]].to_numpy().tolist() == [[1, 2, 1], [1, 2, 2], [2, 0, 0]]
    assert back.attrs["how"] == {run_id: {"by": "test"}}
    assert not list(run.glob(".tmp-*"))
    bad = {
        "depth beyond": [("r", 1, 1, 1, 0.9), ("r", 1, 1, 2, 0.5)],
        "lacks a depth": [("r", 1, 3, 1, 0.9), ("r", 1, 3, 3, 0.5)],
        "null where drafted": [("r", 1, 1, 1, np.nan)],
        "prob where nothing drafted": [("r", 1, 0, 0, 0.3)],
        "not a probability": [("r", 1, 1, 1, 1.5)],
        "duplicate": [("r", 1, 1, 1, 0.5), ("r", 1, 1, 1, 0.5)],
    }
    for what, rows in bad.items():
        with pytest.raises(TraceValidationError):
            write_proposals(run, _frame(run_id, rows), {})
    with pytest.raises(TraceValidationError, match="proposals of run"):
        write_proposals(run, _frame("another-run", [("r", 1, 0, 0, np.nan)]), {})
    assert read_proposals(tmp_path / "nothing-here") is None
    assert (run / PROPOSALS_FILE).is_file()


def test_write_parquet_atomic_replaces_whole_or_not_at_all(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from entropy_law.traces.layout import write_parquet_atomic

    path = tmp_path / "t.parquet"
    write_parquet_atomic(path, pa.table({"x": [1, 2]}))
    seen = []

    def refuse(tmp):  # the check sees the written temp file, beside the target
        seen.append(pq.read_table(tmp).column("x").to_pylist())
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        write_parquet_atomic(path, pa.table({"x": [3]}), check=refuse)
    assert seen == [[3]]
    assert pq.read_table(path).column("x").to_pylist() == [1, 2]  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]  # no temp file left
    write_parquet_atomic(path, pa.table({"x": [4]}), check=lambda tmp: None)
    assert pq.read_table(path).column("x").to_pylist() == [4]


# --- the law's DP over them -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    return simulate_traces(seed=7, n_requests_per_category=12, k=0.8, lambda_d=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6],
                           block_size=B, tokens_per_request=(60, 100))


def _full_proposals(traces, top1=0.5, *, top1_of=None):
    """A proposal of the full block at every output position (the simulated drafter always drafts B - 1)."""
    rows = []
    for rec in entropy_sequences(traces, "sim-block").itertuples():
        T = len(rec.entropy)
        start = np.repeat(np.arange(T), DRAFTS)
        depth = np.tile(np.arange(1, DRAFTS + 1), T)
        prob = np.full(start.size, top1) if top1_of is None else top1_of(rec, start, depth)
        rows.append(pd.DataFrame({"run_id": rec.run_id, "request_id": rec.request_id, "start_position": start,
                                  "proposal_depth": DRAFTS, "depth": depth, "top1_prob": prob}))
    return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def full_proposals(sim):
    """``_full_proposals(sim)``, built once for the tests that read it."""
    return _full_proposals(sim)


@pytest.fixture(scope="module")
def replayed_loco(sim, full_proposals):
    """LOCO of ``sim`` with the full-block proposals replayed (``depths="replayed"``), run once."""
    return loco_transfer(sim, "law_exp", drafter="sim-block", depths="replayed", proposals=full_proposals)


@pytest.fixture(scope="module")
def full_loco(sim):
    """LOCO of ``sim`` with a full block every round (``depths="full"``), run once."""
    return loco_transfer(sim, "law_exp", drafter="sim-block", depths="full")


def test_proposal_arrays_and_missing_starts():
    frame = _frame("x", [("r", 1, 2, 1, 0.9), ("r", 1, 2, 2, 0.5), ("r", 2, 0, 0, np.nan), ("r", 3, 9, 1, 0.7)])
    frame = pd.concat([frame, _frame("x", [("r", 3, 9, d, 0.1) for d in range(2, 10)])], ignore_index=True)
    depth, top1 = proposal_arrays(frame, 4, 3)
    assert depth.tolist() == [0, 2, 0, 3]  # position 0: the prefill; 9 capped at 3 drafts
    assert top1[1].tolist()[:2] == [0.9, 0.5] and np.isnan(top1[1, 2]) and np.isnan(top1[2]).all()
    assert top1[3].tolist() == pytest.approx([0.7, 0.1, 0.1])
    with pytest.raises(ValueError, match="lack 1 of the 4 round starts"):
        proposal_arrays(frame, 5, 3)


def test_replayed_full_depth_proposals_give_the_full_depth_prediction(sim, full_proposals, replayed_loco, full_loco):
    replayed, full = replayed_loco, full_loco
    for column in ("predicted_tokens_per_round", "depth_only_tokens_per_round", "predicted_mean_accepted"):
        assert replayed.summary[column].to_numpy() == pytest.approx(full.summary[column].to_numpy(), rel=1e-10)
    with pytest.raises(ValueError, match="needs the drafter's replayed proposals"):
        loco_transfer(sim, "law_exp", drafter="sim-block", depths="replayed")
    law = fit_law(sim, "law_exp")
    in_sample = block_prediction(law, sim, drafter="sim-block", depths="replayed", proposals=full_proposals)
    assert in_sample.summary["dp_tokens_per_round"].to_numpy() == pytest.approx(
        block_prediction(law, sim, drafter="sim-block", depths="full").summary["dp_tokens_per_round"].to_numpy(),
        rel=1e-10)


def test_replayed_prediction_reads_nothing_of_the_held_out_rounds(sim, full_proposals, replayed_loco):
    """The held-out category's recorded rounds (drafted depths, tau) may change: the replayed prediction does not."""
    proposals = full_proposals
    rounds = sim.rounds.copy()
    mine = (rounds["category"] == "qa").to_numpy() if "category" in rounds else None
    if mine is None:
        keys = sim.requests.loc[sim.requests["category"] == "qa", "request_id"]
        mine = rounds["request_id"].isin(keys).to_numpy()
    rounds.loc[mine, "tree_depth"] = 1
    changed = dataclasses.replace(sim, rounds=rounds)
    base = replayed_loco
    moved = loco_transfer(changed, "law_exp", drafter="sim-block", depths="replayed", proposals=proposals)
    qa_pred = base.summary.loc["qa", "predicted_tokens_per_round"]
    assert moved.summary.loc["qa", "predicted_tokens_per_round"] == pytest.approx(qa_pred, rel=1e-12)
    # the change is one a reader of the held-out rounds would see: the oracle mode's prediction moves
    oracle = [loco_transfer(t, "law_exp", drafter="sim-block", depths="oracle").summary.loc[
        "qa", "predicted_tokens_per_round"] for t in (sim, changed)]
    assert abs(oracle[1] / oracle[0] - 1) > 0.05


def _with_informative_top1(traces):
    """The simulated drafter's top-1 probability made informative: higher where its draft was accepted
    (uniform on [0.4, 0.99]) than where it was rejected ([0.05, 0.6]); every at-risk trial has one, bonus tokens
    none."""
    tokens = traces.tokens.copy()
    role = tokens["role"].to_numpy()
    rng = np.random.default_rng(3)
    tokens["draft_top1_prob"] = np.where(role == "accepted", rng.uniform(0.4, 0.99, len(role)),
                                         np.where(role == "correction", rng.uniform(0.05, 0.6, len(role)), np.nan))
    return dataclasses.replace(traces, tokens=tokens)


def test_a_law_in_the_drafters_confidence_predicts_from_the_replayed_top1(sim):
    traces = _with_informative_top1(sim)
    law = fit_law(traces, "law_exp_obs_ceil_drafttop")
    seqs = entropy_sequences(traces, "sim-block")
    sure, unsure = _full_proposals(traces, 0.95), _full_proposals(traces, 0.05)
    high = predict_requests(law, seqs, B, depths="replayed", proposals=sure)
    low = predict_requests(law, seqs, B, depths="replayed", proposals=unsure)
    tpr_high = high["tokens"].sum() / high["predicted_rounds"].sum()
    tpr_low = low["tokens"].sum() / low["predicted_rounds"].sum()
    assert tpr_high > 1.5 * tpr_low  # the fitted law rewards the drafter's confidence, the DP reads it
    # confidence only at one start: only rounds from there change
    h = np.asarray(seqs.iloc[0]["entropy"], dtype=float)
    _, top1 = proposal_arrays(unsure.loc[unsure["request_id"] == seqs.iloc[0]["request_id"]], h.size, DRAFTS)
    top1[5] = 0.95
    frame, shape = law.sequence_frame(h, DRAFTS, draft_top1=top1)
    a = law.shape_acceptance(law.predict_frame(frame), shape)  # [T, drafts] ([D, T, drafts] for a law in D)
    base_frame, _ = law.sequence_frame(h, DRAFTS, draft_top1=np.where(np.isnan(top1), np.nan, 0.05))
    base = law.shape_acceptance(law.predict_frame(base_frame), shape)
    changed = np.argwhere(~np.isclose(a, base))
    assert changed.size and set(changed[:, a.ndim - 2]) == {5}
    with pytest.raises(ValueError, match="depths='replayed'"):
        law.sequence_frame(h, DRAFTS)
    with pytest.raises(ValueError, match="use depths='replayed'"):
        predict_requests(law, seqs, B, depths="full")
    assert get_family("law_exp_obs_ceil_drafttop").needs_draft_stats


def test_loco_predictions_with_replayed_proposals_and_category_predictions(sim, full_proposals, replayed_loco):
    pred = loco_predictions(sim, "law_exp", drafter="sim-block", n_draws=0, proposals=full_proposals)
    cat = pred.category_predictions()
    r = pred.requests
    qa = r.loc[r["category"] == "qa"]
    assert cat.loc["qa", "predicted_tokens_per_round"] == pytest.approx(qa["tokens"].sum()
                                                                         / (qa["tokens"] / qa["center"]).sum())
    assert cat.loc["qa", "observed_tokens_per_round"] == pytest.approx(
        qa["tokens"].sum() / (qa["tokens"] / qa["observed_tokens_per_round"]).sum())
    acc = pred.category_accuracy()
    assert acc["mean_abs_relative_error"] == pytest.approx(cat["relative_error"].abs().mean())
    assert "replayed proposals" in pred.notes[0]
    # the mean accepted length: observed and raw DP as loco_transfer computes them on its own path
    loco = replayed_loco
    for column in ("observed_mean_accepted", "predicted_mean_accepted"):
        source = column if column.startswith("observed") else column + "_raw"
        np.testing.assert_allclose(cat[source].to_numpy(), loco.summary.loc[cat.index, column].to_numpy(), rtol=1e-9)
    # the centres': the DP's drafting share in each request applied to its rounds at T / centre
    rounds = qa["tokens"] / qa["center"]
    drafting = rounds * qa["predicted_drafting_rounds"] / qa["predicted_rounds"]
    assert cat.loc["qa", "predicted_mean_accepted"] == pytest.approx(
        (qa["tokens"].sum() - rounds.sum()) / drafting.sum())
    assert acc["mean_accepted_mean_abs_relative_error"] == pytest.approx(
        cat["mean_accepted_relative_error"].abs().mean())


def test_category_mean_accepted_of_the_centres_by_hand():
    from entropy_law.payoff.predict import RequestPredictions

    # two requests of 10 tokens: centre 2 (5 rounds each), the raw DP 4 rounds of which 3 draft (share 3/4);
    # observed 4 rounds of which 2 draft
    requests = pd.DataFrame({"category": ["qa", "qa"], "tokens": [10, 10], "center": [2.0, 2.0],
                             "predicted_tokens_per_round": [2.5, 2.5], "predicted_rounds": [4.0, 4.0],
                             "predicted_drafting_rounds": [3.0, 3.0], "observed_tokens_per_round": [2.5, 2.5],
                             "observed_drafting_rounds": [2, 2]})
    pred = RequestPredictions(summary=pd.DataFrame(), requests=requests, reliability=pd.DataFrame(),
                              family="law_exp", level=0.9)
    cat = pred.category_predictions().loc["qa"]
    assert cat["observed_mean_accepted"] == pytest.approx((20 - 8) / 4)  # 3.0
    assert cat["predicted_mean_accepted_raw"] == pytest.approx((20 - 8) / 6)  # 2.0
    assert cat["predicted_mean_accepted"] == pytest.approx((20 - 10) / 7.5)  # 10 rounds, 7.5 drafting
    assert cat["mean_accepted_relative_error"] == pytest.approx((10 / 7.5) / 3.0 - 1)


def test_law_command_asks_for_the_replayed_proposals(capsys):
    from entropy_law.cli import main

    assert main(["law", "--simulate", "3", "--drafter", "sim-block", "--loco", "--loco-depths", "replayed"]) == 2
    assert "bench/law.py proposals --write" in capsys.readouterr().err


def test_the_proposals_module_needs_no_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, entropy_law.traces.proposals\n"
            "assert 'torch' not in sys.modules, 'torch imported by the traces layer'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).parents[1]))


def test_trace_analysis_reports_the_replayed_mode_where_proposals_are_given(sim, full_proposals, full_loco):
    from entropy_law.analysis import TraceAnalysis

    plain = TraceAnalysis(sim, family="law_exp")
    assert "replayed" not in plain.loco_depths
    assert "bench/law.py proposals" in plain.attempt("loco", "sim-block chain", "replayed").error
    an = TraceAnalysis(sim, family="law_exp", proposals=full_proposals)
    assert an.loco_depths == ("training", "replayed", "oracle")
    full = full_loco
    replayed = an.loco("sim-block chain", "replayed")
    assert replayed.depths == "replayed"
    assert replayed.summary["predicted_tokens_per_round"].to_numpy() == pytest.approx(
        full.summary["predicted_tokens_per_round"].to_numpy(), rel=1e-10)
    assert set(an.loco_accuracy()["depths"]) == {"training", "replayed", "oracle"}

