"""``entropy-law record`` end to end on a tiny random model saved as a local Hugging Face folder.

Needs ``entropy_law.traces.recorder`` (the TraceRecorder) and the decoder; reads the written Parquet
shards with pyarrow directly and checks the recorded tokens against ``model.generate`` greedy output.
"""

import functools
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from entropy_law.cli import main
from entropy_law.decoding.gate import VerifyCost

WORDS = ("the cat dog sat on a mat and ran to red blue green house tree big small one two three "
         "four five is was very happy sad day night sun moon").split()
SPECIALS = ["<pad>", "<unk>", "<eos>", "<user>", "<assistant>"]
CHAT_TEMPLATE = ("{% for m in messages %}<user> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
MAX_POSITIONS = 48


def make_tiny_model_folder(folder: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                         initializer_range=0.05, eos_token_id=2, pad_token_id=0, bos_token_id=None,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def task_file(tmp_path):
    rows = [
        {"question_id": 1, "category": "alpha", "turns": ["the cat sat on the mat"]},
        {"question_id": 2, "category": "alpha", "turns": ["one two three four five one two three"]},
        {"question_id": 3, "category": "beta", "turns": ["red blue green red blue green red"]},
        {"question_id": 4, "category": "beta", "turns": [""]},  # empty: skipped by the task loader
        {"question_id": 5, "category": "beta", "turns": [" ".join(["big"] * 60)]},  # too long for the context
        {"question_id": 6, "category": "gamma", "turns": ["the sun was very happy"]},
        {"question_id": 7, "category": "alpha", "turns": ["the dog ran to the house"]},
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# the tiny model's verify-cost curve as timed on an idle machine (flat: verifying a few more tokens costs nothing);
# tests that need drafting under the cost gate fix it, since a loaded machine's timing can make every draft too dear
FLAT_COST = VerifyCost((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.0, 1.0, 1.04, 1.12))


def read_table(run: Path, name: str):
    shards = sorted(p for p in (run / "shards").iterdir() if p.is_dir() and p.name.isdigit())
    tables = [pq.read_table(s / f"{name}.parquet") for s in shards]
    import pyarrow as pa

    return pa.concat_tables(tables).to_pandas() if tables else None


@functools.lru_cache(maxsize=None)
def greedy_reference(folder: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """``model.generate``'s greedy tokens for ``prompt`` (kept per folder and prompt: the folders are never changed)."""
    tokenizer, model = _reference_model(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@functools.lru_cache(maxsize=None)
def _reference_model(folder: Path):
    """The tokenizer and model saved in ``folder``, loaded by transformers alone (once per folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return tokenizer, model


def record(model_folder, task_file, out, *extra):
    return main(["record", "--model", str(model_folder), "--tasks", str(task_file), "--out", str(out),
                 "--max-new-tokens", "12", "--block-size", "4", "--no-progress", *extra])


def test_record_writes_greedy_traces_and_skips_bad_prompts(model_folder, task_file, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level("WARNING"):
        assert record(model_folder, task_file, out, "--tree", "ddtree", "--budget", "6",
                      "--categories", "alpha,beta") == 0
    assert "tasks:4" in caplog.text and "empty prompt" in caplog.text
    assert "tasks:5" in caplog.text and "context" in caplog.text
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["tree_policy"] == "ddtree" and meta["tree_budget"] == 6
    assert meta["drafter_id"] == "ngram" and meta["drafter_config"]["block_size"] == 4
    requests = read_table(out, "requests")
    assert sorted(requests["request_id"]) == ["tasks:1", "tasks:2", "tasks:3", "tasks:7"]
    tokens = read_table(out, "tokens")
    prompts = {json.loads(line)["question_id"]: json.loads(line)["turns"][0]
               for line in task_file.read_text().splitlines()}
    for request_id, group in tokens.groupby("request_id"):
        group = group.sort_values("position")
        assert group["position"].tolist() == list(range(len(group)))
        expected = greedy_reference(model_folder, prompts[int(request_id.split(":")[1])], 12)
        assert group["token_id"].tolist() == expected
        assert (group["target_entropy_nats"] >= 0).all()
    rounds = read_table(out, "rounds")
    assert (rounds["tree_nodes"] <= 6).all()


def test_resume_after_an_interruption_and_refusals(model_folder, task_file, tmp_path, monkeypatch, capsys):
    from entropy_law.decoding import decoder as decoder_module

    out = tmp_path / "run"
    original = decoder_module.SpeculativeDecoder.generate
    calls = []

    def interrupted(self, prompt, **kwargs):
        calls.append(kwargs["request_id"])
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user stops the run during the third prompt
        return original(self, prompt, **kwargs)

    monkeypatch.setattr(decoder_module.SpeculativeDecoder, "generate", interrupted)
    capsys.readouterr()
    assert record(model_folder, task_file, out, "--drafter", "ar") == 130  # Ctrl-C: one line, no traceback
    err = capsys.readouterr().err
    assert err.endswith(f"entropy-law record: interrupted; {out} keeps 2 finished prompt(s), the prompt being "
                        "decoded was not recorded; to go on, run the same command with --resume (it skips the "
                        "prompts already recorded)\n") and "Traceback" not in err
    monkeypatch.setattr(decoder_module.SpeculativeDecoder, "generate", original)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] != "complete"
    # AR runs keep the trace names the analysis recognises them by
    assert meta["drafter_id"] == "none" and meta["tree_policy"] == "none" and meta["drafter_config"] == {}
    assert sorted(read_table(out, "requests")["request_id"]) == sorted(calls[:2])

    # an existing run is neither appended to nor replaced without being asked
    assert record(model_folder, task_file, out, "--drafter", "ar") == 2
    # resuming with different decoding settings is refused
    assert record(model_folder, task_file, out, "--drafter", "ngram", "--resume") == 2

    # 'none', the old name of the AR arm, is still accepted: it continues the same run
    assert record(model_folder, task_file, out, "--drafter", "none", "--resume") == 0
    requests = read_table(out, "requests")
    assert sorted(requests["request_id"]) == ["tasks:1", "tasks:2", "tasks:3", "tasks:6", "tasks:7"]
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert json.loads((out / "run.json").read_text())["run_id"] == meta["run_id"]

    assert record(model_folder, task_file, out, "--drafter", "ar", "--overwrite", "--limit", "1") == 0
    assert sorted(read_table(out, "requests")["request_id"]) == ["tasks:1", "tasks:3", "tasks:6"]


def test_a_run_with_the_metadata_of_earlier_versions_is_resumed(model_folder, task_file, tmp_path):
    """A run recorded before ``record_arms`` (its run.json has the keys and values of data/traces/ngram, with
    this model's and these options' values) is continued by ``--resume``: same run, metadata unchanged."""
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.loading import load_target
    from entropy_law.decoding.observers import RecorderObserver
    from entropy_law.drafters.ngram import NgramDrafter
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.recorder import TraceRecorder

    old_metadata = {
        "model_id": model_folder.name, "drafter_id": "ngram",
        "drafter_config": {"max_ngram": 4, "min_ngram": 1, "block_size": 4, "max_matches": 4, "min_path_prob": 0.05,
                           "prior_hit_rate": 0.25, "prior_miss_decay": 0.6, "prior_weight": 2.0,
                           "pool_weight": 2.0, "keep_calibration": False},
        "tree_policy": "chain", "tree_budget": None, "dtype": "float32", "device": "cpu", "max_new_tokens": 12,
        "verify_cost_ratio": 2.0, "chat_template": True, "tasks": str(task_file),
    }
    out = tmp_path / "run"
    (first,) = load_tasks(task_file, categories=["alpha"], limit=1)
    target = load_target(str(model_folder))
    with TraceRecorder(out, **old_metadata) as recorder:  # the first prompt, recorded as earlier versions did
        decoder = SpeculativeDecoder(target, NgramDrafter(max_ngram=4, block_size=4, max_matches=4),
                                     observers=[RecorderObserver(recorder)])
        decoder.generate(decoder.encode_prompt(first.messages()), max_new_tokens=12, category=first.category,
                         request_id=first.request_id, dataset=first.dataset, question_id=first.question_id)
    before = json.loads((out / "run.json").read_text())

    assert record(model_folder, task_file, out, "--categories", "alpha", "--resume") == 0
    after = json.loads((out / "run.json").read_text())
    assert after["status"] == "complete" and after["run_id"] == before["run_id"]
    assert set(after) == set(before) | {"resumed_at"}  # no key added ...
    changed = {key for key in before if after[key] != before[key]}
    assert changed <= {"status", "end_time"}  # ... and none changed
    assert {key: after[key] for key in old_metadata} == old_metadata
    requests = read_table(out, "requests")
    assert sorted(requests["request_id"]) == ["tasks:1", "tasks:2", "tasks:7"]  # tasks:1 not decoded again


def test_a_failing_request_does_not_stop_the_run(model_folder, task_file, tmp_path, monkeypatch):
    from entropy_law.decoding.observers import RecorderObserver

    original = RecorderObserver.on_round

    def flaky_round(self, record):  # the request fails in its round 2, after two rounds were recorded
        if record.request_id == "tasks:2" and record.round_index == 2:
            raise RuntimeError("simulated failure in round 2")
        return original(self, record)

    monkeypatch.setattr(RecorderObserver, "on_round", flaky_round)
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--categories", "alpha") == 1  # 1: some request failed
    requests = read_table(out, "requests").set_index("request_id")
    assert requests.loc["tasks:2", "stop_reason"] == "error"
    assert requests.loc["tasks:1", "stop_reason"] in ("eos", "max_new_tokens")
    assert requests.loc["tasks:7", "stop_reason"] in ("eos", "max_new_tokens")
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_bad_options_fail_before_loading_the_model(task_file, tmp_path, capsys):
    assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(task_file),
                 "--categories", "omega", "--out", str(tmp_path / "x")]) == 2
    assert "unknown category omega" in capsys.readouterr().err
    assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(task_file),
                 "--out", str(tmp_path / "x")]) == 2
    assert "target model not found" in capsys.readouterr().err


def random_block_checkpoint(model_folder, path, seed=0):
    """A randomly initialised block drafter for the tiny target, saved at ``path``."""
    from transformers import AutoModelForCausalLM

    from entropy_law.drafters.block import BlockDrafter

    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    return BlockDrafter(model, seed=seed, block_size=4, num_layers=1, feature_layers=(0, 1)).save(path)


def assert_greedy_outputs(run, model_folder, task_file, new_tokens=12):
    """Every request of ``run`` holds the target's greedy continuation of its prompt; returns the tokens table."""
    tokens = read_table(run, "tokens")
    prompts = {json.loads(line)["question_id"]: json.loads(line)["turns"][0]
               for line in task_file.read_text().splitlines()}
    for request_id, group in tokens.groupby("request_id"):
        expected = greedy_reference(model_folder, prompts[int(request_id.split(":")[1])], new_tokens)
        assert group.sort_values("position")["token_id"].tolist() == expected
    return tokens


def test_record_with_a_block_drafter_checkpoint_and_the_cost_gate(model_folder, task_file, tmp_path):
    """`--drafter block --checkpoint` decodes losslessly with a (random) block drafter for this target;
    `--gate cost` stores the measured verify-cost curve in the run metadata."""
    checkpoint = random_block_checkpoint(model_folder, tmp_path / "drafter.safetensors")
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--drafter", "block", "--checkpoint", str(checkpoint),
                  "--tree", "ddtree", "--budget", "5", "--gate", "cost", "--categories", "alpha") == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["drafter_id"].startswith("block") and meta["tree_budget"] == 5
    assert meta["verify_cost"]["sizes"][0] == 1 and meta["verify_cost"]["costs"][0] == 1.0
    tokens = assert_greedy_outputs(out, model_folder, task_file)
    assert set(tokens["request_id"]) == {"tasks:1", "tasks:2", "tasks:7"}
    rounds = read_table(out, "rounds")
    assert (rounds["block_size"] == 4).all() and (rounds["tree_nodes"] <= 5).all()


def test_record_with_a_bfloat16_block_drafter_stays_greedy_and_says_so(model_folder, task_file, tmp_path):
    """`--drafter-dtype bfloat16`: the drafter's layers in bf16, the output still the target's greedy output,
    the dtype in the run's drafter config; a run in the other dtype is not resumed into it."""
    checkpoint = random_block_checkpoint(model_folder, tmp_path / "drafter.safetensors")
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--drafter", "block", "--checkpoint", str(checkpoint),
                  "--drafter-dtype", "bfloat16", "--tree", "ddtree", "--budget", "5", "--categories", "alpha") == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["drafter_config"]["compute_dtype"] == "bfloat16"
    assert set(assert_greedy_outputs(out, model_folder, task_file)["request_id"]) == {"tasks:1", "tasks:2", "tasks:7"}
    assert record(model_folder, task_file, out, "--drafter", "block", "--checkpoint", str(checkpoint),
                  "--tree", "ddtree", "--budget", "5", "--categories", "alpha", "--resume") == 2
    # a replay of the arm (entropy-law predict --replay) loads its drafter in the dtype it ran in
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_inputs

    drafter = workload_inputs(out, meta, load_target(str(model_folder)), None, checkpoint)[1]
    assert drafter.compute_dtype == torch.bfloat16


def test_a_replayed_block_arm_loads_the_checkpoint_it_ran_with(model_folder, task_file, tmp_path, monkeypatch):
    """A replay (entropy-law predict --replay) takes the checkpoint whose SHA-256 the arm recorded: found under
    $ENTROPY_LAW_BLOCK_DRAFTER (or data/drafters/) when none is given, refused when another file is given, and
    an error that says what to pass when it is nowhere; never silently another drafter of the same shape."""
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.arms import BLOCK_DRAFTER_ENV
    from entropy_law.jobs.reference import workload_inputs
    from entropy_law.traces.layout import file_sha256

    checkpoint = random_block_checkpoint(model_folder, tmp_path / "drafter.safetensors")
    other = random_block_checkpoint(model_folder, tmp_path / "other.safetensors", seed=1)
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--drafter", "block", "--checkpoint", str(checkpoint),
                  "--tree", "ddtree", "--budget", "5", "--categories", "alpha", "--limit", "1") == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["drafter_config"]["checkpoint_sha256"] == file_sha256(checkpoint) != file_sha256(other)
    target = load_target(str(model_folder))
    with pytest.raises(ValueError, match=r"recorded with the block drafter checkpoint sha256:\w{12}, .*other"):
        workload_inputs(out, meta, target, None, other)
    monkeypatch.setenv(BLOCK_DRAFTER_ENV, str(other))
    with pytest.raises(ValueError, match="is not under data/drafters/: pass it"):
        workload_inputs(out, meta, target, None, None)
    monkeypatch.setenv(BLOCK_DRAFTER_ENV, str(checkpoint))
    drafter = workload_inputs(out, meta, target, None, None)[1]
    assert drafter.provenance["checkpoint_sha256"] == file_sha256(checkpoint)


def test_the_default_block_checkpoint_is_chosen_by_name_not_by_sort_order(monkeypatch, tmp_path):
    """data/drafters/ holds more than one checkpoint: a run that names none gets the default by its name, never the
    first file in sort order (on 2026-12-05 09:24-13:45Z that rule gave the broad checkpoint while the docs and the
    reference traces described the sixth)."""
    from entropy_law.drafters.block import DEFAULT_CHECKPOINT, REFERENCE_CHECKPOINT, default_drafter_path
    from entropy_law.jobs.arms import BLOCK_DRAFTER_ENV, block_drafter_checkpoint

    monkeypatch.delenv(BLOCK_DRAFTER_ENV, raising=False)
    assert DEFAULT_CHECKPOINT != REFERENCE_CHECKPOINT
    drafters = tmp_path / "data" / "drafters"
    drafters.mkdir(parents=True)
    monkeypatch.setenv("ENTROPY_LAW_DATA", str(tmp_path / "data"))
    assert block_drafter_checkpoint() is None  # no default here: none, not some other file
    (drafters / "aaa-sorts-first.safetensors").write_bytes(b"x")
    (drafters / REFERENCE_CHECKPOINT).write_bytes(b"y")
    assert block_drafter_checkpoint() is None
    (drafters / DEFAULT_CHECKPOINT).write_bytes(b"z")
    assert block_drafter_checkpoint() == default_drafter_path() == drafters / DEFAULT_CHECKPOINT
    monkeypatch.setenv(BLOCK_DRAFTER_ENV, "/elsewhere/mine.safetensors")
    assert str(block_drafter_checkpoint()) == "/elsewhere/mine.safetensors"


def test_block_drafter_options_are_checked_before_loading(task_file, tmp_path, capsys):
    assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(task_file), "--drafter", "ngram",
                 "--checkpoint", "x.safetensors", "--out", str(tmp_path / "x")]) == 2
    assert "use it with --drafter block" in capsys.readouterr().err
    assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(task_file), "--drafter", "ngram",
                 "--drafter-dtype", "bfloat16", "--out", str(tmp_path / "x")]) == 2
    assert "use it with --drafter block" in capsys.readouterr().err
    assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", "vlm_tasks", "--drafter", "block",
                 "--out", str(tmp_path / "x")]) == 2
    assert "image tasks need a drafter" in capsys.readouterr().err


def _forbid_measuring(monkeypatch):
    """A resumed cost-gate run takes the curve it stored; measuring again would give another curve."""
    from entropy_law.jobs import record as record_job

    def measure(*args, **kwargs):
        raise AssertionError("the verify cost was measured again")

    monkeypatch.setattr(record_job, "measure_verify_cost", measure)


def test_resume_refuses_another_gate_and_names_it(model_folder, task_file, tmp_path, capsys):
    """A ratio-gate run resumed with --gate cost is refused (and the reverse): key, both values, what to do."""
    ratio_run = tmp_path / "ratio"
    assert record(model_folder, task_file, ratio_run, "--categories", "alpha", "--limit", "1") == 0
    meta = json.loads((ratio_run / "run.json").read_text())
    assert "gate" not in meta and "verify_cost" not in meta  # the keys runs have always had: the ratio gate
    before = (ratio_run / "run.json").read_text()
    capsys.readouterr()
    assert record(model_folder, task_file, ratio_run, "--categories", "alpha", "--resume", "--gate", "cost") == 2
    err = capsys.readouterr().err
    assert "gate: run has 'ratio' (not in its run.json, which means 'ratio'), given 'cost'" in err
    assert "a new --out" in err and "--overwrite" in err
    assert (ratio_run / "run.json").read_text() == before  # untouched
    assert sorted(read_table(ratio_run, "requests")["request_id"]) == ["tasks:1"]

    cost_run = tmp_path / "cost"
    assert record(model_folder, task_file, cost_run, "--categories", "alpha", "--limit", "1", "--gate", "cost") == 0
    curve = json.loads((cost_run / "run.json").read_text())["verify_cost"]
    capsys.readouterr()
    assert record(model_folder, task_file, cost_run, "--categories", "alpha", "--resume") == 2
    err = capsys.readouterr().err
    assert "gate: run has 'cost', given 'ratio'" in err and "verify_cost: run has" in err
    assert sorted(read_table(cost_run, "requests")["request_id"]) == ["tasks:1"]


def test_a_resumed_cost_gate_run_keeps_its_stored_curve(model_folder, task_file, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--categories", "alpha", "--limit", "1", "--gate", "cost") == 0
    before = json.loads((out / "run.json").read_text())
    assert before["verify_cost"]["sizes"][0] == 1
    _forbid_measuring(monkeypatch)
    assert record(model_folder, task_file, out, "--categories", "alpha", "--resume", "--gate", "cost") == 0
    after = json.loads((out / "run.json").read_text())
    assert after["verify_cost"] == before["verify_cost"]
    assert before["gate"] == after["gate"] == "cost"  # cost-gate runs name their gate
    assert sorted(read_table(out, "requests")["request_id"]) == ["tasks:1", "tasks:2", "tasks:7"]


def test_a_run_recorded_before_the_gate_was_named_resumes_only_with_its_gate(model_folder, task_file, tmp_path,
                                                                             capsys):
    """No ``gate`` and no ``verify_cost`` in run.json (as in every ratio-gate run): a ratio-gate run
    (resumable with the ratio gate, as ``test_a_run_with_the_metadata_of_earlier_versions_is_resumed``
    shows); with --gate cost it is refused. ``verify_cost`` without ``gate``: a cost-gate run, refused with
    the ratio gate."""
    out = tmp_path / "run"
    assert record(model_folder, task_file, out, "--categories", "alpha", "--limit", "1") == 0
    capsys.readouterr()
    assert record(model_folder, task_file, out, "--categories", "alpha", "--resume", "--gate", "cost") == 2
    assert "gate: run has 'ratio' (not in its run.json" in capsys.readouterr().err
    assert sorted(read_table(out, "requests")["request_id"]) == ["tasks:1"]

    cost = tmp_path / "cost"
    assert record(model_folder, task_file, cost, "--categories", "alpha", "--limit", "1", "--gate", "cost") == 0
    meta = json.loads((cost / "run.json").read_text())
    del meta["gate"]
    (cost / "run.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert record(model_folder, task_file, cost, "--categories", "alpha", "--resume") == 2
    assert "gate: run has 'cost' (not in its run.json" in capsys.readouterr().err


def test_the_output_folder_is_checked_before_the_model_loads(task_file, tmp_path, capsys):
    """--model names no model here: an --out that cannot be written must be refused first (loading a real
    model takes about 40 s)."""
    from entropy_law.traces.recorder import TraceRecorder

    def refused(out, *extra) -> str:
        assert main(["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(task_file), "--out", str(out),
                     *extra]) == 2
        err = capsys.readouterr().err
        assert "target model not found" not in err
        return err

    (tmp_path / "a-file").write_text("x")
    assert "is not a directory" in refused(tmp_path / "a-file")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    assert "not empty and holds no trace run" in refused(tmp_path / "notes", "--resume")
    TraceRecorder(tmp_path / "done", model_id="m").finish()
    assert "--resume to continue it" in refused(tmp_path / "done")
    holder = TraceRecorder(tmp_path / "held", model_id="m")  # another writer, alive (this process)
    err = refused(tmp_path / "held", "--resume")
    assert f"being written by another writer, pid {os.getpid()}" in err
    holder.finish()


def test_a_base_model_without_chat_template_records_with_no_chat_template_then_law_and_report(task_file, tmp_path,
                                                                                               capsys):
    """A base model (no chat template): ``record`` refuses it and names ``--no-chat-template``; with it the
    prompt text is tokenized as is, the traces hold the greedy tokens of that prompt, and ``law`` and
    ``report`` read the run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_tiny_model_folder(tmp_path / "base-model")
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not getattr(tokenizer, "chat_template", None)

    assert record(folder, task_file, tmp_path / "refused") == 2
    assert "has no chat template (a base model); pass --no-chat-template" in capsys.readouterr().err

    out = tmp_path / "run"
    assert record(folder, task_file, out, "--no-chat-template", "--tree", "ddtree", "--budget", "6") == 0
    assert json.loads((out / "run.json").read_text())["chat_template"] is False
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    prompts = {json.loads(line)["question_id"]: json.loads(line)["turns"][0]
               for line in task_file.read_text().splitlines()}
    tokens = read_table(out, "tokens")
    assert tokens["request_id"].nunique() == 5
    for request_id, group in tokens.groupby("request_id"):
        ids = tokenizer(prompts[int(request_id.split(":")[1])], return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
        assert group.sort_values("position")["token_id"].tolist() == expected

    assert main(["law", str(out)]) == 0
    assert "ngram" in capsys.readouterr().out
    report = tmp_path / "report"
    # two families in the CV comparison (not the default eight): what is checked is that the report reads the run
    assert main(["report", str(out), "--out", str(report), "--format", "md", "--n-boot", "2", "--no-progress",
                 "--compare-families", "law_exp", "law_logit"]) == 0
    assert (report / "report.md").is_file()


@pytest.mark.parametrize("gate", ["ratio", "cost"])
def test_an_arms_rounds_replayed_over_an_ar_workload_are_the_rounds_it_decoded_online(model_folder, task_file,
                                                                                      tmp_path, gate, monkeypatch):
    """``jobs.reference.workload_rounds``: the n-gram DDTree arm's rounds replayed over an AR run of the same
    prompts are, request by request, the rounds it decoded online (tokens, rounds, drafting rounds, draft nodes,
    accepted drafts: ``payoff.workload.round_counts`` of its own run), under its ratio gate or its cost gate with the
    curve its run stored; so ``payoff.workload.price_rounds`` prices the rounds the arm would decode, with no law."""
    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.workload import round_counts
    from entropy_law.traces.reader import load_traces

    ar, ngram = tmp_path / "ar", tmp_path / "ngram"
    # the cost gate's curve fixed at the tiny model's idle-machine timing: a loaded machine's can forbid every draft
    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    assert record(model_folder, task_file, ar, "--drafter", "ar", "--categories", "alpha,gamma") == 0
    assert record(model_folder, task_file, ngram, "--tree", "ddtree", "--budget", "6", "--gate", gate,
                  "--categories", "alpha,gamma") == 0
    target = load_target(str(model_folder))
    meta = json.loads((ngram / "run.json").read_text())
    replayed = workload_rounds(ar, meta, target)
    analysis = TraceAnalysis(load_traces(ngram), n_boot=0)
    online = round_counts(analysis.view, analysis.arms[0])
    assert replayed.attrs["gate"].startswith(f"the arm's {gate} gate")
    assert set(replayed["run_id"]) == {json.loads((ar / "run.json").read_text())["run_id"]}
    assert len(replayed) == len(online) == 4 and (replayed["drafting_rounds"] > 0).any()
    columns = ["request_id", "category", "tokens", "rounds", "drafting_rounds", "nodes", "accepted"]
    pd.testing.assert_frame_equal(replayed[columns].sort_values("request_id").reset_index(drop=True),
                                  online[columns].sort_values("request_id").reset_index(drop=True), check_dtype=False)
    assert (replayed["tokens"] == 11).all()  # 12 new tokens, the first from the prefill
    with pytest.raises(ValueError, match="AR run's"):
        workload_rounds(ar, json.loads((ar / "run.json").read_text()), target)
    with pytest.raises(ValueError, match="no verify_cost curve"):
        workload_rounds(ar, {**meta, "gate": "cost", "verify_cost": None}, target)


def test_the_replay_oracle_over_an_ar_workload_counts_its_rounds_as_the_arm_replay_does(model_folder, task_file,
                                                                                        tmp_path):
    """``jobs.reference.workload_oracle_rounds``: with a flat verify cost the hindsight-best round commits what the
    largest tree commits (a failed draft ties with a plain step, which the oracle keeps), so its tokens, rounds and
    accepted drafts equal the arm's rounds replayed always drafting that tree (``workload_rounds``, threshold 0),
    with no more drafting rounds; with a prohibitive cost it never drafts (every round a skipped plain step)."""
    import pandas as pd

    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_oracle_rounds, workload_rounds

    ar, ngram = tmp_path / "ar", tmp_path / "ngram"
    assert record(model_folder, task_file, ar, "--drafter", "ar", "--categories", "alpha,gamma") == 0
    assert record(model_folder, task_file, ngram, "--tree", "ddtree", "--budget", "6", "--categories", "alpha") == 0
    target = load_target(str(model_folder))
    meta = {**json.loads((ngram / "run.json").read_text()), "min_expected_accepted": 0.0}
    flat = workload_oracle_rounds(ar, meta, target, verify_cost=VerifyCost((1, 2), (1.0, 1.0)), budgets=(0, 6))
    always = workload_rounds(ar, meta, target)
    always = always.sort_values("request_id").reset_index(drop=True)
    columns = ["request_id", "category", "tokens", "rounds", "accepted"]
    pd.testing.assert_frame_equal(flat[columns], always[columns], check_dtype=False)
    assert (flat["drafting_rounds"] <= always["drafting_rounds"]).all() and (flat["nodes"] <= always["nodes"]).all()
    assert (flat["drafting_rounds"] > 0).any() and (flat["tokens"] == 11).all()
    assert (flat["skipped_rounds"] == flat["rounds"] - flat["drafting_rounds"]).all()
    steep = workload_oracle_rounds(ar, meta, target, verify_cost=VerifyCost((1, 2), (1.0, 12.0)), draft_cost=0.1)
    assert (steep["drafting_rounds"] == 0).all() and (steep["rounds"] == steep["tokens"]).all()
    assert (steep["skipped_rounds"] == steep["rounds"]).all() and (steep["accepted"] == 0).all()
    with pytest.raises(ValueError, match="AR run's"):
        workload_oracle_rounds(ar, json.loads((ar / "run.json").read_text()), target, verify_cost=VerifyCost((1,), (1,)))


def test_round_outcomes_and_round_records_over_an_ar_workload(model_folder, task_file, tmp_path):
    """``jobs.reference.workload_round_records`` are the rounds ``workload_rounds`` counts (the same totals per
    request); ``workload_round_outcomes`` has a row per (start, budget) of every request, a plain step committing one
    token, and with a policy the inputs it reads before drafting: the window entropy is the mean of the recorded
    entropies of the last ``window`` committed positions, the law's rate is at least a plain step's."""
    import pandas as pd

    from entropy_law.decoding.gate import VerifyCost
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_round_outcomes, workload_round_records, workload_rounds
    from entropy_law.traces.reader import load_traces
    from test_policy import params

    ar, ngram = tmp_path / "ar", tmp_path / "ngram"
    assert record(model_folder, task_file, ar, "--drafter", "ar", "--categories", "alpha,gamma") == 0
    assert record(model_folder, task_file, ngram, "--tree", "ddtree", "--budget", "6", "--categories", "alpha") == 0
    target = load_target(str(model_folder))
    meta = {**json.loads((ngram / "run.json").read_text()), "min_expected_accepted": 0.0}
    records = workload_round_records(ar, meta, target)
    counts = workload_rounds(ar, meta, target).set_index("request_id")
    decode = records.loc[records["round_index"] > 0].groupby("request_id")
    assert (decode["committed"].sum() == counts["tokens"]).all() and (decode.size() == counts["rounds"]).all()
    assert (decode["tree_nodes"].sum() == counts["nodes"]).all() and records["policy_drafted"].isna().all()

    policy = {**params(0.9), "drafter_id": "ngram"}
    table = workload_round_outcomes(ar, meta, target, budgets=(0, 2, 6), policy=policy,
                                    verify_cost=VerifyCost((1, 2, 8), (1.0, 1.2, 2.0)))
    assert set(table["request_id"]) == set(counts.index) and set(table["budget"]) == {0, 2, 6}
    per_start = table.groupby(["request_id", "start_position"]).size()
    assert (per_start == 3).all()
    plain = table.loc[table["budget"] == 0]
    assert (plain["committed"] == 1).all() and (plain["tree_nodes"] == 0).all()
    assert (table["law_rate"] >= 1.0).all() and (table["law_rate"] > 1.0).any()
    tokens = load_traces(ar).tokens
    for rid, part in plain.groupby("request_id"):
        h = tokens.loc[tokens["request_id"] == rid].sort_values("position")["target_entropy_nats"].to_numpy()
        expected = [h[max(0, s - policy["window"]):s].mean() for s in part["start_position"]]
        assert part["window_entropy"].to_numpy() == pytest.approx(expected)
        assert part["start_position"].tolist() == list(range(1, len(part) + 1))
    with pytest.raises(ValueError, match="AR run's"):
        workload_round_outcomes(ar, json.loads((ar / "run.json").read_text()), target)
    # a sample of the workload's requests: exactly their rows of the whole table and records; an unknown id refused
    one = sorted(counts.index)[-1]
    part = workload_round_outcomes(ar, meta, target, budgets=(0, 2, 6), policy=policy, requests=[one],
                                   verify_cost=VerifyCost((1, 2, 8), (1.0, 1.2, 2.0)))
    pd.testing.assert_frame_equal(part.reset_index(drop=True),
                                  table.loc[table["request_id"] == one].reset_index(drop=True))
    some = workload_round_records(ar, meta, target, requests=[one])
    assert set(some["request_id"]) == {one}
    pd.testing.assert_frame_equal(some.reset_index(drop=True),
                                  records.loc[records["request_id"] == one].reset_index(drop=True))
    with pytest.raises(ValueError, match="holds no request nope"):
        workload_round_outcomes(ar, meta, target, requests=[one, "nope"])


def test_an_arms_drafter_replayed_over_an_ar_workload_proposes_what_it_proposes_over_its_own_run(
        model_folder, task_file, tmp_path):
    """``jobs.reference.workload_proposals``: the n-gram arm's drafter replayed over an AR run of the same prompts
    (prompts rebuilt from the run's task file, checked against the recorded lengths) gives, request by request,
    the proposals replayed over the arm's own run: greedy output does not depend on the drafter. The replay of a
    raw-prompt run (``--no-chat-template``) rebuilds raw prompts; an AR run as the arm is refused."""
    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_proposals

    ar, ngram = tmp_path / "ar", tmp_path / "ngram"
    assert record(model_folder, task_file, ar, "--drafter", "ar", "--categories", "alpha,gamma") == 0
    assert record(model_folder, task_file, ngram, "--tree", "ddtree", "--budget", "6", "--categories",
                  "alpha,gamma") == 0
    target = load_target(str(model_folder))
    meta = json.loads((ngram / "run.json").read_text())
    over_ar = workload_proposals(ar, meta, target)
    over_own = workload_proposals(ngram, meta, target)
    assert set(over_ar["run_id"]) == {json.loads((ar / "run.json").read_text())["run_id"]}
    assert over_ar["request_id"].nunique() == 4 and (over_ar["proposal_depth"] > 0).any()  # alpha 3, gamma 1
    keys = ["request_id", "start_position", "depth"]
    pd.testing.assert_frame_equal(over_ar.drop(columns="run_id").sort_values(keys).reset_index(drop=True),
                                  over_own.drop(columns="run_id").sort_values(keys).reset_index(drop=True))
    with pytest.raises(ValueError, match="AR run's"):
        workload_proposals(ar, json.loads((ar / "run.json").read_text()), target)
    with pytest.raises(ValueError, match="not a trace run"):
        workload_proposals(tmp_path, meta, target)


def test_a_timed_recording_resumed_keeps_the_calls_timed_before(model_folder, task_file, tmp_path):
    """``jobs.record.record_timed`` (the speed benches' recorder): AR and the n-gram arm decode the prompts into
    ``out/<arm>``, their run.json holds the metadata, and ``timings.csv`` one timed call per arm and prompt; a
    resumed recording with more prompts appends its calls, never replacing the earlier ones."""
    import pandas as pd

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.plan import Drafting, Limits
    from entropy_law.jobs.record import record_timed
    from entropy_law.prompts.text import load_tasks

    tasks = [t for t in load_tasks(task_file) if t.category in ("alpha", "gamma")]
    target, out, lines = load_target(str(model_folder)), tmp_path / "timed", []
    record_timed(tasks[:2], ("ar", "ngram"), out, target, limits=Limits(6),
                 metadata={"seed": 3, "tasks": str(task_file)}, log=lines.append)
    first = pd.read_csv(out / "timings.csv")
    assert sorted(first["arm"]) == ["ar", "ar", "ngram", "ngram"] and first["matches_reference"].all()
    meta = json.loads((out / "ngram" / "run.json").read_text())
    assert (meta["arm"], meta["seed"], meta["replayed"], meta["tasks"]) == ("ngram", 3, False, str(task_file))
    record_timed(tasks, ("ar", "ngram"), out, target, limits=Limits(6), log=lines.append)
    both = pd.read_csv(out / "timings.csv")
    assert len(both) == 2 * len(tasks) and both["request_id"].nunique() == len(tasks) > 2
    pd.testing.assert_frame_equal(both.iloc[:len(first)], first)
    assert any(line.startswith("recorded into") for line in lines)


def test_a_timed_recording_with_a_law_policy_per_drafter_stores_it_and_is_its_own_arm(model_folder, task_file,
                                                                                     tmp_path, monkeypatch):
    """``record_timed(drafting=Drafting(policy=))`` with a function of the arm (one policy per drafter, the open-ended check's
    recorder): the n-gram arm runs its law policy (the cost gate, the curve measured: fixed here) and its run.json
    holds the parameters as given; the AR run holds none; the analysis labels the run as a law-policy arm."""
    from test_policy import params

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.plan import Drafting, Limits
    from entropy_law.jobs.record import record_timed
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.law.arms import policy_gate
    from entropy_law.prompts.text import load_tasks
    from entropy_law.traces.reader import load_traces

    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    law = {**params(0.8, slope=True), "drafter_id": "ngram"}
    tasks = [t for t in load_tasks(task_file) if t.category in ("alpha", "gamma")][:2]
    out = tmp_path / "timed"
    record_timed(tasks, ("ar", "ngram"), out, load_target(str(model_folder)), limits=Limits(6), log=lambda m: None,
                 drafting=Drafting(gate="cost", policy=lambda spec: law if spec.drafter == "ngram" else None))
    ngram, ar = (json.loads((out / name / "run.json").read_text()) for name in ("ngram", "ar"))
    assert ngram["policy"] == law and ngram["gate"] == "cost" and ngram["verify_cost"] == FLAT_COST.to_config()
    assert "policy" not in ar
    rounds = load_traces(out / "ngram").rounds
    assert rounds["policy_drafted"].notna().any()  # the policy decided each round
    an = TraceAnalysis(load_traces(out), n_boot=0)
    key = an.runs.loc[~an.runs["is_ar"], "arm_key"].iloc[0]
    assert key.gate == policy_gate(law)


def test_a_timed_recording_runs_the_gate_asked_for(model_folder, task_file, tmp_path, monkeypatch):
    """``record_timed(drafting=Drafting(gate="cost"))`` without a policy: the drafting arm runs the cost gate with the curve measured
    (fixed here) and says so in its run.json; AR has none. A law policy under the ratio gate is refused before
    anything decodes (the policy prices trees with the curve)."""
    from test_policy import params

    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.plan import Drafting, Limits
    from entropy_law.jobs.record import record_timed
    from entropy_law.prompts.text import load_tasks

    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    tasks = [t for t in load_tasks(task_file) if t.category == "alpha"][:1]
    target, out = load_target(str(model_folder)), tmp_path / "timed"
    record_timed(tasks, ("ar", "ngram"), out, target, limits=Limits(6), log=lambda m: None,
                 drafting=Drafting(gate="cost"))
    ngram, ar = (json.loads((out / name / "run.json").read_text()) for name in ("ngram", "ar"))
    assert ngram["gate"] == "cost" and ngram["verify_cost"] == FLAT_COST.to_config() and "policy" not in ngram
    assert ar.get("gate") is None and ar.get("verify_cost") is None
    with pytest.raises(ValueError, match="gate='cost'"):
        record_timed(tasks, ("ar", "ngram"), tmp_path / "other", target, limits=Limits(6), log=lambda m: None,
                     drafting=Drafting(gate="ratio", policy={**params(0.8), "drafter_id": "ngram"}))
    assert not (tmp_path / "other").exists()


def test_a_runs_round_proposals_are_its_drafters_own_at_every_verified_depth(model_folder, task_file, tmp_path):
    """``jobs.reference.round_proposals``: the n-gram DDTree run's rounds replayed over its own outputs equal the
    recorded ones, and each drafting round gets the drafter's confidence at depths 1 .. its verified depth; where the
    round reached a depth, that is the ``draft_top1_prob`` the decoder logged there. Replaying with another tree
    budget than the one recorded is refused, naming the request."""
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import round_proposals
    from entropy_law.traces.reader import load_traces

    run = tmp_path / "ngram"
    assert record(model_folder, task_file, run, "--tree", "ddtree", "--budget", "6", "--categories", "alpha") == 0
    target = load_target(str(model_folder))
    got = round_proposals(run, target)
    traces = load_traces(run)
    rounds = traces.rounds.astype({"request_id": str})
    drafting = rounds.loc[rounds["tree_depth"] > 0].set_index(["request_id", "round_index"])
    per_round = got.groupby(["request_id", "round_index"]).agg(n=("depth", "size"), top=("depth", "max"),
                                                              start=("start_position", "first"))
    assert len(per_round) == len(drafting) > 0
    both = per_round.join(drafting[["tree_depth", "start_position"]], how="inner")
    assert len(both) == len(drafting) and (both["n"] == both["tree_depth"]).all()
    assert (both["top"] == both["tree_depth"]).all() and (both["start"] == both["start_position"]).all()
    tokens = traces.tokens.astype({"request_id": str})
    logged = tokens.loc[tokens["draft_top1_prob"].notna(), ["request_id", "round_index", "depth", "draft_top1_prob"]]
    assert len(logged) > 0
    same = logged.merge(got, on=["request_id", "round_index", "depth"], how="left", validate="one_to_one")
    assert np.allclose(same["top1_prob"], same["draft_top1_prob"], atol=1e-6)
    assert len(got) > len(logged) or (rounds["accepted"] + 1 >= rounds["tree_depth"]).all()
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "tree_budget": 2}))
    with pytest.raises(ValueError, match="request .*: replayed round .* differs from the recorded one"):
        round_proposals(run, target)


def test_record_refuses_a_law_policy_of_another_target_unless_borrowed(model_folder, task_file, tmp_path, capsys):
    """`record --policy law` with parameters fitted on another target's traces (here smollm2-135m's, as the reference
    traces' are) stops with what to do; `--policy-borrow` applies them knowingly and the run keeps their origin."""
    from test_policy import params

    from entropy_law.payoff.policy import save_policy

    law = save_policy({**params(0.9), "drafter_id": "ngram", "model_id": ["smollm2-135m"]}, tmp_path / "law.json")
    args = ("--policy", "law", "--policy-law", str(law), "--categories", "alpha")
    assert record(model_folder, task_file, tmp_path / "refused", *args) == 2
    err = capsys.readouterr().err
    assert "fitted on traces of target smollm2-135m" in err and "--policy-borrow" in err
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    out = tmp_path / "borrowed"
    assert record(model_folder, task_file, out, *args, "--policy-borrow") == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["policy"]["borrowed_from"]["model_id"] == ["smollm2-135m"] and meta["policy"]["model_id"] is None
    assert read_table(out, "rounds")["policy_drafted"].notna().any()


def test_record_with_the_hybrid_drafter_and_its_law_policy(model_folder, task_file, tmp_path, capsys, monkeypatch):
    """`record --drafter hybrid` decodes losslessly with prompt lookup and a (random) block drafter in one tree;
    `policy --hybrid NGRAM.json BLOCK.json` combines the two drafters' law policies, and `record --drafter hybrid
    --policy law` decodes with it (each round's route recorded). Either policy on the other kind of drafter is
    refused, saying what to give instead."""
    from test_policy import params

    from entropy_law.payoff.policy import HYBRID_POLICY_KIND, save_policy

    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    checkpoint = random_block_checkpoint(model_folder, tmp_path / "drafter.safetensors")
    hybrid = ("--drafter", "hybrid", "--checkpoint", str(checkpoint), "--tree", "ddtree", "--budget", "8",
              "--categories", "alpha")
    gate = tmp_path / "gate"
    assert record(model_folder, task_file, gate, *hybrid) == 0
    meta = json.loads((gate / "run.json").read_text())
    assert meta["drafter_id"] == "hybrid" and meta["drafter_config"]["ngram"]["block_size"] == 4
    assert meta["drafter_config"]["block"]["checkpoint"] == "drafter.safetensors"
    assert meta["drafter_config"]["skip_block_at"] == 2.0  # the drafter's own default
    assert_greedy_outputs(gate, model_folder, task_file)
    never = tmp_path / "never_skips"  # the block forward every round, whatever prompt lookup proposes
    assert record(model_folder, task_file, never, *hybrid, "--hybrid-skip", "99") == 0
    assert json.loads((never / "run.json").read_text())["drafter_config"]["skip_block_at"] == 99.0
    assert_greedy_outputs(never, model_folder, task_file)
    assert record(model_folder, task_file, tmp_path / "bad", "--hybrid-skip", "1") == 2  # --drafter ngram
    assert "use it with --drafter hybrid" in capsys.readouterr().err
    assert record(model_folder, task_file, tmp_path / "bad", *hybrid, "--hybrid-skip", "-1") == 2
    assert "--hybrid-skip must be a finite number >= 0" in capsys.readouterr().err
    assert record(model_folder, task_file, tmp_path / "bad", *hybrid, "--hybrid-skip", "inf") == 2
    assert "--hybrid-skip must be a finite number >= 0" in capsys.readouterr().err

    ngram = save_policy({**params(0.9), "drafter_id": "ngram"}, tmp_path / "ngram.json")
    block = save_policy({**params(0.9, draft_cost=0.1), "drafter_id": "block-drafter-b4-l1"}, tmp_path / "block.json")
    combined = tmp_path / "hybrid.json"
    assert main(["policy", "--hybrid", str(block), str(ngram), "--out", str(combined)]) == 2  # the order matters
    assert "n-gram drafter's first" in capsys.readouterr().err and not combined.exists()
    assert main(["policy", str(gate), "--hybrid", str(ngram), str(block), "--out", str(combined)]) == 2
    assert "combines two fitted policies" in capsys.readouterr().err
    assert main(["policy", "--out", str(combined)]) == 2  # neither traces to fit nor policies to combine
    assert "give the TRACES to fit on" in capsys.readouterr().err
    assert main(["policy", "--hybrid", str(ngram), str(block), "--out", str(combined)]) == 0
    assert "record --drafter hybrid" in capsys.readouterr().out
    assert json.loads(combined.read_text())["kind"] == HYBRID_POLICY_KIND

    out = tmp_path / "law"
    assert record(model_folder, task_file, out, *hybrid, "--policy", "law", "--policy-law", str(combined)) == 0
    assert json.loads((out / "run.json").read_text())["policy"]["kind"] == HYBRID_POLICY_KIND
    routes = read_table(out, "rounds")["policy_route"]
    assert routes.notna().any() and set(routes.dropna()) <= {"ngram", "block"}
    assert_greedy_outputs(out, model_folder, task_file)
    # the hybrid arms replay exactly over their own outputs (round_proposals raises on any round that differs), the
    # law policy's routes included: what prices a hybrid arm on another workload before running it
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import round_proposals, workload_round_records

    target = load_target(str(model_folder))
    drafted = {run.name: round_proposals(run, target, checkpoint=checkpoint) for run in (gate, never, out)}
    assert not drafted["gate"].empty and not drafted["law"].empty  # rounds that verified drafts were compared
    replayed = workload_round_records(out, json.loads((out / "run.json").read_text()), target, checkpoint=checkpoint)
    recorded = read_table(out, "rounds").sort_values(["request_id", "round_index"])
    assert replayed["policy_route"].tolist() == recorded["policy_route"].tolist()
    assert replayed["policy_route"].isin(["ngram", "block"]).any()

    assert record(model_folder, task_file, tmp_path / "one", "--policy", "law", "--policy-law", str(combined)) == 2
    assert "only a decoder of the hybrid drafter runs it" in capsys.readouterr().err  # --drafter ngram
    one_law = ("--policy", "law", "--policy-law", str(ngram))
    assert record(model_folder, task_file, tmp_path / "two", *hybrid, *one_law) == 2
    assert "the decoder's drafter is 'hybrid'" in capsys.readouterr().err  # one drafter's law on the hybrid
