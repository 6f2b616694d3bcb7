"""The top-k entropy estimator against exact entropies (scipy.stats.entropy) of random distributions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy as exact_entropy

from entropy_law.traces.topk import TopkInputError, pad_topk, topk_entropy, topk_problems

TOL = 1e-9


def distribution(seed: int, vocab: int, concentration: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, concentration))
    p = np.maximum(p, 1e-300)
    return p / p.sum()


def top(p: np.ndarray, k: int) -> np.ndarray:
    return np.log(np.sort(p)[::-1][:k])


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(1, 60), concentration=st.floats(0.01, 5.0),
       k_share=st.floats(0.0, 1.0))
def test_the_exact_entropy_lies_within_the_bounds_and_they_tighten_with_k(seed, vocab, concentration, k_share):
    p = distribution(seed, vocab, concentration)
    h = exact_entropy(p)
    previous_lower, previous_upper = -np.inf, np.inf
    for k in range(1, vocab + 1):
        est = topk_entropy(top(p, k), vocab)
        lower, upper, point = est.lower_nats[0], est.upper_nats[0], est.estimate_nats[0]
        assert lower - TOL <= h <= upper + TOL, (k, lower, h, upper)
        assert lower <= point <= upper
        assert lower >= previous_lower - TOL and upper <= previous_upper + TOL  # a longer list never loosens
        previous_lower, previous_upper = lower, upper
    assert previous_lower == pytest.approx(h, abs=1e-9) and previous_upper == pytest.approx(h, abs=1e-9)  # k = V
    k = max(1, round(k_share * vocab))
    midpoint = topk_entropy(top(p, k), vocab, point="midpoint")
    assert midpoint.estimate_nats[0] == pytest.approx((midpoint.lower_nats[0] + midpoint.upper_nats[0]) / 2)


@settings(max_examples=100, deadline=None)
@given(pk=st.floats(0.01, 0.3), n_top=st.integers(1, 5), tail_tokens=st.integers(2, 40), fill=st.floats(0.05, 1.0))
def test_both_bounds_are_attained(pk, n_top, tail_tokens, fill):
    """The packed tail (as many tokens at p_k as fit, one remainder) and the uniform tail are distributions with
    the given top k: the bounds are their entropies, so no bound from the top k alone is tighter."""
    head = np.linspace(min(1.0, pk * 2), pk, n_top)
    head = head / head.sum() * min(head.sum(), 0.6)
    pk = head[-1]
    tail = min(1.0 - head.sum(), tail_tokens * pk * fill)
    head_and_rest = 1.0 - tail
    head = head / head.sum() * head_and_rest  # top k scaled so the tail is exactly `tail`
    pk = head[-1]
    if tail > tail_tokens * pk:
        return
    vocab = n_top + tail_tokens
    n, r = int(np.floor(tail / pk)), tail - np.floor(tail / pk) * pk
    tail_part = np.zeros(tail_tokens)  # as many tokens at p_k as fit, then the remainder (none when n fills it)
    tail_part[:min(n, tail_tokens)] = pk
    if n < tail_tokens:
        tail_part[n] = r
    packed = np.concatenate([head, tail_part])
    uniform = np.concatenate([head, np.full(tail_tokens, tail / tail_tokens)])
    est = topk_entropy(np.log(head), vocab)
    assert est.lower_nats[0] == pytest.approx(exact_entropy(packed), abs=1e-9)
    assert est.upper_nats[0] == pytest.approx(exact_entropy(uniform), abs=1e-9)


def test_vectorised_over_positions_with_fewer_entries_padded():
    rng = np.random.default_rng(0)
    ps = [distribution(int(s), 30, 0.3) for s in rng.integers(0, 1000, size=8)]
    ks = [1, 3, 5, 5, 2, 30, 7, 4]
    rows = [top(p, k) for p, k in zip(ps, ks)]
    together = topk_entropy(pad_topk(rows), 30)
    for i, (row, k) in enumerate(zip(rows, ks)):
        alone = topk_entropy(row[::-1], 30)  # any order
        assert together.k[i] == k
        for name in ("lower_nats", "upper_nats", "estimate_nats", "tail_mass", "top1_prob"):
            assert getattr(together, name)[i] == pytest.approx(getattr(alone, name)[0])
        assert together.lower_nats[i] - TOL <= exact_entropy(ps[i]) <= together.upper_nats[i] + TOL
    assert np.isnan(together.top2_prob[0]) and together.top2_prob[1] == pytest.approx(np.sort(ps[1])[-2])


def test_large_vocabulary_and_a_point_mass():
    est = topk_entropy([[0.0, -np.inf]], 151_936)
    assert est.lower_nats[0] == est.upper_nats[0] == est.estimate_nats[0] == 0.0
    lp = np.log([0.5, 0.2, 0.1])
    est = topk_entropy(lp, 151_936)
    t = 0.2
    assert est.upper_nats[0] == pytest.approx(exact_entropy([0.5, 0.2, 0.1]) * 0.8 + 0.8 * np.log(1 / 0.8)
                                              + t * np.log((151_936 - 3) / t))
    assert est.lower_nats[0] < est.estimate_nats[0] < est.upper_nats[0]


@pytest.mark.parametrize("row, match", [
    ([np.nan, -1.0], "NaN"), ([0.5, -1.0], "above 0"), ([np.log(0.7), np.log(0.6)], "sum to"),
    ([-np.inf, -np.inf], "no log-probability"), ([np.log(0.1), np.log(0.05)], "cannot lie on the other"),
])
def test_bad_input_names_the_position_and_the_problem(row, match):
    good = [np.log(0.5), np.log(0.25)]
    with pytest.raises(TopkInputError, match=match) as err:
        topk_entropy([good, row], 10)
    assert err.value.row == 1
    assert [r for r, _ in topk_problems([good, row, good], 10)] == [1]


def test_rounding_above_one_within_the_tolerance_is_accepted():
    est = topk_entropy(np.log([0.6, 0.4004]), 2)
    assert est.tail_mass[0] == 0 and est.lower_nats[0] == est.upper_nats[0]


# -- imported engine responses with top-k log-probabilities ----------------------------------------------------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from entropy_law import load_traces  # noqa: E402
from entropy_law.importers import import_jsonl, read_import  # noqa: E402
from entropy_law.importers.records import MalformedResponseError  # noqa: E402

DATA = Path(__file__).parent / "data" / "engines"
EXACT = json.loads((DATA / "topk_exact_entropy.json").read_text())


@pytest.mark.parametrize("name, engine", [("vllm_topk_logprobs", "vllm"), ("sglang_topk_logprobs", "sglang")])
def test_engine_top_k_becomes_bounds_around_the_exact_entropy(tmp_path, name, engine):
    summary = import_jsonl(DATA / f"{name}.jsonl", engine, tmp_path / "run", vocab_size=1000)
    assert summary.rounds_in_tables >= 1 and summary.target_stats.startswith("top-k log-probabilities")
    traces = load_traces(tmp_path / "run")
    tokens = traces.tokens
    assert len(tokens) and tokens["target_entropy_nats"].isna().all() and tokens["target_renyi2_nats"].isna().all()
    for request_id, group in tokens.groupby("request_id", observed=True):
        exact = np.asarray(EXACT[str(request_id)])[group["position"].to_numpy()]
        lower = group["target_entropy_lower_nats"].to_numpy(float)
        upper = group["target_entropy_upper_nats"].to_numpy(float)
        point = group["target_entropy_estimate_nats"].to_numpy(float)
        assert (lower <= exact + 1e-4).all() and (exact <= upper + 1e-4).all()  # float32 columns
        assert ((lower <= point) & (point <= upper)).all()
    topk = next(iter(traces.metadata.values()))["engine_import"]["topk"]
    assert topk["vocab_size"] == 1000 and topk["estimator"] == "geometric" and topk["renormalised"] == []
    if engine == "vllm":  # position 3 of the first request holds 4 entries (a merged duplicate): read, not refused
        assert topk["positions_fewer_entries"] == 1
        assert tokens.loc[tokens["position"] == 3, "target_topk"].min() == 4


def test_llamacpp_top_k_is_kept_in_the_record_without_per_step_data(tmp_path):
    summary = import_jsonl(DATA / "llamacpp_topk_logprobs.jsonl", "llamacpp", tmp_path / "run", vocab_size=1000)
    assert summary.rounds_in_tables == 0
    run = read_import(tmp_path / "run")
    for i, record in enumerate(run.requests):
        est = topk_entropy(pad_topk(record.topk_logprobs), 1000)
        exact = np.asarray(EXACT[f"llamacpp-{i}"])
        assert (est.lower_nats <= exact + 1e-9).all() and (exact <= est.upper_nats + 1e-9).all()


def test_top_k_without_a_vocabulary_size_is_refused_with_what_to_add(tmp_path):
    with pytest.raises(ValueError, match="--vocab-size"):
        import_jsonl(DATA / "vllm_topk_logprobs.jsonl", "vllm", tmp_path / "run")
    with pytest.raises(ValueError, match=r"vllm_topk_logprobs.jsonl:1: .*too small"):
        import_jsonl(DATA / "vllm_topk_logprobs.jsonl", "vllm", tmp_path / "run2", vocab_size=6)


def _edit_first(tmp_path, edit):
    lines = (DATA / "vllm_topk_logprobs.jsonl").read_text().splitlines()
    obj = json.loads(lines[1])
    edit(obj["choices"][0]["logprobs"]["content"])
    lines[1] = json.dumps(obj)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("edit, problem", [
    (lambda c: c[2]["top_logprobs"][1].update(logprob=0.25), "above 0"),
    (lambda c: c[2]["top_logprobs"][1].update(logprob=float("nan")), "NaN"),
    (lambda c: [e.update(logprob=-0.1) for e in c[2]["top_logprobs"]], "sum to"),
    (lambda c: c[2].update(top_logprobs=[]), "request top_logprobs"),
])
def test_bad_log_probabilities_name_file_line_and_position_or_are_skipped(tmp_path, edit, problem):
    path = _edit_first(tmp_path, edit)
    with pytest.raises(MalformedResponseError, match=rf"bad.jsonl:2: choices\[0\]\.logprobs\.content.*2.*{problem}"):
        import_jsonl(path, "vllm", tmp_path / "run", vocab_size=1000)
    summary = import_jsonl(path, "vllm", tmp_path / "skipped", vocab_size=1000, skip_bad=True)
    meta = next(iter(load_traces(tmp_path / "skipped").metadata.values()))["engine_import"]
    assert summary.imported == 2 and meta["skipped_bad"] == 1 and meta["skipped_lines"][0]["line"] == 2


def test_a_renormalised_top_k_is_flagged_and_its_bounds_not_given(tmp_path):
    lines = (DATA / "vllm_topk_logprobs.jsonl").read_text().splitlines()
    obj = json.loads(lines[0])
    for item in obj["choices"][0]["logprobs"]["content"]:  # what an engine that renormalises the list returns
        lp = np.array([e["logprob"] for e in item["top_logprobs"]])
        lp -= np.log(np.exp(lp).sum())
        for e, v in zip(item["top_logprobs"], lp):
            e["logprob"] = float(v)
    path = tmp_path / "renormalised.jsonl"
    path.write_text(json.dumps(obj) + "\n" + lines[1] + "\n")
    import_jsonl(path, "vllm", tmp_path / "run", vocab_size=1000)
    traces = load_traces(tmp_path / "run")
    flagged = next(iter(traces.metadata.values()))["engine_import"]["topk"]["renormalised"]
    assert [f["request_id"] for f in flagged] == [obj["id"]]
    tokens = traces.tokens
    mine = tokens["request_id"] == obj["id"]
    assert tokens.loc[mine, "target_entropy_lower_nats"].isna().all()
    assert tokens.loc[mine, "target_entropy_estimate_nats"].notna().all()
    assert tokens.loc[~mine, "target_entropy_lower_nats"].notna().all()


def test_the_fast_chat_reader_and_the_generic_one_write_identical_runs(tmp_path, monkeypatch):
    import pandas as pd

    from entropy_law.importers import vllm, writer

    law_file(tmp_path / "log.jsonl", vocab=400, k=5, n_requests=6)
    fixture = DATA / "vllm_topk_logprobs.jsonl"  # its first line holds fewer entries at one position: read whole
    decoded = [vllm.fast_decode(line) for line in fixture.read_bytes().splitlines()]
    assert decoded[0] is None and isinstance(decoded[1]["choices"][0]["logprobs"], np.ndarray)
    assert all(vllm.fast_decode(line) for line in (tmp_path / "log.jsonl").read_bytes().splitlines())
    for name, fast in (("fast", vllm.fast_decode), ("generic", lambda raw: None)):
        monkeypatch.setitem(writer.FAST_DECODERS, "vllm", fast)
        for log, vocab in ((tmp_path / "log.jsonl", 400), (fixture, 1000)):
            import_jsonl(log, "vllm", tmp_path / name / log.stem, vocab_size=vocab)
    for log in ("log", fixture.stem):
        fast, generic = (load_traces(tmp_path / name / log) for name in ("fast", "generic"))
        for table in ("tokens", "rounds", "requests"):
            pd.testing.assert_frame_equal(getattr(fast, table).drop(columns="run_id"),
                                          getattr(generic, table).drop(columns="run_id"))
        fast, generic = ([vars(r) for r in read_import(tmp_path / name / log).requests] for name in ("fast", "generic"))
        assert fast == generic and any(r["topk_logprobs"] for r in fast)


def law_file(path: Path, *, vocab: int, k: int, seed: int = 0, n_requests: int = 30, slope: float = 1.2) -> dict:
    """A vLLM chat JSONL (detailed per-step metrics, top-k log-probabilities) drawn from a known law: a draft at
    a position whose target entropy is H is accepted with probability exp(-slope H). Returns the exact entropies."""
    rng = np.random.default_rng(seed)
    exact, lines = {}, []
    for r in range(n_requests):
        dists = []

        def entropy_at(p):
            while len(dists) <= p:
                dists.append(np.sort(rng.dirichlet(np.full(vocab, rng.choice([0.002, 0.02, 0.3]))))[::-1])
            return exact_entropy(dists[p])

        position, accepted, drafted = 1, [], []
        while position < 24:
            a = 0
            while a < 4 and rng.random() < np.exp(-slope * entropy_at(position + a)):
                a += 1
            entropy_at(position + a)
            accepted.append(a)
            drafted.append(4)
            position += a + 1
        dists = dists[:position]
        content = [{"token": "x", "logprob": float(np.log(p[0])),
                    "top_logprobs": [{"token": f"t{i}", "logprob": float(np.log(max(p[i], 1e-300)))} for i in range(k)]}
                   for p in dists]
        hist = np.bincount(accepted, minlength=5).tolist()
        lines.append({"id": f"req-{r}", "model": "m", "category": ["math", "code"][r % 2], "prompt": "p",
                      "prompt_token_ids": [1, 2, 3],
                      "choices": [{"index": 0, "finish_reason": "length", "token_ids": list(range(10, 10 + position)),
                                   "logprobs": {"content": content}}],
                      "metrics": {"speculative_decoding": {
                          "num_spec_steps": len(accepted), "num_accepted_draft_tokens": int(sum(accepted)),
                          "num_draft_tokens": int(sum(drafted)), "num_spec_tokens": 4, "acceptance_histogram": hist,
                          "per_step_accepted": accepted, "per_step_drafted": drafted}}})
        exact[f"req-{r}"] = [exact_entropy(p) for p in dists]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return exact


def test_an_imported_top_k_run_fits_the_law_and_its_sensitivity_spans_the_bounds(tmp_path):
    from entropy_law.law.fit import fit_law
    from entropy_law.law.topk import entropy_sensitivity

    law_file(tmp_path / "log.jsonl", vocab=400, k=5)
    import_jsonl(tmp_path / "log.jsonl", "vllm", tmp_path / "run", vocab_size=400)
    traces = load_traces(tmp_path / "run")
    law = fit_law(traces, "law_logit", depth="none", cov_type="nonrobust")
    assert law.coefficients.loc["target_entropy_nats", "estimate"] < 0  # acceptance falls with the entropy
    table = entropy_sensitivity(traces, "law_logit", depth="none", cov_type="nonrobust")
    assert set(table.index) == set(law.coefficients.index)
    assert np.allclose(table["estimate"], law.coefficients["estimate"])  # the default fit is the estimate's
    assert (table["max_shift"] > 0).all() and np.isfinite(table[["lower", "upper"]].to_numpy()).all()


def test_with_the_whole_vocabulary_the_bounds_meet_and_the_coefficients_do_not_move(tmp_path):
    from entropy_law.law.topk import entropy_sensitivity

    law_file(tmp_path / "log.jsonl", vocab=5, k=5, slope=0.8)
    import_jsonl(tmp_path / "log.jsonl", "vllm", tmp_path / "run", vocab_size=5)
    table = entropy_sensitivity(load_traces(tmp_path / "run"), "law_logit", depth="none", cov_type="nonrobust")
    assert np.allclose(table["max_shift"], 0, atol=1e-6) and table["within_ci"].all()


def test_cli_imports_top_k_and_a_run_without_it_is_refused_for_a_law_saying_what_to_add(tmp_path, capsys):
    from entropy_law.cli import main
    from entropy_law.law.fit import fit_law

    exact = law_file(tmp_path / "log.jsonl", vocab=300, k=5, n_requests=12)
    assert main(["import", "vllm", str(tmp_path / "log.jsonl"), "--out", str(tmp_path / "run"),
                 "--vocab-size", "300"]) == 0
    assert "top-k log-probabilities" in capsys.readouterr().out
    fit_law(load_traces(tmp_path / "run"), "law_logit", depth="none", cov_type="nonrobust")
    assert len(exact) == 12
    bare = [json.loads(t) for t in (tmp_path / "log.jsonl").read_text().splitlines()]
    for obj in bare:
        obj["choices"][0]["logprobs"] = None
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(o) + "\n" for o in bare))
    assert main(["import", "vllm", str(tmp_path / "bare.jsonl"), "--out", str(tmp_path / "bare")]) == 0
    with pytest.raises(ValueError, match=r"hold no target entropies.*top_logprobs: 20.*--vocab-size"):
        fit_law(load_traces(tmp_path / "bare"), "law_logit")


def test_cli_law_sensitivity_prints_the_coefficients_fitted_on_each_bound(tmp_path, capsys):
    from entropy_law.analysis import make_view
    from entropy_law.cli import main
    from entropy_law.law.topk import entropy_sensitivity

    law_file(tmp_path / "log.jsonl", vocab=400, k=5)
    import_jsonl(tmp_path / "log.jsonl", "vllm", tmp_path / "run", vocab_size=400)
    capsys.readouterr()
    assert main(["law", str(tmp_path / "run"), "--family", "law_logit", "--sensitivity"]) == 0
    printed = capsys.readouterr().out.split("sensitivity: ", 1)[1].splitlines()
    header = printed[1].split()
    assert header[:6] == ["estimate", "std_err", "ci_low", "ci_high", "lower", "upper"]
    table = entropy_sensitivity(make_view(load_traces(tmp_path / "run")), "law_logit")
    assert table["max_shift"].gt(0).all()
    for name, row in table.iterrows():
        values = next(line.split()[1:] for line in printed[2:] if line.split()[:1] == [name])
        for column in ("estimate", "lower", "upper"):
            assert float(values[header.index(column)]) == pytest.approx(row[column], rel=1e-5)


def test_top_k_from_logits_bounds_the_recorded_entropy():
    from entropy_law.traces.stats import target_stats_from_logits
    from entropy_law.traces.topk import topk_logprobs_from_logits

    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((40, 500)) * rng.choice([0.5, 3.0, 8.0], size=(40, 1))).astype(np.float32)
    exact = target_stats_from_logits(logits)["entropy_nats"].astype(np.float64)
    widths = []
    for k in (1, 5, 10, 20, 500):
        est = topk_entropy(topk_logprobs_from_logits(logits, k), 500)
        assert (est.lower_nats <= exact + 1e-4).all() and (exact <= est.upper_nats + 1e-4).all()  # fp32 logits
        widths.append(float(np.mean(est.upper_nats - est.lower_nats)))
    assert widths == sorted(widths, reverse=True) and widths[-1] < 1e-4
