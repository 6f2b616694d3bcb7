"""make_reference_traces on a tiny model: one online decode per prompt, AR timing, offline replay marked as
such, entropies of replayed rows equal the online ones, resumable without duplicates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from entropy_law.jobs.reference import ReferencePlan, make_reference_traces, reference_limits
from entropy_law.prompts.text import load_tasks
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder
from conftest import tiny_llama

VOCAB = 96


def encode(task):
    return [b % VOCAB for b in task.prompt.encode()[:20]]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    model = tiny_llama(seed=4, vocab=VOCAB)
    tasks = load_tasks("spec_bench", categories=["qa", "rag"], limit=2)
    out = tmp_path_factory.mktemp("ref")
    plan = ReferencePlan(tasks, model, out, reference_limits(20), replay_arms=("ngram-ddtree16",), ar_limit=1,
                         encode=encode)
    runs = make_reference_traces(plan, progress=False, log=lambda m: None)
    return model, tasks, out, runs


def test_runs_and_metadata(ref):
    _, tasks, out, runs = ref
    assert sorted(runs) == ["ar", "ngram", "ngram-ddtree16"]
    traces = load_traces(out)
    meta = {m["arm"]: m for m in traces.metadata.values()}
    assert meta["ngram"]["replayed"] is False and meta["ar"]["replayed"] is False
    assert meta["ngram-ddtree16"]["replayed"] is True
    assert meta["ngram-ddtree16"]["replayed_from"] == meta["ngram"]["run_id"]
    assert meta["ngram-ddtree16"]["tree_policy"] == "ddtree" and meta["ngram-ddtree16"]["tree_budget"] == 16
    counts = traces.requests.groupby(traces.requests["run_id"].astype(str)).size()
    assert counts[meta["ngram"]["run_id"]] == len(tasks)
    assert counts[meta["ar"]["run_id"]] == 2  # ar_limit=1 per category, 2 categories
    assert counts[meta["ngram-ddtree16"]["run_id"]] == len(tasks)
    rounds = traces.rounds.astype({"run_id": str})
    replayed = rounds.loc[rounds["run_id"] == meta["ngram-ddtree16"]["run_id"]]
    assert (replayed[["draft_ms", "verify_ms", "overhead_ms"]].to_numpy() == 0).all()


def test_replayed_tokens_and_entropies_equal_the_online_decode(ref):
    _, _, out, _ = ref
    traces = load_traces(out)
    tok = traces.tokens.astype({"run_id": str, "request_id": str})
    arm_of = {rid: m["arm"] for rid, m in traces.metadata.items()}
    tok["arm"] = tok["run_id"].map(arm_of)
    online = tok.loc[tok["arm"] == "ngram"].set_index(["request_id", "position"]).sort_index()
    replay = tok.loc[tok["arm"] == "ngram-ddtree16"].set_index(["request_id", "position"]).sort_index()
    assert online.index.equals(replay.index)
    assert (online["token_id"] == replay["token_id"]).all()
    # online: logits from incremental cached forwards; replay: one teacher-forced pass (fp32)
    np.testing.assert_allclose(online["target_entropy_nats"], replay["target_entropy_nats"], atol=1e-4)
    ar = tok.loc[tok["arm"] == "ar"].set_index(["request_id", "position"]).sort_index()
    assert (ar["token_id"] == online.loc[ar.index, "token_id"]).all()


def test_rerun_resumes_without_duplicates(ref):
    model, tasks, out, _ = ref
    before = load_traces(out).requests.groupby("run_id", observed=True).size().to_dict()
    more = load_tasks("spec_bench", categories=["qa", "rag"], limit=3)
    plan = ReferencePlan(more, model, out, reference_limits(20), replay_arms=("ngram-ddtree16",), ar_limit=1,
                         encode=encode)
    make_reference_traces(plan, progress=False, log=lambda m: None)
    after = load_traces(out)
    counts = after.requests.groupby("run_id", observed=True).size().to_dict()
    assert all(after.runs["status"] == "complete")
    for run_id, n in before.items():
        expected = n if n == 2 else n + 2  # AR keeps its 1 per category; the others grow by one per category
        assert counts[run_id] == expected
    assert len(after.runs) == 3  # continued, not new runs


def test_an_existing_online_run_is_adopted_instead_of_decoding_again(ref, tmp_path):
    model, tasks, out, _ = ref
    source = out / "ngram"
    plan = ReferencePlan(tasks, model, tmp_path / "adopted", reference_limits(20), replay_arms=("ngram-ddtree16",),
                         ar_limit=0, encode=encode, from_run=source)
    runs = make_reference_traces(plan, progress=False, log=lambda m: None)
    assert sorted(runs) == ["ngram", "ngram-ddtree16"]
    original = load_traces(source)
    adopted = load_traces(tmp_path / "adopted")
    meta = {m["arm"]: m for m in adopted.metadata.values()}
    (source_id,) = original.metadata
    assert meta["ngram"]["run_id"] == source_id  # copied, not decoded again
    assert meta["ngram-ddtree16"]["replayed_from"] == source_id
    # the replay from the adopted run equals the replay in the first reference set
    again = load_traces(tmp_path / "adopted" / "ngram-ddtree16").rounds.astype({"request_id": str})
    first = load_traces(out / "ngram-ddtree16").rounds.astype({"request_id": str})
    first = first[first["request_id"].isin(set(again["request_id"]))]  # the fixture's set may have grown
    assert set(again["request_id"]) == {t.request_id for t in tasks}
    key = ["request_id", "round_index"]
    assert (first.sort_values(key)["accepted"].tolist() == again.sort_values(key)["accepted"].tolist())


def test_runs_with_the_metadata_of_earlier_versions_are_continued(tmp_path):
    """Online and AR runs opened by earlier versions of the job (the keys and values of data/traces/ar and
    its online n-gram run, with this model's values) are continued: same runs, metadata unchanged."""
    model = tiny_llama(seed=4, vocab=VOCAB)
    tasks = load_tasks("spec_bench", categories=["qa"], limit=2)
    common = {"model_id": "LlamaForCausalLM", "dtype": "float32", "device": "cpu", "max_new_tokens": 20, "seed": 0,
              "verify_cost_ratio": 2.0}
    ngram_config = {"max_ngram": 4, "min_ngram": 1, "block_size": 11, "max_matches": 4, "min_path_prob": 0.05,
                    "prior_hit_rate": 0.25, "prior_miss_decay": 0.6, "prior_weight": 2.0, "pool_weight": 2.0,
                    "keep_calibration": False}
    old = {
        "ngram": {"drafter_id": "ngram", "drafter_config": ngram_config, "tree_policy": "chain", "tree_budget": None,
                  "replayed": False, "arm": "ngram", **common},
        "ar": {"drafter_id": "none", "drafter_config": {}, "tree_policy": "none", "tree_budget": None,
               "replayed": False, "arm": "ar", **common},
    }
    for arm, metadata in old.items():
        TraceRecorder(tmp_path / arm, **metadata)  # opened, nothing recorded yet: a run that was stopped
    before = {arm: json.loads((tmp_path / arm / "run.json").read_text()) for arm in old}

    plan = ReferencePlan(tasks, model, tmp_path, reference_limits(20), replay_arms=(), ar_limit=1, encode=encode)
    runs = make_reference_traces(plan, progress=False, log=lambda m: None)
    assert sorted(runs) == ["ar", "ngram"]
    traces = load_traces(tmp_path)
    for arm, metadata in old.items():
        after = json.loads((tmp_path / arm / "run.json").read_text())
        assert after["status"] == "complete" and after["run_id"] == before[arm]["run_id"]
        assert set(after) == set(before[arm]) | {"resumed_at"}  # no key added ...
        changed = {key for key in before[arm] if after[key] != before[arm][key]}
        assert changed <= {"status", "end_time"}  # ... and none changed
        assert {key: after[key] for key in metadata} == metadata
    counts = traces.requests.groupby(traces.requests["run_id"].astype(str)).size()
    assert counts[before["ngram"]["run_id"]] == 2 and counts[before["ar"]["run_id"]] == 1


def test_from_run_refuses_a_replayed_run(ref, tmp_path):
    model, tasks, out, _ = ref
    with pytest.raises(ValueError, match="decoded online with the n-gram drafter"):
        plan = ReferencePlan(tasks, model, tmp_path / "bad", reference_limits(20), replay_arms=(), ar_limit=0,
                             encode=encode, from_run=out / "ngram-ddtree16")
        make_reference_traces(plan, progress=False, log=lambda m: None)
