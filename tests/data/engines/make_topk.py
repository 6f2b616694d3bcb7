"""Writes the top-k fixtures: the engine fixtures beside this script with the top-5 log-probabilities of each
output token added in each engine's documented shape. The distributions are seeded Dirichlet draws over
V = 1000 tokens (their exact entropies are kept in ``topk_exact_entropy.json`` for the tests); position 3 of
the first vLLM request holds 4 entries (two tokens with one string, merged), as vLLM's completions endpoint
does. Run: python tests/data/engines/make_topk.py"""

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
VOCAB, K = 1000, 5


def distributions(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.sort(rng.dirichlet(np.full(VOCAB, rng.choice([0.003, 0.02, 0.1]))))[::-1] for _ in range(n)]


def entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def lines(name):
    return [json.loads(t) for t in (HERE / f"{name}.jsonl").read_text().splitlines() if t.strip()]


exact = {}
out = []
for i, obj in enumerate(lines("vllm_metrics_detailed")):
    ids = obj["choices"][0]["token_ids"]
    dists = distributions(100 + i, len(ids))
    content = []
    for j, (token, p) in enumerate(zip(ids, dists)):
        top = [{"token": f"t{t}", "logprob": float(np.log(p[t]))} for t in range(K)]
        if i == 0 and j == 3:
            top = top[:4]  # a merged duplicate: fewer entries than requested
        content.append({"token": f"t{token}", "logprob": top[0]["logprob"], "top_logprobs": top})
    obj["choices"][0]["logprobs"] = {"content": content}
    exact[obj["id"]] = [entropy(p) for p in dists]
    out.append(json.dumps(obj))
(HERE / "vllm_topk_logprobs.jsonl").write_text("\n".join(out) + "\n")

out = []
for i, obj in enumerate(lines("sglang_detailed")):
    ids = obj["output_ids"]
    dists = distributions(200 + i, len(ids))
    obj["meta_info"]["output_top_logprobs"] = [[[float(np.log(p[t])), t, None] for t in range(K)] for p in dists]
    exact[obj["meta_info"]["id"]] = [entropy(p) for p in dists]
    out.append(json.dumps(obj))
(HERE / "sglang_topk_logprobs.jsonl").write_text("\n".join(out) + "\n")

out = []
for i, obj in enumerate(lines("llamacpp_completion")):
    dists = distributions(300 + i, len(obj["tokens"]))
    obj["completion_probabilities"] = [
        {"id": tok, "logprob": float(np.log(p[0])),
         "top_logprobs": [{"id": t, "token": f"t{t}", "logprob": float(np.log(p[t]))} for t in range(K)]}
        for tok, p in zip(obj["tokens"], dists)]
    exact[f"llamacpp-{i}"] = [entropy(p) for p in dists]
    out.append(json.dumps(obj))
(HERE / "llamacpp_topk_logprobs.jsonl").write_text("\n".join(out) + "\n")
(HERE / "topk_exact_entropy.json").write_text(json.dumps(exact) + "\n")
