"""The converted-model cache of ``load_target``: a GGUF file converted once is read back as the same model
(bitwise), its key follows the file's bytes and the dtype, and a cache that cannot be read is never used."""

from __future__ import annotations

import warnings

import pytest
import torch

from entropy_law.decoding import loading


def test_the_key_follows_the_bytes_and_the_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    first = loading.converted_cache_path(gguf, torch.float32)
    assert first.parent == tmp_path / "cache" / "converted" and "float32" in first.name
    assert loading.converted_cache_path(gguf, torch.bfloat16) != first
    from entropy_law.traces.layout import file_sha256

    assert loading.converted_cache_path(gguf, torch.float32, sha256=file_sha256(gguf)) == first  # a checked digest
    gguf.write_bytes(b"GGUF two")
    assert loading.converted_cache_path(gguf, torch.float32) != first


class _Stub:
    """Stands in for transformers' loading: records which folders were read; the cache folder fails."""

    def __init__(self, fail_on):
        self.fail_on, self.read, self.saved = fail_on, [], []

    def load(self, folder, dtype, attn_implementation, kwargs):
        self.read.append(str(folder))
        if str(folder) == str(self.fail_on):
            raise OSError("unreadable safetensors header")
        model = torch.nn.Linear(1, 1)
        return object(), model

    def save(self, model, tokenizer, folder, source):
        self.saved.append(folder)


def test_an_unreadable_cache_is_removed_and_the_gguf_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF bytes")
    cached = loading.converted_cache_path(gguf, torch.float32)
    cached.mkdir(parents=True)
    (cached / loading._COMPLETE).write_text("{}")
    stub = _Stub(fail_on=cached)
    monkeypatch.setattr(loading, "_from_folder", stub.load)
    monkeypatch.setattr(loading, "_save_converted", stub.save)
    with pytest.warns(RuntimeWarning, match="could not be loaded.*converting the GGUF file again"):
        target = loading.load_target(gguf)
    assert stub.read == [str(cached), str(tmp_path)]  # the cache first, then the GGUF file's folder
    assert not cached.exists() and stub.saved == [cached]  # removed, then written afresh
    assert target.source == str(gguf) and target.model_id == "m"


def test_a_folder_without_its_completion_marker_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF bytes")
    cached = loading.converted_cache_path(gguf, torch.float32)
    cached.mkdir(parents=True)  # a folder left by a crash before the rename would not have this name; still
    stub = _Stub(fail_on=None)
    monkeypatch.setattr(loading, "_from_folder", stub.load)
    monkeypatch.setattr(loading, "_save_converted", stub.save)
    loading.load_target(gguf)
    assert stub.read == [str(tmp_path)] and stub.saved == [cached]


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_cache_can_be_turned_off(tmp_path, monkeypatch, how):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF bytes")
    stub = _Stub(fail_on=None)
    monkeypatch.setattr(loading, "_from_folder", stub.load)
    monkeypatch.setattr(loading, "_save_converted", stub.save)
    if how == "argument":
        loading.load_target(gguf, cache_converted=False)
    else:
        monkeypatch.setenv(loading.NO_CONVERTED_CACHE_ENV, "1")
        loading.load_target(gguf)
    assert stub.read == [str(tmp_path)] and stub.saved == []


@pytest.mark.real_model
def test_the_cached_smollm2_is_the_converted_one_bitwise(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = loading.load_target("smollm2-135m")
            assert len(list((tmp_path / "cache" / "converted").iterdir())) == 1  # kept, and nothing partial
            cached = loading.load_target("smollm2-135m")
        a, b = converted.model.state_dict(), cached.model.state_dict()
        assert type(converted.model) is type(cached.model) and a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert cached.source == converted.source and cached.model_id == converted.model_id == "smollm2-135m"
        ca, cb = converted.model.config.to_dict(), cached.model.config.to_dict()
        for key in ("_name_or_path", "quantization_config"):  # where it was read from; the GGUF marker
            ca.pop(key, None), cb.pop(key, None)
        assert ca == cb
        assert converted.model.generation_config.to_dict() == cached.model.generation_config.to_dict()
        messages = [{"role": "user", "content": "Translate 'hello, world' into French. Ünïcode ✓ 12345"}]
        prompt = converted.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert prompt == cached.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert converted.tokenizer.chat_template == cached.tokenizer.chat_template
        ids = converted.tokenizer(prompt)["input_ids"]
        assert ids == cached.tokenizer(prompt)["input_ids"]
        text = "Summarize:\n\n  the quick brown fox\tjumps. 3.14159 ✓"
        assert converted.tokenizer(text)["input_ids"] == cached.tokenizer(text)["input_ids"]
        x = torch.tensor([ids])
        with torch.inference_mode():
            assert torch.equal(converted.model(x).logits, cached.model(x).logits)
    finally:
        torch.set_num_threads(threads)


def test_a_cache_that_cannot_be_written_warns_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "converted" / "key"

    class Unsaveable(torch.nn.Linear):
        @property
        def generation_config(self):
            raise ValueError("this tokenizer or config cannot be saved")

    with pytest.warns(RuntimeWarning, match="could not keep the converted model"):
        loading._save_converted(Unsaveable(1, 1), object(), folder, "m.gguf")
    assert not folder.exists() and list(folder.parent.iterdir()) == []  # no partial folder left
