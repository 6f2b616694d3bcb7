"""Claims under matched information (issue 64): a prediction refuses a law that reads more than its information set
holds, and ``calibrated_transfer``'s held-out residuals come from laws that never saw the held-out category."""

import numpy as np
import pytest

from entropy_law.analysis.simulate import simulate_traces
from entropy_law.glance import glance_rounds, law_round_expectations
from entropy_law.law import transfer
from entropy_law.law.fit import fit_law
from entropy_law.law.information import InfoSet

CATEGORIES = ["math_reasoning", "qa", "rag", "translation"]


@pytest.fixture(scope="module")
def sim():
    return simulate_traces(seed=5, n_requests_per_category=6, categories=CATEGORIES, block_size=6,
                           tokens_per_request=(40, 70))


def test_a_before_drafting_prediction_refuses_a_law_that_needs_the_after_verifying_set(sim):
    """law_exp_obs_ceil along the round's path with its observed D reads the entropies ahead of the root and the
    drafted depth: only after verifying holds both. The per-round prediction itself refuses it in a before-drafting
    (or before-verifying) set and computes it where the set holds it."""
    view = sim
    rounds = glance_rounds(view)
    law = fit_law(view, "law_exp_obs_ceil", cov_type="nonrobust")
    with pytest.raises(ValueError, match="before drafting set does not hold"):
        law_round_expectations(law, view, rounds, info=InfoSet.BEFORE_DRAFTING)
    with pytest.raises(ValueError, match="entropy_ahead"):
        law_round_expectations(law, view, rounds, info="before verifying")
    after = law_round_expectations(law, view, rounds, info="after_verifying")
    np.testing.assert_array_equal(after, law_round_expectations(law, view, rounds))
    # from the root alone it still reads the round's own D: before verifying, not before drafting
    law_round_expectations(law, view, rounds, root_only=True, info="before_verifying")
    with pytest.raises(ValueError, match="drafted_depth"):
        law_round_expectations(law, view, rounds, root_only=True, info="before_drafting")
    # with D drawn from a depth model of other categories it is a before-drafting prediction
    law_round_expectations(law, view, rounds, root_only=True, depths="training", info="before_drafting")


def test_a_workload_prediction_refuses_the_drafters_confidence_it_cannot_have(sim):
    """The workload set holds no round's drafter confidence: a law in it is refused by the price itself unless the
    drafter's replayed proposals give it; the answer names its set."""
    from entropy_law.payoff.workload import predict_workload

    seqs = transfer.entropy_sequences(sim, "sim-block")
    with pytest.raises(ValueError, match=r"drafter_confidence.*workload set does not hold.*replayed proposals"):
        predict_workload(sim, seqs, drafter="sim-block", family="law_exp_obs_ceil_drafttop", n_boot=0)


def _recording(monkeypatch):
    """Record, for every law and depth model ``law.transfer`` fits, the categories it saw, and for every prediction
    the categories its law and depth model saw, the categories predicted and the tokens per round."""
    seen, fits, predictions = {}, [], []
    real_fit, real_predict = transfer.fit_law, transfer.predict_requests
    real_depth_fit = transfer.TrainingDepthModel.fit.__func__

    def fit(data, family, **options):
        law = real_fit(data, family, **options)
        seen[id(law)] = (law, frozenset(data["category"]))
        fits.append(seen[id(law)][1])
        return law

    def depth_fit(cls, depths, drafts, **options):
        model = real_depth_fit(cls, depths, drafts, **options)
        seen[id(model)] = (model, frozenset(depths["category"]))
        fits.append(seen[id(model)][1])
        return model

    def predict(law, sequences, B, **options):
        out = real_predict(law, sequences, B, **options)
        predictions.append((seen[id(law)][1], seen[id(options["depth_model"])][1], frozenset(sequences["category"]),
                            out["tokens"].sum() / out["predicted_rounds"].sum()))
        return out

    monkeypatch.setattr(transfer, "fit_law", fit)
    monkeypatch.setattr(transfer.TrainingDepthModel, "fit", classmethod(depth_fit))
    monkeypatch.setattr(transfer, "predict_requests", predict)
    return fits, predictions


def test_calibrated_transfer_residuals_come_from_laws_that_never_saw_the_held_out_category(sim, monkeypatch):
    """Nested: category c is predicted by a law and depth model fitted without c, and scaled by b_-c, the mean log
    residual of every other category j predicted by a law and depth model fitted without both c and j. Every fit is
    recorded; c's calibrated prediction is rebuilt from the recorded predictions whose fits saw neither c nor j."""
    fits, predictions = _recording(monkeypatch)
    loco = transfer.loco_transfer(sim, "law_exp", drafter="sim-block")
    cats = frozenset(CATEGORIES)
    assert len(predictions) == len(cats)
    for law_saw, depth_saw, predicted, _ in predictions:  # the outer run: each category unseen by its predictor
        assert law_saw == depth_saw == cats - predicted and len(predicted) == 1
    fits.clear()
    predictions.clear()
    b, error, table = transfer.calibrated_transfer(loco)
    assert fits and all(len(saw) == len(cats) - 2 for saw in fits)  # no calibration fit saw more than k - 2
    observed = loco.summary["observed_tokens_per_round"]
    table = table.set_index("category")
    for c in cats:
        residuals = {j: np.log(observed[j] / tpr) for law_saw, depth_saw, (j,), tpr in predictions
                     if law_saw == depth_saw == cats - {c, j}}
        assert set(residuals) == cats - {c}
        expected = loco.summary.loc[c, "predicted_tokens_per_round"] * np.exp(np.mean(list(residuals.values())))
        assert table.loc[c, "calibrated_tokens_per_round"] == pytest.approx(expected, rel=1e-12)
    assert len(predictions) == len(cats) * (len(cats) - 1)
    assert b == pytest.approx(np.log(observed / loco.summary["predicted_tokens_per_round"]).mean())
    assert error == pytest.approx(table["relative_error"].abs().max())
    assert loco.info_sets == [InfoSet.WORKLOAD, InfoSet.AFTER_VERIFYING]
    assert "information: workload / after verifying" in loco.title
