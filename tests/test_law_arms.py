"""Arms (issue #16, item 1): runs of different models, checkpoints, tree policies or gates are never pooled
silently; a speedup is measured only against an AR run of the same model and machine; requests are counted
per (run, request).

Trace folders are written through ``TraceRecorder`` from ``simulate_traces`` tables, relabelled with the run
metadata of the case (two models decoding the same prompts, an AR run of another model, one n-gram drafter
under two tree policies, ...). Each ``test_*_problem`` test failed on the code before arms existed (db6e265).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from entropy_law.analysis import TraceAnalysis
from entropy_law.law.bootstrap import bootstrap_law
from entropy_law.law.compare import compare_laws
from entropy_law.payoff.cost import fit_cost_model, when_drafting_pays
from entropy_law.law.fit import fit_law
from entropy_law.analysis.simulate import TreeSpec, simulate_traces
from entropy_law.law.transfer import block_prediction, loco_transfer
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder

MODEL_A, MODEL_B = "smollm2-135m", "qwen2-0.5b"
CATEGORIES = ("qa", "rag", "math_reasoning")
PER_CATEGORY = 6  # 18 prompts, the same request ids in every run
FAST = dict(n_boot=3, compare_families=("law_exp",), n_folds=3, family="law_exp")  # compared with fit_law(...)'s default
SHA_1, SHA_2 = "1" * 64, "2" * 64


def _simulated(seed: int):
    return simulate_traces(seed=seed, n_requests_per_category=PER_CATEGORY, categories=list(CATEGORIES),
                           tokens_per_request=(40, 60), tree=TreeSpec(depth=5, nodes=16), include_ar=True)


@pytest.fixture(scope="module")
def sims():
    """Two 'models': the same prompts (request ids), different greedy entropies and timings."""
    return {MODEL_A: _simulated(1), MODEL_B: _simulated(2)}


def _arm_metadata(kind: str) -> dict:
    return {"ngram": dict(drafter_id="ngram", tree_policy="chain", tree_budget=None),
            "ngram-ddtree16": dict(drafter_id="ngram", tree_policy="ddtree", tree_budget=16),
            "block": dict(drafter_id="block-drafter-b8-l2", tree_policy="chain", tree_budget=None),
            "ar": dict(drafter_id="none", tree_policy="none", tree_budget=None)}[kind]


SOURCE_RUN = {"ngram": "sim-block", "ngram-ddtree16": "sim-tree", "block": "sim-block", "ar": "sim-ar"}


def write_run(folder, sims, run_id: str, kind: str, model: str = MODEL_A, **metadata) -> None:
    """One trace run: the simulated ``model``'s run of ``kind`` (ngram, ngram-ddtree16, block, ar) written
    with that model's id and the ``kind``'s drafter metadata (``metadata`` overrides or adds keys)."""
    sim = sims[model]
    meta = dict(model_id=model, drafter_config={}, dtype="float32", device="cpu", seed=0, replayed=False,
                verify_cost_ratio=2.0, **_arm_metadata(kind))
    meta.update(metadata)
    with TraceRecorder(folder / run_id, run_id=run_id, **meta) as rec:
        tables = {}
        for name in ("tokens", "rounds", "requests"):
            part = getattr(sim, name)
            part = part.loc[part["run_id"] == SOURCE_RUN[kind]]
            tables[name] = {col: part[col].to_numpy() for col in part.columns if col != "run_id"}
        rec.log_columns(**tables)


@pytest.fixture(scope="module")
def two_models(sims, tmp_path_factory):
    """Model A's n-gram run, model B's n-gram run and model B's AR run, on the same 18 prompts."""
    folder = tmp_path_factory.mktemp("two_models")
    write_run(folder, sims, "a-ngram", "ngram", MODEL_A)
    write_run(folder, sims, "b-ngram", "ngram", MODEL_B)
    write_run(folder, sims, "b-ar", "ar", MODEL_B)
    return load_traces(folder)


@pytest.fixture(scope="module")
def two_models_analysis(two_models):
    """``TraceAnalysis(two_models, **FAST)``, built once for the tests that read it."""
    return TraceAnalysis(two_models, **FAST)


@pytest.fixture(scope="module")
def other_ar(sims, tmp_path_factory):
    """Model A's n-gram run (cpu) with AR runs of another model (cpu) and of model A on another device."""
    folder = tmp_path_factory.mktemp("other_ar")
    write_run(folder, sims, "a-ngram", "ngram", MODEL_A)
    write_run(folder, sims, "b-ar", "ar", MODEL_B)
    write_run(folder, sims, "a-ar-gpu", "ar", MODEL_A, device="cuda:0")
    return load_traces(folder)


@pytest.fixture(scope="module")
def policies(sims, tmp_path_factory):
    """One n-gram drafter under two tree policies (chain, DDTree budget 16) and AR, one model."""
    folder = tmp_path_factory.mktemp("policies")
    write_run(folder, sims, "ngram-chain", "ngram")
    write_run(folder, sims, "ngram-ddtree", "ngram-ddtree16")
    write_run(folder, sims, "ar", "ar")
    return load_traces(folder)


def _speedup(requests: pd.DataFrame, arm_run: str, ar_run: str, category: str) -> float:
    """AR decode ms per token / arm decode ms per token (tokens after the prefill), independently."""
    req = requests.astype({"run_id": str, "category": str})
    ar = req.loc[(req["run_id"] == ar_run) & (req["category"] == category)]
    me = req.loc[(req["run_id"] == arm_run) & (req["category"] == category)]
    per_token = [part["decode_ms"].sum() / (part["new_tokens"] - 1).sum() for part in (ar, me)]
    return per_token[0] / per_token[1]


# ----------------------------------------------------------------------------------------- found problems


def test_runs_of_two_models_are_two_arms_problem(two_models, two_models_analysis):
    """Model A's and model B's n-gram runs were one arm "ngram chain" and one pooled law."""
    an = two_models_analysis
    assert an.arms == [f"{MODEL_A}/ngram chain", f"{MODEL_B}/ngram chain"]
    assert an.ar_arms == ["AR"]  # one AR model: its label stays
    for arm, run_id in ((f"{MODEL_A}/ngram chain", "a-ngram"), (f"{MODEL_B}/ngram chain", "b-ngram")):
        alone = fit_law(two_models.filter(run_id=run_id))
        assert an.law(arm).n_rows == alone.n_rows
        np.testing.assert_allclose(an.law(arm).result.params, alone.result.params)
    with pytest.raises(ValueError, match=rf"{MODEL_A}/ngram chain \(runs a-ngram\).*{MODEL_B}/ngram chain "
                                         r"\(runs b-ngram\).*filter\(run_id="):
        fit_law(two_models)


def test_speedup_only_against_ar_of_the_same_model_and_machine_problem(two_models, other_ar, two_models_analysis):
    """An AR run of another model (or of the same model on another device) gave a 'speedup vs AR'."""
    an = TraceAnalysis(other_ar, **FAST)
    assert an.arms == ["ngram chain"]
    table = an.results_table()
    drafted = table.loc[table["arm"] == "ngram chain"]
    assert drafted["speedup_vs_ar"].isna().all() and (drafted["speedup_requests"] == 0).all()
    with pytest.raises(ValueError, match=f"no measured speedup: .*no timed AR run of the same model and machine "
                                         f"\\(model {MODEL_A} on device cpu\\)"):
        an.measured_speedups()
    with pytest.raises(ValueError, match=f"no timed autoregressive run of model {MODEL_A} on device cpu in the traces "
                                         f"\\(the AR runs of model {MODEL_B} on device cpu; model {MODEL_A} on device "
                                         "cuda:0 are no baseline"):
        an.pays("ngram chain")
    # the law layer's cost model takes t_AR from the drafter's model and machine only
    with pytest.raises(ValueError, match=f"no autoregressive rounds .*model {MODEL_A} on device cpu"):
        when_drafting_pays(other_ar, n_boot=2)
    # where a matching AR run exists, the speedup is the one against it (model B's arm and model B's AR)
    an2 = two_models_analysis
    sp = an2.measured_speedups().set_index(["arm", "category"])
    assert set(sp.index.get_level_values("arm")) == {f"{MODEL_B}/ngram chain"}
    assert any("no timed AR run of the same model" in n for n in an2.measured_speedups().attrs["notes"])
    for cat in CATEGORIES:
        expected = _speedup(two_models.requests, "b-ngram", "b-ar", cat)
        assert sp.loc[(f"{MODEL_B}/ngram chain", cat), "speedup"] == pytest.approx(expected, rel=1e-5)


def test_requests_are_counted_per_run_and_request_problem(two_models, sims, tmp_path, two_models_analysis):
    """Requests were counted by request_id across runs: 18 for the 36 decodes of two runs."""
    an = two_models_analysis
    table = an.results_table()
    drafted = table.loc[table["arm"].isin(an.arms)]
    assert drafted["requests"].sum() == 2 * len(CATEGORIES) * PER_CATEGORY == 36
    # two runs of ONE arm (recorded twice) on the same prompts: one arm, every decode counted
    write_run(tmp_path, sims, "ngram-1", "ngram")
    write_run(tmp_path, sims, "ngram-2", "ngram")
    write_run(tmp_path, sims, "ar", "ar")
    an = TraceAnalysis(load_traces(tmp_path), **FAST)
    assert an.arms == ["ngram chain"]
    table = an.results_table().set_index(["arm", "category"])
    for cat in CATEGORIES:
        assert table.loc[("ngram chain", cat), "requests"] == 2 * PER_CATEGORY
        assert table.loc[("ngram chain", cat), "speedup_requests"] == 2 * PER_CATEGORY
        assert table.loc[("AR", cat), "requests"] == PER_CATEGORY
    # the law's intervals cluster by prompt: the two decodes of one prompt (one greedy output) are one cluster
    assert an.law_table().set_index("arm").loc["ngram chain", "requests"] == len(CATEGORIES) * PER_CATEGORY


def test_one_drafter_under_two_tree_policies_is_refused_problem(policies):
    """An n-gram chain run and an n-gram DDTree run were pooled into one law by every entry point."""
    arms = r"ngram chain \(runs ngram-chain\), ngram ddtree16 \(runs ngram-ddtree\)"
    chain_law = fit_law(policies.filter(run_id=["ngram-chain", "ar"]))
    refused = {
        "fit_law": lambda: fit_law(policies),
        "fit_law by drafter": lambda: fit_law(policies, by="drafter_id"),
        "loco_transfer": lambda: loco_transfer(policies),
        "loco_transfer drafter=": lambda: loco_transfer(policies, drafter="ngram"),
        "block_prediction": lambda: block_prediction(chain_law, policies),
        "block_prediction drafter=": lambda: block_prediction(chain_law, policies, drafter="ngram"),
        "when_drafting_pays": lambda: when_drafting_pays(policies, n_boot=2),
        "fit_cost_model drafter=": lambda: fit_cost_model(policies, drafter="ngram"),
        "compare_laws": lambda: compare_laws(policies, ("law_exp",), n_folds=3),
        "bootstrap_law": lambda: bootstrap_law(policies, n_boot=2),
    }
    for name, call in refused.items():
        with pytest.raises(ValueError, match=arms) as err:
            call()
        assert "filter(run_id=" in str(err.value) and "TraceAnalysis" in str(err.value), name
    # TraceAnalysis splits the arms itself; each is its own run's law
    an = TraceAnalysis(policies, **FAST)
    assert an.arms == ["ngram chain", "ngram ddtree16"]
    tree_law = fit_law(policies.filter(run_id="ngram-ddtree"))
    np.testing.assert_allclose(an.law("ngram ddtree16").result.params, tree_law.result.params)
    assert an.law("ngram chain").n_rows == chain_law.n_rows


def test_two_checkpoints_and_two_gates_are_four_arms_problem(sims, tmp_path):
    """Two checkpoints of one block-drafter architecture, and one n-gram drafter under the measured-cost and
    the ratio gate, were two arms ("block-drafter-b8-l2 chain", "ngram chain")."""
    write_run(tmp_path, sims, "block-1", "block", drafter_config={"checkpoint": "a.pt", "checkpoint_sha256": SHA_1})
    write_run(tmp_path, sims, "block-2", "block", drafter_config={"checkpoint": "b.pt", "checkpoint_sha256": SHA_2})
    write_run(tmp_path, sims, "ngram-cost", "ngram", verify_cost={"intercept_ms": 10.0, "per_node_ms": 0.1})
    write_run(tmp_path, sims, "ngram-ratio", "ngram")
    traces = load_traces(tmp_path)
    an = TraceAnalysis(traces, **FAST)
    assert sorted(an.arms) == sorted(["block-drafter-b8-l2 chain sha256:11111111",
                                      "block-drafter-b8-l2 chain sha256:22222222",
                                      "ngram chain cost-gate", "ngram chain ratio-gate2"])
    with pytest.raises(ValueError, match=r"sha256:11111111 \(runs block-1\).*sha256:22222222 \(runs block-2\)"):
        fit_law(traces, by="drafter_id")
    with pytest.raises(ValueError, match=r"ngram chain cost-gate \(runs ngram-cost\)"):
        fit_law(traces.filter(run_id=["ngram-cost", "ngram-ratio"]))


# ----------------------------------------------------------------------------------------- the label rules


def test_arm_keys_and_labels():
    from entropy_law.law.arms import run_arms

    runs = pd.DataFrame([
        dict(run_id="a", model_id=MODEL_A, drafter_id="ngram", tree_policy="chain", device="cpu"),
        dict(run_id="b", model_id=MODEL_A, drafter_id="ngram", tree_policy="ddtree", tree_budget=16.0,
             device="cpu"),  # a float budget (a NaN-padded column) reads as 16
        dict(run_id="c", model_id=MODEL_A, drafter_id="none", tree_policy="none", device="cpu"),
        dict(run_id="d", model_id=MODEL_B, drafter_id="ar", tree_policy="none", device="cuda:0", host="n1"),
        dict(run_id="e", model_id=MODEL_A, drafter_id="ngram", tree_policy="chain", device="cuda:0",
             verify_cost_ratio=np.nan),  # same arm as "a": no gate keys = the ratio gate, another machine
    ])
    arms = run_arms(runs).set_index("run_id")
    assert arms["arm"].to_dict() == {"a": "ngram chain", "b": "ngram ddtree16", "c": f"{MODEL_A}/AR",
                                     "d": f"{MODEL_B}/AR", "e": "ngram chain"}
    assert arms["is_ar"].to_dict() == {"a": False, "b": False, "c": True, "d": True, "e": False}
    assert arms.loc["a", "arm_key"] == arms.loc["e", "arm_key"] and arms.loc["a", "arm_key"].gate == "ratio"
    assert arms.loc["b", "arm_key"].tree_budget == 16
    assert arms.loc["a", "machine"] != arms.loc["e", "machine"]
    assert str(arms.loc["d", "machine"]) == f"model {MODEL_B} on device cuda:0 on host n1"
    # only the parts that differ are added: models differ within "ngram chain", gates do not
    runs.loc[4, ["model_id", "verify_cost_ratio"]] = [MODEL_B, 2.0]
    assert run_arms(runs).set_index("run_id")["arm"].to_dict()["e"] == f"{MODEL_B}/ngram chain ratio-gate2"
    # the gate as written ("gate"), else read from a verify_cost curve (runs recorded before "gate" existed)
    gates = pd.DataFrame([dict(run_id="named-cost", gate="cost", verify_cost=None),
                          dict(run_id="curve", verify_cost={"intercept_ms": 1.0}),
                          dict(run_id="named-ratio", gate="ratio", verify_cost=None),
                          dict(run_id="old")]).assign(drafter_id="ngram", tree_policy="chain")
    keys = run_arms(gates).set_index("run_id")["arm_key"]
    assert [keys[r].gate for r in ("named-cost", "curve", "named-ratio", "old")] == ["cost", "cost", "ratio", "ratio"]


def test_a_law_policy_run_is_its_own_arm_one_per_policy_file():
    """A law-policy run (gate "cost" and a ``policy`` in its metadata) is not pooled with the cost-gate run of the
    same drafter, tree and budget; two runs of one policy file are one arm whatever curve each machine measured;
    another policy file is another arm."""
    from entropy_law.law.arms import policy_gate, run_arms

    law = {"kind": "entropy_law_policy", "drafter_id": "ngram", "acceptance": [[0.5]], "draft_cost": 0.01}
    other = {**law, "acceptance": [[0.6]]}
    runs = pd.DataFrame([
        dict(run_id="gate", gate="cost", verify_cost={"sizes": [1], "costs": [1.0]}),
        dict(run_id="law-1", gate="cost", verify_cost={"sizes": [1], "costs": [1.0]}, policy=law),
        dict(run_id="law-2", gate="cost", verify_cost={"sizes": [1, 2], "costs": [1.0, 1.5]},
             policy={**law, "verify_cost": {"sizes": [1, 2], "costs": [1.0, 1.5]}}),
        dict(run_id="other", gate="cost", verify_cost=None, policy=other),
    ]).assign(model_id=MODEL_A, drafter_id="ngram", tree_policy="ddtree", tree_budget=16)
    arms = run_arms(runs).set_index("run_id")
    keys = arms["arm_key"]
    assert keys["law-1"] == keys["law-2"] != keys["gate"] and keys["other"] not in (keys["law-1"], keys["gate"])
    assert keys["law-1"].gate == policy_gate(law) and policy_gate(law).startswith("law-policy:")
    assert policy_gate(None) is None and policy_gate(float("nan")) is None
    labels = arms["arm"].to_dict()
    assert labels["gate"] == "ngram ddtree16 cost-gate" and labels["law-1"] == f"ngram ddtree16 {policy_gate(law)}"
    assert len(set(labels.values())) == 3


def test_simulated_traces_are_one_arm_per_drafter():
    sim = simulate_traces(seed=0, n_requests_per_category=4, categories=list(CATEGORIES), tokens_per_request=(30, 40),
                          tree=TreeSpec(depth=4, nodes=8), include_ar=True)
    an = TraceAnalysis(sim, **FAST)
    assert an.arms == ["sim-block chain", "sim-tree ddtree"] and an.ar_arms == ["AR"]
    assert fit_law(sim, by="drafter_id").laws.keys() == {"sim-block", "sim-tree"}
    assert len(an.measured_speedups()) == 2 * len(CATEGORIES)
