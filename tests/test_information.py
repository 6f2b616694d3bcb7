"""The four information sets and the inputs each law family reads (entropy_law.law.information)."""

import pytest

from entropy_law.law.fit import FAMILIES, get_family
from entropy_law.law.information import (ALLOWS, INPUTS, InfoSet, check_information, family_inputs, info_set,
                                         predictor_inputs, sets_allowing, sets_label)


def test_sets_are_not_nested():
    workload, before = ALLOWS[InfoSet.WORKLOAD], ALLOWS[InfoSet.BEFORE_DRAFTING]
    assert "entropy_ahead" in workload - before and "request_history" in before - workload
    assert before < ALLOWS[InfoSet.BEFORE_VERIFYING] < ALLOWS[InfoSet.AFTER_VERIFYING] == frozenset(INPUTS)
    assert "outcome" not in ALLOWS[InfoSet.BEFORE_VERIFYING] | workload


def test_primary_law_needs_the_after_verifying_set():
    # entropies ahead of the root and the round's drafted depth: only after verifying holds both
    inputs = family_inputs(get_family("law_exp_obs_ceil"))
    assert {"entropy_ahead", "drafted_depth"} <= inputs
    assert sets_allowing(inputs) == [InfoSet.AFTER_VERIFYING]
    with pytest.raises(ValueError, match="before drafting set does not hold"):
        check_information("before_drafting", inputs, what="law_exp_obs_ceil")
    assert check_information("after verifying", inputs, what="law_exp_obs_ceil") is InfoSet.AFTER_VERIFYING


def test_root_only_law_fits_before_drafting_and_workload_reads_the_path():
    fam = get_family("law_exp")
    assert check_information(InfoSet.BEFORE_DRAFTING, family_inputs(fam, root_only=True), what="law_exp")
    assert check_information(InfoSet.WORKLOAD, family_inputs(fam), what="law_exp")
    with pytest.raises(ValueError, match="entropy_ahead"):
        check_information(InfoSet.BEFORE_DRAFTING, family_inputs(fam), what="law_exp")


def test_every_family_reads_known_inputs_and_some_set_allows_it():
    for fam in FAMILIES.values():
        inputs = family_inputs(fam)
        assert inputs <= set(INPUTS), fam.name
        assert sets_allowing(inputs), fam.name
    assert "entropy_root" not in family_inputs(get_family("law0_cat"))
    assert "drafter_confidence" in family_inputs(get_family("law_exp_obs_ceil_drafttop"))


def test_unknown_set_and_input_are_refused():
    with pytest.raises(ValueError, match="unknown information set"):
        info_set("before lunch")
    with pytest.raises(ValueError, match="unknown inputs"):
        check_information("workload", {"gut_feeling"}, what="x")


def test_depth_source_decides_the_set_of_a_law_in_the_drafted_depth():
    fam = get_family("law_exp_obs_ceil")
    assert sets_allowing(predictor_inputs(fam, "training")) == [InfoSet.WORKLOAD, InfoSet.AFTER_VERIFYING]
    assert sets_allowing(predictor_inputs(fam, "observed", root_only=True)) == [InfoSet.BEFORE_VERIFYING,
                                                                                InfoSet.AFTER_VERIFYING]
    assert sets_allowing(predictor_inputs(fam, "observed")) == [InfoSet.AFTER_VERIFYING]
    assert sets_allowing(predictor_inputs(fam, "training", root_only=True)) == list(InfoSet)
    with pytest.raises(ValueError, match="depths must be one of"):
        predictor_inputs(fam, "guessed")


def test_the_replay_gives_a_law_in_the_drafters_confidence_its_input():
    fam = get_family("law_exp_obs_ceil_drafttop")
    replayed = predictor_inputs(fam, "replayed")
    assert "drafter_confidence" not in replayed and "replayed_proposals" in replayed
    assert sets_allowing(replayed)[0] is InfoSet.WORKLOAD
    assert "drafter_confidence" in predictor_inputs(fam, "training")  # no replay: the round's own confidence
    assert sets_label(sets_allowing(replayed)) == "information: workload / after verifying"
